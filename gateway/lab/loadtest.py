"""`gateway loadtest`: N concurrent streams against a Responses or Chat Completions endpoint.

This module owns the load generator: a minimal HTTP/1.1 client on trio sockets, the per-request
measurements (`RequestResult`), their aggregation (`LoadReport`), the sampling of the server's
CPU time and RSS (through psutil: `ProcessSampler`), and the text, JSON and HTML outputs. The
reports say when, on which machine and with which settings a run was made; they never carry
header values or a password in the URL, which are often keys.

It runs on the same small machine as the server under test, so its own cost per stream must be
tiny; that decides its shape:

* No HTTP library: the request bytes are built once and written as they are; the status line,
  headers and `transfer-encoding: chunked` framing are parsed here (`ChunkedDecoder`).
  Connections are kept alive between one worker's sequential requests.
* No JSON parsing per event: the body is cut into SSE frames at blank lines and each frame is
  classified by a few byte comparisons (the `event:` line, `"content":"`, a leading `:` for
  comments, `[DONE]`). Frames of one read share that read's timestamp (`time.perf_counter()`).

It knows nothing of the gateway's internals: it speaks to any server over the wire, including
the backend directly (`--api chat`) for a baseline.

Error kinds (`RequestResult.error`): ``connect`` (TCP connect failed), ``http_status`` (status
not 2xx), ``no_terminal`` (the body ended without `response.completed`/`response.incomplete`,
or for chat without `[DONE]`), ``failed_event`` (a `response.failed` or `error` event, or a chat
`{"error": ...}` chunk), ``timeout`` (`LoadConfig.timeout`), ``read`` (the connection failed or
closed mid-response), ``protocol`` (the server's bytes are not valid HTTP/1.1 framing).

The report counts failures by a finer kind (`RequestResult.failure_kind`, `LoadReport.failures`):
``http <status>`` and ``failed_event``, each followed by the error's `code` when the server gave
one, and ``reset`` for ``read``; the other kinds keep their names. The code is read only where a
failure was already seen: from the first 64 KiB of a non-2xx body, or of an error/failed frame.
"""

from __future__ import annotations

import argparse
import html
import math
import os
import platform
import re
import resource
import socket
import sys
import time
from array import array
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal
from urllib.parse import urlsplit

import orjson
import psutil
import trio

