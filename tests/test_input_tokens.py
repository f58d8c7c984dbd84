"""`POST /v1/responses/input_tokens`: a create's body, counted exactly by the backend.

Over real sockets, through the official openai SDK: scripted backends that
count as vLLM does (`/tokenize` with the messages), as llama.cpp does
(`/apply-template`, then `/tokenize`), or by neither (a one-token
completion); the scripted Anthropic server's `count_tokens`; and a router
over several.  The count is compared with the chat request a create of the
same body actually sends.  (Against a real llama.cpp: test_input_tokens_llamacpp.py.)
"""

from __future__ import annotations

import functools
from typing import Any

import openai
import pytest
import trio

import gateway
from anthropic_server import AnthropicServer, input_tokens, serve_anthropic
from conftest import SequentialIds, make_settings
from gateway.keys.stores import MemoryKeys
from gateway.store.memory import MemoryStore
from scripted_backend import ScriptedBackend, prompt_tokens, serve_backend
from test_keys import CAROL, auth, key
from test_routing import closed_port
from test_tool_loop import LocalTools

TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
]
QUESTION = "What is the weather in Paris today?"


def sdk_at(url: str, api_key: str = "sk-test") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key=api_key, max_retries=0)


def paths(backend: ScriptedBackend, since: int = 0) -> list[str]:
    return [r.path for r in backend.requests[since:]]


# --- how each kind of backend counts ------------------------------------------------------------

WAYS = {
    # tokenizer: (what the first count asks, what a later count asks once the way is known)
    "vllm": (["/tokenize"], ["/tokenize"]),
    "llamacpp": (["/tokenize", "/apply-template", "/tokenize"], ["/apply-template", "/tokenize"]),
    "completion": (["/tokenize", "/apply-template", "/v1/chat/completions"], ["/v1/chat/completions"]),
}


@pytest.mark.parametrize("tokenizer", sorted(WAYS))
async def test_each_kind_of_backend_counts_exactly_the_chat_request_a_create_sends(start_gateway, backend, tokenizer):
    backend.tokenizer = tokenizer
    sdk = sdk_at(await start_gateway())
    ask: dict[str, Any] = {"model": "text", "input": QUESTION, "instructions": "Be brief.", "tools": TOOLS}
    with trio.fail_after(20):
        counted = await sdk.responses.input_tokens.count(**ask)
        first, later = WAYS[tokenizer]
        assert counted.object == "response.input_tokens" and paths(backend) == first
        seen = len(backend.requests)
        again = await sdk.responses.input_tokens.count(**ask)
        assert again.input_tokens == counted.input_tokens and paths(backend, seen) == later  # the way is remembered
        counts = backend.requests[:]
        await sdk.responses.create(**ask, store=False)
    sent = backend.chat_requests[-1]
    assert counted.input_tokens == prompt_tokens(sent)
    if tokenizer == "vllm":
        asked = counts[-1].body
        assert (asked["messages"], asked["tools"], asked["add_generation_prompt"]) == (sent["messages"], sent["tools"], True)
    elif tokenizer == "llamacpp":
        template, tokenize = counts[-2].body, counts[-1].body
        assert (template["messages"], template["tools"]) == (sent["messages"], sent["tools"])
        assert "stream" not in template and "stream_options" not in template
        assert (tokenize["add_special"], tokenize["parse_special"]) == (True, True)  # as llama.cpp's completions tokenize
    else:
        completion = counts[-1].body
        assert completion["messages"] == sent["messages"] and completion["tools"] == sent["tools"]
        assert (completion["stream"], completion["max_tokens"]) == (False, 1) and "stream_options" not in completion


async def test_instructions_tools_and_a_previous_response_change_the_count_as_they_change_the_request(start_gateway, backend):
    backend.tokenizer = "vllm"
    sdk = sdk_at(await start_gateway())
    with trio.fail_after(20):
        bare = (await sdk.responses.input_tokens.count(model="text", input=QUESTION)).input_tokens
        instructed = (await sdk.responses.input_tokens.count(model="text", input=QUESTION, instructions="Be brief.")).input_tokens
        tooled = (
            await sdk.responses.input_tokens.count(model="text", input=QUESTION, instructions="Be brief.", tools=TOOLS)
        ).input_tokens
        assert bare < instructed < tooled

        first = await sdk.responses.create(model="text", input=QUESTION)
        alone = (await sdk.responses.input_tokens.count(model="text", input="And tomorrow?")).input_tokens
        continued = await sdk.responses.input_tokens.count(model="text", input="And tomorrow?", previous_response_id=first.id)
        await sdk.responses.create(model="text", input="And tomorrow?", previous_response_id=first.id)
    assert continued.input_tokens > alone
    assert continued.input_tokens == prompt_tokens(backend.chat_requests[-1])  # the whole chain, as it was sent
    with pytest.raises(openai.NotFoundError) as missing:
        await sdk.responses.input_tokens.count(model="text", input="x", previous_response_id="resp_nope")
    assert missing.value.code == "previous_response_not_found"


