"""Anthropic's Messages API (`/v1/messages`, `count_tokens`, models) over real sockets.

The client is the official `anthropic` SDK (raw HTTP where the SDK would
hide what is checked); the backends are the scripted Chat Completions
server and the scripted Anthropic server, on loopback.  (Against a real
llama.cpp: test_messages_llamacpp.py.)
"""

from __future__ import annotations

import functools
import json
import logging
import pathlib
from typing import Any

import anthropic
import httpx2
import orjson
import pytest
import trio

import gateway
from anthropic_events import check_stream, sse_events
from anthropic_server import AnthropicServer, serve_anthropic
from conftest import SequentialIds, make_settings
from scripted_backend import USAGE, prompt_tokens
from test_keys import ALICE, CAROL, key
from test_metrics import samples_of, value
from test_routing import start_with_config

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "claude_code"
WEATHER_TOOL: dict[str, Any] = {
    "name": "get_weather",
    "description": "Weather for a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
HI: list[Any] = [{"role": "user", "content": "hi"}]


def sdk(url: str, api_key: str = "sk-test", **options: Any) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=url, api_key=api_key, max_retries=0, **options)


async def raw_stream(client: httpx2.AsyncClient, url: str, body: dict[str, Any], **headers: str) -> httpx2.Response:
    return await client.post(url + "/v1/messages", json={"max_tokens": 64, "stream": True, **body}, headers=headers)


# --- messages, streamed and not ------------------------------------------------------------


async def test_a_message_with_system_blocks_is_created_and_its_usage_is_anthropics(gateway_url, backend):
    system: Any = [
        {"type": "text", "text": "You are terse."},
        {"type": "text", "text": "Answer in English.", "cache_control": {"type": "ephemeral", "ttl": "1h"}},
    ]
    with trio.fail_after(10):
        message = await sdk(gateway_url).messages.create(model="text", max_tokens=64, system=system, messages=HI)
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    assert message.model == "text" and message.stop_reason == "end_turn" and message.stop_sequence is None
    assert [block.type for block in message.content] == ["text"] and message.content[0].text == "Hello, world!"  # type: ignore[union-attr]
    cached = USAGE["prompt_tokens_details"]["cached_tokens"]  # type: ignore[index]
    assert message.usage.input_tokens == USAGE["prompt_tokens"] - cached and message.usage.cache_read_input_tokens == cached
    assert message.usage.output_tokens == USAGE["completion_tokens"]
    sent = backend.chat_requests[-1]
    assert sent["messages"][0] == {"role": "system", "content": "You are terse.\n\nAnswer in English."}
    assert sent["max_tokens"] == 64 and sent["stream"] is True


async def test_a_streamed_message_keeps_anthropics_grammar_and_adds_up_to_the_final_message(gateway_url, client):
    with trio.fail_after(10):
        async with sdk(gateway_url).messages.stream(model="reasoning", max_tokens=64, messages=HI) as stream:
            texts = [text async for text in stream.text_stream]
            final = await stream.get_final_message()
    assert "".join(texts) == "The answer is 4."
    assert [block.type for block in final.content] == ["thinking", "text"]
    assert final.content[0].thinking == "Let me think." and final.stop_reason == "end_turn"  # type: ignore[union-attr]
    r = await raw_stream(client, gateway_url, {"model": "reasoning", "messages": HI})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.content)
    assert check_stream(events) == "message_stop"
    assert events[0]["type"] == "message_start" and events[0]["message"]["model"] == "reasoning"


