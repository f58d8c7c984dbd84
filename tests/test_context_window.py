"""Each route's context window, and `truncation: "auto"` fitting a request into it with exact counts.

Over real sockets: the gateway on port 0 and the scripted backend, which
holds its requests to a window (`ScriptedBackend.window`), says it as vLLM,
llama.cpp or Ollama do (or only in its refusal), and counts tokens as vLLM's
`/tokenize` does.  (Against a real llama.cpp with SmolLM2:
test_messages_llamacpp.py.)
"""

from __future__ import annotations

import sys
from typing import Any

import httpx2
import orjson
import pytest
import trio

from conftest import make_settings, parse_sse
from gateway.backends.openai import OpenAICompatibleBackend
from gateway.turn.fit import groups, without
from scripted_backend import prompt_tokens
from test_websocket import aconnect_ws, turn, ws_url

WORDS = " ".join(f"word{n}" for n in range(40))  # some 40 tokens


def conversation(turns: int) -> list[dict[str, Any]]:
    """A long Responses input: `turns` exchanges (every third one a tool call and its output), then a question."""
    items: list[dict[str, Any]] = []
    for n in range(turns):
        items.append({"role": "user", "content": f"turn {n}: {WORDS}"})
        if n % 3 == 1:
            items.append({"type": "function_call", "call_id": f"call_{n}", "name": "lookup", "arguments": "{}"})
            items.append({"type": "function_call_output", "call_id": f"call_{n}", "output": f"looked up {n}: {WORDS}"})
        items.append({"role": "assistant", "content": f"answer {n}: {WORDS}"})
    items.append({"role": "user", "content": "And the last question?"})
    return items


TOOLS = [{"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}}]


# --- the window -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["vllm", "llamacpp", "ollama"])
async def test_a_backends_context_window_is_asked_once_the_way_its_server_says_it(backend, kind):
    backend.window = (kind, 4096)
    adapter = OpenAICompatibleBackend(make_settings(backend.url))
    try:
        with trio.fail_after(10):
            assert await adapter.context_window("text") == 4096
            asked = len(backend.requests)
            assert await adapter.context_window("text") == 4096
    finally:
        await adapter.aclose()
    assert len(backend.requests) == asked  # remembered


async def test_a_backend_that_does_not_say_has_an_unknown_window(backend):
    adapter = OpenAICompatibleBackend(make_settings(backend.url))
    try:
        with trio.fail_after(10):
            assert await adapter.context_window("text") is None
    finally:
        await adapter.aclose()


ROUTES = """
[backends.local]
type = "openai"
base_url = "{url}"
[[routes]]
model = "pinned"
backends = ["local"]
context_window = 2048
[[routes]]
model = "asked"
backends = [{{ backend = "local", model = "text" }}]
"""


async def test_config_check_shows_each_routes_window_from_the_file_or_the_backend(tmp_path, backend):
    backend.window = ("llamacpp", 8192)
    path = tmp_path / "gateway.toml"
    path.write_text(ROUTES.format(url=backend.url))
    with trio.fail_after(30):
        done = await trio.run_process(
            [sys.executable, "-m", "gateway", "config", "check", str(path)],
            env={"PATH": "/usr/bin:/bin"},
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()
    assert "route pinned: context window 2048 tokens (the file)" in out
    assert "route asked: context window 8192 tokens (local says)" in out


def test_a_routes_file_context_window_that_is_not_a_positive_integer_stops_start_up():
    from gateway.backends.config import parse_config
    from gateway.config import ConfigError

    for bad in ("0", "-5", '"big"'):
        with pytest.raises(ConfigError) as refused:
            parse_config(ROUTES.format(url="http://127.0.0.1:1").replace("2048", bad))
        assert "context_window" in str(refused.value)


# --- which items may go (pure) --------------------------------------------------------------------


def test_the_instructions_the_last_user_turn_and_tool_pairs_are_never_split_or_dropped():
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}, {"id": "c2"}]},
        {"role": "tool", "tool_call_id": "c1", "content": "r1"},
        {"role": "tool", "tool_call_id": "c2", "content": "r2"},
        {"role": "developer", "content": "mid-conversation rules"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "last"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c3"}]},
        {"role": "tool", "tool_call_id": "c3", "content": "r3"},
    ]
    parts = groups(messages)
    assert parts == [[1], [2, 3, 4], [6]]
    assert [m["content"] for m in without(messages, parts, 2)] == ["rules", "mid-conversation rules", "a1", "last", None, "r3"]


# --- truncation: "auto" ---------------------------------------------------------------------------


async def create(client: httpx2.AsyncClient, url: str, **body: Any) -> httpx2.Response:
    with trio.fail_after(20):
        return await client.post(url + "/v1/responses", json={"model": "text", **body})