async def test_a_conversations_items_are_counted_and_the_conversation_is_left_as_it_was(start_gateway, backend):
    backend.tokenizer = "vllm"
    sdk = sdk_at(await start_gateway())
    with trio.fail_after(20):
        conv = await sdk.conversations.create(items=[{"type": "message", "role": "user", "content": "My name is Ada."}])
        alone = await sdk.responses.input_tokens.count(model="text", input="What is my name?")
        counted = await sdk.responses.input_tokens.count(model="text", input="What is my name?", conversation=conv.id)
        items = [item.id async for item in sdk.conversations.items.list(conv.id)]
        await sdk.responses.create(model="text", input="What is my name?", conversation=conv.id)  # not left locked
    assert len(items) == 1  # the count appended nothing
    assert alone.input_tokens < counted.input_tokens == prompt_tokens(backend.chat_requests[-1])


async def test_a_count_on_a_conversation_with_a_response_running_is_not_locked_out(start_gateway, backend, client):
    backend.tokenizer = "vllm"
    url = await start_gateway()
    conv = (await client.post(url + "/v1/conversations", json={"items": [{"type": "message", "role": "user", "content": "hi"}]})).json()
    body = {"model": "text-then-wait", "input": "long", "conversation": conv["id"], "stream": True}
    async with client.stream("POST", url + "/v1/responses", json=body) as held:
        chunks = held.aiter_bytes()  # kept: a dropped iterator would close the stream
        async for data in chunks:
            if b"output_text.delta" in data:
                break
        counted = await client.post(url + "/v1/responses/input_tokens", json={"model": "text", "input": "x", "conversation": conv["id"]})
        assert counted.status_code == 200 and counted.json()["input_tokens"] > 0  # reads the items, takes no lock
        backend.release.set()
        async for _ in chunks:
            pass


async def test_the_gateways_own_tools_are_counted_as_a_create_offers_them(nursery, backend):
    backend.tokenizer = "vllm"
    settings = make_settings(backend.url)
    app = gateway.create_app(settings, mcp=LocalTools(), ids=SequentialIds(), clock=lambda: 1_700_000_000.0)
    sdk = sdk_at(await nursery.start(functools.partial(gateway.serve, settings, app=app)))
    with trio.fail_after(20):
        offered = await sdk.responses.input_tokens.count(model="text", input=QUESTION, tools=TOOLS)
        names = [t["function"]["name"] for t in backend.requests[-1].body["tools"]]
        without = await sdk.responses.input_tokens.count(
            model="text", input=QUESTION, tools=TOOLS, extra_headers={"x-gateway-tools": "none"}
        )
        opted_out = await sdk.responses.input_tokens.count(model="text", input=QUESTION, tools=TOOLS, extra_body={"gateway_tools": False})
        declined = await sdk.responses.input_tokens.count(model="text", input=QUESTION, tools=TOOLS, tool_choice="none")
        await sdk.responses.create(model="text", input=QUESTION, tools=TOOLS, store=False)
    assert names == ["get_weather", "add", "echo", "slow", "fail"]
    assert offered.input_tokens == prompt_tokens(backend.chat_requests[-1])
    assert without.input_tokens == opted_out.input_tokens < offered.input_tokens
    assert declined.input_tokens < offered.input_tokens  # `tool_choice: none` offers none of the gateway's


# --- keys, storage, errors ---------------------------------------------------------------------


class RecordingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.saved: list[str] = []

    async def save(self, record: Any) -> None:
        self.saved.append(record.id)
        await super().save(record)


async def test_a_count_is_not_stored_and_reserves_nothing_but_the_keys_models_hold(nursery, backend):
    backend.tokenizer = "llamacpp"
    keys, store = MemoryKeys(clock=lambda: 1_700_000_000.0), RecordingStore()
    limited = {"sk-test-no-tokens-0123456789": {"tpm": 0}, "sk-test-no-streams-0123456789": {"concurrency": 0}}
    for index, (secret, limits) in enumerate(limited.items()):
        await keys.put(key(f"limited{index}", secret, **limits))
    await keys.put(key("carol", CAROL, models=("reason*",)))
    settings = make_settings(backend.url)
    app = gateway.create_app(settings, keys=keys, store=store, ids=SequentialIds(), clock=lambda: 1_700_000_000.0)
    url = await nursery.start(functools.partial(gateway.serve, settings, app=app))
    with trio.fail_after(20):
        for secret in limited:
            sdk = sdk_at(url, secret)
            counted = await sdk.responses.input_tokens.count(model="text", input=QUESTION)
            assert counted.input_tokens > 0
            with pytest.raises(openai.RateLimitError):  # what a create would reserve, the key does not have
                await sdk.responses.create(model="text", input=QUESTION)
        assert store.saved == [] and backend.chat_requests == []
        carol = sdk_at(url, CAROL)
        sent = len(backend.requests)
        with pytest.raises(openai.NotFoundError) as refused:
            await carol.responses.input_tokens.count(model="text", input=QUESTION)
        assert refused.value.code == "model_not_found" and len(backend.requests) == sent
        assert (await carol.responses.input_tokens.count(model="reasoning", input=QUESTION)).input_tokens > 0


