"""Message threads (`thread: create / continue`, the anthropic SDKs' threads and tool runners) over real sockets.

The client is the official `anthropic` SDK (its `client.beta.messages.thread()`
and `tool_runner()`, which thread by default) or raw HTTP where a refusal is
checked; the backend is the scripted Chat Completions server (a strict one:
`lookup-twice` refuses a history that lost a tool call or its result), and
the scripted Anthropic server for pass-through.
"""

from __future__ import annotations

import functools
import json
import pathlib
import shutil
from typing import Any

import anthropic
import httpx2
import orjson
import pytest
import trio

import gateway
from anthropic_events import check_stream, sse_events
from conftest import SequentialIds, make_settings
from test_keys import ALICE, BOB, key

THREADS = "message-threads-2026-08-12"
SYSTEM = "You answer in one line."


class Recorder:
    """The SDK's requests to the gateway, as sent (bodies decoded)."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[httpx2.Headers] = []

    async def __call__(self, request: httpx2.Request) -> None:
        self.bodies.append(orjson.loads(request.content))
        self.headers.append(request.headers)


def sdk(url: str, recorder: Recorder | None = None, api_key: str = "sk-test") -> anthropic.AsyncAnthropic:
    hooks = {"request": [recorder]} if recorder is not None else {}
    http = anthropic.DefaultAsyncHttpxClient(event_hooks=hooks)
    return anthropic.AsyncAnthropic(base_url=url, api_key=api_key, max_retries=0, http_client=http)


async def post(client: httpx2.AsyncClient, url: str, body: dict[str, Any], **headers: str) -> httpx2.Response:
    return await client.post(
        url + "/v1/messages?beta=true",
        json={"model": "text", "max_tokens": 64, **body},
        headers={"anthropic-version": "2023-06-01", "anthropic-beta": THREADS, **headers},
    )


def said(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def roles(request: dict[str, Any]) -> list[str]:
    return [m["role"] for m in request["messages"]]


# --- the SDKs -------------------------------------------------------------------------------------


@pytest.mark.parametrize("streamed", [False, True])
async def test_thread_send_over_three_turns_sends_only_the_new_messages_and_the_backend_gets_the_whole_conversation(
    gateway_url, backend, streamed
):
    recorder = Recorder()
    thread = sdk(gateway_url, recorder).beta.messages.thread(model="text", max_tokens=64, system=SYSTEM)
    replies = []
    with trio.fail_after(20):
        for text in ("one", "two", "three"):
            if streamed:
                async with thread.stream(said(text)) as stream:
                    replies.append(await stream.get_final_message())
            else:
                replies.append(await thread.send(said(text)))
    assert [r.content[0].text for r in replies] == ["Hello, world!"] * 3  # type: ignore[union-attr]
    # The SDK sent a create with everything, then continues with only the new message.
    first, second, third = recorder.bodies
    assert first["thread"] == {"type": "create"} and first["system"] == SYSTEM
    assert second["thread"] == {"type": "continue", "previous_message_id": replies[0].id}
    assert third["thread"] == {"type": "continue", "previous_message_id": replies[1].id}
    assert second["messages"] == [said("two")] and "system" not in second
    assert THREADS in recorder.headers[1]["anthropic-beta"]
    # Each backend request held the whole conversation, the system prompt first.
    sent = backend.chat_requests[-3:]
    assert [roles(r) for r in sent] == [
        ["system", "user"],
        ["system", "user", "assistant", "user"],
        ["system", "user", "assistant", "user", "assistant", "user"],
    ]
    assert sent[2]["messages"][0] == {"role": "system", "content": SYSTEM}
    assert [m["content"] for m in sent[2]["messages"] if m["role"] == "user"] == ["one", "two", "three"]
    assert [m["content"] for m in sent[2]["messages"] if m["role"] == "assistant"] == ["Hello, world!"] * 2


@pytest.mark.parametrize("streamed", [False, True])
async def test_the_tool_runner_runs_three_turns_on_a_thread_against_a_strict_backend(gateway_url, backend, streamed):
    ran: list[int] = []

    @anthropic.beta_async_tool
    async def lookup(n: int) -> str:
        """Look something up.

        Args:
            n: which lookup this is.
        """
        ran.append(n)
        return f"result {n}"

    recorder = Recorder()
    runner = sdk(gateway_url, recorder).beta.messages.tool_runner(
        model="lookup-twice", max_tokens=64, system=SYSTEM, tools=[lookup], messages=[said("find it")], stream=streamed
    )
    with trio.fail_after(20):
        if streamed:
            messages = [await stream.get_final_message() async for stream in runner]  # type: ignore[union-attr]
        else:
            messages = [message async for message in runner]
    assert ran == [0, 1]
    assert [m.stop_reason for m in messages] == ["tool_use", "tool_use", "end_turn"]
    assert messages[-1].content[0].text == "Found: result 0 and result 1"  # type: ignore[union-attr]
    kinds = [body["thread"]["type"] for body in recorder.bodies]
    assert kinds == ["create", "continue", "continue"]
    assert all("tools" not in body and "system" not in body for body in recorder.bodies[1:])
    assert [len(body["messages"]) for body in recorder.bodies] == [1, 1, 1]  # each a user turn: the tool_result
    # The strict backend refuses a history that lost a call or its result: all three were whole.
    sent = backend.chat_requests[-3:]
    assert [roles(r) for r in sent][-1] == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert all(r["tools"][0]["function"]["name"] == "lookup" for r in sent)


async def test_a_lost_thread_makes_the_sdk_send_the_whole_conversation_again_and_go_on(start_gateway, backend, nursery):
    """`thread_not_found` (here: the gateway restarted on a memory store) is what the SDKs replay on."""
    settings = make_settings(backend.url, store_backend="memory")
    first_url = await nursery.start(
        functools.partial(gateway.serve, settings, app=gateway.create_app(settings))
    )
    recorder = Recorder()
    client = sdk(first_url, recorder)
    thread = client.beta.messages.thread(model="text", max_tokens=64, system=SYSTEM)
    with trio.fail_after(20):
        await thread.send(said("one"))
        # The same thread, now against another gateway that never saw it.
        other_url = await start_gateway(store_backend="memory")
        client.base_url = httpx2.URL(other_url)
        reply = await thread.send(said("two"))
    assert reply.content[0].text == "Hello, world!"  # type: ignore[union-attr]
    kinds = [(body["thread"]["type"], len(body["messages"])) for body in recorder.bodies]
    assert kinds == [("create", 1), ("continue", 1), ("create", 3)]  # refused, then replayed whole
    assert roles(backend.chat_requests[-1]) == ["system", "user", "assistant", "user"]


# --- the refusals ---------------------------------------------------------------------------------


async def create(client: httpx2.AsyncClient, url: str, **body: Any) -> dict[str, Any]:
    r = await post(client, url, {"system": SYSTEM, "messages": [said("one")], "thread": {"type": "create"}, **body})
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def continuing(previous: str, *messages: Any, **body: Any) -> dict[str, Any]:
    return {"messages": list(messages or [said("more")]), "thread": {"type": "continue", "previous_message_id": previous}, **body}


def refusal(r: httpx2.Response, status: int, kind: str, code: str) -> str:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["type"] == kind and error["details"]["error_code"] == code
    return str(error["message"])


async def test_an_unknown_thread_is_a_404_thread_not_found(gateway_url, client, backend):
    before = len(backend.chat_requests)
    r = await post(client, gateway_url, continuing("msg_nope"))
    message = refusal(r, 404, "not_found_error", "thread_not_found")
    assert message.startswith("thread.previous_message_id:") and "msg_nope" in message
    assert len(backend.chat_requests) == before


async def test_each_answer_is_continued_once(gateway_url, client):
    first = await create(client, gateway_url)
    assert (await post(client, gateway_url, continuing(first["id"]))).status_code == 200
    r = await post(client, gateway_url, continuing(first["id"]))
    assert "already continued" in refusal(r, 400, "invalid_request_error", "thread_already_continued")


async def test_a_continue_that_failed_leaves_the_answer_to_be_continued_again(gateway_url, client):
    first = await create(client, gateway_url)
    r = await post(client, gateway_url, continuing(first["id"], model="http-500"))
    assert r.status_code >= 500
    again = await post(client, gateway_url, continuing(first["id"]))
    assert again.status_code == 200, again.text


async def test_a_second_continue_while_the_first_runs_is_thread_continue_in_flight(gateway_url, client, backend):
    first = await create(client, gateway_url)
    async with trio.open_nursery() as nursery:
        results: list[httpx2.Response] = []

        async def slow() -> None:
            results.append(await post(client, gateway_url, continuing(first["id"], model="text-then-wait")))

        backend.stream_started = trio.Event()
        nursery.start_soon(slow)
        with trio.fail_after(10):
            await backend.stream_started.wait()
        r = await post(client, gateway_url, continuing(first["id"]))
        refusal(r, 400, "invalid_request_error", "thread_continue_in_flight")
        backend.release.set()
    assert results[0].status_code == 200


async def test_a_create_only_field_sent_again_with_another_value_is_a_fingerprint_mismatch(gateway_url, client, backend):
    first = await create(client, gateway_url, tools=[{"name": "f", "input_schema": {"type": "object"}}])
    r = await post(client, gateway_url, continuing(first["id"], system="Something else."))
    message = refusal(r, 400, "invalid_request_error", "thread_fingerprint_mismatch")
    assert message.startswith("system:") and "'system'" in message
    # Sent again unchanged, they are accepted.
    same = continuing(first["id"], system=SYSTEM, tools=[{"name": "f", "input_schema": {"type": "object"}}])
    assert (await post(client, gateway_url, same)).status_code == 200


async def test_a_thread_is_the_keys_own_and_another_keys_continue_finds_none(nursery, backend, client):
    from gateway.keys.stores import MemoryKeys

    keys = MemoryKeys(clock=lambda: 1_700_000_000.0)
    await keys.put(key("alice", ALICE))
    await keys.put(key("bob", BOB))
    settings = make_settings(backend.url)
    app = gateway.create_app(settings, keys=keys, ids=SequentialIds())
    url = await nursery.start(functools.partial(gateway.serve, settings, app=app))
    r = await post(client, url, {"system": SYSTEM, "messages": [said("one")], "thread": {"type": "create"}}, **{"x-api-key": ALICE})
    assert r.status_code == 200
    first = r.json()
    stranger = await post(client, url, continuing(first["id"]), **{"x-api-key": BOB})
    refusal(stranger, 404, "not_found_error", "thread_not_found")
    mine = await post(client, url, continuing(first["id"]), **{"x-api-key": ALICE})
    assert mine.status_code == 200


async def test_threads_with_context_management_or_turned_off_are_thread_unsupported_request(start_gateway, client):
    url = await start_gateway()
    body = {"messages": [said("one")], "thread": {"type": "create"}, "context_management": {"edits": []}}
    r = await post(client, url, body)
    refusal(r, 400, "invalid_request_error", "thread_unsupported_request")
    assert r.json()["error"]["details"]["unsupported"] == ["context_management"]
    off = await start_gateway(message_threads=False)
    r = await post(client, off, {"messages": [said("one")], "thread": {"type": "create"}})
    assert "MESSAGE_THREADS" in refusal(r, 400, "invalid_request_error", "thread_unsupported_request")
    assert r.json()["error"]["details"]["unsupported"] == []


async def test_a_thread_whose_stored_content_cannot_be_read_is_a_400_naming_the_field(nursery, backend, client):
    from gateway.store import MemoryStore

    store = MemoryStore()
    settings = make_settings(backend.url)
    app = gateway.create_app(settings, store=store, ids=SequentialIds())
    url = await nursery.start(functools.partial(gateway.serve, settings, app=app))
    first = await create(client, url)
    store._threads[first["id"]] = (store._clock(), b"\x28\xb5\x2f\xfd not zstd at all")  # a damaged record
    r = await post(client, url, continuing(first["id"]))
    message = refusal(r, 400, "invalid_request_error", "thread_not_found")
    assert message.startswith("thread.previous_message_id:") and "cannot be read" in message


async def test_bad_thread_shapes_are_400s_naming_the_field(gateway_url, client, backend):
    before = len(backend.chat_requests)
    cases = [
        ({"thread": {"type": "fork"}, "messages": [said("x")]}, "thread.type"),
        ({"thread": {"type": "continue"}, "messages": [said("x")]}, "thread.continue.previous_message_id"),
        ({"thread": {"type": "create"}, "messages": []}, "messages"),
    ]
    for body, field in cases:
        r = await post(client, gateway_url, body)
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", r.text
        assert r.json()["error"]["message"].split(":")[0] in (field, field.replace(".continue", "")), r.text
    assert len(backend.chat_requests) == before


async def test_a_continues_tool_result_must_answer_a_call_of_the_conversation(gateway_url, client):
    first = await create(client, gateway_url)
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_nope", "content": "x"}]}
    r = await post(client, gateway_url, continuing(first["id"], result))
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("messages.0.content.0.tool_use_id:")
    # The answer was not claimed by the refused request.
    assert (await post(client, gateway_url, continuing(first["id"]))).status_code == 200


async def test_an_empty_continue_resumes_the_conversation_as_it_stands(gateway_url, client, backend):
    first = await create(client, gateway_url)
    r = await post(client, gateway_url, {"messages": [], "thread": {"type": "continue", "previous_message_id": first["id"]}})
    assert r.status_code == 200, r.text
    assert roles(backend.chat_requests[-1]) == ["system", "user", "assistant"]


async def test_a_streamed_continue_is_stored_before_its_message_stop_goes_out(gateway_url, client):
    first = await create(client, gateway_url)
    r = await post(client, gateway_url, {**continuing(first["id"]), "stream": True})
    events = sse_events(r.content)
    assert check_stream(events) == "message_stop"
    answer = events[0]["message"]["id"]
    nxt = await post(client, gateway_url, continuing(answer))
    assert nxt.status_code == 200, nxt.text


async def test_count_tokens_counts_a_continue_with_its_whole_conversation(gateway_url, client, backend):
    backend.tokenizer = "vllm"
    first = await create(client, gateway_url)
    headers = {"anthropic-version": "2023-06-01", "anthropic-beta": THREADS}
    whole = await client.post(
        gateway_url + "/v1/messages/count_tokens",
        json={"model": "text", "system": SYSTEM, "messages": [said("one"), {"role": "assistant", "content": first["content"]}, said("more")]},
        headers=headers,
    )
    threaded = await client.post(gateway_url + "/v1/messages/count_tokens", json={"model": "text", **continuing(first["id"])}, headers=headers)
    assert threaded.status_code == 200 and threaded.json() == whole.json()
    # Only read: the answer can still be continued.
    assert (await post(client, gateway_url, continuing(first["id"]))).status_code == 200


# --- across instances, an Anthropic backend, the TypeScript SDK ---------------------------------


async def test_two_gateways_on_one_redis_share_threads_and_one_continue_at_a_time(nursery, tmp_path, backend, client):
    from test_store_contract import REDIS, start_redis

    if REDIS is None:
        pytest.skip("redis-server is not installed (.ci/run installs it)")
    redis_url = await start_redis(nursery, tmp_path)
    urls = []
    for _ in range(2):
        settings = make_settings(backend.url, store_backend="redis", redis_url=redis_url)
        urls.append(await nursery.start(functools.partial(gateway.serve, settings, app=gateway.create_app(settings))))
    a, b = urls
    first = await create(client, a)
    backend.stream_started = trio.Event()
    async with trio.open_nursery() as running:
        results: list[httpx2.Response] = []

        async def slow() -> None:
            results.append(await post(client, a, continuing(first["id"], model="text-then-wait")))

        running.start_soon(slow)
        with trio.fail_after(10):
            await backend.stream_started.wait()
        r = await post(client, b, continuing(first["id"]))  # the other instance sees the claim
        refusal(r, 400, "invalid_request_error", "thread_continue_in_flight")
        backend.release.set()
    assert results[0].status_code == 200
    # The answer made on one instance is continued on the other.
    r = await post(client, b, continuing(results[0].json()["id"]))
    assert r.status_code == 200, r.text
    assert roles(backend.chat_requests[-1]) == ["system", "user", "assistant", "user", "assistant", "user"]


@pytest.fixture
async def claude_url(nursery, tmp_path, monkeypatch, backend):
    from anthropic_server import AnthropicServer, serve_anthropic
    from test_routing import start_with_config

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
"""
    return await start_with_config(nursery, tmp_path, text, monkeypatch), server


