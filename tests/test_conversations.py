"""The Conversations API, and `conversation` on `POST /v1/responses`, as the clients' own code uses them.

The openai SDK's `client.conversations.*` (every call), `responses.create(conversation=…)` streamed
and not, over WebSocket and in the background; the OpenAI Agents SDK's `OpenAIConversationsSession`
and `Runner.run(conversation_id=…)` with a tool-using agent over two turns; one response at a time
per conversation, across two gateway processes on one real redis-server, the lock released when
its holder dies; tenancy; what a failed response appends (nothing).
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
from typing import Any

import httpx2
import openai
import orjson
import pytest
import trio

import gateway
from conftest import SequentialIds, make_settings, parse_sse
from gateway.keys import ApiKey, digest
from gateway.keys.stores import MemoryKeys
from test_keys import auth
from test_multi_instance_and_crash import STARTUP_SECONDS, start_gateways
from test_store_contract import REDIS, start_redis
from test_websocket import aconnect_ws, ws_url

USER = lambda text: {"type": "message", "role": "user", "content": text}  # noqa: E731


@pytest.fixture
def sdk(gateway_url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gateway_url + "/v1", api_key="sk-test", max_retries=0)


def texts(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(role, text) of a chat request's messages."""
    out = []
    for message in messages:
        content = message.get("content")
        text = content if isinstance(content, str) else "".join(p.get("text", "") for p in content or ())
        out.append((message["role"], text))
    return out


async def test_every_conversations_call_of_the_openai_sdk(sdk):
    with trio.fail_after(20):
        made = await sdk.conversations.create(items=[USER("hello"), USER("again")], metadata={"topic": "demo"})
        assert made.object == "conversation" and made.id.startswith("conv_") and made.metadata == {"topic": "demo"}
        assert made.created_at > 0
        assert (await sdk.conversations.retrieve(made.id)).id == made.id
        updated = await sdk.conversations.update(made.id, metadata={"topic": "other", "n": "2"})
        assert updated.metadata == {"topic": "other", "n": "2"}
        added = await sdk.conversations.items.create(made.id, items=[USER("third")], include=["message.output_text.logprobs"])
        assert [item.type for item in added.data] == ["message"] and added.first_id == added.last_id
        listed = [item async for item in sdk.conversations.items.list(made.id, order="asc", limit=2)]  # pages of 2
        assert [item.content[0].text for item in listed] == ["hello", "again", "third"]
        newest = await sdk.conversations.items.list(made.id, limit=1)  # desc by default
        assert newest.data[0].content[0].text == "third" and newest.has_more
        one = await sdk.conversations.items.retrieve(listed[1].id, conversation_id=made.id)
        assert one.id == listed[1].id and one.role == "user" and one.status == "completed"
        after_delete = await sdk.conversations.items.delete(listed[1].id, conversation_id=made.id)
        assert after_delete.object == "conversation" and after_delete.id == made.id
        left = [item async for item in sdk.conversations.items.list(made.id, order="asc")]
        assert [item.content[0].text for item in left] == ["hello", "third"]
        deleted = await sdk.conversations.delete(made.id)
        assert (deleted.id, deleted.object, deleted.deleted) == (made.id, "conversation.deleted", True)
        for call in (sdk.conversations.retrieve(made.id), sdk.conversations.items.list(made.id)):
            with pytest.raises(openai.NotFoundError):
                await call


