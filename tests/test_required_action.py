"""The opt-in tool-call protocol of the seeds' Go gateway (TOOL_CALL_PROTOCOL=required_action):
`response.required_action` before the terminal event, and POST /v1/responses/{id}/submit_tool_outputs."""

from __future__ import annotations

from conftest import parse_sse
from spec import validate_event

TOOLS = [
    {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
    {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}},
]


async def test_standard_mode_emits_only_the_specs_events_and_has_no_submit_endpoint(gateway_url, client):
    r = await client.post(gateway_url + "/v1/responses", json={"model": "parallel-tools", "input": "x", "tools": TOOLS, "stream": True})
    frames = parse_sse(r.content)
    for frame in frames[:-1]:
        validate_event(frame)
    assert "response.required_action" not in [f["type"] for f in frames[:-1]]
    assert "required_action" not in frames[-2]["response"]
    made = frames[-2]["response"]["id"]
    refused = await client.post(f"{gateway_url}/v1/responses/{made}/submit_tool_outputs", json={"tool_outputs": []})
    assert refused.status_code == 404


async def test_required_action_comes_just_before_the_terminal_event_and_outputs_continue_the_response(start_gateway, client, backend):
    url = await start_gateway(tool_call_protocol="required_action")
    r = await client.post(url + "/v1/responses", json={"model": "parallel-tools", "input": "weather?", "tools": TOOLS, "stream": True})
    frames = parse_sse(r.content)
    events = frames[:-1]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events[-2:]] == ["response.required_action", "response.completed"]
    action = events[-2]["required_action"]
    assert action == {
        "type": "submit_tool_outputs",
        "submit_tool_outputs": {
            "tool_calls": [
                {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
                {"id": "call_b", "type": "function", "function": {"name": "get_time", "arguments": '{"tz": "CET"}'}},
            ]
        },
    }
    final = events[-1]["response"]
    assert events[-2]["response"]["id"] == final["id"] and final["required_action"] == action
    for event in events[:-2]:
        validate_event(event)

    # The outputs continue it: same model and tools, the outputs as tool messages.
    outputs = {"tool_outputs": [{"tool_call_id": "call_a", "output": "18C"}, {"tool_call_id": "call_b", "output": "09:00"}]}
    answer = await client.post(f"{url}/v1/responses/{final['id']}/submit_tool_outputs", json=outputs)
    assert answer.status_code == 200, answer.text
    continued = answer.json()
    assert continued["status"] == "completed" and continued["previous_response_id"] == final["id"]
    assert continued["model"] == "parallel-tools" and "required_action" in continued  # the scripted model calls again
    sent = backend.chat_requests[-1]
    assert [m["tool_call_id"] for m in sent["messages"] if m["role"] == "tool"] == ["call_a", "call_b"]
    assert {t["function"]["name"] for t in sent["tools"]} == {"get_weather", "get_time"}

    streamed = await client.post(f"{url}/v1/responses/{final['id']}/submit_tool_outputs", json={**outputs, "stream": True})
    assert parse_sse(streamed.content)[-2]["type"] == "response.completed"

    unknown = await client.post(f"{url}/v1/responses/{final['id']}/submit_tool_outputs", json={"tool_outputs": [{"tool_call_id": "call_x", "output": "1"}]})
    assert unknown.status_code == 400 and "call_x" in unknown.json()["error"]["message"]
    missing = await client.post(f"{url}/v1/responses/resp_nope/submit_tool_outputs", json=outputs)
    assert missing.status_code == 404
    bad = await client.post(f"{url}/v1/responses/{final['id']}/submit_tool_outputs", json={"tool_outputs": [{"output": "1"}]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tool_outputs[0].tool_call_id"


async def test_a_text_answer_has_no_required_action_in_that_mode(start_gateway, client):
    url = await start_gateway(tool_call_protocol="required_action")
    frames = parse_sse((await client.post(url + "/v1/responses", json={"model": "text", "input": "hi", "stream": True})).content)
    assert "response.required_action" not in [f["type"] for f in frames[:-1]]
    assert "required_action" not in frames[-2]["response"]


async def test_a_quiet_stream_gets_numbered_ping_events_in_that_mode(start_gateway, client, backend):
    url = await start_gateway(tool_call_protocol="required_action", heartbeat_interval=0.2)
    raw = b""
    async with client.stream("POST", url + "/v1/responses", json={"model": "slow-first-token", "input": "hi", "stream": True}) as r:
        chunks = r.aiter_bytes()  # kept: a dropped iterator would close the stream
        async for data in chunks:
            raw += data
            if raw.count(b"event: ping") >= 2:
                break
        backend.release.set()
        async for data in chunks:
            raw += data
    frames = parse_sse(raw)
    events = frames[:-1]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))  # pings take their place in order
    pings = [e for e in events if e["type"] == "ping"]
    assert len(pings) >= 2 and events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"
    assert b": keep-alive" not in raw
    replay = parse_sse((await client.get(f"{url}/v1/responses/{events[-1]['response']['id']}?stream=true")).content)
    assert [e["type"] for e in replay[:-1]] == [e["type"] for e in events]  # kept in the record too


async def test_standard_mode_keeps_alive_with_comments(start_gateway, client, backend):
    url = await start_gateway(heartbeat_interval=0.2)
    raw = b""
    async with client.stream("POST", url + "/v1/responses", json={"model": "slow-first-token", "input": "hi", "stream": True}) as r:
        chunks = r.aiter_bytes()
        async for data in chunks:
            raw += data
            if b": keep-alive" in raw:
                break
        backend.release.set()
        async for data in chunks:
            raw += data
    assert b"event: ping" not in raw and parse_sse(raw)[-2]["type"] == "response.completed"
