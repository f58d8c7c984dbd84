"""The load generator measures streams from scripted servers and the gateway on loopback, precisely and cheaply."""

from __future__ import annotations

import argparse
import functools
import gc
import html
import itertools
import os
import json
import pathlib
import platform
import re
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
import psutil
import pytest
import trio
from hypercorn.config import Config
from hypercorn.trio import serve

import gateway
from conftest import make_settings
from gateway.lab import loadtest
from gateway.lab.loadtest import (
    ChunkedDecoder,
    LoadConfig,
    ProcessSampler,
    RequestResult,
    add_arguments,
    main,
    render_html,
    run_load,
)
from gateway.lab.loadtest.collector import LOADER_GC_THRESHOLDS, quiet_collector
from gateway.lab.loadtest.config import DEFAULT_MAX_TOKENS
from gateway.lab.loadtest.failures import body_failure
from gateway.lab.loadtest.frames import TERMINAL_NAMES
from gateway.lab.loadtest.progress import progress_line
from gateway.lab.simulator import SimConfig, Simulator

ROOT = pathlib.Path(__file__).parent.parent
Send = Callable[[dict[str, Any]], Awaitable[None]]


def responses_event(type_: str, **fields: Any) -> bytes:
    return b"event: " + type_.encode() + b"\ndata: " + orjson.dumps({"type": type_, **fields}) + b"\n\n"


def chat_chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "m", "choices": [choice], **extra}
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


HEARTBEAT = b": keep-alive\n\n"
DONE = b"data: [DONE]\n\n"
CREATED = responses_event("response.created", response={"id": "resp_1", "status": "in_progress"})
DELTAS = [responses_event("response.output_text.delta", delta=text) for text in ("Hel", "lo", " there")]
COMPLETED = responses_event("response.completed", response={"id": "resp_1", "status": "completed"})

# Each scenario: the body, one ASGI message per item; HANG waits until the test ends.
HANG = object()
RESPONSES_SCENARIOS: dict[str, list[Any]] = {
    "sim": [HEARTBEAT, CREATED, *DELTAS, COMPLETED, DONE],
    "truncated": [CREATED, DELTAS[0]],
    "failed": [CREATED, responses_event("error", code="server_error"), responses_event("response.failed"), DONE],
    "hang": [CREATED, HANG],
}
CHAT_SCENARIO = [
    chat_chunk({"role": "assistant", "content": ""}),
    HEARTBEAT,
    chat_chunk({"content": "Hel"}),
    chat_chunk({"content": "lo"}),
    chat_chunk({}, "stop"),
    b'data: {"id":"chatcmpl-1","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\n',
    DONE,
]


def messages_event(type_: str, **fields: Any) -> bytes:
    return b"event: " + type_.encode() + b"\ndata: " + orjson.dumps({"type": type_, **fields}) + b"\n\n"


PING = messages_event("ping")
MESSAGE_START = messages_event("message_start", message={"id": "msg_1", "type": "message", "content": []})
TEXT_START = messages_event("content_block_start", index=0, content_block={"type": "text", "text": ""})
TEXT_DELTAS = [
    messages_event("content_block_delta", index=0, delta={"type": "text_delta", "text": text})
    for text in ('He said "text_delta"', "lo")  # the name inside the text is escaped: still one text delta each
]
TOOL_DELTA = messages_event(
    "content_block_delta", index=1, delta={"type": "input_json_delta", "partial_json": '{"a": "text_delta"'}
)
MESSAGE_TAIL = [
    messages_event("content_block_stop", index=0),
    messages_event("message_delta", delta={"stop_reason": "end_turn"}, usage={"output_tokens": 2}),
]
MESSAGE_STOP = messages_event("message_stop")
MESSAGES_SCENARIOS: dict[str, list[Any]] = {
    "sim": [PING, MESSAGE_START, TEXT_START, TEXT_DELTAS[0], HEARTBEAT, TEXT_DELTAS[1], *MESSAGE_TAIL, MESSAGE_STOP],
    "thinking": [
        MESSAGE_START,
        messages_event("content_block_delta", index=0, delta={"type": "thinking_delta", "thinking": "hmm"}),
        TOOL_DELTA,
        *MESSAGE_TAIL,
        MESSAGE_STOP,
    ],
    "truncated": [MESSAGE_START, TEXT_START, TEXT_DELTAS[0]],
    "failed": [
        MESSAGE_START,
        TEXT_DELTAS[0],
        messages_event("error", error={"type": "overloaded_error", "message": "Overloaded"}),
    ],
}
RESPONSES_EVENTS = 5  # created, three deltas, completed
CHAT_EVENTS = 5  # role, two content chunks, finish, usage
MESSAGES_EVENTS = 7  # message_start, content_block_start, two deltas, content_block_stop, message_delta, message_stop


@dataclass
class ScriptedSSEServer:
    """A raw ASGI app: the model name picks the scenario; it records who connected and what."""

    url: str = ""
    clients: set[tuple[str, int]] = field(default_factory=set)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[bytes, bytes]] = field(default_factory=list)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        self.clients.add(tuple(scope["client"]))
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        body = orjson.loads(raw)
        self.bodies.append(body)
        self.headers.append(dict(scope["headers"]))
        if body["model"] == "error500":
            payload = orjson.dumps({"error": {"message": "boom", "type": "server_error"}})
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
            await send({"type": "http.response.start", "status": 500, "headers": headers})
            await send({"type": "http.response.body", "body": payload})
            return
        if scope["path"] == "/v1/chat/completions":
            script = CHAT_SCENARIO
        elif scope["path"] == "/v1/messages":
            script = MESSAGES_SCENARIOS[body["model"]]
        else:
            script = RESPONSES_SCENARIOS[body["model"]]
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        for item in script:
            if item is HANG:
                await trio.sleep_forever()
            await send({"type": "http.response.body", "body": item, "more_body": True})
        await send({"type": "http.response.body", "body": b""})


@pytest.fixture
async def server(nursery: trio.Nursery) -> ScriptedSSEServer:
    app = ScriptedSSEServer()
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.graceful_timeout = 0.1
    binds = await nursery.start(functools.partial(serve, app, config, mode="asgi"))
    app.url = binds[0]
    return app


async def run(server: ScriptedSSEServer, **options: Any) -> loadtest.LoadReport:
    with trio.fail_after(10):
        return await run_load(LoadConfig(url=server.url, **options))


# ---------------------------------------------------------------------------------------------
# The load generator's own collector