async def test_a_message_begun_before_it_runs_sends_what_its_round_would(gateway_url, client, backend, begun):
    body = {"model": "reasoning", "max_tokens": 64, "messages": HI}
    for streamed in (True, True, False):
        if streamed:
            events = sse_events((await raw_stream(client, gateway_url, body)).content)
            assert check_stream(events) == "message_stop"
            assert "".join(e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta") == "The answer is 4."
        else:
            r = await client.post(gateway_url + "/v1/messages", json=body)
            assert r.json()["content"][-1]["text"] == "The answer is 4."
    assert begun == [False, True, True]  # streamed (sent by its round), streamed, JSON
    first, *others = backend.chat_requests
    assert len(others) == 2 and all(other == first for other in others)


@pytest.mark.parametrize("streamed", [False, True])
async def test_a_tool_round_trip_with_the_sdk(gateway_url, backend, streamed):
    client = sdk(gateway_url)
    ask: dict[str, Any] = {"model": "weather", "max_tokens": 64, "tools": [WEATHER_TOOL]}
    question: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
    with trio.fail_after(10):
        if streamed:
            async with client.messages.stream(**ask, messages=question) as stream:
                first = await stream.get_final_message()
        else:
            first = await client.messages.create(**ask, messages=question)
        assert first.stop_reason == "tool_use"
        [call] = first.content
        assert call.type == "tool_use" and call.name == "get_weather" and call.input == {"city": "Paris"}
        assert call.id.startswith("toolu_")
        history: list[Any] = [
            *question,
            {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in first.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": [{"type": "text", "text": "18C, sunny"}]}]},
        ]
        if streamed:
            async with client.messages.stream(**ask, messages=history) as stream:
                second = await stream.get_final_message()
        else:
            second = await client.messages.create(**ask, messages=history)
    assert second.stop_reason == "end_turn" and second.content[0].text == "The tool said: 18C, sunny"  # type: ignore[union-attr]
    sent = backend.chat_requests[-1]["messages"]
    assert sent[-2]["tool_calls"][0]["id"] == call.id
    assert sent[-1] == {"role": "tool", "tool_call_id": call.id, "content": "18C, sunny"}


async def test_max_tokens_ends_the_message_with_stop_reason_max_tokens(gateway_url, client):
    message = await sdk(gateway_url).messages.create(model="length", max_tokens=5, messages=HI)
    assert message.stop_reason == "max_tokens" and message.content[0].text == "This answer is cut"  # type: ignore[union-attr]
    events = sse_events((await raw_stream(client, gateway_url, {"model": "length", "messages": HI})).content)
    assert check_stream(events) == "message_stop" and events[-2]["delta"]["stop_reason"] == "max_tokens"


# --- what Claude Code sends ---------------------------------------------------------------------

CLAUDE_CODE_HEADERS = {
    "anthropic-version": "2023-06-01",
    "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27",
    "x-app": "cli",
    "x-claude-code-session-id": "4b1d3c1e-0000-4000-8000-000000000000",
}


def claude_code_body(model: str) -> dict[str, Any]:
    """A request with every field Claude Code 2.1 was seen to send (see the issue's list)."""
    schema = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {"command": {"type": "string"}, "timeout": {"type": "number"}},
        "required": ["command"],
        "additionalProperties": False,
    }
    cache = {"type": "ephemeral", "ttl": "1h", "scope": "global"}
    return {
        "model": model,
        "max_tokens": 32000,
        "stream": True,
        "metadata": {"user_id": json.dumps({"device_id": "d", "session_id": "s"})},
        "thinking": {"type": "adaptive"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "medium"},
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1"},
            {"type": "text", "text": "You are Claude Code.", "cache_control": cache},
            {"type": "text", "text": "Use the tools.", "cache_control": cache},
        ],
        "tools": [
            {"name": "Bash", "description": "Run a command", "input_schema": schema},
            {"name": "Skill", "description": "Load a skill", "input_schema": {"type": "object", "properties": {}}, "defer_loading": True},
        ],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "<system-reminder>ctx</system-reminder>"}, {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]},
            {"role": "system", "content": "The model is not a Claude model."},
        ],
    }


async def test_claude_codes_request_with_all_its_extra_fields_is_served_and_beta_true_too(gateway_url, client, backend):
    r = await client.post(gateway_url + "/v1/messages?beta=true", json=claude_code_body("text"), headers=CLAUDE_CODE_HEADERS)
    assert r.status_code == 200, r.text
    assert check_stream(sse_events(r.content)) == "message_stop"
    sent = backend.chat_requests[-1]
    assert [m["role"] for m in sent["messages"]] == ["system", "user", "system"]
    assert "$schema" not in sent["tools"][0]["function"]["parameters"]
    assert sent["tools"][0]["function"]["parameters"]["additionalProperties"] is False
    assert sent["reasoning_effort"] == "medium" and sent["max_tokens"] == 32000
    captured = FIXTURES / "request_tool_turn.json"
    if captured.exists():  # and what the real program sent, as it sent it
        body = {**orjson.loads(captured.read_bytes()), "model": "text"}
        r = await client.post(gateway_url + "/v1/messages?beta=true", json=body, headers=CLAUDE_CODE_HEADERS)
        assert r.status_code == 200, r.text
        assert check_stream(sse_events(r.content)) == "message_stop"