async def test_a_backend_that_cannot_count_is_a_502_and_its_own_refusals_are_the_clients(start_gateway, backend, client):
    backend.tokenizer = "completion"
    url = await start_gateway()
    sdk = sdk_at(url)
    with trio.fail_after(20):
        with pytest.raises(openai.APIStatusError) as uncounted:
            await sdk.responses.input_tokens.count(model="no-usage", input=QUESTION)
        assert uncounted.value.status_code == 502 and uncounted.value.code == "token_count_unavailable"
        with pytest.raises(openai.BadRequestError) as too_long:
            await sdk.responses.input_tokens.count(model="http-400", input=QUESTION)
        assert too_long.value.code == "context_length_exceeded"
        with pytest.raises(openai.BadRequestError) as empty:
            await sdk.responses.input_tokens.count(model="text")
        assert empty.value.code == "missing_required_parameter"
        # Clients configured without the `/v1` reach it too.
        r = await client.post(url + "/responses/input_tokens", json={"model": "text", "input": "hi"})
    assert r.status_code == 200 and r.json() == {"object": "response.input_tokens", "input_tokens": r.json()["input_tokens"]}


# --- Anthropic, and a router over several ------------------------------------------------------------


async def test_an_anthropic_backend_counts_with_its_count_tokens_endpoint(nursery, tmp_path):
    server = AnthropicServer()
    await nursery.start(serve_anthropic, server)
    config = tmp_path / "gateway.toml"
    config.write_text(
        f'[backends.claude]\ntype = "anthropic"\nbase_url = "{server.url}"\napi_key = "sk-ant-test-0123456789"\n'
        '[[routes]]\nmodel = "*"\nbackends = ["claude"]\n'
    )
    settings = make_settings("http://127.0.0.1:9", gateway_config=str(config))
    sdk = sdk_at(await nursery.start(functools.partial(gateway.serve, settings)))
    with trio.fail_after(20):
        bare = await sdk.responses.input_tokens.count(model="claude-text", input=QUESTION)
        counted = await sdk.responses.input_tokens.count(
            model="claude-text", input=QUESTION, instructions="Be brief.", tools=TOOLS, extra_body={"max_output_tokens": 64, "temperature": 0.5}
        )
        asked, headers = server.counts[-1], server.count_headers[-1]
        await sdk.responses.create(model="claude-text", input=QUESTION, instructions="Be brief.", tools=TOOLS, store=False)
    created = server.requests[-1]
    assert set(asked) == {"model", "messages", "system", "tools", "tool_choice"}  # no max_tokens, stream or sampling
    assert {k: created[k] for k in asked} == asked  # what a create sends, but the generation's settings
    assert counted.input_tokens == input_tokens(asked) > bare.input_tokens
    assert headers["x-api-key"] == "sk-ant-test-0123456789" and headers["anthropic-version"] == "2023-06-01"
    with pytest.raises(openai.NotFoundError) as unknown:
        await sdk.responses.input_tokens.count(model="claude-404", input="x")
    assert unknown.value.code == "model_not_found"
    with pytest.raises(openai.APIStatusError) as uncounted:
        await sdk.responses.input_tokens.count(model="claude-no-count", input="x")
    assert uncounted.value.status_code == 502 and uncounted.value.code == "token_count_unavailable"


async def test_a_router_counts_on_the_first_available_backend_of_the_route_by_its_model_name(nursery, tmp_path, monkeypatch):
    from test_routing import start_with_config

    a, b = ScriptedBackend(tokenizer="vllm"), ScriptedBackend(tokenizer="llamacpp")
    await nursery.start(serve_backend, a)
    await nursery.start(serve_backend, b)
    text = """
[backends.first]
base_url = "{first}"
[backends.second]
base_url = "{second}"
[[routes]]
model = "m"
backends = [{{ backend = "first", model = "text" }}, {{ backend = "second", model = "reasoning" }}]
"""
    url = await start_with_config(nursery, tmp_path, text.format(first=a.url, second=b.url), monkeypatch)
    sdk = sdk_at(url)
    with trio.fail_after(20):
        counted = await sdk.responses.input_tokens.count(model="m", input=QUESTION)
        assert paths(a) == ["/tokenize"] and a.requests[-1].body["model"] == "text" and b.requests == []
        with pytest.raises(openai.NotFoundError) as unrouted:
            await sdk.responses.input_tokens.count(model="other", input=QUESTION)
        assert unrouted.value.code == "model_not_found"
    (tmp_path / "down").mkdir()
    down = await start_with_config(nursery, tmp_path / "down", text.format(first=closed_port(), second=b.url), monkeypatch)
    with trio.fail_after(20):
        moved = await sdk_at(down).responses.input_tokens.count(model="m", input=QUESTION)
    assert paths(b) == ["/tokenize", "/apply-template", "/tokenize"] and b.requests[1].body["model"] == "reasoning"
    assert moved.input_tokens == counted.input_tokens  # the same prompt, the same (scripted) tokenizer