async def test_a_run_keeps_the_collector_quiet_while_it_measures_and_restores_it_after(
    server: ScriptedSSEServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    before, frozen_before = gc.get_threshold(), gc.get_freeze_count()
    seen: list[tuple[int, int, int]] = []
    serve = ScriptedSSEServer.__call__

    async def noting(self: ScriptedSSEServer, scope: dict[str, Any], receive: Any, send: Send) -> None:
        if scope["type"] == "http":  # the server shares the process: it sees the run's collector
            seen.append(gc.get_threshold())
        await serve(self, scope, receive, send)

    monkeypatch.setattr(ScriptedSSEServer, "__call__", noting)
    report = await run(server, requests=3)

    assert report.requests_completed == 3 and before != LOADER_GC_THRESHOLDS
    assert seen == [LOADER_GC_THRESHOLDS] * 3
    # Restored after; the program's own frozen objects were never touched.
    assert (gc.get_threshold(), gc.get_freeze_count()) == (before, frozen_before)


def test_overlapping_runs_settle_the_collector_once_and_the_last_to_end_restores_it() -> None:
    before = gc.get_threshold()
    with quiet_collector():
        with quiet_collector():
            assert gc.get_threshold() == LOADER_GC_THRESHOLDS
        assert gc.get_threshold() == LOADER_GC_THRESHOLDS  # the first run still measures
    assert gc.get_threshold() == before


# ---------------------------------------------------------------------------------------------
# Streams and their measurements


async def test_a_responses_stream_is_measured_event_by_event(server: ScriptedSSEServer) -> None:
    report = await run(server, requests=6, concurrency=2)

    assert (report.requests_completed, report.requests_failed) == (6, 0)
    assert report.errors == {}
    assert report.status_codes == {"200": 6}
    assert report.terminals == {"response.completed": 6}
    assert report.events_total == 6 * RESPONSES_EVENTS
    assert report.heartbeats_total == 6
    assert report.inter_event_gap_ms.count == 6 * (RESPONSES_EVENTS - 1)
    assert report.throughput_rps > 0
    for result in report.requests:
        assert result.ok and result.saw_done and result.heartbeats == 1
        assert 0 <= result.started < result.ended <= report.wall_seconds
        assert result.time_to_first_byte is not None
        assert result.time_to_first_event is not None
        assert result.time_to_first_text is not None
        assert result.total is not None
        assert 0 < result.time_to_first_byte <= result.time_to_first_event
        assert result.time_to_first_event <= result.time_to_first_text <= result.total
        assert len(result.gaps) == RESPONSES_EVENTS - 1 and min(result.gaps) >= 0
        assert result.longest_silence is not None and 0 < result.longest_silence <= result.total
    for dist in (report.time_to_first_event_ms, report.time_to_first_text_ms, report.total_latency_ms):
        assert dist.count == 6
        assert dist.p50 is not None and dist.p90 is not None and dist.p99 is not None and dist.max is not None
        assert 0 < dist.p50 <= dist.p90 <= dist.p99 <= dist.max
    assert server.bodies[0] == {"model": "sim", "input": loadtest.DEFAULT_INPUT, "stream": True}


async def test_a_chat_stream_is_measured_for_the_direct_baseline(server: ScriptedSSEServer) -> None:
    report = await run(server, api="chat", requests=3, max_output_tokens=7, input="hi")

    assert (report.requests_completed, report.requests_failed) == (3, 0)
    assert report.events_total == 3 * CHAT_EVENTS
    assert report.heartbeats_total == 3
    for result in report.requests:
        assert result.time_to_first_event is not None and result.time_to_first_text is not None
        assert result.total is not None
        assert result.time_to_first_event <= result.time_to_first_text <= result.total
    assert server.bodies[0] == {
        "model": "sim",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 7,
    }


async def test_a_messages_stream_is_measured_by_anthropics_events(server: ScriptedSSEServer) -> None:
    report = await run(server, api="messages", requests=4, concurrency=2, input="hi")

    assert (report.requests_completed, report.requests_failed) == (4, 0)
    assert report.terminals == {"message_stop": 4}
    assert report.events_total == 4 * MESSAGES_EVENTS  # `ping` is a keep-alive, not an event
    assert report.heartbeats_total == 4 * 2  # a ping and a comment each
    assert report.config["path"] == "/v1/messages"
    for result in report.requests:
        assert result.ok and not result.saw_done
        assert result.time_to_first_event is not None and result.time_to_first_text is not None
        assert result.total is not None
        assert result.time_to_first_event <= result.time_to_first_text <= result.total
        assert len(result.gaps) == MESSAGES_EVENTS - 1
    assert server.bodies[0] == {
        "model": "sim",
        "max_tokens": DEFAULT_MAX_TOKENS,  # required by the Messages API
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
    }
    assert server.headers[0][b"anthropic-version"] == b"2023-06-01"
    await run(server, api="messages", requests=1, max_output_tokens=9)
    assert server.bodies[-1]["max_tokens"] == 9


async def test_only_a_text_delta_is_a_messages_text_event(server: ScriptedSSEServer) -> None:
    report = await run(server, api="messages", model="thinking", requests=1)

    [result] = report.requests
    assert result.ok and result.events == 6  # start, thinking, tool JSON, block stop, message delta, stop
    assert result.time_to_first_text is None  # a thinking delta and a tool's JSON delta carry no text


@pytest.mark.parametrize(
    ("api", "model", "kind"),
    [
        ("responses", "error500", "http_status"),
        ("responses", "truncated", "no_terminal"),
        ("responses", "failed", "failed_event"),
        ("messages", "error500", "http_status"),
        ("messages", "truncated", "no_terminal"),
        ("messages", "failed", "failed_event"),
    ],
)
async def test_a_failing_endpoint_is_counted_under_its_error_kind(
    server: ScriptedSSEServer, api: str, model: str, kind: str
) -> None:
    report = await run(server, api=api, model=model, requests=3, concurrency=1)

    assert (report.requests_completed, report.requests_failed) == (0, 3)
    assert report.errors == {kind: 3}
    assert kind in report.error_examples
    assert report.total_latency_ms.count == 0
    # The body was read to its end, so even a failed response leaves the connection reusable.
    assert report.connections_opened == 1


async def test_a_messages_stream_names_its_missing_terminal_and_its_failure_by_anthropics_error_type(
    server: ScriptedSSEServer,
) -> None:
    truncated = await run(server, api="messages", model="truncated", requests=1)
    failed = await run(server, api="messages", model="failed", requests=1)

    assert truncated.error_examples == {"no_terminal": "the stream ended without message_stop"}
    assert failed.failures == {"failed_event overloaded_error": 1}
    assert failed.failure_examples["failed_event overloaded_error"] == "Overloaded"


async def test_an_http_error_keeps_its_status_code(server: ScriptedSSEServer) -> None:
    report = await run(server, model="error500", requests=2)

    assert report.status_codes == {"500": 2}
    assert report.error_examples["http_status"].startswith("500")


async def test_a_stalled_stream_times_out_and_its_silence_is_recorded(server: ScriptedSSEServer) -> None:
    # The timeout must leave room for the first event on a busy CI host (a run there once took
    # more than 0.3 s to see the head); the stream's end is the timeout, not the server.
    report = await run(server, model="hang", requests=1, timeout=2.0)

    assert report.errors == {"timeout": 1}
    [result] = report.requests
    assert result.events == 1
    assert result.ended - result.started >= 2.0  # it ended at the timeout
    assert result.longest_silence is not None and result.longest_silence > 0
    assert report.longest_silence_max_ms is not None and report.longest_silence_max_ms > 0


async def test_a_refused_connection_is_a_connect_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with trio.fail_after(10):
        report = await run_load(LoadConfig(url=f"http://127.0.0.1:{port}", requests=2))

    assert report.errors == {"connect": 2}
    assert report.requests_completed == 0


# ---------------------------------------------------------------------------------------------
# The gateway's own streams, from the simulator through a real gateway on loopback

SIM_TOKENS = 5
# message_start, content_block_start, a text delta per token, content_block_stop, message_delta, message_stop
GATEWAY_MESSAGES_EVENTS = SIM_TOKENS + 5
# created, in_progress, output_item.added, content_part.added, a delta per token, output_text.done,
# content_part.done, output_item.done, completed
GATEWAY_RESPONSES_EVENTS = SIM_TOKENS + 8


async def test_the_gateways_messages_stream_is_counted_as_its_responses_stream_is(nursery: trio.Nursery) -> None:
    simulator = Simulator(SimConfig(tokens=SIM_TOKENS))
    sim_url = await nursery.start(simulator.serve)
    # Pings and comments every 50 ms: a first token after 300 ms is preceded by some.
    url = await nursery.start(functools.partial(gateway.serve, make_settings(sim_url, heartbeat_interval=0.05)))
    with trio.fail_after(30):
        messages = await run_load(LoadConfig(url=url, api="messages", requests=6, concurrency=2))
        responses = await run_load(LoadConfig(url=url, api="responses", requests=6, concurrency=2))
        slow = await run_load(LoadConfig(url=url, api="messages", model="sim:ttft=0.3", requests=2, concurrency=2))

    for report, terminal, events in (
        (messages, "message_stop", GATEWAY_MESSAGES_EVENTS),
        (responses, "response.completed", GATEWAY_RESPONSES_EVENTS),
        (slow, "message_stop", GATEWAY_MESSAGES_EVENTS),
    ):
        assert (report.requests_completed, report.requests_failed) == (len(report.requests), 0), report.failure_examples
        assert report.terminals == {terminal: len(report.requests)}
        assert report.events_per_response == events
        for result in report.requests:
            assert result.time_to_first_event is not None and result.time_to_first_text is not None
            assert result.time_to_first_event <= result.time_to_first_text
    assert all(result.heartbeats >= 1 for result in slow.requests)  # Anthropic's pings: keep-alives, not events


# ---------------------------------------------------------------------------------------------
# Connections


async def test_a_worker_keeps_its_connection_alive_between_requests(server: ScriptedSSEServer) -> None:
    report = await run(server, requests=8, concurrency=2)

    assert report.requests_completed == 8
    assert len(server.clients) == 2 < len(server.bodies) == 8
    assert report.connections_opened == 2
    assert sum(result.new_connection for result in report.requests) == 2


async def test_a_connection_the_server_closed_after_a_response_is_replaced(nursery: trio.Nursery) -> None:
    # Like llama.cpp after a stream: a content-length response, then close, without `connection: close`.
    body = b"".join([CREATED, *DELTAS, COMPLETED, DONE])
    response = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
    accepted = 0

    async def handle(stream: trio.SocketStream) -> None:
        nonlocal accepted
        accepted += 1
        received = b""
        while b"\r\n\r\n" not in received:
            received += await stream.receive_some(65536)
        await stream.send_all(response)
        await stream.aclose()

    listeners = await nursery.start(functools.partial(trio.serve_tcp, handle, 0, host="127.0.0.1"))
    port = listeners[0].socket.getsockname()[1]
    with trio.fail_after(10):
        report = await run_load(LoadConfig(url=f"http://127.0.0.1:{port}", requests=3))

    assert (report.requests_completed, report.requests_failed) == (3, 0)
    assert report.events_total == 3 * RESPONSES_EVENTS
    assert report.stale_connection_retries == 2
    assert report.connections_opened == accepted == 3


async def test_warmup_requests_are_sent_but_not_counted(server: ScriptedSSEServer) -> None:
    report = await run(server, requests=3, warmup=2, concurrency=2)

    assert report.requests_completed == 3
    assert len(server.bodies) == 5
    assert report.connections_opened == 0  # the warm-up opened both


async def test_a_duration_bounds_a_run_without_a_request_count(server: ScriptedSSEServer) -> None:
    report = await run(server, duration=0.2, concurrency=2)

    assert report.requests_completed > 0
    assert report.requests_failed == 0


# ---------------------------------------------------------------------------------------------
# Failures by kind, and the error rate that fails the command


def http_answer(status: int, body: bytes, content_type: bytes = b"application/json") -> bytes:
    head = b"HTTP/1.1 %d Error\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n" % (status, content_type, len(body))
    return head + body


def sse_head() -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def sse_answer(*frames: bytes) -> bytes:
    return sse_head() + b"".join(b"%x\r\n%s\r\n" % (len(frame), frame) for frame in frames) + b"0\r\n\r\n"


def openai_error(code: str, message: str, type_: str = "server_error") -> bytes:
    return orjson.dumps({"error": {"message": message, "type": type_, "code": code, "param": None}})


@dataclass(frozen=True)
class Cut:
    """An answer that stops after these bytes: the server closes the connection mid-response."""

    sent: bytes


OK = sse_answer(CREATED, *DELTAS, COMPLETED, DONE)
UNAVAILABLE = http_answer(503, openai_error("server_shutting_down", "The server is shutting down"))
RATE_LIMITED = http_answer(429, openai_error("rate_limit_exceeded", "Slow down", "requests"))
BAD_GATEWAY = http_answer(502, b"Bad Gateway", b"text/plain")
FAILED = sse_answer(
    CREATED,
    DELTAS[0],
    responses_event(
        "response.failed",
        response={"id": "resp_1", "status": "failed", "error": {"code": "server_error", "message": "The backend stopped"}},
    ),
    DONE,
)
RESET = Cut(sse_head() + b"%x\r\n%s\r\n" % (len(CREATED), CREATED))
# 20 requests, 7 of them failed: 35%.
MIXED_SCRIPT: list[bytes | Cut] = [
    OK, UNAVAILABLE, OK, FAILED, OK, OK, RATE_LIMITED, OK, UNAVAILABLE, OK,
    RESET, OK, OK, FAILED, OK, BAD_GATEWAY, OK, OK, OK, OK,
]  # fmt: skip
MIXED_FAILURES = [
    ("failed_event server_error", 2),
    ("http 503 server_shutting_down", 2),
    ("http 429 rate_limit_exceeded", 1),
    ("http 502", 1),
    ("reset", 1),
]


@dataclass
class ScriptedHTTPServer:
    """Raw HTTP/1.1 on a trio socket, kept alive: the n-th request anywhere gets the n-th answer
    of the script (cycling), so the counts of a run do not depend on which worker sent what."""

    script: list[bytes | Cut]
    url: str = ""
    served: int = 0

    async def handle(self, stream: trio.SocketStream) -> None:
        buffer = b""
        async with stream:
            while True:
                while b"\r\n\r\n" not in buffer:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    buffer += data
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                match = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
                assert match is not None
                length = int(match[1])
                while len(buffer) < length:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    buffer += data
                buffer = buffer[length:]
                answer = self.script[self.served % len(self.script)]
                self.served += 1
                if isinstance(answer, Cut):
                    await stream.send_all(answer.sent)
                    return  # closes the connection inside the chunked body
                await stream.send_all(answer)


async def serve_script(nursery: trio.Nursery, script: list[bytes | Cut]) -> ScriptedHTTPServer:
    server = ScriptedHTTPServer(script)
    listeners = await nursery.start(functools.partial(trio.serve_tcp, server.handle, 0, host="127.0.0.1"))
    server.url = "http://127.0.0.1:%d" % listeners[0].socket.getsockname()[1]
    return server


async def run_main(*argv: str) -> int:
    with trio.fail_after(10):
        # main() runs its own trio loop, so it gets a thread; the server stays in this loop.
        return await trio.to_thread.run_sync(main, parse_args(*argv))


async def test_failures_are_counted_by_status_error_code_and_transport_kind(nursery: trio.Nursery) -> None:
    server = await serve_script(nursery, MIXED_SCRIPT)
    with trio.fail_after(10):
        report = await run_load(LoadConfig(url=server.url, requests=20, concurrency=2))

    assert (report.requests_completed, report.requests_failed) == (13, 7)
    assert report.error_rate == 0.35
    assert list(report.failures.items()) == MIXED_FAILURES  # most frequent first
    assert report.errors == {"failed_event": 2, "http_status": 4, "read": 1}  # the coarse kinds stay
    assert report.status_codes == {"200": 16, "429": 1, "502": 1, "503": 2}
    examples = report.failure_examples
    assert list(examples) == [kind for kind, _ in MIXED_FAILURES]
    assert examples["http 503 server_shutting_down"] == "503: The server is shutting down"
    assert examples["failed_event server_error"] == "The backend stopped"
    assert examples["http 502"] == "502: Bad Gateway"
    assert "chunked body" in examples["reset"]
    assert sorted(r.code for r in report.requests if r.code) == [
        "rate_limit_exceeded", "server_error", "server_error", "server_shutting_down", "server_shutting_down",
    ]  # fmt: skip

    data = orjson.loads(report.to_json())
    assert list(data["failures"].items()) == MIXED_FAILURES
    assert data["failure_examples"] == examples
    summary = loadtest.format_summary(report)
    assert "failed by kind (7 of 20, 35.0%):" in summary
    for kind, n in MIXED_FAILURES:
        assert f"\n    {kind}: {n}" in summary
    errors = section(render_html(report), "<h2>Errors")
    for kind, n in MIXED_FAILURES:
        assert f"<tr><td>{kind}</td><td>{n}</td>" in errors


@pytest.mark.parametrize(
    ("threshold", "code"),
    [(None, 1), ("0", 1), ("0.34", 1), ("0.35", 0), ("0.5", 0)],
)
async def test_the_command_fails_when_more_requests_failed_than_the_max_error_rate(
    nursery: trio.Nursery, tmp_path: Any, capsys: pytest.CaptureFixture[str], threshold: str | None, code: int
) -> None:
    server = await serve_script(nursery, MIXED_SCRIPT)
    json_path = tmp_path / "report.json"
    limit = () if threshold is None else ("--max-error-rate", threshold)

    assert await run_main("--url", server.url, "-n", "20", "-c", "2", "--json", str(json_path), *limit) == code

    assert list(orjson.loads(json_path.read_bytes())["failures"].items()) == MIXED_FAILURES
    err = capsys.readouterr().err
    if code:
        assert err == f"gateway loadtest: 7 of 20 requests failed (35.0%), above --max-error-rate {threshold or 0}\n"
    else:
        assert "gateway loadtest" not in err


async def test_the_gateway_command_exits_with_the_verdict_and_says_why_on_stderr(nursery: trio.Nursery) -> None:
    server = await serve_script(nursery, MIXED_SCRIPT)
    argv = [sys.executable, "-m", "gateway", "loadtest", "--url", server.url, "-n", "20", "--max-error-rate", "0.1"]
    with trio.fail_after(30):
        done = await trio.run_process(
            argv, cwd=pathlib.Path(__file__).parent.parent, capture_stdout=True, capture_stderr=True, check=False
        )

    assert done.returncode == 1
    assert done.stderr.decode().splitlines()[-1] == (
        "gateway loadtest: 7 of 20 requests failed (35.0%), above --max-error-rate 0.1"
    )
    assert "    http 503 server_shutting_down: 2" in done.stdout.decode()


async def test_a_run_without_failures_passes_at_the_default_max_error_rate(
    server: ScriptedSSEServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await run_main("--url", server.url, "-n", "3") == 0
    assert "gateway loadtest" not in capsys.readouterr().err


async def test_failures_during_warm_up_do_not_count_against_the_max_error_rate(
    nursery: trio.Nursery, tmp_path: Any
) -> None:
    server = await serve_script(nursery, [UNAVAILABLE, UNAVAILABLE, OK, OK, OK])
    json_path = tmp_path / "report.json"

    assert await run_main("--url", server.url, "--warmup", "2", "-n", "3", "--json", str(json_path)) == 0

    assert server.served == 5
    data = orjson.loads(json_path.read_bytes())
    assert (data["requests_completed"], data["requests_failed"], data["failures"]) == (3, 0, {})


async def test_a_run_in_which_every_request_failed_fails_even_at_a_max_error_rate_of_1(
    nursery: trio.Nursery, capsys: pytest.CaptureFixture[str]
) -> None:
    server = await serve_script(nursery, [UNAVAILABLE])

    assert await run_main("--url", server.url, "-n", "2", "--max-error-rate", "1") == 1
    assert capsys.readouterr().err == "gateway loadtest: none of 2 requests succeeded\n"


@pytest.mark.parametrize("threshold", ["-0.1", "1.5", "nan"])
def test_a_max_error_rate_outside_0_to_1_is_refused_before_running(
    threshold: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(parse_args("--url", "http://127.0.0.1:1", "--max-error-rate", threshold)) == 2
    assert "--max-error-rate" in capsys.readouterr().err


async def test_an_error_body_beyond_the_capture_bound_is_read_to_its_end_but_not_parsed(nursery: trio.Nursery) -> None:
    huge = http_answer(503, openai_error("server_shutting_down", "x" * 100_000))
    server = await serve_script(nursery, [huge])
    with trio.fail_after(10):
        report = await run_load(LoadConfig(url=server.url, requests=2))

    # Truncated JSON has no code; the status still counts, and the connection stays usable.
    assert report.failures == {"http 503": 2}
    assert report.connections_opened == 1
    assert len(report.failure_examples["http 503"]) <= len("503: ") + 300


@pytest.mark.parametrize(
    ("classify", "frame", "code", "message"),
    [
        ("responses", responses_event("error", code="rate_limit_exceeded", message="Slow down", param=None),
         "rate_limit_exceeded", "Slow down"),
        ("responses", b'event: error\ndata: {"type":"error","error":{"code":"server_error","message":"Oops"}}\n\n',
         "server_error", "Oops"),
        ("responses", responses_event("response.failed", response={"error": {"code": "server_error", "message": "Gone"}}),
         "server_error", "Gone"),
        ("responses", b'data: {"type":"response.failed","response":{"error":{"code":"x","message":"y"}}}\n\n', "x", "y"),
        ("chat", b'data: {"error":{"message":"Overloaded","type":"server_error","code":"overloaded"}}\n\n',
         "overloaded", "Overloaded"),
        ("chat", b'event: error\ndata: {"error":{"message":"Later","code":429}}\n\n', "429", "Later"),
        ("chat", b'data: {"error":{"message":"No code","code":null}}\n\n', None, "No code"),
        ("messages", b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"Busy"}}\n\n',
         "overloaded_error", "Busy"),
        ("messages", b'event: error\ndata: {"type":"error","error":{"type":"api_error","code":"c1","message":"M"}}\n\n',
         "c1", "M"),
    ],
)  # fmt: skip
def test_an_error_frames_code_and_message_are_read_from_every_shape_servers_send(
    classify: str, frame: bytes, code: str | None, message: str
) -> None:
    classifier = CLASSIFIERS[classify]
    for body in (CREATED + frame, (CREATED + frame).replace(b"\n", b"\r\n")):
        scanner = loadtest._FrameScanner(classifier, 0.0)
        scanner.feed(body, 1.0)
        assert scanner.failed
        assert (scanner.error_code, scanner.error_message) == (code, message)


CLASSIFIERS = {
    "responses": loadtest._classify_responses,
    "chat": loadtest._classify_chat,
    "messages": loadtest._classify_messages,
}


def test_an_anthropic_error_body_is_counted_under_its_error_type() -> None:
    body = b'{"type":"error","error":{"type":"not_found_error","message":"no such model"},"request_id":"req_1"}'
    assert body_failure(body) == ("not_found_error", "no such model")


def test_the_first_error_code_of_a_stream_is_kept() -> None:
    scanner = loadtest._FrameScanner(loadtest._classify_responses, 0.0)
    scanner.feed(b'event: error\ndata: {"type":"error","message":"no code yet"}\n\n', 1.0)
    scanner.feed(responses_event("error", code="first", message="m1"), 2.0)
    scanner.feed(responses_event("response.failed", response={"error": {"code": "second", "message": "m2"}}), 3.0)

    assert (scanner.error_code, scanner.error_message) == ("first", "no code yet")


def test_a_servers_error_code_becomes_a_label_and_its_message_is_safe_to_print() -> None:
    body = orjson.dumps({"error": {"code": "bad code\n\x1b[31m" + "z" * 100, "message": "red\x1b[31m\nnext\u2028line"}})
    code, message = loadtest._error_fields(orjson.loads(body))

    assert code == "bad_code___31m" + "z" * 50
    assert message == "red\\x1b[31m\\nnext\\u2028line"
    result = RequestResult(status=503, error="http_status", code=code)
    assert result.failure_kind == f"http 503 {code}"
    for error, kind in (("read", "reset"), ("timeout", "timeout"), ("connect", "connect"), ("protocol", "protocol"),
                        ("no_terminal", "no_terminal"), ("failed_event", "failed_event")):  # fmt: skip
        assert RequestResult(status=200, error=error).failure_kind == kind
    assert RequestResult(status=200).failure_kind is None


# ---------------------------------------------------------------------------------------------
# Framing, decoded incrementally


def chunked(pieces: list[bytes]) -> bytes:
    out = b""
    for index, piece in enumerate(pieces):
        extension = b";name=value" if index == 1 else b""
        out += b"%x%s\r\n%s\r\n" % (len(piece), extension, piece)
    return out + b"0\r\nx-trailer: 1\r\n\r\n"


PAYLOAD_PIECES = [b"data: {\"a\":1}\n\n", b"x" * 300, b"\r\n\r\n", b"event: e\ndata: \xe2\x80\xa8\n\n"]
PAYLOAD = b"".join(PAYLOAD_PIECES)
ENCODED = chunked(PAYLOAD_PIECES)


def decode_in_parts(parts: list[bytes]) -> tuple[bytes, ChunkedDecoder]:
    decoder = ChunkedDecoder()
    body = b"".join(decoder.feed(part) for part in parts)
    return body, decoder


def test_the_chunked_decoder_reassembles_a_body_cut_at_every_position() -> None:
    for cut in range(len(ENCODED) + 1):
        body, decoder = decode_in_parts([ENCODED[:cut], ENCODED[cut:]])
        assert body == PAYLOAD, cut
        assert decoder.done and decoder.leftover == b"", cut


def test_the_chunked_decoder_reassembles_a_body_fed_byte_by_byte_and_in_three_parts() -> None:
    body, decoder = decode_in_parts([ENCODED[i : i + 1] for i in range(len(ENCODED))])
    assert body == PAYLOAD and decoder.done
    small = chunked([b"ab", b"cde", b"\r\n"])
    for first, second in itertools.combinations(range(len(small) + 1), 2):
        body, decoder = decode_in_parts([small[:first], small[first:second], small[second:]])
        assert body == b"abcde\r\n" and decoder.done, (first, second)


def test_the_chunked_decoder_is_done_only_after_the_trailer_and_keeps_what_follows() -> None:
    decoder = ChunkedDecoder()
    assert decoder.feed(b"3\r\nabc\r\n0\r\n") == b"abc"
    assert not decoder.done
    with pytest.raises(ValueError):
        decoder.eof()
    assert decoder.feed(b"\r\nHTTP/1.1") == b""
    assert decoder.done and decoder.leftover == b"HTTP/1.1"
    lenient = ChunkedDecoder()
    assert lenient.feed(b"2\nhi\n0\n\n") == b"hi" and lenient.done  # bare LF line ends


@pytest.mark.parametrize("bad", [b"zz\r\n", b"3\r\nabcd\r\n", b"-1\r\n", b"1_0\r\n"])
def test_the_chunked_decoder_rejects_malformed_framing(bad: bytes) -> None:
    with pytest.raises(ValueError):
        ChunkedDecoder().feed(bad)


def test_frames_are_classified_the_same_however_the_body_is_split() -> None:
    body = b"".join([HEARTBEAT, CREATED, *DELTAS, COMPLETED, DONE])
    crlf = body.replace(b"\n", b"\r\n")
    for stream in (body, crlf):
        for cut in range(len(stream) + 1):
            scanner = loadtest._FrameScanner(loadtest._classify_responses, 0.0)
            scanner.feed(stream[:cut], 1.0)
            scanner.feed(stream[cut:], 2.0)
            assert (scanner.events, scanner.heartbeats, scanner.done) == (RESPONSES_EVENTS, 1, True), cut
            assert scanner.terminal and not scanner.failed
            assert scanner.first_text is not None


def test_messages_frames_are_classified_the_same_however_the_body_is_split() -> None:
    body = b"".join(MESSAGES_SCENARIOS["sim"])
    crlf = body.replace(b"\n", b"\r\n")
    for stream in (body, crlf):
        for cut in range(len(stream) + 1):
            scanner = loadtest._FrameScanner(loadtest._classify_messages, 0.0)
            scanner.feed(stream[:cut], 1.0)
            scanner.feed(stream[cut:], 2.0)
            assert (scanner.events, scanner.heartbeats, scanner.done) == (MESSAGES_EVENTS, 2, False), cut
            assert TERMINAL_NAMES[scanner.terminal] == "message_stop" and not scanner.failed
            # The first text is the first text delta's: not the message's start, nor the block's.
            through_first_delta = PING + MESSAGE_START + TEXT_START + TEXT_DELTAS[0]
            if stream is crlf:
                through_first_delta = through_first_delta.replace(b"\n", b"\r\n")
            assert scanner.first_text == (1.0 if cut >= len(through_first_delta) else 2.0), cut


def test_chat_frames_without_text_do_not_count_as_text() -> None:
    scanner = loadtest._FrameScanner(loadtest._classify_chat, 0.0)
    scanner.feed(chat_chunk({"role": "assistant", "content": ""}) + chat_chunk({"content": None}), 1.0)
    assert scanner.events == 2 and scanner.first_text is None
    scanner.feed(chat_chunk({"reasoning_content": "hmm"}) + b'data: {"choices":[{"delta":{"content": "x"}}]}\n\n', 2.0)
    assert scanner.first_text == 2.0
    scanner.feed(b'data: {"error":{"message":"x"}}\n\n', 3.0)
    assert scanner.failed


# ---------------------------------------------------------------------------------------------
# Server usage, through psutil


def burn_cpu(seconds: float) -> None:
    start = time.process_time()
    while time.process_time() - start < seconds:
        sum(range(1000))


# Burns 0.3 s of CPU for each line it reads, then prints its CPU time; exits at end of input.
BUSY_CHILD = """
import sys, time
while sys.stdin.readline():
    start = time.process_time()
    while time.process_time() - start < 0.3:
        sum(range(1000))
    print(time.process_time(), flush=True)
"""


def burn_in_child(child: subprocess.Popen[bytes]) -> float:
    """Ask the child for one burn and wait until it says it is done (no sleep decides)."""
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write(b"burn\n")
    child.stdin.flush()
    line = child.stdout.readline()
    assert line, "the busy child exited early"
    return float(line)


def spawn_busy_child() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", BUSY_CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def test_sampling_the_own_process_reports_cpu_time_and_rss() -> None:
    sampler = ProcessSampler([os.getpid()])
    sampler.sample()
    burn_cpu(0.05)
    sampler.sample()

    assert sampler.cpu_seconds > 0
    assert sampler.rss_start_bytes > 0 and sampler.rss_peak_bytes >= sampler.rss_start_bytes
    assert sampler.samples == 2


def test_a_child_born_after_the_first_sample_counts_all_its_cpu_time_and_keeps_it_after_exiting() -> None:
    sampler = ProcessSampler([os.getpid()])  # the child's pid is never given
    own_start = time.process_time()
    sampler.sample()
    child = spawn_busy_child()
    try:
        child_cpu = burn_in_child(child)
        sampler.sample()
        own = time.process_time() - own_start
        assert sampler.processes_seen >= 2
        assert sampler.rss_peak_bytes > 0
        # Its burn and its interpreter's start-up; psutil reads whole clock ticks.
        assert sampler.cpu_seconds - own >= min(child_cpu, 0.3) - 0.05
        while_alive = sampler.cpu_seconds
    finally:
        child.communicate(b"")  # end of input: the child exits and is reaped
    assert child.returncode == 0
    sampler.sample()

    assert sampler.cpu_seconds >= while_alive  # an exited process keeps its last observed time


def test_a_child_present_at_the_first_sample_counts_only_its_cpu_time_since() -> None:
    child = spawn_busy_child()
    try:
        burn_in_child(child)  # before the run: not counted
        sampler = ProcessSampler([os.getpid()])
        own_start = time.process_time()
        sampler.sample()
        burn_in_child(child)  # during the run
        sampler.sample()
        own = time.process_time() - own_start
    finally:
        child.communicate(b"")

    assert 0.25 <= sampler.cpu_seconds - own < 0.5


def test_sampling_includes_child_processes() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        with_child = ProcessSampler([os.getpid()])
        with_child.sample()
        alone = ProcessSampler([child.pid])
        alone.sample()
        assert with_child.processes_seen >= 2
        assert with_child.rss_peak_bytes > alone.rss_peak_bytes > 0
    finally:
        child.communicate(b"")


async def test_a_run_reports_the_servers_cpu_time_and_peak_rss(server: ScriptedSSEServer) -> None:
    # The scripted server runs in this process, so its pid is ours.
    with trio.fail_after(10):
        report = await run_load(LoadConfig(url=server.url, requests=30, concurrency=3), server_pids=[os.getpid()])

    assert report.server is not None
    assert report.server.cpu_seconds > 0
    assert report.server.cpu_per_response_ms is not None and report.server.cpu_per_response_ms > 0
    assert report.server.rss_peak_bytes > 0 and report.server.samples >= 2
    assert report.loader_cpu_seconds > 0


# ---------------------------------------------------------------------------------------------
# Outputs and the command line


def parse_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


async def test_main_prints_a_summary_and_writes_json_and_html(
    server: ScriptedSSEServer, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    json_path, html_path = tmp_path / "report.json", tmp_path / "report.html"
    args = parse_args(
        "--url", server.url, "--requests", "4", "--concurrency", "2", "--header", "Authorization: Bearer sk-secret-123",
        "--json", str(json_path), "--html", str(html_path), "--json-requests",
    )  # fmt: skip
    with trio.fail_after(10):
        # main() runs its own trio loop, so it gets a thread; the server stays in this loop.
        code = await trio.to_thread.run_sync(main, args)

    assert code == 0
    data = orjson.loads(json_path.read_bytes())
    assert data["requests_completed"] == 4 and data["errors"] == {}
    assert data["total_latency_ms"]["count"] == 4
    assert len(data["requests"]) == 4 and len(data["requests"][0]["gaps"]) == RESPONSES_EVENTS - 1
    page = html_path.read_text()
    # first event, total latency, the timeline, the longest silences
    assert page.startswith("<!doctype html>") and page.count("<svg") == 4
    assert "<td>concurrent streams</td><td>2</td>" in page and time.strftime("%Y-%m-%d") in page
    assert data["machine"] and html.escape(data["machine"]) in page
    assert abs(data["started_at"] - time.time()) < 60
    assert "sk-secret-123" not in page and "sk-secret-123" not in json_path.read_text()  # header names only
    assert data["config"]["headers"] == ["Authorization"]
    assert "http://" not in page.replace(server.url, "").replace("http://www.w3.org/2000/svg", "")
    assert "4 ok, 0 failed" in capsys.readouterr().out


async def test_main_fails_when_no_request_succeeded(server: ScriptedSSEServer) -> None:
    args = parse_args("--url", server.url, "--model", "error500", "--requests", "2")
    with trio.fail_after(10):
        assert await trio.to_thread.run_sync(main, args) == 1


def test_invalid_options_are_refused_before_running(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(parse_args("--url", "https://example.com")) == 2
    assert main(parse_args("--header", "no-colon")) == 2
    assert main(parse_args("--concurrency", "0")) == 2
    assert "gateway loadtest:" in capsys.readouterr().err


def test_the_progress_line_counts_requests_or_the_seconds_of_the_duration() -> None:
    by_count = LoadConfig(url="http://127.0.0.1:1", requests=40)
    assert progress_line(by_count, 9, 1, 2.0) == (
        "loadtest [######------------------] 10/40  9 ok  1 failed  4.5/s  0:00:02"
    )
    by_time = LoadConfig(url="http://127.0.0.1:1", duration=3.0)
    assert progress_line(by_time, 2, 0, 1.2) == "loadtest [##########--------------] 1.2/3 s  2 ok  0 failed  1.7/s  0:00:01"
    # Requests in flight when the duration ends still finish: the line stays full, not beyond.
    assert progress_line(by_time, 5, 0, 3725.4).startswith("loadtest [" + "#" * 24 + "] 3.0/3 s  5 ok")
    assert progress_line(by_time, 5, 0, 3725.4).endswith("  1:02:05")


async def test_progress_goes_to_stderr_only_when_asked_for_if_stderr_is_not_a_terminal(
    nursery: trio.Nursery, capsys: pytest.CaptureFixture[str]
) -> None:
    server = await serve_script(nursery, [OK])  # a raw server: nothing of its own on stderr
    assert await run_main("--url", server.url, "-n", "3") == 0
    assert capsys.readouterr().err == ""

    assert await run_main("--url", server.url, "-n", "3", "--progress") == 0
    out, err = capsys.readouterr()
    assert err.startswith("\rloadtest [") and err.endswith("\n")
    assert "] 3/3  3 ok  0 failed  " in err.splitlines()[-1]
    assert "\r" not in out and "3 ok, 0 failed" in out  # the summary on stdout stays clean


# `gateway loadtest` as a plain `pip install` leaves it: the test extras (rich among them) absent.
WITHOUT_RICH = "import sys; sys.modules['rich'] = None; from gateway.cli import main; sys.exit(main())"


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal")
async def test_the_progress_line_needs_no_rich_and_is_drawn_when_stderr_is_a_terminal(nursery: trio.Nursery) -> None:
    server = await serve_script(nursery, [OK])
    controller, terminal = os.openpty()
    argv = [sys.executable, "-c", WITHOUT_RICH, "loadtest", "--url", server.url, "-n", "5", "-c", "2"]
    try:
        with trio.fail_after(30):
            done = await trio.run_process(
                argv, cwd=ROOT, stdin=subprocess.DEVNULL, capture_stdout=True, stderr=terminal, check=False
            )
    finally:
        os.close(terminal)
    drawn = read_terminal(controller)

    assert done.returncode == 0, drawn
    assert "5 ok, 0 failed" in done.stdout.decode()
    assert "No module named" not in drawn and "rich" not in drawn
    # No flag was given: a terminal on stderr turned the line on. It ends with the final counts.
    last = drawn.replace("\r\n", "\n").rsplit("\r", 1)[-1]
    assert last.startswith("loadtest [" + "#" * 24 + "] 5/5  5 ok  0 failed  ") and last.endswith("\n")


def read_terminal(controller: int) -> str:
    """Everything the child wrote to the terminal; it has exited, so reading ends at once."""
    chunks = []
    try:
        while chunk := os.read(controller, 65536):
            chunks.append(chunk)
    except OSError:  # EIO: no process has the terminal open any more
        pass
    finally:
        os.close(controller)
    return b"".join(chunks).decode()


def test_the_load_generator_also_runs_as_a_python_module() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gateway.lab.loadtest", "--help"], cwd=ROOT, capture_output=True, text=True, check=False
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: gateway loadtest") and "--max-error-rate" in done.stdout


def test_raising_the_descriptor_limit_lifts_the_soft_limit_to_the_hard_one() -> None:
    resource = pytest.importorskip("resource")
    # In a child: the test process keeps its own limit.
    probe = (
        "import resource\n"
        "from gateway.lab.fdlimit import raise_fd_limit\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 256), hard))\n"
        "raise_fd_limit()\n"
        "print(*resource.getrlimit(resource.RLIMIT_NOFILE), hard)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    soft, hard_after, hard = map(int, out.split())

    assert hard_after == hard
    assert soft == (1 << 20 if hard == resource.RLIM_INFINITY else hard)


def report_of(config: LoadConfig, results: list[RequestResult], *, started_at: float = 0.0, wall: float = 3.0) -> loadtest.LoadReport:
    return loadtest._aggregate(config, results, loadtest._Counters(), started_at, wall, 0.0, None)


def section(page: str, heading: str) -> str:
    """The page from `heading` to the end of the chart or table that follows it."""
    start = page.index(heading)
    ends = [page.find(tag, start) for tag in ("</svg>", "</table>")]
    return page[start : min(end for end in ends if end >= 0)]


@pytest.mark.parametrize("wall", [1.0, 0.0])
def test_the_html_report_renders_an_empty_run(wall: float) -> None:
    report = report_of(LoadConfig(url="http://127.0.0.1:1"), [], wall=wall)
    page = render_html(report)

    assert page.count("<svg") == 4 and page.endswith("</html>")
    assert "(n=0)" in section(page, "Time to first event") and "(n=0)" in section(page, "Total latency (cumulative)")
    assert "failed (0)" in section(page, "Throughput and errors over time")
    assert orjson.loads(report.to_json())["requests_completed"] == 0


def test_the_page_says_when_where_and_with_which_settings_the_run_was_made() -> None:
    config = LoadConfig(
        url="http://127.0.0.1:1/v1", api="chat", model="tiny", input="Say hi", max_output_tokens=64,
        concurrency=7, requests=50, duration=12.5, timeout=3.0, warmup=4, ramp_up=2.0,
        headers=(("X-Tenant", "blue"),),
    )  # fmt: skip
    started_at = time.mktime((2031, 5, 6, 7, 8, 9, 0, 0, -1))
    report = report_of(config, [], started_at=started_at)
    run = section(render_html(report), "<h2>Run</h2>")

    assert "<td>started</td><td>2031-05-06 07:08:09" in run
    assert f"<td>machine</td><td>{html.escape(report.machine)}</td>" in run
    assert f"Python {platform.python_version()}" in report.machine
    assert f"{platform.system()} " in report.machine and str(psutil.cpu_count()) in report.machine
    for row in (
        ("endpoint", "chat http://127.0.0.1:1/v1/chat/completions"),  # the base's /v1 not doubled
        ("model", "tiny"),
        ("input", "Say hi (6 characters)"),
        ("max output tokens", "64"),
        ("concurrent streams", "7"),
        ("requests", "50"),
        ("duration", "12.5 s"),
        ("per-request timeout", "3 s"),
        ("warm-up requests (not counted)", "4"),
        ("extra headers (names)", "X-Tenant"),
        ("ramp-up", "2 s"),
    ):
        assert "<td>{}</td><td>{}</td>".format(*row) in run, row
    data = orjson.loads(report.to_json())
    assert data["started_at"] == started_at and data["machine"] == report.machine
    assert data["config"]["concurrency"] == 7


def test_keys_in_headers_or_the_url_reach_neither_the_page_nor_the_json() -> None:
    config = LoadConfig(
        url="http://user:pw-secret-0@127.0.0.1:1",
        headers=(("Authorization", "Bearer sk-secret-1"), ("X-Api-Key", "key-secret-2")),
    )
    report = report_of(config, [RequestResult(status=200, total=0.1, ended=0.1)])
    outputs = (render_html(report), report.to_json(include_requests=True), loadtest.format_summary(report))

    for output in outputs:
        for secret in ("pw-secret-0", "sk-secret-1", "key-secret-2"):
            assert secret not in output
    assert "Authorization, X-Api-Key" in outputs[0]
    assert orjson.loads(outputs[1])["config"]["headers"] == ["Authorization", "X-Api-Key"]
    assert "http://127.0.0.1:1/v1/responses" in outputs[0]


def test_what_the_server_or_the_user_wrote_is_escaped_in_the_page() -> None:
    config = LoadConfig(url="http://127.0.0.1:1", model="<b>m</b>", input="<img src=x>")
    detail = "500: <script>alert(1)</script>"
    failed = RequestResult(status=500, error="http_status", error_detail=detail, ended=0.5)
    page = render_html(report_of(config, [failed]))

    for raw in ("<b>m</b>", "<img src=x>", "<script>"):
        assert raw not in page
    assert "&lt;b&gt;m&lt;/b&gt;" in page and html.escape(detail) in section(page, "<h2>Errors")


def polyline_xs(chart: str) -> list[float]:
    [points] = re.findall(r"<polyline [^>]*points='([^']*)'", chart)
    return [float(point.split(",")[0]) for point in points.split()]


def test_first_events_in_milliseconds_and_totals_in_seconds_each_fill_their_own_panel() -> None:
    results = [
        RequestResult(status=200, time_to_first_event=first, total=total, ended=total)
        for first, total in ((0.0010, 10.0), (0.0015, 15.0), (0.0020, 20.0))
    ]
    page = render_html(report_of(LoadConfig(url="http://127.0.0.1:1"), results, wall=25.0))
    first = section(page, "<h2>Time to first event (cumulative)</h2>")
    total = section(page, "<h2>Total latency (cumulative)</h2>")

    assert ">2 ms</text>" in first and " s</text>" not in first
    assert ">20 s</text>" in total
    for chart in (first, total):
        xs = polyline_xs(chart)
        assert max(xs) - min(xs) > 300  # of an 824-pixel plot: the curve is not squashed to an edge


def test_the_timeline_shows_when_requests_ended_and_which_failed() -> None:
    results = [
        RequestResult(started=0.2, ended=0.7, status=200, total=0.5, events=3),
        RequestResult(started=1.1, ended=1.4, status=200, total=0.3, events=3),
        RequestResult(started=2.0, ended=2.35, status=500, error="http_status", longest_silence=0.1),
    ]
    page = render_html(report_of(LoadConfig(url="http://127.0.0.1:1"), results, wall=3.0))
    timeline = section(page, "Throughput and errors over time")

    [failed] = re.findall(r"<rect class='failed'[^>]*>.*?</rect>", timeline)
    assert "fill='#d62728'" in failed and "2.3–2.4 s: 0 completed, 1 failed" in failed
    assert timeline.count("<rect class='completed'") == 2
    assert "completed (2)" in timeline and "failed (1)" in timeline


def test_the_module_exports_its_api() -> None:
    assert sorted(loadtest.__all__) == [
        "ChunkedDecoder",
        "LoadConfig",
        "LoadReport",
        "Percentiles",
        "ProcessSampler",
        "RequestResult",
        "ServerUsage",
        "add_arguments",
        "format_summary",
        "main",
        "render_html",
        "run_load",
    ]


async def test_json_answers_and_websocket_turns_are_measured_on_every_path_of_the_gateway(nursery: trio.Nursery) -> None:
    """`just bench`'s paths: JSON answers (`stream: false`) of the three APIs, the simulator's own
    JSON, and the Responses API's WebSocket mode, each to its finished answer."""
    simulator = Simulator(SimConfig(tokens=SIM_TOKENS))
    sim_url = await nursery.start(simulator.serve)
    url = await nursery.start(functools.partial(gateway.serve, make_settings(sim_url)))
    with trio.fail_after(30):
        reports = {
            (api, where): await run_load(LoadConfig(url=target, api=api, stream=False, requests=4, concurrency=2))
            for api, where, target in (
                ("responses", "gateway", url),
                ("chat", "gateway", url),
                ("messages", "gateway", url),
                ("chat", "simulator", sim_url),
            )
        }
        sockets = await run_load(LoadConfig(url=url, websocket=True, requests=6, concurrency=2))

    for (api, _), report in reports.items():
        assert (report.requests_completed, report.requests_failed) == (4, 0), report.failure_examples
        assert report.events_per_response == 1  # one answer, its arrival its first text
        for result in report.requests:
            assert result.time_to_first_text == result.total
    assert reports[("responses", "gateway")].terminals == {"response.completed": 4}
    assert reports[("messages", "gateway")].terminals == {"message_stop": 4}
    assert simulator.stats.responses_completed >= 8  # the gateway asked the backend for JSON too

    assert (sockets.requests_completed, sockets.requests_failed) == (6, 0), sockets.failure_examples
    assert sockets.terminals == {"response.completed": 6}
    assert sockets.events_per_response == GATEWAY_RESPONSES_EVENTS  # the events SSE sends, one per message
    assert sockets.connections_opened == 2  # a connection per worker, its turns in sequence on it
    for result in sockets.requests:
        assert result.time_to_first_event is not None and result.time_to_first_text is not None
        assert result.time_to_first_event <= result.time_to_first_text <= (result.total or 0)


async def test_a_websocket_turn_that_fails_is_counted_with_its_code(nursery: trio.Nursery) -> None:
    simulator = Simulator(SimConfig(tokens=SIM_TOKENS))
    sim_url = await nursery.start(simulator.serve)
    url = await nursery.start(functools.partial(gateway.serve, make_settings(sim_url)))
    with trio.fail_after(30):
        report = await run_load(LoadConfig(url=url, websocket=True, model="sim:fail=1,kinds=500", requests=2))
    assert (report.requests_completed, report.requests_failed) == (0, 2)
    assert report.failures == {"failed_event backend_error": 2}  # the turn's error event, read from its frame


def test_websocket_mode_is_for_the_responses_api_streamed() -> None:
    with pytest.raises(ValueError, match="websocket"):
        LoadConfig(url="http://127.0.0.1:1", api="chat", websocket=True)
    with pytest.raises(ValueError, match="websocket"):
        LoadConfig(url="http://127.0.0.1:1", websocket=True, stream=False)


async def test_the_command_runs_json_answers_and_websocket_turns(nursery: trio.Nursery, tmp_path: pathlib.Path) -> None:
    simulator = Simulator(SimConfig(tokens=SIM_TOKENS))
    sim_url = await nursery.start(simulator.serve)
    url = await nursery.start(functools.partial(gateway.serve, make_settings(sim_url)))
    for flag, events in (("--no-stream", 1), ("--websocket", GATEWAY_RESPONSES_EVENTS)):
        report = tmp_path / f"{flag}.json"
        with trio.fail_after(30):
            assert await run_main("--url", url, "-n", "3", flag, "--json", str(report)) == 0
        saved = json.loads(report.read_text())
        assert (saved["requests_completed"], saved["events_per_response"]) == (3, events)
        assert saved["config"]["stream"] is (flag != "--no-stream") and saved["config"]["websocket"] is (flag == "--websocket")
