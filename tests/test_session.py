"""The pure session: rounds of backend calls and the gateway's tool calls, without I/O.

What a turn used to decide in its shells is decided here, and tested here
chunk by chunk: what ends a round, which calls the gateway runs, the next
round's request, when the response ends, and the same for chat completions.
"""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.streams.chat import ChatSession, collect_chat_completion
from gateway.streams.chunks import DONE
from gateway.streams.session import ResponseSession
from gateway.streams.translator import ResponseTranslator, RoundCall
from gateway.turn.plan import plan_chat_request
from gateway.wire import parse_create_request
from scripted_backend import call_delta, chunk, usage_chunk
from spec import check_events
from test_translator_properties import CLOCK, CountingIds

Event = dict[str, Any]

ADD_CALL = [chunk(call_delta(0, id="call_a", name="add", args='{"a": 2, "b": 3}')), chunk(finish="tool_calls"), usage_chunk()]
ANSWER = [chunk({"content": "It is "}), chunk({"content": "5."}), chunk(finish="stop"), usage_chunk()]


def make_session(
    *, max_rounds: int | None = 5, gateway: dict[str, str] | None = None, approval: frozenset[str] = frozenset()
) -> ResponseSession:
    plan = plan_chat_request(parse_create_request(b'{"model":"m","input":"2+3?"}'), response_id="resp_1", created_at=1)
    translator = ResponseTranslator(plan.response, ids=CountingIds(), clock=lambda: CLOCK)
    translator.set_gateway_tools(gateway if gateway is not None else {"add": "calc"}, approval)
    return ResponseSession(translator, plan.body, max_rounds=max_rounds)


def run_round(session: ResponseSession, script: list[Any], *, done: bool = True) -> list[Event]:
    events: list[Event] = []
    for step in script:
        events += session.feed(step)
    return events + (session.feed(DONE) if done else session.end_of_stream())


def two_rounds(session: ResponseSession, first: list[Any], second: list[Any]) -> list[Event]:
    events = session.start() + run_round(session, first)
    for call in session.calls:
        events += session.tool_result(call, output="5")
    events += session.tools_done()
    if not session.done:
        events += run_round(session, second)
    return events


def test_a_gateway_call_ends_the_round_and_its_result_starts_the_next():
    session = make_session()
    events = session.start() + run_round(session, ADD_CALL)
    assert not session.done and session.round_over
    assert [(c.name, c.arguments, c.server) for c in session.calls] == [("add", '{"a": 2, "b": 3}', "calc")]
    assert events[-1]["type"] == "response.mcp_call.in_progress"
    events += session.tool_result(session.calls[0], output="5")
    assert events[-2]["type"] == "response.mcp_call.completed"
    events += session.tools_done()
    assert not session.round_over and session.calls == []
    exchange = session.request["messages"][-2:]
    assert exchange == [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_a", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]},
        {"role": "tool", "tool_call_id": "call_a", "content": "5"},
    ]
    events += run_round(session, ANSWER)
    final = check_events(events)
    assert final["status"] == "completed"
    assert [item["type"] for item in final["output"]] == ["mcp_call", "message"]
    assert final["output"][0]["output"] == "5" and final["output"][1]["content"][0]["text"] == "It is 5."
    assert final["usage"]["total_tokens"] == 36  # both rounds


def test_the_rounds_text_goes_into_the_next_request():
    session = make_session()
    two_rounds(session, [chunk({"content": "Let me add."}), *ADD_CALL], [])
    assert session.request["messages"][-2]["content"] == "Let me add."


def test_a_failed_tool_is_data_for_the_model():
    session = make_session()
    events = session.start() + run_round(session, ADD_CALL)
    events += session.tool_result(session.calls[0], error="division by zero")
    events += session.tools_done()
    assert session.request["messages"][-1]["content"] == "Error: division by zero"
    assert events[-2]["type"] == "response.mcp_call.failed"


def test_client_calls_beside_gateway_calls_end_the_response_after_the_gateways_run():
    session = make_session()
    both = [
        chunk(call_delta(0, id="call_a", name="add", args="{}")),
        chunk(call_delta(1, id="call_w", name="get_weather", args='{"city": "Oslo"}')),
        chunk(finish="tool_calls"),
    ]
    events = session.start() + run_round(session, both)
    assert [c.name for c in session.calls] == ["add"]
    events += session.tool_result(session.calls[0], output="0")
    events += session.tools_done()
    final = check_events(events)
    assert final["status"] == "completed"
    assert {i["type"] for i in final["output"]} == {"mcp_call", "function_call"}


def test_rounds_run_out_as_incomplete_max_tool_calls():
    session = make_session(max_rounds=2)
    events = session.start()
    for _ in range(2):
        events += run_round(session, ADD_CALL)
        events += session.tool_result(session.calls[0], output="5")
        events += session.tools_done()
    final = check_events(events)
    assert final["status"] == "incomplete" and final["incomplete_details"] == {"reason": "max_tool_calls"}
    assert session.rounds == 2


def test_without_a_tool_loop_the_first_round_ends_the_response():
    session = make_session(max_rounds=None)
    final = check_events(session.start() + run_round(session, ADD_CALL))
    assert final["status"] == "completed" and session.calls == []


def test_a_cut_off_round_does_not_run_its_calls():
    session = make_session()
    cut = [chunk(call_delta(0, id="call_a", name="add", args='{"a": 2')), chunk(finish="length")]
    final = check_events(session.start() + run_round(session, cut))
    assert final["status"] == "incomplete" and session.calls == []


