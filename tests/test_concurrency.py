"""Structured concurrency of one streamed response: heartbeats, disconnects, ownership."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import orjson
import trio
import trio.testing

from conftest import parse_sse
from gateway.turn.sealing import Sealer
from gateway.store import MemoryStore
from gateway.streams.chunks import ChunkDecoder
from gateway.transport.heartbeats import Heartbeats
from gateway.transport.sse import TurnEventStream
from gateway.turn import Resources, prepare_turn
from gateway.wire import parse_create_request
from scripted_backend import chunk

HEARTBEAT = b": keep-alive\n\n"


class ChannelBackend:
    """An in-memory ChatBackend driven by the test (for exact timing under a mock clock).

    The test sends SSE bytes; the stream decodes them into batches of chunks
    as the HTTP adapter does (one batch per message sent).
    """

    def __init__(self) -> None:
        self.answer = trio.Event()
        self.asked = trio.Event()  # a request reached it
        self.send, self.recv = trio.open_memory_channel[bytes](100)
        self.closed = trio.Event()

    @contextlib.asynccontextmanager
    async def open_chat_stream(self, body: dict[str, Any], headers: Any = None, native: Any = None) -> AsyncIterator[Any]:
        self.asked.set()
        try:
            await self.answer.wait()
            yield _DecodedChannel(self.recv)
        finally:
            self.closed.set()

    def open_passthrough(self, *args: Any) -> Any:  # pragma: no cover - not used here
        raise NotImplementedError


class _DecodedChannel:
    def __init__(self, recv: trio.MemoryReceiveChannel[bytes]) -> None:
        self._recv = recv
        self._decoder = ChunkDecoder()

    @property
    def saw_done(self) -> bool:
        return self._decoder.saw_done

    def __aiter__(self) -> _DecodedChannel:
        return self

    async def __anext__(self) -> list[Any]:
        while not self._decoder.finished:
            try:
                data = await self._recv.receive()
            except trio.EndOfChannel:
                raise StopAsyncIteration from None
            batch = self._decoder.decode(data)
            if batch:
                return batch
        raise StopAsyncIteration


async def make_body(backend: ChannelBackend, interval: float, nursery: trio.Nursery) -> TurnEventStream:
    from conftest import SequentialIds, make_settings

    settings = make_settings("http://127.0.0.1:9", heartbeat_interval=interval)
    resources = Resources(
        settings=settings,
        backend=backend,  # type: ignore[arg-type]
        store=MemoryStore(),
        mcp=None,
        sealer=Sealer("test"),
        clock=lambda: 0.0,
        ids=SequentialIds(),
    )
    turn = await prepare_turn(resources, parse_create_request(b'{"model":"m","input":"hi"}'), transport="sse")
    heartbeats = Heartbeats(interval)
    await nursery.start(heartbeats.run)
    return TurnEventStream(turn, heartbeats=heartbeats)


async def test_heartbeats_start_before_the_backend_answers_and_repeat_each_silent_interval(autojump_clock, nursery):
    backend = ChannelBackend()
    body = await make_body(backend, interval=2.0, nursery=nursery)
    writes: list[tuple[float, bytes]] = []
    start = trio.current_time()

    async def write(body: TurnEventStream) -> None:
        status, headers = await body.head()
        assert status == 200 and headers["content-type"].startswith("text/event-stream")
        async for data in body:
            writes.append((trio.current_time() - start, data))
            if len([d for _, d in writes if d == HEARTBEAT]) == 3:
                backend.answer.set()
                await backend.send.send(b"data: " + orjson.dumps(chunk({"content": "late"})) + b"\n\n")
                await backend.send.send(b"data: [DONE]\n\n")

    await body.serve(write)
    times = [t for t, _ in writes]
    # The stream commits (created + in_progress) after half an interval with no
    # answer, then a heartbeat follows every further interval of silence.
    assert b"response.created" in writes[0][1] and times[0] == 1.0
    assert [t for t, d in writes if d == HEARTBEAT] == [3.0, 5.0, 7.0]
    assert max(b - a for a, b in zip([0.0, *times], times)) <= 2.0
    assert b"response.completed" in b"".join(d for _, d in writes)
    assert writes[-1][1].endswith(b"data: [DONE]\n\n")


async def test_no_heartbeat_while_events_keep_flowing(autojump_clock, nursery):
    backend = ChannelBackend()
    backend.answer.set()
    body = await make_body(backend, interval=2.0, nursery=nursery)
    seen: list[bytes] = []

    async def write(body: TurnEventStream) -> None:
        await body.head()
        async for data in body:
            seen.append(data)
            if len(seen) < 6:
                await trio.sleep(1.5)
                await backend.send.send(b"data: " + orjson.dumps(chunk({"content": "x"})) + b"\n\n")
            elif len(seen) == 6:
                await backend.send.send(b"data: [DONE]\n\n")

    await body.serve(write)
    assert HEARTBEAT not in seen


async def test_leaving_the_body_early_cancels_the_backend_call(autojump_clock, nursery):
    backend = ChannelBackend()
    backend.answer.set()
    body = await make_body(backend, interval=5.0, nursery=nursery)

    async def write(body: TurnEventStream) -> None:
        await body.head()
        async for data in body:
            break  # the send loop stops, as an HTTP layer does when its client is gone

    with trio.fail_after(5):
        await body.serve(write)
    assert backend.closed.is_set()


async def test_the_turn_reaches_its_backend_before_the_send_loop_takes_its_first_step(autojump_clock, nursery):
    backend = ChannelBackend()
    body = await make_body(backend, interval=5.0, nursery=nursery)
    asked_first: list[bool] = []

    async def write(body: TurnEventStream) -> None:
        asked_first.append(backend.asked.is_set())  # the turn runs in serve's own task, ahead of this one
        backend.answer.set()
        await backend.send.send(b"data: [DONE]\n\n")
        async for _ in body:
            pass

    await body.serve(write)
    assert asked_first == [True]


async def test_client_disconnect_closes_the_upstream_request(gateway_url, backend):
    async with httpx2.AsyncClient(timeout=10) as http:
        async with http.stream(
            "POST", gateway_url + "/v1/responses", json={"model": "hang", "input": "hi", "stream": True}
        ) as r:
            async for data in r.aiter_raw():
                if b"response.output_text.delta" in data:
                    break
            assert not backend.client_left.is_set()
            left_at = trio.current_time()
    with trio.fail_after(2):
        await backend.client_left.wait()
    assert backend.client_left_at is not None
    print(f"disconnect -> upstream closed: {(backend.client_left_at - left_at) * 1000:.1f} ms")


async def test_heartbeat_comments_reach_the_client_before_the_first_token(start_gateway, backend):
    url = await start_gateway(heartbeat_interval=0.1)
    raw = b""
    async with httpx2.AsyncClient(timeout=10) as http:
        with trio.fail_after(10):
            async with http.stream(
                "POST", url + "/v1/responses", json={"model": "slow-first-token", "input": "hi", "stream": True}
            ) as r:
                assert r.status_code == 200
                async for data in r.aiter_raw():
                    raw += data
                    if raw.count(HEARTBEAT) >= 2 and not backend.release.is_set():
                        assert b"output_text.delta" not in raw
                        backend.release.set()
    frames = parse_sse(raw)
    assert frames[-1] == "[DONE]" and frames[-2]["type"] == "response.completed"
    assert frames[-2]["response"]["output"][0]["content"][0]["text"] == "Finally"


async def test_streams_proceed_concurrently(gateway_url, backend):
    # Ten streams held open by a backend that waits: all start before any finishes.
    results: list[bytes] = []

    async def one(http: httpx2.AsyncClient) -> None:
        r = await http.post(gateway_url + "/v1/responses", json={"model": "slow-first-token", "input": "x", "stream": True})
        results.append(r.content)

    async with httpx2.AsyncClient(timeout=10) as http:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                for _ in range(10):
                    nursery.start_soon(one, http)
                await backend.wait_for(lambda: len(backend.chat_requests) == 10)
                assert results == []
                backend.release.set()
    assert len(results) == 10 and all(b"response.completed" in r for r in results)


async def test_events_already_queued_are_coalesced_into_one_write(autojump_clock, nursery):
    backend = ChannelBackend()
    for n in range(50):
        backend.send.send_nowait(b"data: " + orjson.dumps(chunk({"content": f"t{n}"})) + b"\n\n")
    backend.send.send_nowait(b"data: [DONE]\n\n")
    backend.answer.set()
    body = await make_body(backend, interval=5.0, nursery=nursery)
    writes: list[bytes] = []

    async def write(body: TurnEventStream) -> None:
        await body.head()
        await trio.testing.wait_all_tasks_blocked()  # let the producers queue everything
        async for data in body:
            writes.append(data)

    await body.serve(write)
    frames = parse_sse(b"".join(writes))
    assert len(frames) > 50 and frames[-1] == "[DONE]"
    assert len(writes) < 5


def test_framework_response_timeouts_are_off():
    from conftest import make_settings
    from gateway import create_app

    app = create_app(make_settings("http://127.0.0.1:9"))
    assert app.config["RESPONSE_TIMEOUT"] is None


async def test_a_finished_body_is_not_kept_alive_by_the_heartbeat_wheel(autojump_clock, nursery):
    # The wheel drops a stream's entry only when its slot comes up, an interval
    # later; the finished response (all its events) must not live that long.
    import gc
    import weakref

    backend = ChannelBackend()
    backend.answer.set()
    body = await make_body(backend, interval=60.0, nursery=nursery)
    wheel = body._heartbeats._wheel

    async def write(body: TurnEventStream) -> None:
        await body.head()
        await backend.send.send(b"data: " + orjson.dumps(chunk({"content": "x"})) + b"\n\n")
        await backend.send.send(b"data: [DONE]\n\n")
        async for _ in body:
            pass

    await body.serve(write)
    assert sum(len(slot) for slot in wheel.values()) == 1  # its slot has not come up yet
    finished = weakref.ref(body)
    del body
    gc.collect()
    assert finished() is None
