"""The load generator's HTTP/1.1 client: one worker's requests on one kept-alive connection.

It owns the connection (trio sockets, a duplicate descriptor for cheap reads), the request's
bytes (`Target`), the timing of each request (connect, first byte, every read, the longest
silence, the timeout) and the error kind each failure gets: every failure becomes
`RequestResult.error`, none escapes. It knows nothing of how many requests run or for how long
(`run.py`), nor of reports beyond filling in one `RequestResult`.

No HTTP library: its cost per stream must be tiny, because it runs on the same small machine
as the server under test. The request bytes are built once and written as they are; the
response is framed by `framing.py` and cut into SSE frames by `frames.py`. A connection is
kept alive between one worker's sequential requests; one the server closed while idle is
replaced and the request retried (`Counters.stale_retries`).
"""

from __future__ import annotations

import math
import os
import socket
import time
from dataclasses import dataclass
from typing import Any

import orjson
import trio

from .config import DEFAULT_MAX_TOKENS, ApiKind, LoadConfig
from .failures import MAX_ERROR_BODY, body_failure
from .frames import DIALECTS, TERMINAL_NAMES, FrameScanner
from .framing import UntilCloseDecoder, decoder_for, parse_head
from .report import Counters, RequestResult

__all__ = ["Client", "Target"]

_READ_SIZE = 65536
_MAX_HEAD = 65536
# A refused connection fails in microseconds; without a pause an unlimited run would spin a
# core on a machine it shares with the server under test.
_CONNECT_BACKOFF = 0.05
# The version of Anthropic's Messages API the requests ask for (`anthropic-version`).
ANTHROPIC_VERSION = "2023-06-01"


