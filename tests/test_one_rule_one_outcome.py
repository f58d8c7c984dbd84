"""Where one decision used to live twice: one tool-offering rule, one outcome, one renderer.

- Responses and chat completions offer the gateway's tools by the same rule:
  a forced client function offers only that function, `tool_choice: "none"`
  offers none, `allowed_tools` restricts to its list.
- Every response ends as one outcome (one log line, the same metrics): its
  final status (`cancelled`, `client_left` ...), the HTTP status actually
  sent, and the backend that answered (name and URL), on every transport
  and for chat completions relayed as bytes too.
- A chat stream ends with an error chunk and `[DONE]` whatever fails.
- WebSocket `response.create` frames as Codex and the Agents SDKs send them
  (`stream`, `stream_options`) are answered; `background` is refused.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

import orjson
import pytest
import trio

import gateway
from conftest import SequentialIds, make_settings
from test_metrics import scrape, value
from test_tool_loop import LocalTools
from test_websocket import aconnect_ws, ws_url

ADD_OWN = {"type": "function", "name": "zzz", "parameters": {"type": "object", "properties": {}}}
CHAT_OWN = {"type": "function", "function": {"name": "zzz", "parameters": {"type": "object", "properties": {}}}}


@pytest.fixture
async def with_tools(nursery, backend):
    tools = LocalTools()
    settings = make_settings(backend.url)
    app = gateway.create_app(settings, mcp=tools, ids=SequentialIds())
    return await nursery.start(functools.partial(gateway.serve, settings, app=app)), tools


def offered(request: dict[str, Any]) -> list[str]:
    return sorted(t["function"]["name"] for t in request.get("tools") or ())


@pytest.mark.parametrize(
    "responses_choice,chat_choice,expected",
    [
        ({"type": "function", "name": "zzz"}, {"type": "function", "function": {"name": "zzz"}}, ["zzz"]),
        ("none", "none", ["zzz"]),  # the tools are listed, none may be called: the backend is told so
        ("auto", "auto", ["add", "echo", "fail", "slow", "zzz"]),
        ("required", "required", ["add", "echo", "fail", "slow", "zzz"]),
    ],
    ids=["forced", "none", "auto", "required"],
)
async def test_responses_and_chat_completions_offer_the_gateways_tools_by_one_rule(
    with_tools, client, backend, responses_choice, chat_choice, expected
):
    url, _ = with_tools
    await client.post(url + "/v1/responses", json={"model": "text", "input": "x", "tools": [ADD_OWN], "tool_choice": responses_choice})
    via_responses = backend.chat_requests[-1]
    chat = {"model": "text", "messages": [{"role": "user", "content": "x"}], "tools": [CHAT_OWN], "tool_choice": chat_choice}
    await client.post(url + "/v1/chat/completions", json=chat)
    via_chat = backend.chat_requests[-1]
    assert offered(via_responses) == offered(via_chat) == expected
    assert via_responses.get("tool_choice") == via_chat.get("tool_choice")


async def test_allowed_tools_restricts_what_is_offered_and_adds_no_gateway_tool(with_tools, client, backend):
    url, _ = with_tools
    other = {"type": "function", "name": "other", "parameters": {"type": "object", "properties": {}}}
    choice = {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "zzz"}]}
    await client.post(url + "/v1/responses", json={"model": "text", "input": "x", "tools": [ADD_OWN, other], "tool_choice": choice})
    assert offered(backend.chat_requests[-1]) == ["zzz"]
    chat_choice = {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [{"type": "function", "function": {"name": "zzz"}}]}}
    chat = {"model": "text", "messages": [{"role": "user", "content": "x"}], "tools": [CHAT_OWN], "tool_choice": chat_choice}
    await client.post(url + "/v1/chat/completions", json=chat)
    assert offered(backend.chat_requests[-1]) == ["zzz"]  # the client's own list, no gateway tool added


# --- one outcome ------------------------------------------------------------------------------------


def outcome_lines(caplog: Any) -> list[dict[str, Any]]:
    return [r.fields for r in caplog.records if r.name == "gateway" and hasattr(r, "fields")]


async def test_every_kind_of_response_logs_one_line_with_its_status_http_status_and_backend(with_tools, client, backend, caplog):
    caplog.set_level(logging.INFO, logger="gateway")
    url, _ = with_tools
    chat = {"model": "text", "messages": [{"role": "user", "content": "x"}]}
    await client.post(url + "/v1/responses", json={"model": "text", "input": "x"})
    await client.post(url + "/v1/chat/completions", json={**chat, "gateway_tools": False})  # relayed as bytes
    await client.post(url + "/v1/chat/completions", json={**chat, "gateway_tools": False, "stream": True})
    await client.post(url + "/v1/chat/completions", json={**chat, "stream": True})  # with the gateway's tools
    failed = await client.post(url + "/v1/chat/completions", json={**chat, "model": "http-500"})
    await client.post(url + "/v1/responses/compact", json={"model": "text", "input": "x"})
    assert failed.status_code == 502
    lines = outcome_lines(caplog)
    seen = [(line["transport"], line["status"], line["http_status"]) for line in lines]
    assert seen == [
        ("json", "completed", 200),
        ("chat-relay", "completed", 200),
        ("chat-relay", "completed", 200),
        ("chat-sse", "completed", 200),
        ("chat-json", "failed", 502),  # the status the client got, not 200
        ("compact", "completed", 200),
    ]
    answered = [line for line in lines if line["status"] == "completed"]
    assert {line["backend"] for line in answered} == {f"default@{backend.url}/v1"}
    assert all(line["output_tokens"] == 7 for line in answered)
    page = await scrape(client, url)
    for transport in ("chat-relay", "chat-sse", "json", "compact"):
        assert value(page, "gateway_responses_total", model="text", status="completed", key="anonymous", transport=transport) >= 1


async def test_a_cancelled_background_response_is_counted_and_logged_as_cancelled(with_tools, client, backend, caplog):
    caplog.set_level(logging.INFO, logger="gateway")
    url, _ = with_tools
    made = (await client.post(url + "/v1/responses", json={"model": "hang", "input": "x", "background": True})).json()
    with trio.fail_after(5):
        await backend.stream_started.wait()
    await client.post(f"{url}/v1/responses/{made['id']}/cancel")
    (line,) = [line for line in outcome_lines(caplog) if line["response_id"] == made["id"]]
    assert line["status"] == "cancelled" and line["transport"] == "background"
    page = await scrape(client, url)
    assert value(page, "gateway_responses_total", model="hang", status="cancelled", key="anonymous", transport="background") == 1


@pytest.mark.parametrize("path,body", [
    ("/v1/responses", {"model": "hang", "input": "x"}),
    ("/v1/chat/completions", {"model": "hang", "messages": [{"role": "user", "content": "x"}], "stream": True}),
], ids=["JSON response", "streamed chat"])
async def test_a_client_that_leaves_is_logged_as_client_left(with_tools, backend, caplog, path, body):
    import httpx2

    caplog.set_level(logging.INFO, logger="gateway")
    url, _ = with_tools
    async with httpx2.AsyncClient(timeout=10) as http, trio.open_nursery() as nursery:
        nursery.start_soon(functools.partial(http.post, url + path, json=body))
        with trio.fail_after(5):
            await backend.stream_started.wait()
        nursery.cancel_scope.cancel()  # the client hangs up
    with trio.fail_after(5):
        await backend.client_left.wait()
        while not outcome_lines(caplog):
            await trio.sleep(0.01)  # the line is written as the turn unwinds
    (line,) = outcome_lines(caplog)
    assert line["status"] == "client_left" and line["client_left"] is True


class ExplodingBackend:
    """A backend whose stream fails with an exception no adapter maps (a bug somewhere below)."""

    @contextlib.asynccontextmanager
    async def open_chat_stream(
        self, body: dict[str, Any], *, headers: Mapping[str, str] | None = None, native: Any = None
    ) -> AsyncIterator[Any]:
        yield self

    def __aiter__(self) -> Any:
        return self

    async def __anext__(self) -> Any:
        raise RuntimeError("a bug")

    saw_done = False


async def test_an_unexpected_failure_ends_a_chat_stream_with_an_error_chunk_and_done(nursery, client):
    settings = make_settings("http://127.0.0.1:9")
    app = gateway.create_app(settings, backend=ExplodingBackend(), mcp=LocalTools(), ids=SequentialIds())  # type: ignore[arg-type]
    url = await nursery.start(functools.partial(gateway.serve, settings, app=app))
    r = await client.post(url + "/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True})
    frames = [frame[6:] for frame in r.content.split(b"\n\n") if frame.startswith(b"data: ")]
    assert frames[-1] == b"[DONE]"
    error = orjson.loads(frames[-2])["error"]
    assert error["code"] == "internal_error" and "bug" not in error["message"]  # no library text reaches the client


# --- WebSocket frames as real clients send them ------------------------------------------------------


CLIENT_FRAMES = {
    # Codex CLI: the whole request, `stream: true` included, `store: false`.
    "codex": {
        "type": "response.create", "model": "text", "instructions": "You are Codex.", "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
        ], "tools": [], "tool_choice": "auto", "parallel_tool_calls": False, "reasoning": None, "store": False,
        "stream": True, "include": [], "prompt_cache_key": "0195-abc",
    },
    # OpenAI Agents SDK (Python, responses_websocket_session): the create params, `stream: true`.
    "agents-python": {"type": "response.create", "model": "text", "input": "hi", "stream": True, "tools": [], "metadata": {}},
    # OpenAI Agents SDK (JavaScript, OpenAIResponsesWSModel): `stream` and `stream_options`.
    "agents-js": {
        "type": "response.create", "model": "text", "input": [{"role": "user", "content": "hi"}], "stream": True,
        "stream_options": {"include_obfuscation": False}, "store": True,
    },
}


@pytest.mark.parametrize("client_name", list(CLIENT_FRAMES))
async def test_websocket_frames_as_real_clients_send_them_are_answered(gateway_url, client_name):
    async with aconnect_ws(ws_url(gateway_url)) as ws:
        await ws.send_text(orjson.dumps(CLIENT_FRAMES[client_name]).decode())
        events = []
        with trio.fail_after(10):
            while not events or events[-1]["type"] not in ("response.completed", "response.failed", "error"):
                events.append(orjson.loads(await ws.receive_text()))
        assert events[-1]["type"] == "response.completed", events[-1]
        await ws.send_text(orjson.dumps({**CLIENT_FRAMES[client_name], "background": True}).decode())
        with trio.fail_after(5):
            refused = orjson.loads(await ws.receive_text())
    assert refused["type"] == "error" and refused["status"] == 400
    assert refused["error"]["param"] == "background" and refused["error"]["code"] == "invalid_request"


async def test_a_refusal_over_websocket_keeps_its_type_as_over_http(nursery, backend):
    from gateway.keys import ApiKey, KeyLimits, digest
    from gateway.keys.stores import MemoryKeys

    keys = MemoryKeys()
    secret = "sk-test-ws-tokens-0123456789"
    await keys.put(ApiKey(name="t", id="key_t", digest=digest(secret), created_at=0.0, limits=KeyLimits(tpm=0)))
    settings = make_settings(backend.url)
    app = gateway.create_app(settings, keys=keys, ids=SequentialIds())
    url = await nursery.start(functools.partial(gateway.serve, settings, app=app))
    async with aconnect_ws(ws_url(url), headers={"authorization": f"Bearer {secret}"}) as ws:
        await ws.send_text(orjson.dumps({"type": "response.create", "model": "text", "input": "hi"}).decode())
        with trio.fail_after(5):
            refused = orjson.loads(await ws.receive_text())
    assert refused["status"] == 429 and refused["error"]["type"] == "tokens"


async def test_a_background_response_asked_for_once_background_work_has_stopped_is_a_503():
    from gateway.errors import ShuttingDown
    from gateway.turn.sealing import Sealer
    from gateway.store import MemoryStore
    from gateway.transport.background import BackgroundRunner
    from gateway.turn import Resources, prepare_turn
    from gateway.wire import parse_create_request

    store = MemoryStore()
    resources = Resources(
        settings=make_settings("http://127.0.0.1:9"), backend=ExplodingBackend(), store=store, mcp=None,  # type: ignore[arg-type]
        sealer=Sealer("test"), clock=lambda: 0.0, ids=SequentialIds(),
    )
    turn = await prepare_turn(resources, parse_create_request(b'{"model":"m","input":"hi","background":true}'), transport="background")
    with pytest.raises(ShuttingDown) as refused:
        await BackgroundRunner(store).start(turn)  # its nursery is gone (or not yet there): shutting down
    assert refused.value.status == 503 and refused.value.code == "server_shutting_down"


@pytest.mark.parametrize("extra", [{}, {"stream": True}, {"background": True}, {"background": True, "stream": True}],
                         ids=["json", "stream", "background", "background stream"])
async def test_every_responses_body_is_decoded_and_validated_once(gateway_url, client, monkeypatch, extra):
    import gateway.wire.requests

    decoded: list[bytes] = []
    original = gateway.wire.requests.decode_json_object

    def counting(body: bytes) -> Any:
        decoded.append(body)
        return original(body)

    monkeypatch.setattr(gateway.wire.requests, "decode_json_object", counting)
    r = await client.post(gateway_url + "/v1/responses", json={"model": "text", "input": "hi", **extra})
    assert r.status_code == 200
    assert len(decoded) == 1