async def test_an_anthropic_backend_gets_the_whole_conversation_without_thread_or_its_beta(claude_url, client):
    url, server = claude_url
    betas = f"interleaved-thinking-2025-05-14,{THREADS}"
    first = await create(client, url, model="claude-text")
    r = await post(client, url, continuing(first["id"], model="claude-text"), **{"anthropic-beta": betas})
    assert r.status_code == 200, r.text
    sent, headers = server.requests[-1], server.headers[-1]
    assert "thread" not in sent and sent["system"] == SYSTEM
    assert [m["role"] for m in sent["messages"]] == ["user", "assistant", "user"]
    assert sent["messages"][1]["content"] == first["content"]
    assert headers["anthropic-beta"] == "interleaved-thinking-2025-05-14"


TS_SDK = pathlib.Path(__file__).parent.parent / ".venv" / "anthropic-sdk"


@pytest.mark.skipif(shutil.which("node") is None or not (TS_SDK / "node_modules" / "@anthropic-ai" / "sdk").is_dir(),
                    reason="node or the TypeScript SDK is not installed (.ci/run installs @anthropic-ai/sdk where npm is)")
async def test_the_typescript_sdks_thread_send_and_tool_runner_work_over_three_turns(gateway_url, backend):
    before = len(backend.chat_requests)
    with trio.fail_after(60):
        done = await trio.run_process(
            ["node", str(pathlib.Path(__file__).parent / "js" / "threads.mjs"), gateway_url, str(TS_SDK)],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    out = json.loads(done.stdout)
    assert [r["text"] for r in out["replies"]] == ["Hello, world!"] * 3
    assert [b["thread"]["type"] for b in out["sent"]] == ["create", "continue", "continue"] * 2
    assert [len(b["messages"]) for b in out["sent"]] == [1, 1, 1] * 2
    assert out["ran"] == [0, 1] and out["stops"] == ["tool_use", "tool_use", "end_turn"]
    assert out["final"] == "Found: result 0 and result 1"
    sent = backend.chat_requests[before:]
    assert [len(r["messages"]) for r in sent] == [2, 4, 6, 2, 4, 6]  # the whole conversation every time