# --- count_tokens and models -------------------------------------------------------------------


@pytest.mark.parametrize("tokenizer", ["vllm", "llamacpp", "completion"])
async def test_count_tokens_is_the_backends_exact_count_of_the_request_a_create_sends(start_gateway, backend, tokenizer):
    backend.tokenizer = tokenizer
    client = sdk(await start_gateway())
    ask: dict[str, Any] = {"model": "text", "system": "Be brief.", "tools": [WEATHER_TOOL], "messages": [{"role": "user", "content": "Weather in Paris?"}]}
    with trio.fail_after(10):
        counted = await client.messages.count_tokens(**ask)
        await client.messages.create(**ask, max_tokens=64)
    assert counted.input_tokens == prompt_tokens(backend.chat_requests[-1]) > 0


async def test_models_are_in_anthropics_shape_for_anthropic_clients_and_openais_otherwise(gateway_url, client):
    listed = await sdk(gateway_url).models.list()
    assert [model.id for model in listed.data] == ["text"]
    assert listed.data[0].type == "model" and listed.data[0].display_name == "text"
    page = (await client.get(gateway_url + "/v1/models", headers={"anthropic-version": "2023-06-01"})).json()
    assert page == {
        "data": [{"type": "model", "id": "text", "display_name": "text", "created_at": "1970-01-01T00:00:00Z"}],
        "has_more": False,
        "first_id": "text",
        "last_id": "text",
    }
    one = await sdk(gateway_url).models.retrieve("text")
    assert one.id == "text" and one.type == "model"
    with pytest.raises(anthropic.NotFoundError) as missing:
        await sdk(gateway_url).models.retrieve("nope")
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    openai_shaped = (await client.get(gateway_url + "/v1/models")).json()
    assert openai_shaped["object"] == "list" and openai_shaped["data"][0]["object"] == "model"


# --- errors ------------------------------------------------------------------------------------


def assert_anthropic_error(response: httpx2.Response, status: int, kind: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == kind and body["error"]["message"]
    assert set(body) <= {"type", "error", "request_id"} and set(body["error"]) == {"type", "message"}
    assert response.headers["request-id"] == body["request_id"]
    assert "Traceback" not in response.text
    return body


@pytest.mark.parametrize(
    ("model", "status", "kind", "exception"),
    [
        ("unknown-model", 404, "not_found_error", anthropic.NotFoundError),
        ("http-400", 400, "invalid_request_error", anthropic.BadRequestError),
        ("http-500", 502, "api_error", anthropic.InternalServerError),
        ("error-first", 502, "api_error", anthropic.InternalServerError),
    ],
)
@pytest.mark.parametrize("streamed", [False, True])
async def test_a_failure_before_the_stream_is_an_http_error_in_anthropics_shape(gateway_url, client, model, status, kind, exception, streamed):
    body = {"model": model, "max_tokens": 8, "messages": HI, "stream": streamed}
    assert_anthropic_error(await client.post(gateway_url + "/v1/messages", json=body), status, kind)
    with pytest.raises(exception) as caught:
        if streamed:
            async with sdk(gateway_url).messages.stream(model=model, max_tokens=8, messages=HI) as stream:
                await stream.get_final_message()
        else:
            await sdk(gateway_url).messages.create(model=model, max_tokens=8, messages=HI)
    assert caught.value.status_code == status and caught.value.body["error"]["type"] == kind  # type: ignore[index]


@pytest.mark.parametrize("model", ["error-mid-stream", "eof-abrupt", "not-json"])
async def test_a_backend_failing_after_the_stream_started_is_an_error_event_never_a_success(gateway_url, client, model):
    events = sse_events((await raw_stream(client, gateway_url, {"model": model, "messages": HI})).content)
    assert check_stream(events) == "error" and events[-1]["error"]["type"] == "api_error"
    assert any(e["type"] == "content_block_delta" for e in events)  # it had started
    with pytest.raises(anthropic.APIStatusError):
        async with sdk(gateway_url).messages.stream(model=model, max_tokens=8, messages=HI) as stream:
            await stream.get_final_message()
    with pytest.raises(anthropic.APIStatusError) as caught:  # not streamed: the error, with its status
        await sdk(gateway_url).messages.create(model=model, max_tokens=8, messages=HI)
    assert caught.value.status_code == 502 and caught.value.body["error"]["type"] == "api_error"  # type: ignore[index]


async def test_a_backend_that_times_out_before_answering_is_a_504_timeout_error(start_gateway, client):
    url = await start_gateway(stream_timeout=0.2)
    body = {"model": "slow-first-token", "max_tokens": 8, "messages": HI}
    assert_anthropic_error(await client.post(url + "/v1/messages", json=body), 504, "timeout_error")


BAD: list[tuple[str, bytes, str]] = [
    ("no messages", orjson.dumps({"model": "text", "max_tokens": 5}), "messages"),
    (
        "a tool_result answering no call",
        orjson.dumps({"model": "text", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_nope", "content": "x"}]}]}),
        "messages.0.content.0.tool_use_id",
    ),
    ("a JSON array", b"[1, 2, 3]", "JSON object"),
    ("nesting 200 deep", b'{"model": "text", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "metadata": ' + b'{"a": ' * 200 + b"1" + b"}" * 200 + b"}", "nest"),
    ("an unknown block type", orjson.dumps({"model": "text", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "hologram"}]}]}), "messages.0.content.0.type"),
    ("no max_tokens", orjson.dumps({"model": "text", "messages": HI}), "max_tokens"),
]