@pytest.mark.parametrize("how", ["json", "stream", "background", "websocket"])
async def test_auto_drops_the_oldest_items_until_the_input_fits_the_window(gateway_url, client, backend, how):
    backend.window, backend.tokenizer = ("vllm", 1200), "vllm"
    body = {"instructions": "Be brief.", "input": conversation(12), "tools": TOOLS, "max_output_tokens": 100, "truncation": "auto"}
    before = len(backend.chat_requests)
    if how == "json":
        r = await create(client, gateway_url, **body)
        assert r.status_code == 200, r.text
        answer = r.json()
    elif how == "stream":
        r = await create(client, gateway_url, **body, stream=True)
        answer = [e for e in parse_sse(r.content) if isinstance(e, dict)][-1]["response"]
    elif how == "background":
        made = (await create(client, gateway_url, **body, background=True)).json()
        with trio.fail_after(20):
            followed = await client.get(f"{gateway_url}/v1/responses/{made['id']}?stream=true")
        answer = [e for e in parse_sse(followed.content) if isinstance(e, dict)][-1]["response"]
    else:
        async with aconnect_ws(ws_url(gateway_url)) as ws:
            events = await turn(ws, model="text", **body)
            assert events[-1]["type"] == "response.completed", events[-1]
            answer = events[-1]["response"]
    assert answer["status"] == "completed" and answer["truncation"] == "auto"
    sent = backend.chat_requests[before:]
    assert len(sent) == 1  # fitted before it was sent: the backend never refused it
    messages = sent[0]["messages"]
    assert prompt_tokens(sent[0]) + 100 <= 1200
    assert messages[0] == {"role": "system", "content": "Be brief."}
    assert messages[-1]["content"] == "And the last question?"
    assert len(messages) < 2 + len(conversation(12))  # some went: the oldest
    first_kept = messages[1]
    assert first_kept["role"] != "tool" and "turn 0:" not in str(first_kept.get("content"))
    ids = [c["id"] for m in messages for c in m.get("tool_calls") or ()]
    assert ids == [m["tool_call_id"] for m in messages if m["role"] == "tool"]  # no call without its output, nor the reverse


async def test_disabled_keeps_the_backends_context_length_error(gateway_url, client, backend):
    backend.window = ("vllm", 1200)
    r = await create(client, gateway_url, input=conversation(12), max_output_tokens=100)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert "maximum context length is 1200" in r.json()["error"]["message"]


async def test_with_a_window_nobody_knew_the_backends_refusal_fits_it_once(gateway_url, client, backend):
    backend.window, backend.tokenizer = ("hidden", 1200), "vllm"
    before = len(backend.chat_requests)
    r = await create(client, gateway_url, input=conversation(12), max_output_tokens=100, truncation="auto", stream=True)
    events = [e for e in parse_sse(r.content) if isinstance(e, dict)]
    assert events[-1]["type"] == "response.completed"
    refused, fitted = backend.chat_requests[before:]
    assert len(fitted["messages"]) < len(refused["messages"])
    assert prompt_tokens(fitted) + 100 <= 1200
    assert not any(e["type"] == "error" for e in events)


async def test_an_input_whose_last_turn_alone_does_not_fit_is_a_400_and_too_many_output_tokens_names_the_field(gateway_url, client, backend):
    backend.window, backend.tokenizer = ("vllm", 300), "vllm"
    before = len(backend.chat_requests)
    r = await create(client, gateway_url, input=[{"role": "user", "content": " ".join([WORDS] * 10)}], truncation="auto", max_output_tokens=50)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert r.json()["error"]["param"] == "input"
    r = await create(client, gateway_url, input="hi", truncation="auto", max_output_tokens=300)
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_output_tokens"
    assert r.json()["error"]["message"].startswith("max_output_tokens: 300 leaves no room")
    assert len(backend.chat_requests) == before  # nothing reached the backend


async def test_a_routes_files_window_is_the_one_fitted_to(nursery, tmp_path, monkeypatch, client, backend):
    from test_routing import start_with_config

    backend.tokenizer = "vllm"
    url = await start_with_config(nursery, tmp_path, ROUTES.format(url=backend.url).replace("2048", "900"), monkeypatch)
    before = len(backend.chat_requests)
    r = await create(client, url, model="pinned", input=conversation(12), max_output_tokens=100, truncation="auto")
    assert r.status_code == 200, r.text
    [sent] = backend.chat_requests[before:]
    assert prompt_tokens(sent) + 100 <= 900 < prompt_tokens({**sent, "messages": sent["messages"] * 2})
    assert orjson.loads(orjson.dumps(sent["messages"][-1]))["content"] == "And the last question?"
