"""Strict continuations: with `previous_response_id`, a tool output must answer a call the
chain made (400 naming the call id, as OpenAI answers); stateless histories are repaired."""

from __future__ import annotations

from typing import Any

import pytest

from test_websocket import aconnect_ws, turn, ws_url

from gateway.errors import InvalidRequest
from gateway.turn.conversation import Prepared, check_outputs_answer_calls, to_wire


def output(call_id: str, result: str = "42") -> dict[str, str]:
    return {"type": "function_call_output", "call_id": call_id, "output": result}


def call(call_id: str, turn: int = 0) -> dict[str, str]:
    return {"type": "function_call", "call_id": call_id, "name": "lookup", "arguments": f'{{"turn": {turn}}}'}


def continuation(history: list[dict[str, Any]], new: list[dict[str, Any]]) -> Prepared:
    return Prepared(history=to_wire(history), input=to_wire(new), input_records=[])


# A chain from a backend that numbers call ids per response: `call_0` in every turn.
NUMBERED_CHAIN = [
    {"type": "message", "role": "user", "content": "look it up"},
    call("call_0", 0), output("call_0", "result 0"),
    call("call_0", 1), output("call_0", "result 1"),
    call("call_0", 2),
]


def test_an_output_answering_the_latest_of_several_calls_with_one_id_is_accepted():
    check_outputs_answer_calls(continuation(NUMBERED_CHAIN, [output("call_0", "result 2")]))


@pytest.mark.parametrize(
    "new",
    [
        [output("call_0", "result 2"), output("call_0", "result 2")],
        [output("call_0", "result 2"), output("call_0", "another answer to the same call")],
        [output("call_0", "result 2"), {"type": "message", "role": "user", "content": "hm"}, output("call_0", "result 2")],
    ],
    ids=["resent", "second-answer-at-once", "resent-after-a-message"],
)
def test_a_duplicate_output_is_not_refused_since_the_planner_drops_it(new):
    check_outputs_answer_calls(continuation(NUMBERED_CHAIN, new))


def test_an_output_no_call_with_its_id_is_waiting_for_is_refused_though_the_id_was_used_before():
    done = [*NUMBERED_CHAIN, output("call_0", "result 2"), {"type": "message", "role": "assistant", "content": "All done."}]
    with pytest.raises(InvalidRequest) as refused:
        check_outputs_answer_calls(continuation(done, [{"type": "message", "role": "user", "content": "and?"}, output("call_0", "new")]))
    assert refused.value.status == 400 and refused.value.param == "input[1]"


def test_an_orphan_in_the_stored_history_is_not_the_continuations_fault():
    check_outputs_answer_calls(continuation([output("call_gone"), *NUMBERED_CHAIN], [output("call_0", "result 2")]))


async def test_an_output_for_a_call_the_chain_never_made_is_refused(gateway_url, client, backend):
    first = (await client.post(gateway_url + "/v1/responses", json={"model": "parallel-tools", "input": "weather?"})).json()
    assert [i["call_id"] for i in first["output"] if i["type"] == "function_call"] == ["call_a", "call_b"]
    sent = len(backend.requests)
    for stream in (False, True):
        r = await client.post(
            gateway_url + "/v1/responses",
            json={"model": "text", "previous_response_id": first["id"], "input": [output("call_a"), output("call_zzz")], "stream": stream},
        )
        assert r.status_code == 400
        error = r.json()["error"]
        assert error["type"] == "invalid_request_error" and "call_zzz" in error["message"] and error["param"] == "input[1]"
    assert len(backend.requests) == sent  # refused before any backend call
    ok = await client.post(
        gateway_url + "/v1/responses",
        json={"model": "text", "previous_response_id": first["id"], "input": [output("call_a"), output("call_b")]},
    )
    assert ok.status_code == 200 and ok.json()["status"] == "completed"
    # A call made in the same input counts.
    own = {"type": "function_call", "call_id": "call_new", "name": "f", "arguments": "{}"}
    r = await client.post(
        gateway_url + "/v1/responses",
        json={"model": "text", "previous_response_id": first["id"], "input": [own, output("call_new")]},
    )
    assert r.status_code == 200


async def test_a_stateless_history_with_an_orphan_output_is_still_repaired(gateway_url, client, backend):
    r = await client.post(gateway_url + "/v1/responses", json={"model": "text", "input": [output("call_gone")]})
    assert r.status_code == 200
    messages = backend.chat_requests[-1]["messages"]
    assert messages[0]["tool_calls"][0]["id"] == "call_gone" and messages[1]["tool_call_id"] == "call_gone"


async def test_a_failed_websocket_continuation_is_refused_and_evicts_the_cached_response(gateway_url):
    async with aconnect_ws(ws_url(gateway_url)) as ws:
        first = await turn(ws, model="parallel-tools", input="weather?", store=False)
        first_id = first[-1]["response"]["id"]
        refused = await turn(ws, model="text", previous_response_id=first_id, input=[output("call_zzz")], store=False)
        assert refused[-1]["type"] == "error" and "call_zzz" in refused[-1]["error"]["message"]
        again = await turn(ws, model="text", previous_response_id=first_id, input=[output("call_a"), output("call_b")], store=False)
        assert again[-1]["type"] == "error" and again[-1]["error"]["code"] == "previous_response_not_found"