@pytest.mark.parametrize(("what", "raw", "named"), BAD, ids=[b[0] for b in BAD])
async def test_bad_input_is_a_400_in_anthropics_shape_naming_the_field_and_nothing_reaches_the_backend(
    gateway_url, client, backend, what, raw, named
):
    for path in ("/v1/messages", "/v1/messages?beta=true"):
        r = await client.post(gateway_url + path, content=raw, headers={"content-type": "application/json"})
        body = assert_anthropic_error(r, 400, "invalid_request_error")
        assert named in body["error"]["message"], body
    with pytest.raises(anthropic.BadRequestError):
        await sdk(gateway_url).messages.create(model="text", max_tokens=5, messages=[{"role": "user", "content": [{"type": "hologram"}]}])  # type: ignore[list-item,typeddict-item]
    assert backend.requests == []


async def test_a_body_over_the_limit_is_a_413_request_too_large(start_gateway, client):
    url = await start_gateway(max_request_body_bytes=2048)
    body = {"model": "text", "max_tokens": 5, "messages": [{"role": "user", "content": "x" * 4096}]}
    assert_anthropic_error(await client.post(url + "/v1/messages", json=body), 413, "request_too_large")


# --- keys, limits, telemetry ------------------------------------------------------------------


@pytest.fixture
async def keyed_url(nursery, backend):
    from gateway.keys.stores import MemoryKeys

    keys = MemoryKeys(clock=lambda: 1_700_000_000.0)
    await keys.put(key("alice", ALICE))
    await keys.put(key("carol", CAROL, models=("reason*",), tpm=10))
    settings = make_settings(backend.url)
    app = gateway.create_app(settings, keys=keys, ids=SequentialIds(), clock=lambda: 1_700_000_000.0)
    return await nursery.start(functools.partial(gateway.serve, settings, app=app))


async def test_the_key_may_come_as_x_api_key_or_as_a_bearer_token_and_a_bad_one_is_an_authentication_error(keyed_url, client, backend):
    with trio.fail_after(10):
        assert (await sdk(keyed_url, api_key=ALICE).messages.create(model="text", max_tokens=8, messages=HI)).content
        bearer = anthropic.AsyncAnthropic(base_url=keyed_url, auth_token=ALICE, max_retries=0)
        assert (await bearer.messages.create(model="text", max_tokens=8, messages=HI)).content
        sent = len(backend.requests)
        for path in ("/v1/messages", "/v1/messages/count_tokens"):
            r = await client.post(keyed_url + path, json={"model": "text", "max_tokens": 8, "messages": HI}, headers={"x-api-key": "sk-wrong-0123456789"})
            assert_anthropic_error(r, 401, "authentication_error")
        with pytest.raises(anthropic.AuthenticationError):
            await sdk(keyed_url, api_key="sk-wrong-0123456789").models.list()
    assert len(backend.requests) == sent