class _Failure(Exception):
    """Ends one request with an error kind (never escapes the worker)."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail


class _StaleConnection(Exception):
    """A reused keep-alive connection was closed by the server before answering."""


@dataclass(frozen=True)
class Target:
    """Where a run's requests go and the request itself, built once: every send writes the same
    bytes."""

    host: str
    port: int
    request: bytes
    stream: bool = True  # False: the answer is one JSON body

    @classmethod
    def of(cls, config: LoadConfig) -> Target:
        """The target of `config`. Raises `ValueError` for a URL the client cannot use."""
        endpoint = config.endpoint()
        body: dict[str, Any]
        stream = config.stream
        if config.api == "responses":
            body = {"model": config.model, "input": config.input, "stream": stream}
            if config.max_output_tokens is not None:
                body["max_output_tokens"] = config.max_output_tokens
        elif config.api == "messages":
            tokens = config.max_output_tokens
            body = {
                "model": config.model,
                "max_tokens": DEFAULT_MAX_TOKENS if tokens is None else tokens,
                "stream": stream,
                "messages": [{"role": "user", "content": config.input}],
            }
        else:
            body = {
                "model": config.model,
                "messages": [{"role": "user", "content": config.input}],
                "stream": stream,
            }
            if stream:
                body["stream_options"] = {"include_usage": True}
            if config.max_output_tokens is not None:
                body["max_tokens"] = config.max_output_tokens
        payload = orjson.dumps(body)
        headers = {
            "host": ("Host", endpoint.authority),
            "user-agent": ("User-Agent", "gateway-loadtest"),
            "accept": ("Accept", "text/event-stream" if stream else "application/json"),
            "content-type": ("Content-Type", "application/json"),
        }
        if config.api == "messages":
            headers["anthropic-version"] = ("anthropic-version", ANTHROPIC_VERSION)
        for name, value in config.headers:
            headers[name.lower()] = (name, value)
        headers["content-length"] = ("Content-Length", str(len(payload)))
        lines = "".join(f"{name}: {value}\r\n" for name, value in headers.values())
        head = f"POST {endpoint.path} HTTP/1.1\r\n{lines}\r\n"
        return cls(endpoint.host, endpoint.port, head.encode("latin-1") + payload, stream)


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


class Client:
    """One worker's connection: sequential requests, kept alive until the server closes it."""

    def __init__(self, target: Target, api: ApiKind, counters: Counters) -> None:
        self._target = target
        self._dialect = DIALECTS[api]
        self._dialect_name = api
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
        stamps = _Timestamps(t_start)
        failure: _Failure | None = None
        try:
            with trio.fail_after(math.inf if timeout is None else timeout):
                await self._exchange(result, stamps)
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
            if stamps.sent:
                silence = now - stamps.last_byte
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

    async def _exchange(self, result: RequestResult, stamps: _Timestamps) -> None:
        conn, (status, headers, keep_alive) = await self._send(result, stamps)
        result.status = status
        try:
            decoder = decoder_for(status, headers)
        except ValueError as error:
            raise _Failure("protocol", str(error)) from None
        if decoder is None:
            keep_alive = False
            decoder = UntilCloseDecoder()
        ok_status = 200 <= status < 300
        streamed = self._target.stream
        scanner = FrameScanner(self._dialect.classify, stamps.t_start) if ok_status and streamed else None
        answer = ok_status and not streamed  # a JSON answer: read whole, checked at its end
        error_body = bytearray()
        json_body = bytearray()
        longest = 0.0
        last_byte = stamps.last_byte
        first_byte: float | None = None
        reads = 0
        data, self._buf = self._buf, b""
        now = stamps.head_at
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
                        if body:
                            if first_byte is None:
                                first_byte = now
                            if scanner is not None:
                                scanner.feed(body, now)
                            elif answer:
                                if len(json_body) + len(body) > _MAX_ANSWER:
                                    raise ValueError(f"a JSON answer exceeded {_MAX_ANSWER} bytes")
                                json_body += body
                            elif len(error_body) < MAX_ERROR_BODY:
                                error_body += body[: MAX_ERROR_BODY - len(error_body)]
                    except ValueError as error:  # bad chunked framing, or an SSE frame without end
                        raise _Failure("protocol", str(error)) from None
                if decoder.done:
                    break
                # Keep the running maximum visible to a timeout that interrupts the read.
                stamps.last_byte = last_byte
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
                result.time_to_first_byte = first_byte - stamps.t_start
            if scanner is not None:
                result.events = scanner.events
                result.heartbeats = scanner.heartbeats
                result.gaps = scanner.gaps
                result.time_to_first_event = scanner.first_event
                result.time_to_first_text = scanner.first_text
                result.terminal = TERMINAL_NAMES.get(scanner.terminal)
                result.saw_done = scanner.done
        result.total = now - stamps.t_start

        if decoder.leftover:
            # Nothing was pipelined, so extra bytes mean the framing went wrong: do not reuse.
            keep_alive = False
        if keep_alive:
            self._buf = b""
        else:
            await self.aclose()

        if answer:
            _check_answer(result, self._dialect_name, bytes(json_body))
            return
        if scanner is None:
            result.code, message = body_failure(bytes(error_body))
            raise _Failure("http_status", f"{status}: {message}")
        if scanner.failed:
            result.code = scanner.error_code
            raise _Failure("failed_event", scanner.error_message or "the stream reported a failure")
        if not (scanner.done if self._dialect.ends_with_done else scanner.terminal):
            raise _Failure("no_terminal", f"the stream ended without {self._dialect.ending}")

    async def _send(
        self, result: RequestResult, stamps: _Timestamps
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
                stamps.sent = True
                stamps.last_byte = time.perf_counter()
                return conn, await self._read_head(conn, stamps, reused=reused)
            except _StaleConnection:
                # The server closed an idle keep-alive connection (llama.cpp does after every
                # stream, without `connection: close`). Retry on a new connection, which cannot
                # be stale, and time the request afresh: the lost attempt is the loader's cost.
                await self.aclose()
                self._counters.stale_retries += 1
                stamps.restart()

    async def _read_head(
        self, conn: _Connection, stamps: _Timestamps, *, reused: bool
    ) -> tuple[int, dict[bytes, bytes], bool]:
        buf = self._buf
        received = bool(buf)
        while True:
            end = buf.find(b"\r\n\r\n")
            if end >= 0:
                head, buf = buf[:end], buf[end + 4 :]
                try:
                    status, headers, keep_alive = parse_head(head)
                except ValueError as error:
                    raise _Failure("protocol", str(error)) from None
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
            stamps.head_at = time.perf_counter()
            if not data:
                if reused and not received:
                    raise _StaleConnection
                raise _Failure("read", "connection closed before the response head")
            received = True
            buf += data


_MAX_ANSWER = 16 * 1024 * 1024


def _check_answer(result: RequestResult, api: str, body: bytes) -> None:
    """A JSON answer (`stream: false`): complete when it is the API's finished object. Its
    arrival is its first (and only) event and its first text."""
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise _Failure("protocol", "the JSON answer is not valid JSON") from None
    if not isinstance(answer, dict):
        raise _Failure("protocol", "the JSON answer is not an object")
    if api == "responses":
        status = answer.get("status")
        if status == "failed":
            result.code = str((answer.get("error") or {}).get("code") or "") or None
            raise _Failure("failed_event", "the response failed")
        ended = status in ("completed", "incomplete")
        result.terminal = f"response.{status}" if ended else None
    elif api == "messages":
        ended = answer.get("type") == "message" and answer.get("stop_reason") is not None
        result.terminal = "message_stop" if ended else None
    else:
        ended = bool(answer.get("choices"))
        result.saw_done = ended
    if not ended:
        raise _Failure("no_terminal", "the JSON answer is not a finished one")
    result.events = 1
    result.time_to_first_event = result.time_to_first_text = result.total


class _Timestamps:
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