@pytest.mark.parametrize(
    "path,body,param",
    [
        ("/v1/conversations", {"items": [USER(str(n)) for n in range(21)]}, "items"),
        ("/v1/conversations", {"metadata": {f"k{n}": "v" for n in range(17)}}, "metadata"),
        ("/v1/conversations", {"metadata": {"k" * 65: "v"}}, "metadata." + "k" * 64),
        ("/v1/conversations", {"metadata": {"k": "v" * 513}}, "metadata.k"),
        ("/v1/conversations", {"metadata": {"k": 1}}, "metadata"),
        ("/v1/conversations", {"items": [{"type": "item_reference", "id": "msg_1"}]}, "items[0]"),
        ("/v1/conversations", {"items": [{"type": "message", "role": "user"}]}, "items[0].content"),
    ],
    ids=["21 items", "17 pairs", "long key", "long value", "not a string", "a reference", "no content"],
)
async def test_conversations_refuse_what_openai_refuses_naming_the_field(gateway_url, client, path, body, param):
    r = await client.post(gateway_url + path, json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


async def test_item_lists_page_with_openais_cursor_arguments(gateway_url, client):
    made = (await client.post(gateway_url + "/v1/conversations", json={"items": [USER(str(n)) for n in range(5)]})).json()
    url = f"{gateway_url}/v1/conversations/{made['id']}/items"
    first = (await client.get(url, params={"limit": 2, "order": "asc"})).json()
    assert [i["content"][0]["text"] for i in first["data"]] == ["0", "1"] and first["has_more"] is True
    rest = (await client.get(url, params={"limit": 10, "order": "asc", "after": first["last_id"]})).json()
    assert [i["content"][0]["text"] for i in rest["data"]] == ["2", "3", "4"] and rest["has_more"] is False
    for args in ({"limit": 0}, {"limit": 101}, {"order": "sideways"}, {"after": "msg_nope"}, {"include": "nonsense"}):
        assert (await client.get(url, params=args)).status_code == 400, args


async def test_a_response_on_a_conversation_sees_its_items_and_adds_its_own(sdk, backend):
    with trio.fail_after(20):
        conv = await sdk.conversations.create(items=[USER("My name is Ada.")])
        first = await sdk.responses.create(model="text", input="What is my name?", conversation=conv.id)
        assert first.conversation is not None and first.conversation.id == conv.id
        assert texts(backend.chat_requests[-1]["messages"]) == [("user", "My name is Ada."), ("user", "What is my name?")]
        stream = await sdk.responses.create(model="text", input="And again?", conversation={"id": conv.id}, stream=True)
        events = [event async for event in stream]
        assert events[-1].type == "response.completed" and events[-1].response.conversation.id == conv.id
        items = [item async for item in sdk.conversations.items.list(conv.id, order="asc")]
    roles = [(item.role, item.content[0].text) for item in items]
    assert roles == [
        ("user", "My name is Ada."),
        ("user", "What is my name?"),
        ("assistant", "Hello, world!"),
        ("user", "And again?"),
        ("assistant", "Hello, world!"),
    ]
    assert texts(backend.chat_requests[-1]["messages"])[:3] == [
        ("user", "My name is Ada."), ("user", "What is my name?"), ("assistant", "Hello, world!")
    ]


async def test_a_conversation_over_a_websocket_and_in_the_background(gateway_url, client, backend):
    conv = (await client.post(gateway_url + "/v1/conversations", json={"items": [USER("first")]})).json()
    async with aconnect_ws(ws_url(gateway_url)) as ws:
        await ws.send_text(orjson.dumps({"type": "response.create", "model": "text", "input": "over ws", "conversation": conv["id"]}).decode())
        with trio.fail_after(10):
            while (event := orjson.loads(await ws.receive_text()))["type"] != "response.completed":
                pass
    assert event["response"]["conversation"] == {"id": conv["id"]}
    queued = (await client.post(gateway_url + "/v1/responses", json={"model": "text", "input": "later", "conversation": conv["id"], "background": True})).json()
    with trio.fail_after(10):
        while (await client.get(f"{gateway_url}/v1/responses/{queued['id']}")).json()["status"] != "completed":
            await trio.sleep(0.01)  # polling is what a background client does
    items = (await client.get(f"{gateway_url}/v1/conversations/{conv['id']}/items", params={"order": "asc"})).json()["data"]
    assert [i["content"][0]["text"] for i in items] == ["first", "over ws", "Hello, world!", "later", "Hello, world!"]


async def test_conversation_refusals_are_openais(gateway_url, client, backend):
    conv = (await client.post(gateway_url + "/v1/conversations", json={})).json()
    earlier = (await client.post(gateway_url + "/v1/responses", json={"model": "text", "input": "hi"})).json()
    both = await client.post(gateway_url + "/v1/responses", json={"model": "text", "input": "x", "conversation": conv["id"], "previous_response_id": earlier["id"]})
    assert both.status_code == 400 and "previous_response_id" in both.json()["error"]["message"]
    assert "conversation" in both.json()["error"]["message"]
    for stream in (False, True):
        unknown = await client.post(gateway_url + "/v1/responses", json={"model": "text", "input": "x", "conversation": "conv_nope", "stream": stream})
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "conversation_not_found"
    sent = len(backend.chat_requests)
    bad = await client.post(gateway_url + "/v1/responses", json={"model": "text", "input": "x", "conversation": 7})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "conversation"
    assert len(backend.chat_requests) == sent


async def test_a_failed_response_appends_nothing_and_lets_the_conversation_go(gateway_url, client):
    conv = (await client.post(gateway_url + "/v1/conversations", json={"items": [USER("keep me")]})).json()
    failed = await client.post(gateway_url + "/v1/responses", json={"model": "http-500", "input": "lost", "conversation": conv["id"]})
    assert failed.status_code == 502
    streamed = parse_sse((await client.post(gateway_url + "/v1/responses", json={"model": "error-mid-stream", "input": "lost too", "conversation": conv["id"], "stream": True})).content)
    assert streamed[-2]["type"] == "response.failed"
    items = (await client.get(f"{gateway_url}/v1/conversations/{conv['id']}/items")).json()["data"]
    assert [i["content"][0]["text"] for i in items] == ["keep me"]  # the client may send the same input again
    again = await client.post(gateway_url + "/v1/responses", json={"model": "text", "input": "retry", "conversation": conv["id"]})
    assert again.status_code == 200  # the failures did not leave it locked


async def test_one_response_at_a_time_per_conversation(gateway_url, client, backend):
    conv = (await client.post(gateway_url + "/v1/conversations", json={})).json()
    body = {"model": "text-then-wait", "input": "long", "conversation": conv["id"], "stream": True}
    async with client.stream("POST", gateway_url + "/v1/responses", json=body) as held:
        chunks = held.aiter_bytes()  # kept: a dropped iterator would close the stream
        async for data in chunks:
            if b"output_text.delta" in data:
                break
        second = await client.post(gateway_url + "/v1/responses", json={"model": "text", "input": "x", "conversation": conv["id"]})
        assert second.status_code == 400 and second.json()["error"]["code"] == "conversation_locked"
        assert second.json()["error"]["param"] == "conversation"
        backend.release.set()
        async for _ in chunks:
            pass
    after = await client.post(gateway_url + "/v1/responses", json={"model": "text", "input": "x", "conversation": conv["id"]})
    assert after.status_code == 200


@pytest.mark.skipif(REDIS is None, reason="redis-server is not installed")
async def test_the_lock_holds_across_two_processes_on_redis_and_lapses_when_its_holder_dies(tmp_path, backend):
    with trio.fail_after(STARTUP_SECONDS * 3 + 40):
        async with trio.open_nursery() as nursery:
            redis_url = await start_redis(nursery, tmp_path / "redis")
            env = {"STORE_BACKEND": "redis", "REDIS_URL": redis_url, "LOG_FILE_PATH": "", "OPENAI_BASE_URL_INTERNAL": backend.url,
                   "BACKGROUND_LEASE_SECONDS": "3"}
            first, second = await start_gateways(nursery, tmp_path, env, env)
            async with httpx2.AsyncClient(timeout=10) as http:
                conv = (await http.post(first.url + "/v1/conversations", json={})).json()
                body = {"model": "hang", "input": "x", "conversation": conv["id"], "stream": True}

                async def hold() -> None:
                    with contextlib.suppress(httpx2.HTTPError):  # its gateway is killed under it
                        await http.post(first.url + "/v1/responses", json=body)

                async with trio.open_nursery() as holding:
                    holding.start_soon(hold)
                    await backend.stream_started.wait()
                    refused = await http.post(second.url + "/v1/responses", json={"model": "text", "input": "y", "conversation": conv["id"]})
                    assert refused.status_code == 400 and refused.json()["error"]["code"] == "conversation_locked"
                    first.process.send_signal(signal.SIGKILL)  # the holder dies without letting go
                    await first.process.wait()
                    holding.cancel_scope.cancel()
                while True:  # the lease (3 s) lapses: the other instance may go on
                    answer = await http.post(second.url + "/v1/responses", json={"model": "text", "input": "y", "conversation": conv["id"]})
                    if answer.status_code == 200:
                        break
                    assert answer.json()["error"]["code"] == "conversation_locked"
                    await trio.sleep(0.2)
            nursery.cancel_scope.cancel()


async def test_another_keys_conversation_answers_as_one_that_does_not_exist(nursery, backend, client):
    keys = MemoryKeys()
    alice, bob = "sk-test-conv-alice-0123456789", "sk-test-conv-bob-0123456789"
    for name, secret in (("alice", alice), ("bob", bob)):
        await keys.put(ApiKey(name=name, id=f"key_{name}", digest=digest(secret), created_at=0.0))
    settings = make_settings(backend.url)
    app = gateway.create_app(settings, keys=keys, ids=SequentialIds())
    url = await nursery.start(functools.partial(gateway.serve, settings, app=app))
    conv = (await client.post(url + "/v1/conversations", json={"items": [USER("alice's secret")]}, headers=auth(alice))).json()
    item = (await client.get(f"{url}/v1/conversations/{conv['id']}/items", headers=auth(alice))).json()["data"][0]
    probes = [
        ("GET", f"/v1/conversations/{conv['id']}", None),
        ("POST", f"/v1/conversations/{conv['id']}", {"metadata": {}}),
        ("DELETE", f"/v1/conversations/{conv['id']}", None),
        ("POST", f"/v1/conversations/{conv['id']}/items", {"items": [USER("x")]}),
        ("GET", f"/v1/conversations/{conv['id']}/items", None),
        ("GET", f"/v1/conversations/{conv['id']}/items/{item['id']}", None),
        ("DELETE", f"/v1/conversations/{conv['id']}/items/{item['id']}", None),
        ("POST", "/v1/responses", {"model": "text", "input": "x", "conversation": conv["id"]}),
    ]
    for method, path, body in probes:
        theirs = await client.request(method, url + path, json=body, headers=auth(bob))
        elsewhere = orjson.loads(orjson.dumps(body).replace(conv["id"].encode(), b"conv_nope")) if body else None
        missing = await client.request(method, url + path.replace(conv["id"], "conv_nope"), json=elsewhere, headers=auth(bob))
        assert theirs.status_code == missing.status_code == 404, (path, theirs.text)
        assert theirs.content.replace(conv["id"].encode(), b"ID") == missing.content.replace(b"conv_nope", b"ID")
    kept = (await client.get(f"{url}/v1/conversations/{conv['id']}/items", headers=auth(alice))).json()["data"]
    assert [i["content"][0]["text"] for i in kept] == ["alice's secret"]
    assert all("alice's secret" not in orjson.dumps(r).decode() for r in backend.chat_requests)


AGENT_SCRIPT = """
import asyncio, json, sys
from openai import AsyncOpenAI
from agents import Agent, OpenAIConversationsSession, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

set_tracing_disabled(True)
client = AsyncOpenAI(base_url=sys.argv[1], api_key="sk-test", max_retries=0)


@function_tool
def get_weather(city: str) -> str:
    "The weather in a city."
    return f"sunny in {city}"


agent = Agent(name="forecaster", instructions="Answer about the weather.", tools=[get_weather],
              model=OpenAIResponsesModel(model="weather", openai_client=client))


async def main():
    session = OpenAIConversationsSession(openai_client=client)
    first = await Runner.run(agent, "Weather in Paris?", session=session)
    second = await Runner.run(agent, "And tomorrow?", session=session)
    kept = await session.get_items()
    conversation = await client.conversations.create()
    third = await Runner.run(agent, "Weather in Paris?", conversation_id=conversation.id)
    fourth = await Runner.run(agent, "And tomorrow?", conversation_id=conversation.id)
    print(json.dumps({"outputs": [first.final_output, second.final_output, third.final_output, fourth.final_output],
                      "kept": [item.get("type") or "message" for item in kept]}))


asyncio.run(main())
"""


async def test_the_agents_sdk_runs_a_tool_using_agent_over_two_turns_of_a_conversation(gateway_url, backend, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI")}
    with trio.fail_after(60):
        done = await trio.run_process(
            [sys.executable, "-c", AGENT_SCRIPT, gateway_url + "/v1"], env=env, cwd=tmp_path,
            capture_stdout=True, capture_stderr=True, check=False,
        )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    result = orjson.loads(done.stdout.decode().strip().splitlines()[-1])
    assert result["outputs"] == ["The tool said: sunny in Paris"] * 4
    assert result["kept"][:4] == ["message", "function_call", "function_call_output", "message"]
    # Each second turn's backend request carries its first turn: the question, the call, its result, the answer.
    seconds = [r for r in backend.chat_requests if texts(r["messages"])[-1] == ("user", "And tomorrow?")]
    assert len(seconds) == 2
    for request in seconds:
        roles = [m["role"] for m in request["messages"] if m["role"] != "system"]
        assert roles == ["user", "assistant", "tool", "assistant", "user"], texts(request["messages"])
        assert texts(request["messages"])[-4:-1] == [("assistant", ""), ("tool", "sunny in Paris"), ("assistant", "The tool said: sunny in Paris")]