async def test_a_keys_model_list_and_token_limit_hold_on_messages(keyed_url, client, backend):
    carol = sdk(keyed_url, api_key=CAROL)
    with pytest.raises(anthropic.NotFoundError) as refused:
        await carol.messages.create(model="text", max_tokens=8, messages=HI)
    assert refused.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    assert backend.requests == []
    first = await carol.messages.create(model="reasoning", max_tokens=8, messages=HI)
    assert first.usage.input_tokens + first.usage.output_tokens + (first.usage.cache_read_input_tokens or 0) == 18  # over 10
    for streamed in (False, True):
        r = await client.post(keyed_url + "/v1/messages", json={"model": "reasoning", "max_tokens": 8, "messages": HI, "stream": streamed}, headers={"x-api-key": CAROL})
        assert_anthropic_error(r, 429, "rate_limit_error")
        assert int(r.headers["retry-after"]) >= 1
    assert len(backend.chat_requests) == 1


async def test_the_outcome_line_and_the_metrics_name_the_messages_transport(start_gateway, client, caplog):
    caplog.set_level(logging.INFO, logger="gateway")
    url = await start_gateway()
    await sdk(url).messages.create(model="text", max_tokens=8, messages=HI)
    async with sdk(url).messages.stream(model="text", max_tokens=8, messages=HI) as stream:
        await stream.get_final_message()
    await trio.testing.wait_all_tasks_blocked()  # (the outcome is logged once the stream's end is written)
    lines = [r.getMessage() for r in caplog.records if "transport=messages" in r.getMessage()]
    assert len(lines) == 2 and all("status=completed" in line and "model=text" in line for line in lines)
    m = samples_of((await client.get(url + "/metrics")).text)
    assert value(m, "gateway_responses_total", model="text", status="completed", key="anonymous", transport="messages") == 2
    assert value(m, "gateway_http_requests_total", route="/v1/messages", method="POST", status="200", key="anonymous") == 2


# --- streams: keep-alives, clients that leave ----------------------------------------------------


async def test_ping_is_the_keep_alive_from_the_first_moment_before_the_backend_answers(start_gateway, backend):
    url = await start_gateway(heartbeat_interval=0.2)
    raw = bytearray()
    with trio.fail_after(10):
        async with httpx2.AsyncClient(timeout=10) as http:
            body = {"model": "slow-first-token", "max_tokens": 8, "messages": HI, "stream": True}
            async with http.stream("POST", url + "/v1/messages", json=body) as response:
                assert response.status_code == 200
                async for data in response.aiter_bytes():
                    raw += data
                    if raw.count(b"event: ping\n") >= 2 and not backend.release.is_set():
                        backend.release.set()  # two pings while the backend said nothing: now let it answer
    events = sse_events(bytes(raw))
    kinds = [event["type"] for event in events]
    assert kinds[0] == "message_start" and kinds[1:3] == ["ping", "ping"]  # before any content
    assert check_stream(events) == "message_stop" and events[-2]["delta"]["stop_reason"] == "end_turn"


async def test_a_client_that_leaves_mid_stream_closes_the_backends_request(gateway_url, backend):
    with trio.fail_after(10):
        async with httpx2.AsyncClient(timeout=10) as http:
            body = {"model": "text-then-wait", "max_tokens": 8, "messages": HI, "stream": True}
            async with http.stream("POST", gateway_url + "/v1/messages", json=body) as response:
                async for data in response.aiter_bytes():
                    if b"text_delta" in data:
                        break
            left = trio.current_time()
        await backend.client_left.wait()
    print(f"the backend saw the client leave {(backend.client_left_at or left) - left:.4f} s after it did")


# --- routing, and an Anthropic backend --------------------------------------------------------


async def test_a_backend_failing_before_its_first_chunk_is_passed_over_for_the_next(nursery, tmp_path, client, monkeypatch):
    from test_routing import two  # noqa: F401  (the fixture's helpers)
    from scripted_backend import ScriptedBackend, serve_backend

    first, second = ScriptedBackend(), ScriptedBackend()
    await nursery.start(serve_backend, first)
    await nursery.start(serve_backend, second)
    text = f"""
[backends.first]
base_url = "{first.url}"
[backends.second]
base_url = "{second.url}"
[[routes]]
model = "claude-*"
backends = [{{ backend = "first", model = "http-500" }}, {{ backend = "second", model = "text" }}]
"""
    url = await start_with_config(nursery, tmp_path, text, monkeypatch)
    for streamed in (False, True):
        if streamed:
            async with sdk(url).messages.stream(model="claude-local-1", max_tokens=8, messages=HI) as stream:
                message = await stream.get_final_message()
        else:
            message = await sdk(url).messages.create(model="claude-local-1", max_tokens=8, messages=HI)
        assert message.content[0].text == "Hello, world!" and message.model == "claude-local-1"  # type: ignore[union-attr]
    assert [c["model"] for c in first.chat_requests] == ["http-500", "http-500"]
    assert [c["model"] for c in second.chat_requests] == ["text", "text"]