def test_approval_requests_are_the_clients_to_answer():
    session = make_session(approval={"add"})
    final = check_events(session.start() + run_round(session, ADD_CALL))
    assert session.calls == [] and final["output"][0]["type"] == "mcp_approval_request"


def test_the_end_of_the_body_after_a_finish_reason_ends_the_round_and_without_one_fails():
    session = make_session(max_rounds=None)
    final = check_events(session.start() + run_round(session, ANSWER, done=False))
    assert final["status"] == "completed"
    session = make_session(max_rounds=None)
    final = check_events(session.start() + run_round(session, ANSWER[:2], done=False))
    assert final["status"] == "failed" and final["error"]["code"] == "backend_stream_ended"


def test_resumed_and_declined_approvals_are_in_the_first_request():
    session = make_session()
    events = session.start()
    call = RoundCall("mcpr_9", "mcpr_9", "add", '{"a": 1}', "calc")
    events += session.resume(call, output="2", error=None, approval_request_id="mcpr_9")
    session.decline(RoundCall("mcpr_8", "mcpr_8", "add", "{}", "calc"), "no")
    item = events[-1]["item"]
    assert (item["type"], item["approval_request_id"], item["output"]) == ("mcp_call", "mcpr_9", "2")
    tool_messages = [m for m in session.request["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in tool_messages] == ["2", "The user did not approve this tool call. Reason: no"]
    final = check_events(events + run_round(session, ANSWER))
    assert [i["type"] for i in final["output"]] == ["mcp_call", "message"]


def test_a_backend_failure_in_a_later_round_keeps_what_the_earlier_ones_made():
    session = make_session()
    events = session.start() + run_round(session, ADD_CALL)
    events += session.tool_result(session.calls[0], output="5")
    events += session.tools_done()
    events += session.feed(chunk({"content": "It"}))
    events += session.fail("backend_timeout", "timed out waiting for the backend")
    final = check_events(events)
    assert final["status"] == "failed"
    assert [i["type"] for i in final["output"]] == ["mcp_call", "message"]
    assert final["output"][1]["status"] == "incomplete"


PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(st.data())
def test_a_two_round_turn_gives_the_same_events_however_the_chunks_are_split(data):
    def split(script: list[Any]) -> list[Any]:
        out: list[Any] = []
        for step in script:
            delta = (step.get("choices") or [{}])[0].get("delta") or {}
            text = delta.get("content")
            if isinstance(text, str) and len(text) > 1:
                cut = data.draw(st.integers(1, len(text) - 1))
                out += [chunk({"content": text[:cut]}), chunk({"content": text[cut:]})]
            else:
                out.append(step)
        return out

    reference = make_session()
    expected = two_rounds(reference, ADD_CALL, ANSWER)
    session = make_session()
    events = two_rounds(session, split(ADD_CALL), split(ANSWER))
    final = check_events(events)
    assert final["output"] == check_events(expected)["output"]
    assert session.request["messages"] == reference.request["messages"]


# --- chat completions ------------------------------------------------------------------------


def chat_round(session: ChatSession, script: list[Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for step in script:
        out += session.feed(step)
    return out + session.feed(DONE)


def test_a_chat_session_hides_the_gateways_calls_and_sums_usage():
    session = ChatSession({"model": "m", "messages": [{"role": "user", "content": "2+3"}]}, {"add"}, max_rounds=5)
    out = chat_round(session, [chunk({"content": "Let me add."}), *ADD_CALL])
    assert [call.name for call in session.calls] == ["add"]
    for call in session.calls:
        out += session.tool_result(call, output="5")
    out += session.tools_done()
    assert session.request["messages"][-1] == {"role": "tool", "tool_call_id": "call_a", "content": "5"}
    out += chat_round(session, ANSWER)
    assert session.done
    assert not any(c.get("choices") and c["choices"][0]["delta"].get("tool_calls") for c in out)
    finishes = [c["choices"][0]["finish_reason"] for c in out if c.get("choices") and c["choices"][0].get("finish_reason")]
    assert finishes == ["stop"]
    assert out[-1]["usage"]["total_tokens"] == 36
    completion = collect_chat_completion(out)
    assert completion["choices"][0]["message"]["content"] == "Let me add.It is 5."
    assert completion["choices"][0]["finish_reason"] == "stop"


def test_a_chat_session_returns_the_clients_calls_reindexed_and_ends_with_tool_calls():
    session = ChatSession({"model": "m", "messages": []}, {"add"}, max_rounds=5)
    out = chat_round(
        session,
        [chunk(call_delta(0, id="call_a", name="add", args="{}")), chunk(call_delta(1, id="call_w", name="get_weather", args="{}")), chunk(finish="tool_calls")],
    )
    for call in session.calls:
        out += session.tool_result(call, output="0")
    out += session.tools_done()
    assert session.done
    calls = [c for o in out if o.get("choices") for c in o["choices"][0]["delta"].get("tool_calls") or []]
    assert calls == [{"index": 0, "id": "call_w", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]
    assert out[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_a_chat_session_turns_an_error_chunk_or_garbage_into_one_error():
    session = ChatSession({"model": "m", "messages": []}, {"add"}, max_rounds=5)
    out = session.feed({"error": {"message": "boom", "code": "x"}})
    assert out == [{"error": {"message": "boom", "type": "server_error", "param": None, "code": "x"}}] and session.done
    session = ChatSession({"model": "m", "messages": []}, {"add"}, max_rounds=5)
    out = session.feed(chunk({"content": 3}))
    assert out[0]["error"]["code"] == "backend_error" and session.done
    assert orjson.dumps(out)  # plain data
