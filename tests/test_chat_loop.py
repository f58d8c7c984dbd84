"""/v1/chat/completions with the gateway's tools: the loop, streamed and not."""

from __future__ import annotations

import httpx2
import orjson
import trio


from test_tool_loop import tools_gateway  # noqa: F401  (fixture)

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}


def chunks(raw: bytes) -> list[dict]:
    out = []
    for frame in raw.split(b"\n\n"):
        if frame.startswith(b"data: ") and frame != b"data: [DONE]":
            out.append(orjson.loads(frame[6:]))
    return out


async def test_non_streaming_runs_the_tools_and_returns_the_answer(tools_gateway, client):  # noqa: F811
    tools, start = tools_gateway
    url = await start()
    r = await client.post(url + "/v1/chat/completions", json={"model": "mcp-add", "messages": [{"role": "user", "content": "2+3"}]})
    body = r.json()
    assert r.status_code == 200 and body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["content"].endswith("Tool result: 5")
    assert body["choices"][0]["finish_reason"] == "stop" and "tool_calls" not in body["choices"][0]["message"]
    assert body["usage"]["total_tokens"] == 36 and tools.calls == [("add", {"a": 2, "b": 3})]


async def test_streaming_streams_the_answer_once_and_hides_the_gateways_calls(tools_gateway, client):  # noqa: F811
    tools, start = tools_gateway
    url = await start()
    r = await client.post(
        url + "/v1/chat/completions", json={"model": "mcp-add", "stream": True, "messages": [{"role": "user", "content": "x"}]}
    )
    assert r.content.endswith(b"data: [DONE]\n\n")
    got = chunks(r.content)
    text = "".join((c["choices"][0]["delta"].get("content") or "") for c in got if c.get("choices"))
    assert text == "Let me use a tool.Tool result: 5"
    assert not any(c["choices"] and c["choices"][0]["delta"].get("tool_calls") for c in got if c.get("choices"))
    finishes = [c["choices"][0]["finish_reason"] for c in got if c.get("choices") and c["choices"][0]["finish_reason"]]
    assert finishes == ["stop"]
    assert got[-1]["usage"]["total_tokens"] == 36


async def test_the_clients_own_tools_are_returned_to_it(tools_gateway, client):  # noqa: F811
    tools, start = tools_gateway
    url = await start()
    body = {"model": "mcp-mixed", "messages": [{"role": "user", "content": "x"}], "tools": [WEATHER]}
    plain = (await client.post(url + "/v1/chat/completions", json=body)).json()
    message = plain["choices"][0]["message"]
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather"]
    assert plain["choices"][0]["finish_reason"] == "tool_calls" and tools.calls == [("add", {"a": 1, "b": 1})]
    streamed = chunks((await client.post(url + "/v1/chat/completions", json={**body, "stream": True})).content)
    calls = [c for s in streamed if s.get("choices") for c in s["choices"][0]["delta"].get("tool_calls") or []]
    assert calls[0]["index"] == 0 and calls[0]["function"]["name"] == "get_weather"


async def test_without_gateway_tools_the_request_is_passed_through(tools_gateway, client, backend):  # noqa: F811
    tools, start = tools_gateway
    url = await start()
    r = await client.post(
        url + "/v1/chat/completions",
        json={"model": "text", "stream": True, "messages": [{"role": "user", "content": "x"}], "gateway_tools": False},
    )
    assert b'"Hello"' in r.content and "tools" not in backend.chat_requests[-1]
    assert "gateway_tools" not in backend.chat_requests[-1]


async def test_keep_alive_comments_flow_while_a_tool_runs_and_leaving_cancels_it(tools_gateway):  # noqa: F811
    tools, start = tools_gateway
    url = await start(heartbeat_interval=0.05)
    raw = b""
    async with httpx2.AsyncClient(timeout=10) as http:
        with trio.fail_after(10):
            async with http.stream(
                "POST", url + "/v1/chat/completions", json={"model": "mcp-slow", "stream": True, "messages": [{"role": "user", "content": "x"}]}
            ) as r:
                async for data in r.aiter_raw():
                    raw += data
                    if tools.slow_started.is_set() and raw.count(b": keep-alive") >= 2:
                        break
    assert b"Let me use a tool." in raw
    with trio.fail_after(1):
        await tools.slow_cancelled.wait()


async def test_bad_chat_requests_get_openai_errors(tools_gateway, client):  # noqa: F811
    tools, start = tools_gateway
    url = await start()
    r = await client.post(url + "/v1/chat/completions", content=b"{nope", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = await client.post(url + "/v1/chat/completions", json={"model": "x"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"


async def test_a_chat_turn_begun_before_it_runs_sends_what_its_round_would(tools_gateway, client, backend, begun):  # noqa: F811
    tools, start = tools_gateway
    url = await start()
    body = {"model": "mcp-add", "messages": [{"role": "user", "content": "2+3"}]}
    for extra in ({"stream": True}, {"stream": True}, {}):
        r = await client.post(url + "/v1/chat/completions", json={**body, **extra})
        if extra:
            text = "".join((c["choices"][0]["delta"].get("content") or "") for c in chunks(r.content) if c.get("choices"))
            assert text.endswith("Tool result: 5") and r.content.endswith(b"data: [DONE]\n\n")
        else:
            assert r.json()["choices"][0]["message"]["content"].endswith("Tool result: 5")
    assert begun == [False, True, True]  # streamed (sent by its round), streamed, JSON
    firsts = backend.chat_requests[::2]
    assert len(firsts) == 3 and all(first == firsts[0] for first in firsts)
    assert "add" in [t["function"]["name"] for t in firsts[0]["tools"]]
