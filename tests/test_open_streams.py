"""The live streams the heartbeat wheel holds, as the operator console lists them.

A real gateway on loopback and the scripted backend holding its streams open: each open stream
is listed with its transport, route, model, key, age and silences, for as long as it is open.
Time is the test's own only through `now=`; the silences are bounded below by the gateway's own
keep-alives, which come no sooner than a heartbeat interval after the last write.
"""

from __future__ import annotations

import functools
from typing import Any

import httpx2
import pytest
import trio
import trio.testing

import gateway
from conftest import make_settings
from gateway.keys import ApiKey, digest
from gateway.keys.stores import MemoryKeys
from scripted_backend import SCENARIOS, WAIT_RELEASE, chunk, usage_chunk

ALICE = "sk-test-alice-0123456789"
INTERVAL = 0.25  # the heartbeat interval: a keep-alive after this long without a write


async def _start(nursery: trio.Nursery, backend: Any) -> tuple[str, Any]:
    keys = MemoryKeys()
    await keys.put(ApiKey(name="alice", id="key_alice", digest=digest(ALICE), created_at=0.0))
    settings = make_settings(backend.url, heartbeat_interval=INTERVAL)
    app = gateway.create_app(settings, keys=keys)
    url = await nursery.start(functools.partial(gateway.serve, settings, app=app))
    return url, app.shared.heartbeats


class Reader:
    """A streamed body read frame by frame (frames end with a blank line)."""

    def __init__(self, response: httpx2.Response) -> None:
        self._chunks = response.aiter_bytes()
        self._buffer = b""

    async def until(self, wanted: bytes, count: int = 1) -> None:
        """Read until `wanted` has begun `count` frames."""
        seen = 0
        while True:
            while b"\n\n" in self._buffer:
                frame, self._buffer = self._buffer.split(b"\n\n", 1)
                seen += wanted in frame
                if seen >= count:
                    return
            self._buffer += await self._chunks.__anext__()

    async def rest(self) -> None:
        async for _ in self._chunks:
            pass


async def test_an_open_stream_is_listed_with_its_transport_route_key_age_and_silences_until_it_ends(
    nursery, backend, client, monkeypatch
):
    monkeypatch.setitem(
        SCENARIOS,
        "pause-twice",
        [
            chunk({"role": "assistant", "content": ""}),
            chunk({"content": "Hello"}),
            WAIT_RELEASE,
            chunk({"content": ", world"}),
            WAIT_RELEASE,
            chunk(finish="stop"),
            usage_chunk(),
            b"[DONE]",
        ],
    )
    url, heartbeats = await _start(nursery, backend)
    body = {"model": "pause-twice", "input": "hi", "stream": True}
    with trio.fail_after(20):
        async with client.stream("POST", url + "/v1/responses", json=body, headers={"authorization": f"Bearer {ALICE}"}) as r:
            reader = Reader(r)
            await reader.until(b'"delta":"Hello"')
            (listed,) = heartbeats.open_streams()
            assert (listed.transport, listed.route, listed.model, listed.key) == ("sse", "/v1/responses", "pause-twice", "alice")
            assert listed.events >= 3  # created, in_progress, ... the first delta
            now = trio.current_time()
            (at_now,), (later,) = heartbeats.open_streams(now=now), heartbeats.open_streams(now=now + 5)
            assert later.age == pytest.approx(at_now.age + 5) and later.silence == pytest.approx(at_now.silence + 5)

            # The backend is silent: the gateway's keep-alives reach the client, but they end no silence.
            await reader.until(b": keep-alive", count=2)
            (quiet,) = heartbeats.open_streams()
            assert quiet.silence >= 2 * INTERVAL and quiet.longest_silence >= quiet.silence
            assert quiet.events == listed.events  # keep-alives are not events

            first, backend.release = backend.release, trio.Event()  # the second pause waits on a new event
            first.set()
            await reader.until(b'"delta":", world"')
            (spoke,) = heartbeats.open_streams()
            assert spoke.silence < quiet.silence  # it spoke since
            assert spoke.longest_silence >= quiet.silence  # the gap it ended is kept
            assert spoke.events > quiet.events and spoke.age > quiet.age

            backend.release.set()
            await reader.rest()
        await trio.testing.wait_all_tasks_blocked()  # (the gateway's last steps after the body went out)
        assert heartbeats.open_streams() == []


async def test_messages_streams_and_relayed_chat_completions_are_listed_by_their_transport(nursery, backend, client):
    url, heartbeats = await _start(nursery, backend)
    headers = {"authorization": f"Bearer {ALICE}"}
    messages = {"model": "text-then-wait", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    chat = {"model": "text-then-wait", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with trio.fail_after(20):
        async with (
            client.stream("POST", url + "/v1/messages", json=messages, headers=headers) as anthropic,
            client.stream("POST", url + "/v1/chat/completions", json=chat, headers=headers) as relayed,
        ):
            first, second = Reader(anthropic), Reader(relayed)
            await first.until(b"Hello")
            await second.until(b"Hello")
            listed = {(s.transport, s.route, s.model, s.key) for s in heartbeats.open_streams()}
            assert listed == {
                ("messages", "/v1/messages", "text-then-wait", "alice"),
                ("relay", "/v1/chat/completions", "text-then-wait", "alice"),
            }
            assert all(s.events >= 1 and s.age >= s.silence >= 0 for s in heartbeats.open_streams())
            backend.release.set()
            await first.rest()
            await second.rest()
        await trio.testing.wait_all_tasks_blocked()
        assert heartbeats.open_streams() == []


async def test_a_stream_whose_client_left_is_no_longer_listed(nursery, backend, client):
    url, heartbeats = await _start(nursery, backend)
    body = {"model": "text-then-wait", "input": "hi", "stream": True}
    with trio.fail_after(20):
        async with client.stream("POST", url + "/v1/responses", json=body, headers={"authorization": f"Bearer {ALICE}"}) as r:
            await Reader(r).until(b'"delta":"Hello"')
            assert len(heartbeats.open_streams()) == 1
        await backend.client_left.wait()  # the gateway let go of the backend: the stream is over
        await trio.testing.wait_all_tasks_blocked()
        assert heartbeats.open_streams() == []


async def test_a_websocket_connection_is_listed_with_its_model_and_events_while_it_is_open(nursery, backend):
    from test_websocket import aconnect_ws, turn

    url, heartbeats = await _start(nursery, backend)
    with trio.fail_after(20):
        async with aconnect_ws(url + "/v1/responses", headers={"authorization": f"Bearer {ALICE}"}) as ws:
            events = await turn(ws, model="text", input="hi")
            (listed,) = heartbeats.open_streams()
            assert (listed.transport, listed.route, listed.model, listed.key) == ("websocket", "/v1/responses", "text", "alice")
            assert listed.events == len(events) and listed.age >= listed.silence >= 0
        await trio.testing.wait_all_tasks_blocked()
        assert heartbeats.open_streams() == []
