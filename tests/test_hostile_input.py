"""What an attacker or a broken backend sends, over real sockets: refused cleanly, never a crash.

Each test names the finding it covers: deeply nested JSON, paths that try
to leave `/v1`, chunks the Chat Completions protocol does not allow, and
backends that send bytes but never data.
"""

from __future__ import annotations

import json
from typing import Any

import h11
import httpx2
import orjson
import pytest
import trio

from conftest import parse_sse
from test_http_responses import check_stream, stream
from test_tool_loop import tools_gateway  # noqa: F401  (fixture)
from test_websocket import aconnect_ws, turn, ws_url


def nested_schema(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def deep_tool_request(levels: int = 300, **extra: Any) -> dict[str, Any]:
    tool = {"type": "function", "name": "f", "parameters": nested_schema(levels)}
    return {"model": "text", "input": "hi", "tools": [tool], **extra}


# --- deeply nested JSON -------------------------------------------------------------


async def test_the_crash_request_is_refused_before_anything_starts_and_the_gateway_keeps_answering(gateway_url, client):
    # 300 levels in tools[0].parameters once took the whole process down.
    for attempt in range(20):
        status, body = await stream(client, gateway_url, deep_tool_request())
        assert status == 400, attempt
        assert body["error"]["code"] == "nesting_too_deep"
        assert body["error"]["param"] == "tools[0].parameters.properties"
        health = await client.get(gateway_url + "/health")
        assert health.status_code == 200


@pytest.mark.parametrize(
    ("field", "param"),
    [
        ({"text": {"format": {"type": "json_schema", "name": "s", "schema": nested_schema(300)}}}, "text.format.schema"),
        ({"metadata": {"k": nested_schema(80)}}, "metadata.k.properties.a"),
        ({"input": [{"role": "user", "content": [{"type": "input_text", "text": "x", "extra": nested_schema(80)}]}]}, "input[0].content[0]"),
    ],
)
async def test_json_nested_too_deeply_anywhere_is_a_400_naming_the_field(gateway_url, client, field, param):
    r = await client.post(gateway_url + "/v1/responses", json={"model": "text", "input": "hi", **field})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["code"] == "nesting_too_deep" and error["param"].startswith(param)


async def test_a_tool_schema_nested_within_the_limit_is_served(gateway_url, client):
    status, frames = await stream(client, gateway_url, deep_tool_request(levels=25))
    assert status == 200
    assert check_stream(frames)["status"] == "completed"


async def test_chat_completions_refuse_deep_json_too(gateway_url, client):
    body = {"model": "text", "messages": [{"role": "user", "content": "hi"}], "tools": deep_tool_request()["tools"]}
    r = await client.post(gateway_url + "/v1/chat/completions", json=body)
    assert r.status_code == 400 and r.json()["error"]["code"] == "nesting_too_deep"


async def test_a_deep_websocket_message_gets_an_error_event_and_the_socket_stays_usable(gateway_url):
    async with aconnect_ws(ws_url(gateway_url)) as ws:
        # orjson cannot even write this message; the standard library can.
        await ws.send_text(json.dumps({"type": "response.create", **deep_tool_request()}))
        with trio.fail_after(10):
            error = orjson.loads(await ws.receive_text())
        assert error["type"] == "error" and error["status"] == 400
        assert error["error"]["code"] == "nesting_too_deep"
        events = await turn(ws, model="text", input="hi")
        assert events[-1]["type"] == "response.completed"


# --- chunks the protocol does not allow --------------------------------------------------


@pytest.mark.parametrize(
    ("model", "named"),
    [
        ("garbage-choices", "'choices' must be a list"),
        ("garbage-content", "'delta.content' must be a string, not a number"),
        ("garbage-tool-calls", "'delta.tool_calls[].function' must be an object"),
        ("garbage-not-object", "a chunk must be a JSON object, not a list"),
    ],
)
async def test_garbage_from_the_backend_fails_the_response_naming_what_was_wrong(gateway_url, client, model, named):
    status, frames = await stream(client, gateway_url, {"model": model, "input": "hi"})
    assert status == 200
    final = check_stream(frames)
    assert final["status"] == "failed"
    assert final["error"]["code"] == "backend_error" and named in final["error"]["message"]
    error = [f for f in frames if isinstance(f, dict) and f["type"] == "error"][0]
    assert error["code"] == "backend_error"
    # Without streaming it is a 502 with the same code, never an empty "completed".
    r = await client.post(gateway_url + "/v1/responses", json={"model": model, "input": "hi"})
    assert r.status_code == 502 and r.json()["error"]["code"] == "backend_error"
    assert named in r.json()["error"]["message"]


async def test_garbage_in_a_chat_completions_tool_loop_is_an_error_not_an_empty_answer(tools_gateway, client):  # noqa: F811
    _tools, start = tools_gateway
    url = await start()
    body = {"model": "garbage-content", "messages": [{"role": "user", "content": "hi"}]}
    r = await client.post(url + "/v1/chat/completions", json=body)
    assert r.status_code == 502 and r.json()["error"]["code"] == "backend_error"
    r = await client.post(url + "/v1/chat/completions", json={**body, "stream": True})
    error = orjson.loads(r.content.split(b"\n\n")[0].removeprefix(b"data: "))["error"]
    assert error["code"] == "backend_error" and "'delta.content'" in error["message"]
    assert r.content.endswith(b"data: [DONE]\n\n")


# --- bytes that are not data ---------------------------------------------------------------


@pytest.mark.parametrize("model", ["comments-forever", "trickle"])
async def test_a_backend_that_sends_bytes_but_no_data_times_out(start_gateway, client, model):
    url = await start_gateway(stream_timeout=1.0)
    started = trio.current_time()
    status, frames = await stream(client, url, {"model": model, "input": "hi"})
    assert status == 200
    final = check_stream(frames)
    assert final["status"] == "failed" and final["error"]["code"] == "backend_timeout"
    assert trio.current_time() - started < 10  # bounded by fail_after in `stream` too; here: it did not run on
    r = await client.post(url + "/v1/responses", json={"model": model, "input": "hi"})
    assert r.status_code == 504 and r.json()["error"]["code"] == "backend_timeout"


# --- the passthrough stays under /v1 ------------------------------------------------------------


async def raw_get(url: str, target: bytes) -> tuple[int, bytes]:
    """One GET with `target` exactly as given (clients normalise paths; attackers do not)."""
    host, port = url.removeprefix("http://").split(":")
    conn = h11.Connection(h11.CLIENT)
    with trio.fail_after(10):
        stream_ = await trio.open_tcp_stream(host, int(port))
        async with stream_:
            await stream_.send_all(
                conn.send(h11.Request(method="GET", target=target, headers=[("host", "gateway")]))
                + conn.send(h11.EndOfMessage())
            )
            status, body = 0, b""
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    conn.receive_data(await stream_.receive_some())
                elif isinstance(event, h11.Response):
                    status = event.status_code
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                    return status, body


@pytest.mark.parametrize(
    "target",
    [b"/v1/../admin", b"/v1/%2e%2e/admin", b"/v1/%2E%2E/%2e%2e/admin", b"/v1/models/../../admin", b"/v1/./../admin"],
)
async def test_paths_that_leave_v1_are_refused_and_never_reach_the_backend(gateway_url, backend, target):
    status, body = await raw_get(gateway_url, target)
    assert status == 400
    assert orjson.loads(body)["error"]["code"] == "invalid_path"
    assert all(r.path.startswith("/v1/") for r in backend.requests)


@pytest.mark.parametrize("target", [b"/v1/models%00", b"/v1/mod%1Bels", b"/v1/models%7F"])
async def test_control_characters_in_a_path_are_a_400(gateway_url, backend, target):
    status, body = await raw_get(gateway_url, target)
    assert status == 400
    assert orjson.loads(body)["error"]["code"] == "invalid_path"
    assert backend.requests == []


async def test_dot_segments_inside_v1_are_resolved_before_forwarding(gateway_url, backend):
    status, body = await raw_get(gateway_url, b"/v1/embeddings/../models/./")
    assert status == 200 and orjson.loads(body)["data"][0]["id"] == "text"
    assert backend.requests[-1].path == "/v1/models"
    status, _ = await raw_get(gateway_url, b"/v1/a%2Fb")
    assert backend.requests[-1].path == "/v1/a/b" and status == 404


async def test_httpx_clients_normalising_the_path_still_reach_only_v1(gateway_url, backend, client):
    r = await client.get(gateway_url + "/v1/models")
    assert r.status_code == 200
    assert [r.path for r in backend.requests] == ["/v1/models"]


# --- the backend key never reaches a client ----------------------------------------------------

SECRET = "sk-test-4f1b9c2e7d8a6b5c3e0f"


@pytest.fixture
async def keyed_url(start_gateway: Any) -> str:
    return await start_gateway(openai_api_key=SECRET)  # type: ignore[no-any-return]


async def test_a_backend_error_that_echoes_request_headers_is_passed_on_without_the_key(keyed_url, backend, client):
    r = await client.get(keyed_url + "/v1/echo-headers")
    assert backend.requests[-1].headers["authorization"] == f"Bearer {SECRET}"  # the backend did get it
    assert r.status_code == 400
    assert SECRET not in r.text and "[redacted]" in r.text


async def test_a_chat_error_echoing_the_key_is_redacted_in_json_and_in_streams(keyed_url, client):
    r = await client.post(keyed_url + "/v1/responses", json={"model": "echo-auth-400", "input": "hi"})
    assert r.status_code == 400 and SECRET not in r.text and "[redacted]" in r.json()["error"]["message"]
    status, body = await stream(client, keyed_url, {"model": "echo-auth-400", "input": "hi"})
    assert status == 400 and SECRET not in orjson.dumps(body).decode()
    status, frames = await stream(client, keyed_url, {"model": "echo-auth-stream", "input": "hi"})
    final = check_stream(frames)
    assert final["status"] == "failed" and "[redacted]" in final["error"]["message"]
    assert SECRET not in orjson.dumps(frames).decode()


async def test_the_documented_placeholder_key_is_not_treated_as_a_secret(gateway_url, client):
    r = await client.get(gateway_url + "/v1/echo-headers")
    assert "Bearer dummy-key" in r.json()["error"]["message"]


def test_mcp_server_credentials_count_as_secrets() -> None:
    from gateway.mcp import ServerConfig

    config = ServerConfig(
        name="s",
        type="stdio",
        command="x",
        env={"API_KEY": "k-123456", "PATH": "/usr/bin"},
        headers={"Authorization": "Bearer tok-abcdef"},
    )
    assert set(config.secrets()) == {"k-123456", "Bearer tok-abcdef", "tok-abcdef"}
