"""Anthropic Messages events from chat chunks (`gateway.streams.messages`), pure: exact sequences,
stop reasons, usage, ids, failures, the gateway's tools hidden, and any re-chunking."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from anthropic_events import check_stream
from gateway.streams.chunks import DONE
from gateway.streams.messages import MessagesSession, collect_message
from gateway.streams.translator import RoundCall
from scripted_backend import call_delta, chunk

USAGE = {"prompt_tokens": 40, "completion_tokens": 9, "total_tokens": 49, "prompt_tokens_details": {"cached_tokens": 30}}


class Ids:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}_{self.n}"


def session(gateway_tools: set[str] | None = None, **fields: Any) -> MessagesSession:
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    return MessagesSession(chat, gateway_tools or set(), max_rounds=5, message_id="msg_1", model="claude-x", ids=Ids())


def usage() -> dict[str, Any]:
    return {"id": "c", "object": "chat.completion.chunk", "choices": [], "usage": USAGE}


def run(chunks: list[Any], s: MessagesSession | None = None) -> list[dict[str, Any]]:
    s = s or session()
    return s.start() + s.feed_batch(chunks) + s.end_of_stream()


def test_a_text_answer_is_one_text_block_between_message_start_and_message_stop():
    events = run([chunk({"role": "assistant", "content": ""}), chunk({"content": "Hel"}), chunk({"content": "lo"}), chunk(finish="stop"), usage(), DONE])
    assert events == [
        {
            "type": "message_start",
            "message": {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "model": "claude-x",
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": 0, "output_tokens": 0},
            },
        },
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hel"}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "lo"}},
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            # The chat usage's prompt tokens hold the cached ones: Anthropic counts them apart.
            "usage": {"input_tokens": 10, "output_tokens": 9, "cache_read_input_tokens": 30, "cache_creation_input_tokens": 0},
        },
        {"type": "message_stop"},
    ]


def test_thinking_with_its_signature_then_text_then_tool_calls_are_blocks_in_order():
    events = run(
        [
            chunk({"reasoning_content": "Let me "}),
            chunk({"reasoning_content": "think."}),
            chunk({"reasoning_signature": "sig=="}),
            chunk({"content": "Calling."}),
            chunk(call_delta(0, id="call_abc", name="get_weather", args='{"ci')),
            chunk(call_delta(0, args='ty": "Paris"}')),
            chunk(call_delta(1, id="toolu_keep", name="get_time", args="{}")),
            chunk(finish="tool_calls"),
            DONE,
        ]
    )
    assert check_stream(events) == "message_stop"
    message = collect_message(events)
    assert message is not None
    assert message["content"] == [
        {"type": "thinking", "thinking": "Let me think.", "signature": "sig=="},
        {"type": "text", "text": "Calling."},
        # A backend's own id is not Anthropic's form: the gateway gives one; an Anthropic one is kept.
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
        {"type": "tool_use", "id": "toolu_keep", "name": "get_time", "input": {}},
    ]
    assert message["stop_reason"] == "tool_use"


def test_each_finish_reason_is_anthropics_stop_reason():
    for finish, reason in [("stop", "end_turn"), ("length", "max_tokens"), ("tool_calls", "tool_use"), ("content_filter", "refusal")]:
        tail = [chunk(call_delta(0, id="c", name="f", args="{}"))] if finish == "tool_calls" else []
        events = run([chunk({"content": "x"}), *tail, chunk(finish=finish), DONE])
        assert events[-2]["delta"]["stop_reason"] == reason, finish


def test_a_backend_without_usage_still_gives_usage_and_cache_writes_are_kept_apart():
    assert run([chunk({"content": "x"}), chunk(finish="stop"), DONE])[-2]["usage"]["input_tokens"] == 0
    written = {**USAGE, "prompt_tokens_details": {"cached_tokens": 30, "cache_creation_tokens": 5}}
    events = run([chunk({"content": "x"}), chunk(finish="stop"), {"choices": [], "usage": written}, DONE])
    assert events[-2]["usage"] == {"input_tokens": 5, "output_tokens": 9, "cache_read_input_tokens": 30, "cache_creation_input_tokens": 5}


def test_a_failure_is_one_error_event_in_anthropics_shape_and_nothing_follows():
    s = session()
    events = s.start() + s.feed_batch([chunk({"content": "partial"})])
    failed = s.fail("backend_timeout", "the backend sent no data in time", type="server_error", status=504)
    assert failed == [{"type": "error", "error": {"type": "timeout_error", "message": "the backend sent no data in time"}}]
    assert s.done and s.feed(chunk({"content": "more"})) == [] and s.end_of_stream() == []
    assert check_stream(events + failed) == "error"
    assert collect_message(events + failed) is None


def test_an_error_inside_the_backends_stream_and_a_cut_stream_end_with_an_error_not_a_success():
    inside = run([chunk({"content": "a"}), {"error": {"message": "slot unavailable", "code": 503}}])
    assert check_stream(inside) == "error" and inside[-1]["error"] == {"type": "api_error", "message": "slot unavailable"}
    s = session()
    cut = s.start() + s.feed_batch([chunk({"content": "a"})]) + s.end_of_stream()  # no finish, no [DONE]
    assert check_stream(cut) == "error"


def test_the_gateways_own_tool_calls_are_hidden_and_its_rounds_make_one_message():
    s = session({"lookup"})
    events = s.start() + s.feed_batch([chunk({"content": "Let me look. "}), chunk(call_delta(0, id="g1", name="lookup", args="{}")), chunk(finish="tool_calls"), DONE])
    assert not s.done and [call.name for call in s.calls] == ["lookup"]
    events += s.tool_result(s.calls[0], output="42") + s.tools_done()
    assert s.request["messages"][-1] == {"role": "tool", "tool_call_id": "g1", "content": "42"}
    events += s.feed_batch([chunk({"content": "It is 42."}), chunk(finish="stop"), usage(), DONE])
    assert check_stream(events) == "message_stop"
    message = collect_message(events)
    assert message is not None and message["content"] == [{"type": "text", "text": "Let me look. It is 42."}]
    assert message["stop_reason"] == "end_turn"


def test_the_client_request_goes_natively_only_with_the_first_round():
    s = MessagesSession({"model": "m", "messages": []}, {"lookup"}, max_rounds=5, message_id="msg_1", model="m", ids=Ids(), native="NATIVE")
    assert s.native == "NATIVE"
    s.feed_batch([chunk(call_delta(0, id="g1", name="lookup", args="{}")), chunk(finish="tool_calls"), DONE])
    s.tool_result(RoundCall("g1", "g1", "lookup", "{}", "gateway"), output="x")
    s.tools_done()
    assert s.native is None  # the next round's request carries the gateway's tool results


# --- any re-chunking --------------------------------------------------------------------

_pieces = st.lists(st.text(min_size=1, max_size=6), min_size=1, max_size=6)


def _split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts} | {0, len(text)})
    return [text[a:b] for a, b in zip(points, points[1:]) if b > a]


@settings(max_examples=300, deadline=None)
@given(
    thinking=st.one_of(st.none(), st.text(min_size=1, max_size=20)),
    text=st.text(min_size=1, max_size=40),
    calls=st.lists(st.fixed_dictionaries({"name": st.sampled_from(["a", "b"]), "city": st.text(max_size=8)}), max_size=3),
    cuts=st.lists(st.integers(0, 200), max_size=8),
    finish=st.sampled_from(["stop", "length"]),
)
def test_any_rechunking_of_a_stream_gives_the_same_message_and_a_valid_stream(
    thinking: str | None, text: str, calls: list[dict[str, str]], cuts: list[int], finish: str
):
    import orjson

    def stream(split: bool) -> list[Any]:
        pieces = (lambda s: _split(s, cuts)) if split else (lambda s: [s])
        out: list[Any] = [chunk({"role": "assistant", "content": ""})]
        if thinking:
            out += [chunk({"reasoning_content": p}) for p in pieces(thinking)]
        out += [chunk({"content": p}) for p in pieces(text)]
        for i, call in enumerate(calls):
            arguments = orjson.dumps({"city": call["city"]}).decode()
            parts = pieces(arguments)
            out.append(chunk(call_delta(i, id=f"c{i}", name=call["name"], args=parts[0])))
            out += [chunk(call_delta(i, args=p)) for p in parts[1:]]
        out += [chunk(finish="tool_calls" if calls else finish), usage(), DONE]
        return out

    whole = run(stream(False))
    split = run(stream(True))
    assert check_stream(split) == "message_stop"
    assert collect_message(split) == collect_message(whole)
    message = collect_message(split)
    assert message is not None
    blocks = message["content"]
    assert [b["type"] for b in blocks] == ["thinking"] * bool(thinking) + ["text"] + ["tool_use"] * len(calls)
    assert [b["input"] for b in blocks if b["type"] == "tool_use"] == [{"city": c["city"]} for c in calls]
    assert message["stop_reason"] == ("tool_use" if calls else {"stop": "end_turn", "length": "max_tokens"}[finish])


def test_the_stop_string_a_backend_names_makes_the_stop_reason_stop_sequence():
    named = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop", "stop_reason": "###"}]}
    events = run([chunk({"content": "1, 2"}), named, DONE])
    assert events[-2]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "###"}
    token = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop", "stop_reason": 128009}]}  # vLLM: an EOS token id
    assert run([chunk({"content": "1"}), token, DONE])[-2]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}


def test_a_refusal_is_text_with_the_stop_reason_refusal():
    events = run([chunk({"refusal": "I can't "}), chunk({"refusal": "help."}), chunk(finish="stop"), DONE])
    message = collect_message(events)
    assert message is not None and message["content"] == [{"type": "text", "text": "I can't help."}]
    assert message["stop_reason"] == "refusal"


def test_every_status_has_anthropics_error_type():
    from gateway.errors import anthropic_error_body, anthropic_error_type

    table = {400: "invalid_request_error", 401: "authentication_error", 402: "billing_error", 403: "permission_error",
             404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large", 422: "invalid_request_error",
             429: "rate_limit_error", 500: "api_error", 502: "api_error", 503: "overloaded_error", 504: "timeout_error",
             508: "api_error", 529: "overloaded_error"}
    assert {status: anthropic_error_type(status) for status in table} == table
    assert anthropic_error_body(429, "slow down", "req_1") == {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}, "request_id": "req_1"}


def test_a_tool_call_cut_by_max_tokens_says_max_tokens_not_tool_use():
    events = run([chunk(call_delta(0, id="c1", name="get_weather", args='{"ci')), chunk(finish="length"), DONE])
    assert check_stream(events) == "message_stop"
    assert events[-2]["delta"]["stop_reason"] == "max_tokens"
    s = session({"lookup"})  # nor is a cut call of the gateway's run
    s.feed_batch([chunk(call_delta(0, id="g1", name="lookup", args='{"q')), chunk(finish="length"), DONE])
    assert s.done and s.calls == []
