"""Strict continuations: with `previous_response_id`, a tool output must answer a call the
chain made (400 naming the call id, as OpenAI answers); stateless histories are repaired."""

from __future__ import annotations

from test_websocket import aconnect_ws, turn, ws_url


def output(call_id: str) -> dict[str, str]:
    return {"type": "function_call_output", "call_id": call_id, "output": "42"}


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
