"""The process's one heartbeat ticker, and the bound on clients that stop reading."""

from __future__ import annotations

import functools
import socket

import orjson
import pytest
import trio

import gateway
from conftest import make_settings
from gateway.lab.simulator import SimConfig, Simulator
from gateway.transport.heartbeats import Heartbeats


class Quiet:
    """A stream as the ticker sees it: beats when `interval` passed since its last write."""

    def __init__(self, interval: float, start: float) -> None:
        self.interval = interval
        self.last_write = start
        self.beats: list[float] = []
        self.over = False

    def beat(self, now: float, stall_timeout: float) -> float | None:
        if self.over:
            return None
        due = self.last_write + self.interval
        if now < due:
            return due
        self.beats.append(now)
        self.last_write = now
        return now + self.interval


async def test_one_ticker_keeps_thousands_of_quiet_streams_within_a_sixteenth_of_the_interval(autojump_clock, nursery):
    heartbeats = Heartbeats(2.0)
    await nursery.start(heartbeats.run)
    streams = []
    for n in range(5000):  # arriving over 10 s, as a load test ramps up
        if n % 500 == 0:
            await trio.sleep(1.0)
        stream = Quiet(2.0, trio.current_time())
        heartbeats.add(stream, stream.last_write + 2.0)
        streams.append((trio.current_time(), stream))
    busy = Quiet(2.0, trio.current_time())
    heartbeats.add(busy, busy.last_write + 2.0)
    for _ in range(20):  # a stream that keeps writing is never beaten
        await trio.sleep(0.5)
        busy.last_write = trio.current_time()
    busy_beats = len(busy.beats)
    end = trio.current_time()
    for start, stream in streams:
        times = [start, *stream.beats]
        gaps = [b - a for a, b in zip(times, times[1:])]
        assert gaps and max(gaps) <= 2.0 * 1.0625 and end - times[-1] <= 2.0 * 1.0625
    assert busy_beats == 0
    for _, stream in streams:
        stream.over = True
    busy.over = True
    await trio.sleep(4.0)
    assert not any(heartbeats._wheel.values())  # streams that are over leave the wheel


@pytest.mark.parametrize("tokens", [200000, 3000])  # the turn still producing; the turn over, its end queued
async def test_a_client_that_stops_reading_has_its_stream_closed_after_the_stall_bound(nursery, tokens):
    import logging

    gave_up = trio.Event()

    class Watch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "stopped reading" in record.getMessage():
                gave_up.set()

    watch = Watch()
    logger = logging.getLogger("gateway")
    level = logger.level
    logger.addHandler(watch)
    logger.setLevel(logging.INFO)
    simulator = Simulator(SimConfig())
    sim_url = await nursery.start(simulator.serve)
    settings = make_settings(sim_url, client_stall_timeout=0.5, heartbeat_interval=0.2)
    url = await nursery.start(functools.partial(gateway.serve, settings))
    body = orjson.dumps({"model": f"sim:tokens={tokens}", "input": "go", "stream": True})
    sock = trio.socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # small buffers fill fast
    await sock.connect(("127.0.0.1", int(url.rsplit(":", 1)[1])))
    head = b"POST /v1/responses HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
    await sock.send(head % len(body) + body)
    seen = 0
    try:
        with trio.fail_after(30):
            await gave_up.wait()  # the client has read nothing, and the gateway gave up on it
            try:  # what was buffered, then the connection's end (or a reset)
                while data := await sock.recv(65536):
                    seen += len(data)
            except ConnectionResetError:
                pass
    finally:
        logger.removeHandler(watch)
        logger.setLevel(level)
        sock.close()
    assert 0 < seen < tokens * 100  # a beginning, far from the whole: the stream was cut