@pytest.fixture
async def claude_backend(nursery, tmp_path, monkeypatch, backend):
    server = AnthropicServer()
    await nursery.start(serve_anthropic, server)
    text = f"""
[backends.claude]
type = "anthropic"
base_url = "{server.url}"
api_key = "sk-ant-gateway-0123456789"
[[routes]]
model = "claude-*"
backends = ["claude"]
[[routes]]
model = "local"
backends = [{{ backend = "claude", model = "claude-text" }}]
"""
    return await start_with_config(nursery, tmp_path, text, monkeypatch), server


async def test_an_anthropic_backend_gets_the_clients_request_as_it_came(claude_backend, client):
    url, server = claude_backend
    body = claude_code_body("local")
    body["messages"] = [
        {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral", "scope": "global"}}]},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "EqQBsig"}, {"type": "text", "text": "hello"}]},
        {"role": "user", "content": "again"},
    ]
    r = await client.post(url + "/v1/messages?beta=true", json=body, headers={**CLAUDE_CODE_HEADERS, "x-api-key": "sk-client-key"})
    assert check_stream(sse_events(r.content)) == "message_stop"
    sent, headers = server.requests[-1], server.headers[-1]
    assert sent == {**body, "model": "claude-text", "stream": True}  # as it came, but for the route's model name
    assert headers["anthropic-beta"] == CLAUDE_CODE_HEADERS["anthropic-beta"]
    assert headers["x-api-key"] == "sk-ant-gateway-0123456789"  # the backend's key, never the client's


async def test_an_anthropic_backends_answer_comes_back_with_its_thinking_signature_tools_and_cache_usage(claude_backend):
    url, _ = claude_backend
    client = sdk(url)
    thinking = await client.messages.create(model="claude-thinking", max_tokens=64, messages=HI)
    assert [b.type for b in thinking.content] == ["thinking", "text"]
    assert thinking.content[0].signature == "EqQBCgIYAhIM"  # type: ignore[union-attr]
    async with client.messages.stream(model="claude-tools", max_tokens=64, messages=HI, tools=[WEATHER_TOOL]) as stream:
        tools = await stream.get_final_message()
    assert [(b.type, getattr(b, "id", None)) for b in tools.content] == [("text", None), ("tool_use", "toolu_01"), ("tool_use", "toolu_02")]
    assert tools.content[1].input == {"city": "Paris"} and tools.stop_reason == "tool_use"  # type: ignore[union-attr]
    cached = await client.messages.create(model="claude-cached", max_tokens=64, messages=HI)
    assert (cached.usage.input_tokens, cached.usage.cache_read_input_tokens, cached.usage.output_tokens) == (5, 100, 3)
    refused = await client.messages.create(model="claude-refusal", max_tokens=64, messages=HI)
    assert refused.stop_reason == "refusal"
    with pytest.raises(anthropic.InternalServerError):  # overloaded mid-stream: an error, not a success
        await client.messages.create(model="claude-overloaded-mid", max_tokens=64, messages=HI)


async def test_count_tokens_on_an_anthropic_backend_asks_its_own_count_tokens_with_the_clients_request(claude_backend):
    from anthropic_server import input_tokens

    url, server = claude_backend
    body = claude_code_body("local")
    counted = await sdk(url).messages.count_tokens(
        model="local", messages=body["messages"][:1], system=body["system"], tools=body["tools"], thinking={"type": "adaptive"},
        extra_headers={"anthropic-beta": "token-counting-2024-11-01"},
    )
    asked = server.counts[-1]
    assert asked["model"] == "claude-text" and asked["system"] == body["system"] and asked["tools"] == body["tools"]
    assert counted.input_tokens == input_tokens(asked)
    assert server.count_headers[-1]["anthropic-beta"] == "token-counting-2024-11-01"


# --- traces, drain -----------------------------------------------------------------------------


async def test_a_message_is_one_trace_from_the_server_span_to_the_backend(nursery, backend, client):
    from test_mcp_manager import serve_asgi
    from test_tracing import CLIENT_SPAN, CLIENT_TRACE, OTLPReceiver, start_traced_gateway, tracing_of

    receiver = OTLPReceiver()
    receiver_url = await nursery.start(serve_asgi, receiver)
    url, app = await start_traced_gateway(nursery, backend, receiver_url)
    r = await raw_stream(client, url, {"model": "text", "messages": [{"role": "user", "content": "PROMPT-MARKER-9"}]}, traceparent=f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01")
    assert check_stream(sse_events(r.content)) == "message_stop"
    await tracing_of(app).flush()
    (server,) = receiver.named("POST /v1/messages")
    assert (server["trace_id"], server["parent"]) == (CLIENT_TRACE, CLIENT_SPAN)
    assert server["attributes"]["http.route"] == "/v1/messages"
    (turn,) = receiver.named("turn")
    assert turn["parent"] == server["span_id"] and turn["attributes"]["gateway.transport"] == "messages"
    (round_,) = receiver.named("backend round")
    assert round_["parent"] == turn["span_id"]
    assert backend.requests[-1].headers["traceparent"].split("-")[1:3] == [CLIENT_TRACE, round_["span_id"]]
    assert "PROMPT-MARKER-9" not in repr([span["attributes"] for span in receiver.spans])
    await tracing_of(app).aclose()


async def test_a_stream_the_drain_stops_ends_with_an_error_event_and_new_requests_are_overloaded(tmp_path, backend):
    from test_drain import OpenStream, served, sigterm_and_wait_until_nothing_listens
    from test_multi_instance_and_crash import STARTUP_SECONDS

    with trio.fail_after(STARTUP_SECONDS + 30):
        async with served(tmp_path, backend.url, SHUTDOWN_GRACE="1") as gateway_process:
            stream = OpenStream()
            body = {"model": "text-then-wait", "max_tokens": 8, "messages": HI, "stream": True}
            async with trio.open_nursery() as nursery:
                nursery.start_soon(stream.run, gateway_process.url, "/v1/messages", body)
                await stream.first_delta.wait()
                async with httpx2.AsyncClient(timeout=10) as http:  # a kept-alive connection, opened before the signal
                    assert (await http.get(gateway_process.url + "/health")).status_code == 200
                    await sigterm_and_wait_until_nothing_listens(gateway_process, 1)
                    refused = await http.post(gateway_process.url + "/v1/messages", json={"model": "text", "max_tokens": 8, "messages": HI})
                    assert_anthropic_error(refused, 503, "overloaded_error")
                await stream.ended.wait()  # never released: the drain's grace runs out
            assert await gateway_process.process.wait() == 0
            log = await gateway_process.read_rest()
    assert stream.cut is None, stream.cut
    events = sse_events(bytes(stream.raw))
    assert check_stream(events) == "error" and events[-1]["error"]["type"] == "overloaded_error"
    assert "Traceback" not in log and "transport=messages" in log


async def test_the_stop_sequence_that_ended_a_message_is_named_when_the_backend_names_it(gateway_url, claude_backend):
    vllm_like = await sdk(gateway_url).messages.create(model="stop-string", max_tokens=8, stop_sequences=["###"], messages=HI)
    assert (vllm_like.stop_reason, vllm_like.stop_sequence) == ("stop_sequence", "###")
    url, _ = claude_backend
    native = await sdk(url).messages.create(model="claude-stop-sequence", max_tokens=8, stop_sequences=["END"], messages=HI)
    assert (native.stop_reason, native.stop_sequence) == ("stop_sequence", "END")


async def test_unknown_fields_and_betas_are_accepted_and_named_in_one_debug_line_without_their_values(gateway_url, client, caplog):
    caplog.set_level(logging.DEBUG, logger="gateway.turn")
    body = {"model": "text", "max_tokens": 8, "messages": HI, "container": "SECRET-CONTAINER", "mcp_servers": [{"url": "https://x"}], "brand_new_field": {"a": 1}}
    r = await client.post(gateway_url + "/v1/messages", json=body, headers={"anthropic-beta": "files-api-2025-04-14"})
    assert r.status_code == 200 and r.json()["content"][0]["text"] == "Hello, world!"
    [line] = [rec.getMessage() for rec in caplog.records if rec.getMessage().startswith("messages request:")]
    assert "brand_new_field, container, mcp_servers" in line and "files-api-2025-04-14" in line
    assert "SECRET-CONTAINER" not in line and all(rec.levelno == logging.DEBUG for rec in caplog.records if "messages request:" in rec.getMessage())
