"""The load generator measures streams from scripted servers on loopback, precisely and cheaply."""

from __future__ import annotations

import argparse
import functools
import itertools
import os
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
import trio
from hypercorn.config import Config
from hypercorn.trio import serve

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
RESPONSES_EVENTS = 5  # created, three deltas, completed
CHAT_EVENTS = 5  # role, two content chunks, finish, usage


@dataclass
class ScriptedSSEServer:
    """A raw ASGI app: the model name picks the scenario; it records who connected and what."""

    url: str = ""
    clients: set[tuple[str, int]] = field(default_factory=set)
    bodies: list[dict[str, Any]] = field(default_factory=list)

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
        if body["model"] == "error500":
            payload = orjson.dumps({"error": {"message": "boom", "type": "server_error"}})
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
            await send({"type": "http.response.start", "status": 500, "headers": headers})
            await send({"type": "http.response.body", "body": payload})
            return
        if scope["path"] == "/v1/chat/completions":
            script = CHAT_SCENARIO
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


@pytest.mark.parametrize(
    ("model", "kind"),
    [("error500", "http_status"), ("truncated", "no_terminal"), ("failed", "failed_event")],
)
async def test_a_failing_endpoint_is_counted_under_its_error_kind(
    server: ScriptedSSEServer, model: str, kind: str
) -> None:
    report = await run(server, model=model, requests=3, concurrency=1)

    assert (report.requests_completed, report.requests_failed) == (0, 3)
    assert report.errors == {kind: 3}
    assert kind in report.error_examples
    assert report.total_latency_ms.count == 0
    # The body was read to its end, so even a failed response leaves the connection reusable.
    assert report.connections_opened == 1


async def test_an_http_error_keeps_its_status_code(server: ScriptedSSEServer) -> None:
    report = await run(server, model="error500", requests=2)

    assert report.status_codes == {"500": 2}
    assert report.error_examples["http_status"].startswith("500")


async def test_a_stalled_stream_times_out_and_its_silence_is_recorded(server: ScriptedSSEServer) -> None:
    report = await run(server, model="hang", requests=1, timeout=0.3)

    assert report.errors == {"timeout": 1}
    [result] = report.requests
    assert result.events == 1
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


def test_chat_frames_without_text_do_not_count_as_text() -> None:
    scanner = loadtest._FrameScanner(loadtest._classify_chat, 0.0)
    scanner.feed(chat_chunk({"role": "assistant", "content": ""}) + chat_chunk({"content": None}), 1.0)
    assert scanner.events == 2 and scanner.first_text is None
    scanner.feed(chat_chunk({"reasoning_content": "hmm"}) + b'data: {"choices":[{"delta":{"content": "x"}}]}\n\n', 2.0)
    assert scanner.first_text == 2.0
    scanner.feed(b'data: {"error":{"message":"x"}}\n\n', 3.0)
    assert scanner.failed


# ---------------------------------------------------------------------------------------------
# Server usage from /proc


def burn_cpu(seconds: float) -> None:
    start = time.process_time()
    while time.process_time() - start < seconds:
        sum(range(1000))


def test_sampling_the_own_process_reports_cpu_time_and_rss() -> None:
    sampler = ProcessSampler([os.getpid()])
    sampler.sample()
    burn_cpu(0.05)
    sampler.sample()

    assert sampler.cpu_seconds > 0
    assert sampler.rss_start_bytes > 0 and sampler.rss_peak_bytes >= sampler.rss_start_bytes
    assert sampler.samples == 2


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
    assert "concurrency=2" in page and "Python " in page and time.strftime("%Y-%m-%d") in page
    assert data["machine"] and data["machine"] in page
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


def test_the_html_report_renders_an_empty_run() -> None:
    report = loadtest._aggregate(
        LoadConfig(url="http://127.0.0.1:1"), [], loadtest._Counters(), 0.0, 1.0, 0.0, None
    )
    assert "<svg" in render_html(report)
    assert orjson.loads(report.to_json())["requests_completed"] == 0


def test_the_timeline_shows_when_requests_ended_and_which_failed() -> None:
    config = LoadConfig(url="http://127.0.0.1:1")
    results = [
        RequestResult(started=0.2, status=200, total=0.5, events=3),
        RequestResult(started=1.1, status=200, total=0.3, events=3),
        RequestResult(started=2.0, status=500, error="http_500", longest_silence=0.1),
    ]
    report = loadtest._aggregate(config, results, loadtest._Counters(), 0.0, 3.0, 0.0, None)
    page = render_html(report)
    timeline = page[page.index("Throughput and errors over time") :]
    timeline = timeline[: timeline.index("</svg>")]
    assert timeline.count("fill='#d62728'") == 1  # the failure, in the third second
    assert timeline.count("<rect") == 3


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