__all__ = [
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

ApiKind = Literal["responses", "chat"]

#: Requests sent when neither a request count nor a duration is given.
DEFAULT_REQUESTS = 100
DEFAULT_INPUT = "Write a short story about a lighthouse keeper who finds a message in a bottle."

_READ_SIZE = 65536
_MAX_HEAD = 65536
_MAX_CHUNK_LINE = 4096
# A server that never sends a blank line would otherwise grow the frame buffer without bound.
_MAX_FRAME = 16 * 1024 * 1024
# A refused connection fails in microseconds; without a pause an unlimited run would spin a
# core on a machine it shares with the server under test.
_CONNECT_BACKOFF = 0.05
_ERROR_SAMPLE = 300
# How much of a non-2xx body or of one error frame is kept to find the error's code: the rest of
# a large body is still read (to keep the connection) but not stored.
_MAX_ERROR_BODY = 65536
# Error frames parsed per stream while none has given a code (the gateway sends an `error` event
# and then `response.failed`); a server repeating codeless error frames costs no more than this.
_MAX_FAILURE_FRAMES = 4
_CODE_CHARS = re.compile(r"[^\w.:/-]")
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


class _Failure(Exception):
    """Ends one request with an error kind (never escapes the worker)."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail


class _StaleConnection(Exception):
    """A reused keep-alive connection was closed by the server before answering."""


# ---------------------------------------------------------------------------------------------
# HTTP/1.1 body framing


# A chunk-size line: hex digits, optional extensions (ignored), CRLF or bare LF.
_SIZE_LINE = re.compile(rb"([0-9A-Fa-f]{1,16})[ \t]*(?:;[^\r\n]*)?\r?\n")

_SIZE, _DATA, _DATA_END, _TRAILER, _DONE = range(5)


class ChunkedDecoder:
    """Incremental decoder of a `transfer-encoding: chunked` body (RFC 9112 section 7.1).

    `feed(data)` returns the payload bytes decoded so far; `done` turns true after the last
    chunk and its trailer section; bytes after that are kept in `leftover`. Bare LF line ends
    are accepted. Raises `ValueError` on malformed framing.
    """

    __slots__ = ("done", "leftover", "_state", "_remaining", "_pending")

    def __init__(self) -> None:
        self.done = False
        self.leftover = b""
        self._state = _SIZE
        self._remaining = 0
        self._pending = b""  # an incomplete size/trailer line, or a lone CR after a chunk

    def feed(self, data: bytes) -> bytes:
        state = self._state
        if state == _DONE:
            self.leftover += data
            return b""
        if self._pending:
            data = self._pending + data
            self._pending = b""
        out: list[bytes] = []
        remaining = self._remaining
        pos = 0
        end = len(data)
        while pos < end:
            if state == _SIZE:
                match = _SIZE_LINE.match(data, pos)
                if match is None:
                    if data.find(b"\n", pos) >= 0:
                        raise ValueError(f"bad chunk size line {data[pos : pos + 40]!r}")
                    if end - pos > _MAX_CHUNK_LINE:
                        raise ValueError("chunk size line too long")
                    self._pending = data[pos:]
                    break
                size = int(match[1], 16)
                pos = match.end()
                if not size:
                    state = _TRAILER
                    continue
                stop = pos + size
                # The usual case, a whole chunk in this read, takes one turn of the loop.
                if stop + 1 < end and data[stop] == 0x0D and data[stop + 1] == 0x0A:
                    out.append(data[pos:stop])
                    pos = stop + 2
                    continue
                state = _DATA
                remaining = size
            elif state == _DATA:
                take = min(remaining, end - pos)
                out.append(data[pos : pos + take])
                pos += take
                remaining -= take
                if not remaining:
                    state = _DATA_END
            elif state == _DATA_END:
                if data[pos] == 0x0A:  # bare LF
                    pos += 1
                elif data[pos] == 0x0D:
                    if pos + 1 == end:
                        self._pending = data[pos:]
                        break
                    if data[pos + 1] != 0x0A:
                        raise ValueError("chunk data not followed by CRLF")
                    pos += 2
                else:
                    raise ValueError("chunk data longer than its size")
                state = _SIZE
            else:  # _TRAILER: field lines until an empty line
                newline = data.find(b"\n", pos)
                if newline < 0:
                    if end - pos > _MAX_CHUNK_LINE:
                        raise ValueError("trailer line too long")
                    self._pending = data[pos:]
                    break
                line = data[pos:newline]
                pos = newline + 1
                if line == b"" or line == b"\r":
                    state = _DONE
                    self.done = True
                    self.leftover = data[pos:]
                    break
        self._state = state
        self._remaining = remaining
        if len(out) == 1:
            return out[0]
        return b"".join(out)

    def eof(self) -> None:
        """The connection closed; raises `ValueError` unless the body was complete."""
        if not self.done:
            raise ValueError("connection closed inside a chunked body")


class _LengthDecoder:
    """A body of `content-length` bytes."""

    __slots__ = ("done", "leftover", "_remaining")

    def __init__(self, length: int) -> None:
        self._remaining = length
        self.done = length == 0
        self.leftover = b""

    def feed(self, data: bytes) -> bytes:
        if self.done:
            self.leftover += data
            return b""
        if len(data) < self._remaining:
            self._remaining -= len(data)
            return data
        body, self.leftover = data[: self._remaining], data[self._remaining :]
        self._remaining = 0
        self.done = True
        return body

    def eof(self) -> None:
        if not self.done:
            raise ValueError("connection closed before content-length bytes")


class _UntilCloseDecoder:
    """A body delimited by the server closing the connection (HTTP/1.0 style)."""

    __slots__ = ("done", "leftover")

    def __init__(self) -> None:
        self.done = False
        self.leftover = b""

    def feed(self, data: bytes) -> bytes:
        return data

    def eof(self) -> None:
        self.done = True


_BodyDecoder = ChunkedDecoder | _LengthDecoder | _UntilCloseDecoder


# ---------------------------------------------------------------------------------------------
# SSE frames, classified by bytes

_OTHER, _COMMENT, _DONE_FRAME, _TEXT, _COMPLETED, _INCOMPLETE, _FAILED = range(7)
_TERMINAL_NAMES = {_COMPLETED: "response.completed", _INCOMPLETE: "response.incomplete"}

# Event names after `event: `; the trailing newline keeps prefixes of longer names from matching.
_RESPONSES_EVENT_KINDS: tuple[tuple[bytes, int], ...] = (
    (b"response.output_text.delta\n", _TEXT),
    (b"response.output_text.delta\r", _TEXT),
    (b"response.completed\n", _COMPLETED),
    (b"response.completed\r", _COMPLETED),
    (b"response.incomplete\n", _INCOMPLETE),
    (b"response.incomplete\r", _INCOMPLETE),
    (b"response.failed\n", _FAILED),
    (b"response.failed\r", _FAILED),
    (b"error\n", _FAILED),
    (b"error\r", _FAILED),
)
# For servers that send `data:` lines without `event:` lines.
_RESPONSES_TYPE_KINDS: tuple[tuple[bytes, int], ...] = (
    (b'"type":"response.output_text.delta"', _TEXT),
    (b'"type":"response.completed"', _COMPLETED),
    (b'"type":"response.incomplete"', _INCOMPLETE),
    (b'"type":"response.failed"', _FAILED),
    (b'"type":"error"', _FAILED),
)


def _is_done(buf: bytearray, start: int) -> bool:
    return buf.startswith(b"data: [DONE]", start) or buf.startswith(b"data:[DONE]", start)


def _classify_responses(buf: bytearray, start: int, end: int) -> int:
    first = buf[start]
    if first == 0x3A:  # ":"
        return _COMMENT
    if first == 0x65 and buf.startswith(b"event:", start):  # "e"
        name = start + 6
        if buf[name] == 0x20:
            name += 1
        for prefix, kind in _RESPONSES_EVENT_KINDS:
            if buf.startswith(prefix, name):
                return kind
        return _OTHER
    if _is_done(buf, start):
        return _DONE_FRAME
    for needle, kind in _RESPONSES_TYPE_KINDS:
        if buf.find(needle, start, end) >= 0:
            return kind
    return _OTHER


def _classify_chat(buf: bytearray, start: int, end: int) -> int:
    if buf[start] == 0x3A:
        return _COMMENT
    # Text chunks are most frames, so they are recognised first; an error chunk has no
    # `"content":` and `[DONE]` is not JSON.
    at = buf.find(b'"content":', start, end)
    if at >= 0:
        at += 10
        if buf[at] == 0x20:
            at += 1
        # `"content":""` (the role chunk) and `"content":null` carry no text.
        if buf[at] == 0x22 and buf[at + 1] != 0x22:
            return _TEXT
        return _OTHER
    if _is_done(buf, start):
        return _DONE_FRAME
    if buf.startswith(b'data: {"error"', start) or buf.startswith(b'data:{"error"', start):
        return _FAILED
    if buf.startswith(b"event: error", start):
        return _FAILED
    return _OTHER


_Classifier = Callable[[bytearray, int, int], int]


# ---------------------------------------------------------------------------------------------
# What a failure said: read only once a request has failed, so it costs nothing on success


def _sample(text: str) -> str:
    """`text` cut to a sample and made safe to print: control characters (a terminal's escape
    sequences among them) and line separators are shown escaped."""
    text = text[:_ERROR_SAMPLE]
    return _UNPRINTABLE.sub(lambda match: match[0].encode("unicode_escape").decode("ascii"), text)


def _loads(data: bytes) -> object:
    """JSON, or None when `data` is not (a truncated body is not)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


def _frame_json(frame: bytes) -> object:
    """The JSON in an SSE frame's `data:` lines (joined with LF, as the SSE spec says)."""
    data = []
    for line in frame.splitlines():
        if line.startswith(b"data:"):
            value = line[5:]
            data.append(value[1:] if value.startswith(b" ") else value)
    return _loads(b"\n".join(data)) if data else None


def _error_fields(data: object) -> tuple[str | None, str]:
    """(code, message) of an OpenAI-shaped error, either may be missing: `{"error": {...}}` (a
    JSON error body, a chat error chunk), a `response.failed` event's `response.error`, or an
    `error` event's own `code` and `message`. The code becomes a label (at most 64 characters
    of letters, digits and `_.:/-`); the message a printable sample."""
    if not isinstance(data, dict):
        return None, ""
    error = data.get("error")
    if isinstance(error, str):  # `{"error": "text"}`, as some servers send
        return None, _sample(error)
    response = data.get("response")
    candidates = [error, response.get("error") if isinstance(response, dict) else None, data]
    code: str | None = None
    message = ""
    for candidate in candidates:
        if not isinstance(candidate, dict):
            continue
        value = candidate.get("code")
        if code is None and isinstance(value, (str, int)) and not isinstance(value, bool):
            code = _CODE_CHARS.sub("_", str(value).strip())[:64] or None
        text = candidate.get("message")
        if not message and isinstance(text, str):
            message = _sample(text)
    return code, message


class _FrameScanner:
    """Cuts a body into SSE frames at blank lines and keeps the per-stream counters."""

    __slots__ = (
        "_buf",
        "_classify",
        "_sep",
        "_t_start",
        "_last_event",
        "gaps",
        "first_event",
        "first_text",
        "events",
        "heartbeats",
        "terminal",
        "failed",
        "done",
        "error_code",
        "error_message",
        "_failure_frames",
    )

    def __init__(self, classify: _Classifier, t_start: float) -> None:
        self._buf = bytearray()
        self._classify = classify
        self._sep = b""  # decided on the first line end: b"\n\n" or b"\r\n\r\n"
        self._t_start = t_start
        self._last_event = 0.0
        self.gaps = array("d")
        self.first_event: float | None = None
        self.first_text: float | None = None
        self.events = 0
        self.heartbeats = 0
        self.terminal = 0
        self.failed = False
        self.done = False
        self.error_code: str | None = None
        self.error_message = ""
        self._failure_frames = 0

    def feed(self, data: bytes, now: float) -> None:
        buf = self._buf
        buf += data
        sep = self._sep
        if not sep:
            newline = buf.find(b"\n")
            if newline < 0:
                return
            sep = self._sep = b"\r\n\r\n" if newline and buf[newline - 1] == 0x0D else b"\n\n"
        step = len(sep)
        classify = self._classify
        start = 0
        while True:
            end = buf.find(sep, start)
            if end < 0:
                break
            while start < end and buf[start] in (0x0A, 0x0D):  # stray blank lines
                start += 1
            if start < end:
                kind = classify(buf, start, end)
                if kind == _COMMENT:
                    self.heartbeats += 1
                elif kind == _DONE_FRAME:
                    self.done = True
                else:
                    if self.events:
                        self.gaps.append(now - self._last_event)
                    else:
                        self.first_event = now - self._t_start
                    self._last_event = now
                    self.events += 1
                    if kind == _TEXT:
                        if self.first_text is None:
                            self.first_text = now - self._t_start
                    elif kind == _FAILED:
                        self.failed = True
                        if self.error_code is None and self._failure_frames < _MAX_FAILURE_FRAMES:
                            self._read_failure(bytes(buf[start : min(end, start + _MAX_ERROR_BODY)]))
                    elif kind != _OTHER:
                        self.terminal = kind
            start = end + step
        if start:
            del buf[:start]
        if len(buf) > _MAX_FRAME:
            raise _Failure("protocol", f"an SSE frame exceeded {_MAX_FRAME} bytes")

    def _read_failure(self, frame: bytes) -> None:
        """Keep the first code and message of an `error`/`response.failed` frame or chat error
        chunk. Only failure frames get here, so parsing their JSON costs nothing on success."""
        self._failure_frames += 1
        code, message = _error_fields(_frame_json(frame))
        self.error_code = code
        if not self.error_message:
            self.error_message = message


# ---------------------------------------------------------------------------------------------
# Configuration and results


@dataclass(frozen=True)
class LoadConfig:
    """What to run. `requests` and `duration` both bound the run (whichever ends it first);
    with neither, `DEFAULT_REQUESTS` requests are sent. `timeout` bounds each request, connect
    included. `warmup` requests run first, at the same concurrency, and are not counted.
    `url` is the server's base URL; a base ending in ``/v1`` is not doubled.

    Raises `ValueError` for invalid values.
    """

    url: str
    api: ApiKind = "responses"
    model: str = "sim"
    input: str = DEFAULT_INPUT
    max_output_tokens: int | None = None
    concurrency: int = 1
    requests: int | None = None
    duration: float | None = None
    timeout: float | None = None
    warmup: int = 0
    headers: tuple[tuple[str, str], ...] = ()
    progress: bool = False
    # Seconds over which the workers start, evenly spaced: thousands of real
    # clients do not all connect in the same millisecond.
    ramp_up: float = 0.0

    def __post_init__(self) -> None:
        if self.api not in ("responses", "chat"):
            raise ValueError(f"api must be 'responses' or 'chat', not {self.api!r}")
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if self.requests is not None and self.requests < 1:
            raise ValueError("requests must be at least 1")
        if self.duration is not None and not self.duration > 0:
            raise ValueError("duration must be positive")
        if self.timeout is not None and not self.timeout > 0:
            raise ValueError("timeout must be positive")
        if self.warmup < 0:
            raise ValueError("warmup must not be negative")
        if self.ramp_up < 0:
            raise ValueError("ramp_up must not be negative")
        for name, value in self.headers:
            if not name or any(c in name for c in ":\r\n ") or any(c in value for c in "\r\n"):
                raise ValueError(f"invalid header {name!r}")
        _target(self)  # validates the URL

    @property
    def request_limit(self) -> int | None:
        if self.requests is None and self.duration is None:
            return DEFAULT_REQUESTS
        return self.requests


@dataclass(slots=True)
class RequestResult:
    """One request's measurements. Times are seconds from the request's start (before connect
    when a new connection was needed); `started` and `ended` (when it finished, whatever the
    outcome) are seconds from the start of the run.
    `longest_silence` is the longest wait for body bytes, counted from the moment the request
    was written, so a slow first token without heartbeats counts; on a timeout it includes the
    final wait."""

    started: float = 0.0
    ended: float = 0.0
    status: int = 0
    error: str | None = None
    error_detail: str = ""
    time_to_first_byte: float | None = None
    time_to_first_event: float | None = None
    time_to_first_text: float | None = None
    total: float | None = None
    events: int = 0
    heartbeats: int = 0
    reads: int = 0  # body reads: events per read shows how much the kernel coalesced
    gaps: array[float] = field(default_factory=lambda: array("d"))
    longest_silence: float | None = None
    terminal: str | None = None
    saw_done: bool = False
    new_connection: bool = False
    # The error's `code` as the server said it: in a non-2xx JSON body, an `error` or
    # `response.failed` event, or a chat error chunk.
    code: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def failure_kind(self) -> str | None:
        """The row this request counts under in `LoadReport.failures`, None if it succeeded:
        ``http 503 server_shutting_down``, ``http 500``, ``failed_event server_error``,
        ``failed_event``, ``reset`` (for `error` ``read``), ``timeout``, ``connect``,
        ``protocol``, ``no_terminal``."""
        error = self.error
        if error is None:
            return None
        if error == "http_status":
            kind = f"http {self.status}"
        elif error == "read":
            return "reset"
        elif error == "failed_event":
            kind = error
        else:
            return error
        return f"{kind} {self.code}" if self.code else kind


@dataclass(frozen=True)
class Percentiles:
    """A distribution in milliseconds (nearest-rank percentiles); all None when empty."""

    count: int
    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None
    max: float | None

    @classmethod
    def of(cls, seconds: Sequence[float]) -> Percentiles:
        values = sorted(seconds)
        n = len(values)
        if not n:
            return cls(0, None, None, None, None, None)

        def rank(p: float) -> float:
            return _ms(values[max(0, math.ceil(p / 100 * n) - 1)])

        return cls(n, _ms(math.fsum(values) / n), rank(50), rank(90), rank(99), _ms(values[-1]))


@dataclass(frozen=True)
class ServerUsage:
    """CPU time and RSS of the server's processes (the pids given and their descendants)."""

    pids: list[int]
    processes_seen: int
    cpu_seconds: float
    cpu_per_response_ms: float | None
    rss_start_bytes: int
    rss_peak_bytes: int
    # Peak minus start, divided by the concurrency: the memory one more open stream costs.
    rss_growth_per_stream_bytes: float
    samples: int


@dataclass
class LoadReport:
    """The aggregate of one run. Latency distributions cover successful requests; longest
    silences cover every request that got response headers (a stall that ended in a timeout is
    exactly what they are for).

    `errors` counts failed requests by `RequestResult.error`; `failures` by the finer
    `RequestResult.failure_kind` (most frequent first), with one sample message of each in
    `failure_examples`."""

    config: dict[str, Any]
    started_at: float
    wall_seconds: float
    requests_completed: int
    requests_failed: int
    throughput_rps: float
    status_codes: dict[str, int]
    errors: dict[str, int]
    error_examples: dict[str, str]
    terminals: dict[str, int]
    time_to_first_byte_ms: Percentiles
    time_to_first_event_ms: Percentiles
    time_to_first_text_ms: Percentiles
    total_latency_ms: Percentiles
    inter_event_gap_ms: Percentiles
    longest_silence_max_ms: float | None
    longest_silence_p99_ms: float | None
    events_total: int
    events_per_response: float | None
    reads_per_response: float | None
    heartbeats_total: int
    connections_opened: int
    stale_connection_retries: int
    loader_cpu_seconds: float
    loader_cpu_per_response_ms: float | None
    server: ServerUsage | None
    machine: str = ""  # where the run was made: CPU, cores, OS, Python
    failures: dict[str, int] = field(default_factory=dict)
    failure_examples: dict[str, str] = field(default_factory=dict)
    requests: list[RequestResult] = field(default_factory=list, repr=False)

    @property
    def error_rate(self) -> float:
        """Failed requests as a fraction of the counted ones (warm-up excluded); 0 when none."""
        counted = self.requests_completed + self.requests_failed
        return self.requests_failed / counted if counted else 0.0

    def to_json(self, *, include_requests: bool = False) -> str:
        """The report as indented JSON; per-request records only when asked (they are large)."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "requests"}
        if include_requests:
            data["requests"] = self.requests
        return orjson.dumps(data, default=_json_default, option=orjson.OPT_INDENT_2).decode()


def cpu_model() -> str:
    """The CPU's model name, as well as the system tells it."""
    model = platform.processor() or platform.machine()
    try:  # Linux names the CPU model only here; elsewhere `platform.processor()` does
        with open("/proc/cpuinfo", encoding="utf-8") as file:
            model = next((line.split(":", 1)[1].strip() for line in file if line.startswith("model name")), model)
    except OSError:
        pass
    return model


def _describe_machine() -> str:
    """This machine in a line: CPU model, CPUs, memory, OS and Python (not the host name)."""
    model = cpu_model()
    logical = psutil.cpu_count(logical=True) or os.cpu_count() or 1
    physical = psutil.cpu_count(logical=False)
    cores = f"{logical} CPUs" if physical in (None, logical) else f"{physical} cores / {logical} threads"
    memory = psutil.virtual_memory().total / 2**30
    return (
        f"{model}, {cores}, {memory:.1f} GiB RAM, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}"
    )


def _json_default(value: object) -> object:
    if isinstance(value, array):
        return value.tolist()
    raise TypeError(f"cannot serialize {type(value).__name__}")


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


# ---------------------------------------------------------------------------------------------
# The HTTP/1.1 client


@dataclass(frozen=True)
class _Target:
    host: str
    port: int
    path: str
    request: bytes  # the whole request, identical for every send


def _target(config: LoadConfig) -> _Target:
    parts = urlsplit(config.url)
    if parts.scheme != "http":
        raise ValueError(f"url must start with http:// (TLS is not supported): {config.url!r}")
    if not parts.hostname:
        raise ValueError(f"url has no host: {config.url!r}")
    try:
        port = parts.port or 80
    except ValueError as error:
        raise ValueError(f"bad port in url {config.url!r}") from error
    prefix = parts.path.rstrip("/")
    if not prefix.endswith("/v1"):
        prefix += "/v1"
    path = prefix + ("/responses" if config.api == "responses" else "/chat/completions")
    body: dict[str, Any]
    if config.api == "responses":
        body = {"model": config.model, "input": config.input, "stream": True}
        if config.max_output_tokens is not None:
            body["max_output_tokens"] = config.max_output_tokens
    else:
        body = {
            "model": config.model,
            "messages": [{"role": "user", "content": config.input}],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if config.max_output_tokens is not None:
            body["max_tokens"] = config.max_output_tokens
    payload = orjson.dumps(body)
    host_header = parts.netloc.rsplit("@", 1)[-1]
    headers = {
        "host": ("Host", host_header),
        "user-agent": ("User-Agent", "gateway-loadtest"),
        "accept": ("Accept", "text/event-stream"),
        "content-type": ("Content-Type", "application/json"),
    }
    for name, value in config.headers:
        headers[name.lower()] = (name, value)
    headers["content-length"] = ("Content-Length", str(len(payload)))
    head = f"POST {path} HTTP/1.1\r\n" + "".join(f"{n}: {v}\r\n" for n, v in headers.values()) + "\r\n"
    return _Target(parts.hostname, port, path, head.encode("latin-1") + payload)


class _Connection:
    """One TCP connection: trio's stream connects, writes and closes; reads go through a
    duplicate of its socket.

    Why the duplicate: `SocketStream.receive_some` tries `recv` first, and on EAGAIN waits and
    tries again, then yields once more after success. Tokens arrive one TCP segment at a time,
    so that is three syscalls and two scheduler passes per event. Waiting for readability on
    trio's socket, then one `recv` on a plain (non-blocking) socket object sharing the same
    open file, costs one pass and two syscalls (measured: about 15% less CPU per stream). The
    price is a second file descriptor per connection.
    """

    __slots__ = ("stream", "socket", "raw", "recv")

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.socket = stream.socket  # what trio waits on; trio also closes it
        self.raw = socket.socket(fileno=os.dup(stream.socket.fileno()))  # raises OSError (EMFILE)
        self.raw.setblocking(False)
        self.recv = self.raw.recv

    async def receive(self) -> bytes:
        """The next bytes received; b"" at end of file. Raises OSError."""
        while True:
            await trio.lowlevel.wait_readable(self.socket)
            try:
                return self.recv(_READ_SIZE)
            except BlockingIOError:
                pass

    async def aclose(self) -> None:
        self.raw.close()
        with trio.move_on_after(1, shield=True):
            await self.stream.aclose()


@dataclass
class _Counters:
    connections_opened: int = 0
    stale_retries: int = 0
    completed: int = 0
    failed: int = 0


class _Client:
    """One worker's connection: sequential requests, kept alive until the server closes it."""

    def __init__(self, target: _Target, api: ApiKind, counters: _Counters) -> None:
        self._target = target
        self._classify: _Classifier = _classify_responses if api == "responses" else _classify_chat
        self._chat = api == "chat"
        self._counters = counters
        self._conn: _Connection | None = None
        self._buf = b""  # bytes received past the previous response

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        self._buf = b""
        if conn is not None:
            await conn.aclose()

    async def request(self, timeout: float | None, run_start: float) -> RequestResult:
        """One request; every failure becomes `RequestResult.error`, none escapes."""
        result = RequestResult()
        t_start = time.perf_counter()
        result.started = t_start - run_start
        progress = _Progress(t_start)
        failure: _Failure | None = None
        try:
            with trio.fail_after(math.inf if timeout is None else timeout):
                await self._exchange(result, progress)
        except trio.TooSlowError:
            failure = _Failure("timeout", f"no complete response within {timeout} s")
        except _Failure as error:
            failure = error
        now = time.perf_counter()
        result.ended = now - run_start
        if failure is None:
            return result
        result.error, result.error_detail = failure.kind, failure.detail
        if failure.kind == "timeout":
            if progress.sent:
                silence = now - progress.last_byte
                if result.longest_silence is None or silence > result.longest_silence:
                    result.longest_silence = silence
            await self.aclose()
        elif failure.kind in ("read", "protocol"):
            # Mid-response: the connection's state is unknown. After the other kinds the
            # body was read to its end and `_exchange` already kept or closed it.
            await self.aclose()
        elif failure.kind == "connect":
            await trio.sleep(_CONNECT_BACKOFF)
        return result

    async def _open(self) -> _Connection:
        try:
            stream = await trio.open_tcp_stream(self._target.host, self._target.port)
        except OSError as error:
            raise _Failure("connect", f"{type(error).__name__}: {error}") from None
        try:
            conn = _Connection(stream)
        except OSError as error:
            with trio.move_on_after(1, shield=True):
                await stream.aclose()
            raise _Failure("connect", f"{type(error).__name__}: {error}") from None
        self._counters.connections_opened += 1
        self._conn = conn
        self._buf = b""
        return conn

    async def _exchange(self, result: RequestResult, progress: _Progress) -> None:
        conn, (status, headers, keep_alive) = await self._send(result, progress)
        result.status = status
        decoder = _decoder_for(status, headers)
        if decoder is None:
            keep_alive = False
            decoder = _UntilCloseDecoder()
        ok_status = 200 <= status < 300
        scanner = _FrameScanner(self._classify, progress.t_start) if ok_status else None
        error_body = bytearray()
        longest = 0.0
        last_byte = progress.last_byte
        first_byte: float | None = None
        reads = 0
        data, self._buf = self._buf, b""
        now = progress.head_at
        wait_readable, waitable, recv = trio.lowlevel.wait_readable, conn.socket, conn.recv
        try:
            while True:
                if data:
                    silence = now - last_byte
                    if silence > longest:
                        longest = silence
                    last_byte = now
                    reads += 1
                    try:
                        body = decoder.feed(data)
                    except ValueError as error:
                        raise _Failure("protocol", str(error)) from None
                    if body:
                        if first_byte is None:
                            first_byte = now
                        if scanner is not None:
                            scanner.feed(body, now)
                        elif len(error_body) < _MAX_ERROR_BODY:
                            error_body += body[: _MAX_ERROR_BODY - len(error_body)]
                if decoder.done:
                    break
                # Keep the running maximum visible to a timeout that interrupts the read.
                progress.last_byte = last_byte
                result.longest_silence = longest
                # `_Connection.receive`, inlined: this line runs once per event.
                await wait_readable(waitable)
                try:
                    data = recv(_READ_SIZE)
                except BlockingIOError:  # a spurious wake-up
                    data = b""
                    continue
                now = time.perf_counter()
                if not data:
                    try:
                        decoder.eof()
                    except ValueError as error:
                        raise _Failure("read", str(error)) from None
                    keep_alive = False
                    break
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as error:
            raise _Failure("read", f"{type(error).__name__}: {error}") from None
        finally:
            result.longest_silence = longest
            result.reads = reads
            if first_byte is not None:
                result.time_to_first_byte = first_byte - progress.t_start
            if scanner is not None:
                result.events = scanner.events
                result.heartbeats = scanner.heartbeats
                result.gaps = scanner.gaps
                result.time_to_first_event = scanner.first_event
                result.time_to_first_text = scanner.first_text
                result.terminal = _TERMINAL_NAMES.get(scanner.terminal)
                result.saw_done = scanner.done
        result.total = now - progress.t_start

        if decoder.leftover:
            # Nothing was pipelined, so extra bytes mean the framing went wrong: do not reuse.
            keep_alive = False
        if keep_alive:
            self._buf = b""
        else:
            await self.aclose()

        if scanner is None:
            body = bytes(error_body)
            result.code, message = _error_fields(_loads(body))
            if not message:
                message = _sample(body[:_ERROR_SAMPLE].decode("utf-8", "replace"))
            raise _Failure("http_status", f"{status}: {message}")
        if scanner.failed:
            result.code = scanner.error_code
            raise _Failure("failed_event", scanner.error_message or "the stream reported a failure")
        if self._chat:
            if not scanner.done:
                raise _Failure("no_terminal", "the stream ended without [DONE]")
        elif not scanner.terminal:
            raise _Failure("no_terminal", "the stream ended without response.completed/incomplete")

    async def _send(
        self, result: RequestResult, progress: _Progress
    ) -> tuple[_Connection, tuple[int, dict[bytes, bytes], bool]]:
        """Write the request and read the response head, on a new connection if needed."""
        while True:
            conn = self._conn
            reused = conn is not None
            if conn is None:
                conn = await self._open()
                result.new_connection = True
            try:
                try:
                    await conn.stream.send_all(self._target.request)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as error:
                    if reused:
                        raise _StaleConnection from None
                    raise _Failure("read", f"{type(error).__name__}: {error}") from None
                progress.sent = True
                progress.last_byte = time.perf_counter()
                return conn, await self._read_head(conn, progress, reused=reused)
            except _StaleConnection:
                # The server closed an idle keep-alive connection (llama.cpp does after every
                # stream, without `connection: close`). Retry on a new connection, which cannot
                # be stale, and time the request afresh: the lost attempt is the loader's cost.
                await self.aclose()
                self._counters.stale_retries += 1
                progress.restart()

    async def _read_head(
        self, conn: _Connection, progress: _Progress, *, reused: bool
    ) -> tuple[int, dict[bytes, bytes], bool]:
        buf = self._buf
        received = bool(buf)
        while True:
            end = buf.find(b"\r\n\r\n")
            if end >= 0:
                head, buf = buf[:end], buf[end + 4 :]
                status, headers, keep_alive = _parse_head(head)
                if 100 <= status < 200:
                    continue  # interim responses (100 Continue, 103 Early Hints) precede the real one
                self._buf = buf
                return status, headers, keep_alive
            if len(buf) > _MAX_HEAD:
                raise _Failure("protocol", "response head too large")
            try:
                data = await conn.receive()
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as error:
                if reused and not received:
                    raise _StaleConnection from None
                raise _Failure("read", f"{type(error).__name__}: {error}") from None
            progress.head_at = time.perf_counter()
            if not data:
                if reused and not received:
                    raise _StaleConnection
                raise _Failure("read", "connection closed before the response head")
            received = True
            buf += data


class _Progress:
    """Timestamps shared between a request and its timeout handler."""

    __slots__ = ("t_start", "sent", "last_byte", "head_at")

    def __init__(self, t_start: float) -> None:
        self.t_start = t_start
        self.sent = False
        self.last_byte = t_start
        self.head_at = t_start

    def restart(self) -> None:
        self.t_start = time.perf_counter()
        self.sent = False
        self.last_byte = self.t_start


def _parse_head(head: bytes) -> tuple[int, dict[bytes, bytes], bool]:
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise _Failure("protocol", f"bad status line {lines[0][:80]!r}")
    status = int(parts[1])
    headers: dict[bytes, bytes] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            raise _Failure("protocol", f"bad header line {line[:80]!r}")
        key = name.strip().lower()
        value = value.strip()
        # Repeated headers are joined as RFC 9110 allows for list-valued fields.
        headers[key] = headers[key] + b", " + value if key in headers else value
    connection = headers.get(b"connection", b"").lower()
    if parts[0] == b"HTTP/1.0":
        keep_alive = b"keep-alive" in connection
    else:
        keep_alive = b"close" not in connection
    return status, headers, keep_alive


def _decoder_for(status: int, headers: dict[bytes, bytes]) -> _BodyDecoder | None:
    """The body framing; None when the body runs until the connection closes."""
    if status in (204, 304):
        return _LengthDecoder(0)
    encoding = headers.get(b"transfer-encoding")
    if encoding is not None:
        if encoding.lower().rsplit(b",", 1)[-1].strip() != b"chunked":
            raise _Failure("protocol", f"unsupported transfer-encoding {encoding!r}")
        return ChunkedDecoder()
    length = headers.get(b"content-length")
    if length is not None:
        if not length.isdigit():
            raise _Failure("protocol", f"bad content-length {length!r}")
        return _LengthDecoder(int(length))
    return None


# ---------------------------------------------------------------------------------------------
# Server process sampling


class ProcessSampler:
    """CPU time (user+sys) and summed RSS of some processes and their descendants, read through
    psutil, so it works wherever psutil does (Linux, macOS, Windows, the BSDs).

    A process is identified by (pid, create time), so a reused pid counts as a new process. A
    process first seen after the first sample was born during the run: all its CPU time counts.
    A process that exits keeps the time it had at its last sample. Processes that vanish or may
    not be read between two calls are skipped, never raised.
    """

    def __init__(self, pids: Sequence[int]) -> None:
        self.pids = list(pids)
        self._baseline: dict[tuple[int, float], float] = {}
        self._latest: dict[tuple[int, float], float] = {}
        self.samples = 0
        self.rss_start_bytes = 0
        self.rss_peak_bytes = 0

    @property
    def cpu_seconds(self) -> float:
        return sum(self._latest[key] - self._baseline[key] for key in self._latest)

    @property
    def processes_seen(self) -> int:
        return len(self._latest)

    def sample(self) -> None:
        """Read every process once: a few small reads each, cheap enough for the event loop."""
        first = self.samples == 0
        rss = 0
        for process in self._processes():
            try:
                with process.oneshot():  # the create and CPU times come from one read
                    key = (process.pid, process.create_time())
                    times = process.cpu_times()
                    memory = process.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            cpu = times.user + times.system
            # Born during the run when first seen after the first sample. Comparing its create
            # time with the first sample's clock instead would misjudge: on Linux psutil derives
            # it from the boot time in whole seconds, so a newborn child can look a second older.
            self._baseline.setdefault(key, cpu if first else 0.0)
            self._latest[key] = cpu
            rss += memory
        if first:
            self.rss_start_bytes = rss
        self.rss_peak_bytes = max(self.rss_peak_bytes, rss)
        self.samples += 1

    async def run_sampling(self, interval: float = 0.1) -> None:
        """Sample every `interval` seconds until cancelled."""
        while True:
            await trio.sleep(interval)
            self.sample()

    def _processes(self) -> list[psutil.Process]:
        found: dict[int, psutil.Process] = {}
        for pid in self.pids:
            try:
                root = psutil.Process(pid)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            found.setdefault(root.pid, root)
            try:
                children = root.children(recursive=True)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue  # the root exited between the two calls; its last sample stands
            for child in children:
                found.setdefault(child.pid, child)
        return list(found.values())


# ---------------------------------------------------------------------------------------------
# The run


class _Plan:
    """Hands out request slots until the count or the deadline is reached."""

    def __init__(self, limit: int | None, deadline: float | None) -> None:
        self._left = limit
        self._deadline = deadline

    def take(self) -> bool:
        if self._left is not None:
            if self._left <= 0:
                return False
        if self._deadline is not None and time.perf_counter() >= self._deadline:
            return False
        if self._left is not None:
            self._left -= 1
        return True


async def _run_phase(
    clients: list[_Client],
    plan: _Plan,
    timeout: float | None,
    run_start: float,
    sink: list[RequestResult] | None,
    counters: _Counters | None,
    ramp_up: float = 0.0,
) -> None:
    async def run_worker(client: _Client, start_at: float) -> None:
        if start_at > 0:
            await trio.sleep_until(trio.current_time() + start_at)
        while plan.take():
            result = await client.request(timeout, run_start)
            if sink is not None and counters is not None:
                sink.append(result)
                if result.error is None:
                    counters.completed += 1
                else:
                    counters.failed += 1

    step = ramp_up / len(clients) if clients else 0.0
    async with trio.open_nursery() as nursery:
        for index, client in enumerate(clients):
            nursery.start_soon(run_worker, client, index * step)


async def run_load(config: LoadConfig, *, server_pids: Sequence[int] = ()) -> LoadReport:
    """Run the load described by `config` and aggregate it.

    Requests that fail are counted, never raised. In-flight requests are allowed to finish
    after the duration ends (bounded by `config.timeout`), so slow streams are not dropped from
    the distributions. Raises `ValueError` only for an invalid configuration.
    """
    target = _target(config)
    counters = _Counters()
    clients = [_Client(target, config.api, counters) for _ in range(config.concurrency)]
    results: list[RequestResult] = []
    sampler = ProcessSampler(server_pids) if server_pids else None
    try:
        if config.warmup:
            await _run_phase(
                clients, _Plan(config.warmup, None), config.timeout, time.perf_counter(), None, None
            )
        warm_connections = counters.connections_opened
        warm_retries = counters.stale_retries
        started_at = time.time()
        cpu_start = time.process_time()
        run_start = time.perf_counter()
        deadline = None if config.duration is None else run_start + config.duration
        if sampler is not None:
            sampler.sample()
        async with trio.open_nursery() as background:
            if sampler is not None:
                background.start_soon(sampler.run_sampling)
            if config.progress:
                background.start_soon(_run_progress, config, counters, run_start)
            await _run_phase(
                clients,
                _Plan(config.request_limit, deadline),
                config.timeout,
                run_start,
                results,
                counters,
                config.ramp_up,
            )
            background.cancel_scope.cancel()
        wall = time.perf_counter() - run_start
        loader_cpu = time.process_time() - cpu_start
        if sampler is not None:
            sampler.sample()
    finally:
        for client in clients:
            await client.aclose()
    counters.connections_opened -= warm_connections
    counters.stale_retries -= warm_retries
    return _aggregate(config, results, counters, started_at, wall, loader_cpu, sampler)


async def _run_progress(config: LoadConfig, counters: _Counters, run_start: float) -> None:
    # Imported here: rich is only needed for a live display, and only the CLI asks for one.
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    limit = config.request_limit
    by_count = limit is not None
    total = float(limit) if limit is not None else float(config.duration or 0)
    columns = (
        TextColumn("[bold]loadtest[/]"),
        BarColumn(),
        TextColumn("{task.fields[ok]} ok  {task.fields[failed]} failed  {task.fields[rate]:.1f}/s"),
        TimeElapsedColumn(),
    )
    # auto_refresh off: no extra thread waking up; this task refreshes 4 times a second.
    with Progress(*columns, auto_refresh=False, transient=False) as progress:
        task = progress.add_task("run", total=total, ok=0, failed=0, rate=0.0)
        try:
            while True:
                await trio.sleep(0.25)
                elapsed = time.perf_counter() - run_start
                done = counters.completed + counters.failed
                progress.update(
                    task,
                    completed=done if by_count else min(elapsed, total),
                    ok=counters.completed,
                    failed=counters.failed,
                    rate=counters.completed / elapsed if elapsed > 0 else 0.0,
                )
                progress.refresh()
        finally:
            elapsed = time.perf_counter() - run_start
            progress.update(
                task,
                completed=counters.completed + counters.failed if by_count else total,
                ok=counters.completed,
                failed=counters.failed,
                rate=counters.completed / elapsed if elapsed > 0 else 0.0,
            )
            progress.refresh()


def _aggregate(
    config: LoadConfig,
    results: list[RequestResult],
    counters: _Counters,
    started_at: float,
    wall: float,
    loader_cpu: float,
    sampler: ProcessSampler | None,
) -> LoadReport:
    ok = [r for r in results if r.error is None]
    completed = len(ok)
    gaps: array[float] = array("d")
    for r in ok:
        gaps.extend(r.gaps)
    silences = sorted(r.longest_silence for r in results if r.status and r.longest_silence is not None)
    silence_p99 = Percentiles.of(silences).p99
    events_total = sum(r.events for r in ok)
    server = None
    if sampler is not None:
        cpu = sampler.cpu_seconds
        server = ServerUsage(
            pids=list(sampler.pids),
            processes_seen=sampler.processes_seen,
            cpu_seconds=round(cpu, 3),
            cpu_per_response_ms=_ms(cpu / completed) if completed else None,
            rss_start_bytes=sampler.rss_start_bytes,
            rss_peak_bytes=sampler.rss_peak_bytes,
            rss_growth_per_stream_bytes=round(
                max(0, sampler.rss_peak_bytes - sampler.rss_start_bytes) / config.concurrency, 1
            ),
            samples=sampler.samples,
        )
    errors = Counter(r.error for r in results if r.error is not None)
    examples: dict[str, str] = {}
    kinds: Counter[str] = Counter()
    kind_examples: dict[str, str] = {}
    for r in results:
        if r.error is not None and r.error not in examples:
            examples[r.error] = r.error_detail
        kind = r.failure_kind
        if kind is not None:
            kinds[kind] += 1
            kind_examples.setdefault(kind, r.error_detail)
    failures = dict(sorted(kinds.items(), key=lambda item: (-item[1], item[0])))
    return LoadReport(
        machine=_describe_machine(),
        config=_reported_config(config),
        started_at=started_at,
        wall_seconds=round(wall, 6),
        requests_completed=completed,
        requests_failed=len(results) - completed,
        throughput_rps=round(completed / wall, 3) if wall > 0 else 0.0,
        status_codes=dict(sorted(Counter(str(r.status) for r in results if r.status).items())),
        errors=dict(sorted(errors.items())),
        error_examples=examples,
        failures=failures,
        failure_examples={kind: kind_examples[kind] for kind in failures},
        terminals=dict(sorted(Counter(r.terminal for r in ok if r.terminal).items())),
        time_to_first_byte_ms=Percentiles.of([r.time_to_first_byte for r in ok if r.time_to_first_byte is not None]),
        time_to_first_event_ms=Percentiles.of(
            [r.time_to_first_event for r in ok if r.time_to_first_event is not None]
        ),
        time_to_first_text_ms=Percentiles.of([r.time_to_first_text for r in ok if r.time_to_first_text is not None]),
        total_latency_ms=Percentiles.of([r.total for r in ok if r.total is not None]),
        inter_event_gap_ms=Percentiles.of(gaps),
        longest_silence_max_ms=_ms(silences[-1]) if silences else None,
        longest_silence_p99_ms=silence_p99,
        events_total=events_total,
        events_per_response=round(events_total / completed, 2) if completed else None,
        reads_per_response=round(sum(r.reads for r in ok) / completed, 2) if completed else None,
        heartbeats_total=sum(r.heartbeats for r in results),
        connections_opened=counters.connections_opened,
        stale_connection_retries=counters.stale_retries,
        loader_cpu_seconds=round(loader_cpu, 4),
        loader_cpu_per_response_ms=_ms(loader_cpu / completed) if completed else None,
        server=server,
        requests=results,
    )


def _reported_config(config: LoadConfig) -> dict[str, Any]:
    """The settings as the JSON and HTML reports show them. Header values and a password in the
    URL are left out: they are often keys, and reports get shared."""
    data = asdict(config)
    data["headers"] = [name for name, _ in config.headers]
    parts = urlsplit(config.url)
    if "@" in parts.netloc:
        data["url"] = parts._replace(netloc=parts.netloc.rsplit("@", 1)[-1]).geturl()
    data["path"] = _target(config).path
    return data


# ---------------------------------------------------------------------------------------------
# Outputs


def format_summary(report: LoadReport) -> str:
    """A compact, human summary."""
    c = report.config
    lines = [
        f"gateway loadtest: {_endpoint(c)}  model={c['model']}  "
        f"concurrency={c['concurrency']}",
        f"  {report.requests_completed} ok, {report.requests_failed} failed in "
        f"{report.wall_seconds:.2f} s: {report.throughput_rps:.1f} responses/s; "
        f"{report.connections_opened} new connections"
        + (f", {report.stale_connection_retries} found closed" if report.stale_connection_retries else ""),
    ]
    if report.failures:
        counted = report.requests_completed + report.requests_failed
        lines.append(f"  failed by kind ({report.requests_failed} of {counted}, {_percent(report.error_rate)}):")
        for kind, n in report.failures.items():
            example = report.failure_examples.get(kind, "")
            lines.append(f"    {kind}: {n}" + (f"    e.g. {example[:120]}" if example else ""))
    lines.append(f"  {'(ms)':<18}{'p50':>9}{'p90':>9}{'p99':>9}{'max':>9}")
    for label, dist in (
        ("first byte", report.time_to_first_byte_ms),
        ("first event", report.time_to_first_event_ms),
        ("first text", report.time_to_first_text_ms),
        ("total", report.total_latency_ms),
        ("event gap", report.inter_event_gap_ms),
    ):
        cells = "".join(f"{_num(v):>9}" for v in (dist.p50, dist.p90, dist.p99, dist.max))
        lines.append(f"  {label:<18}{cells}")
    lines.append(
        f"  longest silence: max {_num(report.longest_silence_max_ms)} ms, "
        f"p99 {_num(report.longest_silence_p99_ms)} ms; heartbeats {report.heartbeats_total}; "
        f"events/response {_num(report.events_per_response)} in {_num(report.reads_per_response)} reads"
    )
    if report.server is not None:
        s = report.server
        lines.append(
            f"  server: cpu {s.cpu_seconds:.2f} s ({_num(s.cpu_per_response_ms)} ms/response) "
            f"over {s.processes_seen} processes; rss {_mib(s.rss_start_bytes)} -> peak "
            f"{_mib(s.rss_peak_bytes)} MiB"
        )
    lines.append(
        f"  loader: cpu {report.loader_cpu_seconds:.2f} s ({_num(report.loader_cpu_per_response_ms)} ms/response)"
    )
    return "\n".join(lines)


def _percent(rate: float) -> str:
    # One failure in thousands of requests must not read as 0.0%.
    text = f"{rate:.1%}"
    return "<0.1%" if rate and text == "0.0%" else text


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def _mib(value: int) -> str:
    return f"{value / 1048576:.1f}"


def _endpoint(config: dict[str, Any]) -> str:
    """`api` and the URL requested (the reported `path` already holds the base URL's path)."""
    parts = urlsplit(str(config["url"]))
    return f"{config['api']} {parts.scheme}://{parts.netloc}{config['path']}"


def _seconds(value: float) -> str:
    return f"{value:g} s"


def _duration_label(ms: float) -> str:
    """An axis tick: `250 ms`, `1.5 s`."""
    return f"{ms:g} ms" if ms < 1000 else f"{ms / 1000:g} s"


def _settings_rows(config: dict[str, Any]) -> list[tuple[str, str]]:
    """Every setting of the run, readable. A `LoadConfig` field without a label here is still
    shown, under its own name, so a new setting cannot silently go missing from the page."""
    rows: list[tuple[str, str]] = []
    for key, value in config.items():
        if key in ("url", "path", "api", "progress"):
            continue  # the endpoint row shows these; a progress bar does not change a result
        if key == "requests":
            if value is None:
                value = "as many as the duration allows" if config.get("duration") else f"{DEFAULT_REQUESTS} (default)"
        elif key == "duration":
            value = "until the requests are sent" if value is None else _seconds(value)
        elif key in ("timeout", "ramp_up"):
            value = "none" if not value else _seconds(value)
        elif key == "max_output_tokens" and value is None:
            value = "the server's default"
        elif key == "headers":
            # Names only, even if a caller built the report from a raw config: values may be keys.
            names = [item[0] if isinstance(item, (list, tuple)) else item for item in value]
            value = ", ".join(map(str, names)) or "none"
        elif key == "input":
            text = str(value)
            value = f"{text[:160]}{'…' if len(text) > 160 else ''} ({len(text)} characters)"
        rows.append((_SETTING_LABELS.get(key, key), "-" if value is None else str(value)))
    return rows


_SETTING_LABELS = {
    "model": "model",
    "input": "input",
    "max_output_tokens": "max output tokens",
    "concurrency": "concurrent streams",
    "requests": "requests",
    "duration": "duration",
    "timeout": "per-request timeout",
    "warmup": "warm-up requests (not counted)",
    "headers": "extra headers (names)",
    "ramp_up": "ramp-up",
}

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1000px}
h1{font-size:20px;margin-bottom:4px}h2{font-size:16px;margin-top:28px}
.meta{color:#555;margin-top:0}
table{border-collapse:collapse}td,th{padding:3px 10px;border-bottom:1px solid #ddd;text-align:right}
td:first-child,th:first-child{text-align:left}
table.run td{text-align:left}
.example{font-family:ui-monospace,monospace;font-size:12px;text-align:left;max-width:640px;overflow-wrap:anywhere}
svg{background:#fafafa;border:1px solid #ddd}
.axis{stroke:#888;stroke-width:1}.grid{stroke:#e4e4e4;stroke-width:1}
text{font:11px system-ui,sans-serif;fill:#444}
"""

_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728")
_FAILED_COLOR = "#d62728"


def render_html(report: LoadReport) -> str:
    """A self-contained page: when, where and with which settings the run was made; the
    results; time to first event and total latency in panels of their own; completed and failed
    requests per second over the run; the longest silences. Inline SVG, nothing fetched; every
    value from the configuration or the server is escaped."""
    ok = [r for r in report.requests if r.error is None]
    esc = html.escape
    c = report.config
    endpoint = _endpoint(c)
    when = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(report.started_at))
    run_rows = [("started", when), ("machine", report.machine or "-"), ("endpoint", endpoint)]
    run_rows += _settings_rows(c)
    rows = [
        ("completed / failed", f"{report.requests_completed} / {report.requests_failed}"),
        ("wall time", f"{report.wall_seconds:.2f} s"),
        ("throughput", f"{report.throughput_rps:.2f} responses/s"),
        ("failed by kind", ", ".join(f"{k}: {v}" for k, v in report.failures.items()) or "none"),
        ("connections opened", str(report.connections_opened)),
        ("heartbeats", str(report.heartbeats_total)),
        ("longest silence max / p99", f"{_num(report.longest_silence_max_ms)} / {_num(report.longest_silence_p99_ms)} ms"),
        ("loader cpu", f"{report.loader_cpu_seconds:.2f} s ({_num(report.loader_cpu_per_response_ms)} ms/response)"),
    ]
    if report.server is not None:
        s = report.server
        rows.append(("server cpu", f"{s.cpu_seconds:.2f} s ({_num(s.cpu_per_response_ms)} ms/response)"))
        rows.append(("server rss start / peak", f"{_mib(s.rss_start_bytes)} / {_mib(s.rss_peak_bytes)} MiB"))
    run_table = "".join(f"<tr><td>{esc(k)}</td><td>{esc(v)}</td></tr>" for k, v in run_rows)
    summary = "".join(f"<tr><td>{esc(k)}</td><td>{esc(v)}</td></tr>" for k, v in rows)
    errors = ""
    if report.failures:
        errors = (
            "<h2>Errors by kind</h2><table><tr><th>kind</th><th>n</th><th>first example</th></tr>"
            + "".join(
                f"<tr><td>{esc(kind)}</td><td>{n}</td>"
                f"<td class='example'>{esc(report.failure_examples.get(kind, '')[:400])}</td></tr>"
                for kind, n in report.failures.items()
            )
            + "</table>"
        )
    dist_rows = "".join(
        f"<tr><td>{esc(label)}</td><td>{d.count}</td>"
        + "".join(f"<td>{_num(v)}</td>" for v in (d.p50, d.p90, d.p99, d.max))
        + "</tr>"
        for label, d in (
            ("time to first byte", report.time_to_first_byte_ms),
            ("time to first event", report.time_to_first_event_ms),
            ("time to first text", report.time_to_first_text_ms),
            ("total latency", report.total_latency_ms),
            ("inter-event gap", report.inter_event_gap_ms),
        )
    )
    # One panel each: a first event in milliseconds and a total in seconds do not share a scale.
    first_cdf = _svg_cdf(
        [("time to first event", [r.time_to_first_event * 1000 for r in ok if r.time_to_first_event is not None])]
    )
    total_cdf = _svg_cdf([("total latency", [r.total * 1000 for r in ok if r.total is not None])])
    timeline = _svg_timeline(report.requests, report.wall_seconds)
    silences = [
        (r.longest_silence * 1000, r.error is not None)
        for r in report.requests
        if r.status and r.longest_silence is not None
    ]
    bars = _svg_bars(silences)
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>gateway loadtest {esc(when)}</title><style>{_CSS}</style></head><body>"
        f"<h1>gateway loadtest: {esc(endpoint)}</h1>"
        f"<p class='meta'>{esc(when)} &middot; {report.requests_completed} completed, "
        f"{report.requests_failed} failed in {report.wall_seconds:.2f} s</p>"
        f"<h2>Run</h2><table class='run'>{run_table}</table>"
        f"<h2>Results</h2><table>{summary}</table>{errors}"
        "<h2>Latency (ms, successful requests)</h2><table><tr><th></th><th>n</th><th>p50</th>"
        f"<th>p90</th><th>p99</th><th>max</th></tr>{dist_rows}</table>"
        f"<h2>Time to first event (cumulative)</h2>{first_cdf}"
        f"<h2>Total latency (cumulative)</h2>{total_cdf}"
        "<h2>Throughput and errors over time (requests ended per second; failed in red)</h2>"
        f"{timeline}"
        "<h2>Longest silence per request (ms, in start order; failed requests in red)</h2>"
        f"{bars}</body></html>"
    )


def _nice_step(span: float, ticks: int) -> float:
    """A round tick step (1, 2 or 5 times a power of ten) giving about `ticks` ticks."""
    if span <= 0:
        return 1.0
    raw = span / ticks
    magnitude = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 5):
        if raw <= factor * magnitude:
            return factor * magnitude
    return 10 * magnitude


def _nice_scale(top: float, ticks: int) -> tuple[float, float]:
    """(axis maximum, tick step): the maximum rounded up to a whole number of steps."""
    step = _nice_step(top or 1.0, ticks)
    return step * max(1, math.ceil(top / step - 1e-9)), step


def _general(value: float) -> str:
    return f"{value:g}"


class _Plot:
    """Pixel geometry of one chart: a plot area with a left and a bottom margin for labels."""

    def __init__(self, width: int, height: int, x_max: float, y_max: float, *, top: int = 16) -> None:
        self.width, self.height = width, height
        self.left, self.top = 56, top
        self.plot_w = width - self.left - 20
        self.plot_h = height - self.top - 40
        self.x_max, self.y_max = x_max, y_max

    def x(self, value: float) -> float:
        return self.left + self.plot_w * value / self.x_max

    def y(self, value: float) -> float:
        return self.top + self.plot_h - self.plot_h * value / self.y_max

    def axes(
        self,
        x_step: float,
        y_step: float,
        y_fmt: Callable[[float], str],
        x_label: str,
        x_fmt: Callable[[float], str] = _general,
    ) -> list[str]:
        parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{self.width}' height='{self.height}'>"]
        bottom = self.top + self.plot_h
        for i in range(round(self.x_max / x_step) + 1):
            x = self.x(i * x_step)
            parts.append(f"<line class='grid' x1='{x:.1f}' y1='{self.top}' x2='{x:.1f}' y2='{bottom}'/>")
            parts.append(f"<text x='{x:.1f}' y='{bottom + 15}' text-anchor='middle'>{x_fmt(i * x_step)}</text>")
        for i in range(round(self.y_max / y_step) + 1):
            y = self.y(i * y_step)
            parts.append(f"<line class='grid' x1='{self.left}' y1='{y:.1f}' x2='{self.left + self.plot_w}' y2='{y:.1f}'/>")
            parts.append(f"<text x='{self.left - 6}' y='{y + 4:.1f}' text-anchor='end'>{y_fmt(i * y_step)}</text>")
        parts.append(f"<line class='axis' x1='{self.left}' y1='{bottom}' x2='{self.left + self.plot_w}' y2='{bottom}'/>")
        parts.append(f"<line class='axis' x1='{self.left}' y1='{self.top}' x2='{self.left}' y2='{bottom}'/>")
        parts.append(
            f"<text x='{self.left + self.plot_w / 2:.0f}' y='{self.height - 6}' text-anchor='middle'>"
            f"{html.escape(x_label)}</text>"
        )
        return parts

    def legend(self, index: int, color: str, label: str) -> str:
        x = self.left + 260 * index
        return (
            f"<rect x='{x}' y='8' width='12' height='10' fill='{color}'/>"
            f"<text x='{x + 18}' y='17'>{html.escape(label)}</text>"
        )


def _svg_cdf(series: list[tuple[str, list[float]]], width: int = 900, height: int = 320) -> str:
    top = max((max(values) for _, values in series if values), default=0.0)
    x_max, x_step = _nice_scale(top, 8)
    plot = _Plot(width, height, x_max, 1.0, top=34)  # room for the legend above the plot
    parts = plot.axes(x_step, 0.25, lambda v: f"{v:.0%}", "time since the request started", _duration_label)
    for index, (label, values) in enumerate(series):
        color = _COLORS[index % len(_COLORS)]
        ordered = sorted(values)
        n = len(ordered)
        if n:
            stride = max(1, n // 600)  # a few hundred points draw the same curve as thousands
            points = [f"{plot.x(ordered[0]):.1f},{plot.y(0):.1f}"]
            for i in list(range(0, n, stride)) + [n - 1]:
                points.append(f"{plot.x(ordered[i]):.1f},{plot.y((i + 1) / n):.1f}")
            parts.append(f"<polyline fill='none' stroke='{color}' stroke-width='2' points='{' '.join(points)}'/>")
        parts.append(plot.legend(index, color, f"{label} (n={n})"))
    parts.append("</svg>")
    return "".join(parts)


def _svg_timeline(requests: Sequence[RequestResult], wall: float, width: int = 900, height: int = 280) -> str:
    """Requests per second that ended in each slice of the run, the completed stacked under the
    failed. Slices are about a hundredth of the run (0.1 s at least): seconds for a minute's
    run, tenths for a few seconds', so a stall or a burst of errors shows where it happened."""
    bucket = max(0.1, _nice_step(wall, 100))
    count = max(1, math.ceil(wall / bucket - 1e-9))
    done, failed = [0] * count, [0] * count
    for r in requests:
        index = min(count - 1, max(0, int(r.ended / bucket)))
        (done if r.error is None else failed)[index] += 1
    y_max, y_step = _nice_scale(max((a + b for a, b in zip(done, failed)), default=0) / bucket, 5)
    x_max, x_step = _nice_scale(count * bucket, 8)
    plot = _Plot(width, height, x_max, y_max, top=34)
    parts = plot.axes(x_step, y_step, _general, "seconds into the run")
    parts.append(plot.legend(0, _COLORS[0], f"completed ({sum(done)})"))
    parts.append(plot.legend(1, _FAILED_COLOR, f"failed ({sum(failed)})"))
    bar_w = max(plot.plot_w * bucket / x_max * 0.85, 0.5)
    for index, (ok_count, failed_count) in enumerate(zip(done, failed)):
        if not ok_count + failed_count:
            continue
        x = plot.x(index * bucket)
        title = (
            f"<title>{index * bucket:g}–{(index + 1) * bucket:g} s: "
            f"{ok_count} completed, {failed_count} failed</title>"
        )
        for low, high, kind, color in (
            (0, ok_count, "completed", _COLORS[0]),
            (ok_count, ok_count + failed_count, "failed", _FAILED_COLOR),
        ):
            if high > low:
                top_y, low_y = plot.y(high / bucket), plot.y(low / bucket)
                parts.append(
                    f"<rect class='{kind}' x='{x:.2f}' y='{top_y:.2f}' width='{bar_w:.2f}' "
                    f"height='{low_y - top_y:.2f}' fill='{color}'>{title}</rect>"
                )
    parts.append("</svg>")
    return "".join(parts)


def _svg_bars(values: list[tuple[float, bool]], width: int = 900, height: int = 260) -> str:
    # Many requests: one bar per bucket of consecutive requests, showing the bucket's worst.
    size = max(1, math.ceil(len(values) / 600))
    bars = [
        (max(v for v, _ in values[i : i + size]), any(failed for _, failed in values[i : i + size]))
        for i in range(0, len(values), size)
    ]
    y_max, y_step = _nice_scale(max((v for v, _ in bars), default=0.0), 5)
    x_max, x_step = _nice_scale(float(max(1, len(values))), 8)
    plot = _Plot(width, height, x_max, y_max)
    parts = plot.axes(x_step, y_step, _general, "request (in start order)")
    bar_w = plot.plot_w * size / x_max
    for i, (value, failed) in enumerate(bars):
        color = _FAILED_COLOR if failed else _COLORS[0]
        y = plot.y(value)
        parts.append(
            f"<rect x='{plot.x(i * size):.2f}' y='{y:.2f}' width='{max(bar_w * 0.85, 0.5):.2f}' "
            f"height='{plot.top + plot.plot_h - y:.2f}' fill='{color}'/>"
        )
    parts.append("</svg>")
    return "".join(parts)


# ---------------------------------------------------------------------------------------------
# Command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the loadtest options to `parser` (the `gateway loadtest` subcommand uses this)."""
    parser.add_argument("--url", default="http://127.0.0.1:8080", help="server base URL (default: %(default)s)")
    parser.add_argument("--api", choices=("responses", "chat"), default="responses",
                        help="POST /v1/responses, or /v1/chat/completions for a direct baseline")
    parser.add_argument("--model", default="sim", help="model name (default: %(default)s)")
    parser.add_argument("--input", default=DEFAULT_INPUT, help="the user message")
    parser.add_argument("--max-output-tokens", type=int, help="max_output_tokens (max_tokens for chat)")
    parser.add_argument("--concurrency", "-c", type=int, default=1, help="concurrent streams (default: 1)")
    parser.add_argument("--requests", "-n", type=int,
                        help=f"total requests (default: unlimited with --duration, else {DEFAULT_REQUESTS})")
    parser.add_argument("--duration", "-d", type=float, help="stop starting requests after SECONDS")
    parser.add_argument("--timeout", type=float, help="per-request timeout in seconds, connect included")
    parser.add_argument("--ramp-up", type=float, default=0.0, help="seconds over which the workers start (default 0)")
    parser.add_argument("--warmup", type=int, default=0, help="requests sent first and not counted")
    parser.add_argument("--header", "-H", action="append", default=[], metavar="K:V",
                        help="extra request header (repeatable)")
    parser.add_argument("--server-pid", action="append", type=int, default=[], metavar="PID",
                        help="server pid to sample for CPU time and RSS, children included (repeatable)")
    parser.add_argument("--json", dest="json_path", metavar="PATH", help="write the report as JSON")
    parser.add_argument("--json-requests", action="store_true", help="include per-request records in --json")
    parser.add_argument("--html", dest="html_path", metavar="PATH", help="write an HTML report with charts")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="show live progress (default: when stdout is a terminal)")
    parser.add_argument("--max-error-rate", type=float, default=0.0, metavar="R",
                        help="exit 1 when more than this fraction (0..1) of the counted requests failed "
                        "(default 0: any failure)")


def _config_from(args: argparse.Namespace) -> LoadConfig:
    headers = []
    for item in args.header:
        name, sep, value = item.partition(":")
        if not sep:
            raise ValueError(f"--header needs K:V, got {item!r}")
        headers.append((name.strip(), value.strip()))
    progress = args.progress if args.progress is not None else sys.stdout.isatty()
    return LoadConfig(
        url=args.url,
        api=args.api,
        model=args.model,
        input=args.input,
        max_output_tokens=args.max_output_tokens,
        concurrency=args.concurrency,
        requests=args.requests,
        duration=args.duration,
        timeout=args.timeout,
        warmup=args.warmup,
        headers=tuple(headers),
        progress=progress,
        ramp_up=args.ramp_up,
    )


def _max_error_rate(args: argparse.Namespace) -> float:
    rate = float(getattr(args, "max_error_rate", 0.0))
    if not 0 <= rate <= 1:  # NaN fails this too
        raise ValueError(f"--max-error-rate must be a fraction from 0 to 1, got {rate:g}")
    return rate


def _verdict(report: LoadReport, max_error_rate: float) -> str | None:
    """Why the run fails, in one line, or None when it passes: more than `max_error_rate` of
    the counted requests failed, or none succeeded."""
    counted = report.requests_completed + report.requests_failed
    if report.requests_failed and report.error_rate > max_error_rate:
        return (
            f"{report.requests_failed} of {counted} requests failed ({_percent(report.error_rate)}), "
            f"above --max-error-rate {max_error_rate:g}"
        )
    if not report.requests_completed:
        return f"none of {counted} requests succeeded" if counted else "no request was made"
    return None


def main(args: argparse.Namespace) -> int:
    """Run the load test described by parsed `args`, print a summary and write the outputs.

    Returns 0 when the run passed, 1 (with one line on stderr saying why) when more than
    `--max-error-rate` of the counted requests failed or none succeeded, 2 for invalid options.
    """
    try:
        config = _config_from(args)
        max_error_rate = _max_error_rate(args)
    except ValueError as error:
        print(f"gateway loadtest: {error}", file=sys.stderr)
        return 2
    _raise_fd_limit()
    try:
        report = trio.run(lambda: run_load(config, server_pids=args.server_pid))
    except KeyboardInterrupt:
        print("gateway loadtest: interrupted", file=sys.stderr)
        return 130
    print(format_summary(report))
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as file:
            file.write(report.to_json(include_requests=getattr(args, "json_requests", False)))
    if args.html_path:
        with open(args.html_path, "w", encoding="utf-8") as file:
            file.write(render_html(report))
    problem = _verdict(report, max_error_rate)
    if problem is not None:
        print(f"gateway loadtest: {problem}", file=sys.stderr)
        return 1
    return 0


def _raise_fd_limit() -> None:
    # Each stream holds two descriptors (see `_Connection`); thousands of streams need more than
    # the usual soft limit of 1024.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass  # then the run reports connect errors, which say why


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gateway loadtest",
        description="Run concurrent streams against a Responses (or Chat Completions) endpoint and measure them.",
    )
    add_arguments(parser)
    return parser


if __name__ == "__main__":
    sys.exit(main(_parser().parse_args()))
