"""The server-side tool loop on /v1/responses, with tools behind the gateway's ToolSource interface.

(The same loop with real MCP servers is in test_mcp_http.py.)
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import openai
import pytest
import trio

import gateway
from conftest import SequentialIds, make_settings, parse_sse
from spec import validate_event


@dataclass(frozen=True)
class Tool:
    server: str
    name: str
    description: str | None
    input_schema: dict[str, Any]


@dataclass(frozen=True)
class Result:
    text: str
    is_error: bool = False


class LocalTools:
    """Tools computed in-process: the loop's contract, without MCP transport."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.slow_started = trio.Event()
        self.slow_cancelled = trio.Event()

    def tools(self) -> list[Tool]:
        schema = {"type": "object", "properties": {}}
        return [Tool("calc", n, f"the {n} tool", schema) for n in ("add", "echo", "slow", "fail")]

    async def call(self, name: str, arguments: dict[str, Any]) -> Result:
        self.calls.append((name, arguments))
        if name == "add":
            return Result(str(arguments["a"] + arguments["b"]))
        if name == "echo":
            return Result(arguments["text"])
        if name == "fail":
            return Result(arguments["message"], is_error=True)
        self.slow_started.set()
        try:
            await trio.sleep(arguments["seconds"])
        except trio.Cancelled:
            self.slow_cancelled.set()
            raise
        return Result("slept")


@pytest.fixture
async def tools_gateway(nursery, backend):
    tools = LocalTools()

    async def start(**overrides: Any) -> str:
        settings = make_settings(backend.url, **overrides)
        app = gateway.create_app(settings, mcp=tools, ids=SequentialIds(), clock=lambda: 1_700_000_000.0)
        return await nursery.start(functools.partial(gateway.serve, settings, app=app))

    return tools, start


def types(frames: list[Any]) -> list[str]:
    return [f["type"] for f in frames if isinstance(f, dict)]


async def test_a_gateway_tool_runs_and_the_model_answers_with_its_result(tools_gateway, client, backend):
    tools, start = tools_gateway
    url = await start()
    r = await client.post(url + "/v1/responses", json={"model": "mcp-add", "input": "2+3?", "stream": True})
    frames = parse_sse(r.content)
    for event in frames[:-1]:
        validate_event(event)
    assert tools.calls == [("add", {"a": 2, "b": 3})]
    seq = types(frames)
    i = seq.index("response.mcp_call_arguments.delta")
    assert seq[i : i + 4] == [
        "response.mcp_call_arguments.delta",
        "response.mcp_call_arguments.done",
        "response.mcp_call.in_progress",
        "response.mcp_call.completed",
    ]
    assert [e["sequence_number"] for e in frames[:-1]] == list(range(len(frames) - 1))
    final = frames[-2]["response"]
    assert [item["type"] for item in final["output"]] == ["message", "mcp_call", "message"]
    call = final["output"][1]
    assert (call["server_label"], call["name"], call["output"], call["status"]) == ("calc", "add", "5", "completed")
    assert final["output"][2]["content"][0]["text"] == "Tool result: 5"
    # Usage is summed over the two backend calls.
    assert final["usage"]["total_tokens"] == 36
    second = backend.chat_requests[-1]["messages"]
    assert second[-2]["tool_calls"][0]["function"]["name"] == "add" and second[-1] == {
        "role": "tool",
        "tool_call_id": second[-2]["tool_calls"][0]["id"],
        "content": "5",
    }


async def test_a_tool_error_goes_back_to_the_model(tools_gateway, client):
    tools, start = tools_gateway
    url = await start()
    final = (await client.post(url + "/v1/responses", json={"model": "mcp-fail", "input": "x"})).json()
    assert final["status"] == "completed"
    assert final["output"][1]["status"] == "failed" and final["output"][1]["error"] == "boom"
    assert final["output"][-1]["content"][0]["text"] == "Tool result: Error: boom"


async def test_mcp_calls_run_and_client_calls_are_returned_in_the_same_turn(tools_gateway, client):
    tools, start = tools_gateway
    url = await start()
    weather = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}
    final = (await client.post(url + "/v1/responses", json={"model": "mcp-mixed", "input": "x", "tools": [weather]})).json()
    assert [i["type"] for i in final["output"]] == ["message", "mcp_call", "function_call"]
    assert final["output"][1]["output"] == "2" and final["output"][2]["name"] == "get_weather"
    assert final["status"] == "completed"


async def test_a_requests_own_tool_of_the_same_name_wins(tools_gateway, client, backend):
    tools, start = tools_gateway
    url = await start()
    own_add = {"type": "function", "name": "add", "parameters": {"type": "object", "properties": {}}}
    final = (await client.post(url + "/v1/responses", json={"model": "mcp-add", "input": "x", "tools": [own_add]})).json()
    assert [i["type"] for i in final["output"]] == ["message", "function_call"]
    assert tools.calls == []
    assert [t["function"]["name"] for t in backend.chat_requests[-1]["tools"]].count("add") == 1


async def test_the_loop_stops_after_max_tool_call_iterations(tools_gateway, client, backend):
    tools, start = tools_gateway
    url = await start(max_tool_call_iterations=3)
    final = (await client.post(url + "/v1/responses", json={"model": "mcp-forever", "input": "x"})).json()
    assert final["status"] == "incomplete" and final["incomplete_details"] == {"reason": "max_tool_calls"}
    assert len(tools.calls) == 3 and len(backend.chat_requests) == 3


async def test_opting_out_hides_the_gateway_tools(tools_gateway, client, backend):
    tools, start = tools_gateway
    url = await start()
    await client.post(url + "/v1/responses", json={"model": "text", "input": "x", "gateway_tools": False})
    assert "tools" not in backend.chat_requests[-1]
    await client.post(url + "/v1/responses", json={"model": "text", "input": "x"}, headers={"x-gateway-tools": "none"})
    assert "tools" not in backend.chat_requests[-1]


async def test_a_client_disconnect_cancels_an_in_flight_tool_call(tools_gateway, backend):
    tools, start = tools_gateway
    url = await start()
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0) as sdk:
        async with await sdk.responses.create(model="mcp-slow", input="x", stream=True) as stream:
            async for event in stream:
                if event.type == "response.mcp_call.in_progress":
                    break
        with trio.fail_after(5):
            await tools.slow_started.wait()
    left_at = trio.current_time()
    with trio.fail_after(1):
        await tools.slow_cancelled.wait()
    print(f"disconnect -> tool call cancelled: {(trio.current_time() - left_at) * 1000:.1f} ms")


async def test_a_calls_in_progress_event_reaches_the_client_once_the_call_has_begun(tools_gateway, backend):
    # The round's last events (the arguments done, `mcp_call.in_progress`) wait for the calls to
    # begin: a client that reads them and leaves leaves a call that runs, and cancels it.
    tools, start = tools_gateway
    url = await start()
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0) as sdk:
        async with await sdk.responses.create(model="mcp-slow", input="x", stream=True) as stream:
            seen = []
            async for event in stream:
                seen.append(event.type)
                if event.type == "response.mcp_call.in_progress":
                    assert tools.slow_started.is_set()  # no wait: begun before the event left
                    break
    assert seen[-2:] == ["response.mcp_call_arguments.done", "response.mcp_call.in_progress"]
    with trio.fail_after(5):
        await tools.slow_cancelled.wait()


async def test_a_conversation_continues_after_a_tool_round(tools_gateway, client, backend):
    tools, start = tools_gateway
    url = await start()
    first = (await client.post(url + "/v1/responses", json={"model": "mcp-add", "input": "2+3?"})).json()
    await client.post(url + "/v1/responses", json={"model": "text", "input": "thanks", "previous_response_id": first["id"]})
    roles = [(m["role"], bool(m.get("tool_calls"))) for m in backend.chat_requests[-1]["messages"]]
    assert roles == [("user", False), ("assistant", True), ("tool", False), ("assistant", False), ("user", False)]


async def test_required_applies_to_the_gateways_tools_and_is_lifted_after_the_forced_call(tools_gateway, client, backend):
    tools, start = tools_gateway
    url = await start()
    final = (await client.post(url + "/v1/responses", json={"model": "mcp-add", "input": "2+3?", "tool_choice": "required"})).json()
    assert final["status"] == "completed" and final["output"][-1]["content"][0]["text"] == "Tool result: 5"
    first, second = backend.chat_requests[-2:]
    assert first["tool_choice"] == "required"  # only the gateway's tools to choose from: one must be called
    assert second["tool_choice"] == "auto"  # forcing again would loop until the round limit


async def test_a_streamed_request_opts_out_by_header_too(tools_gateway, client, backend):
    # Streamed requests take the hot route beside Quart: it reads the header itself.
    tools, start = tools_gateway
    url = await start()
    await client.post(url + "/v1/responses", json={"model": "text", "input": "x", "stream": True})
    assert "tools" in backend.chat_requests[-1]
    await client.post(
        url + "/v1/responses", json={"model": "text", "input": "x", "stream": True}, headers={"x-gateway-tools": "none"}
    )
    assert "tools" not in backend.chat_requests[-1]


async def test_a_turn_begun_before_it_runs_sends_the_request_its_round_would_and_runs_the_loop(
    tools_gateway, client, backend, begun
):
    # On a kept-alive backend connection a turn's first request is sent before anything else
    # (`Turn.begin`; a stream begins it before it sets up): the same request its round would
    # send, the gateway's tools in it, whatever the transport.
    tools, start = tools_gateway
    url = await start()
    ask = {"model": "mcp-add", "input": "2+3?"}
    answers = []
    for extra in ({"stream": True}, {"stream": True}, {}, {"background": True}):
        r = await client.post(url + "/v1/responses", json={**ask, **extra})
        if extra.get("stream"):
            frames = parse_sse(r.content)
            assert [e["sequence_number"] for e in frames[:-1]] == list(range(len(frames) - 1))
            answers.append(frames[-2]["response"])
        elif extra.get("background"):
            response_id = r.json()["id"]
            frames = parse_sse((await client.get(f"{url}/v1/responses/{response_id}", params={"stream": "true"})).content)
            answers.append(frames[-2]["response"])
        else:
            answers.append(r.json())
    assert begun == [False, True, True, True]  # streamed, streamed, JSON, background
    for answer in answers:
        assert [item["type"] for item in answer["output"]] == ["message", "mcp_call", "message"]
        assert answer["output"][2]["content"][0]["text"] == "Tool result: 5"
    firsts = backend.chat_requests[::2]
    assert len(firsts) == 4 and all(first == firsts[0] for first in firsts)
    assert "add" in [t["function"]["name"] for t in firsts[0]["tools"]]
    assert tools.calls == [("add", {"a": 2, "b": 3})] * 4
