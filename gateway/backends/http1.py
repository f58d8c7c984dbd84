"""HTTP/1.1 to a backend on trio sockets, parsed by httptools (llhttp, Node's C parser).

A streamed chat completion is hundreds of small chunked-encoding chunks.
Read through httpcore and h11, each chunk is one event walked up through
several layers of Python; here one socket read is one `feed_data` call
whose body callbacks append to a list, and the stream hands on all that
read completed.  It is an httpx2 transport, so the adapters keep httpx2's
request and response types, and its exception classes carry the failures
to the one place that maps them (`openai.backend_error_from`).

What it does, as the adapters need it:
- a keep-alive pool per origin, LIFO (the warmest connection first), idle
  connections dropped after `keepalive_expiry`, and a connection the server
  closed while idle noticed before reuse (a peek);
- at most `max_connections` requests in flight, the rest wait in turn;
- connect, read and write timeouts from the request's `timeout` extension;
  a read that finds data waiting costs no timer (one is set only when the
  read must wait);
- TLS (trio's SSLStream) for https origins;
- a body read to its end returns its connection to the pool; a body closed
  early (the client left) closes the connection at once, which is what
  tells the backend to stop generating;
- the time a request spends waiting on its backend (connecting, for room to
  send, for bytes to read) is added up in its `WaitClock`, which its body
  carries (`_Body.waits`): what the gateway adds to a response is its
  duration less that.

Request bodies must be bytes (`content=`), which is what the chat path sends.
"""

from __future__ import annotations

import math
import os
import re
import socket
import ssl
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

import httptools
import httpx2
import trio

from ..ops.loops import HOP_HEADER, outgoing_hops

__all__ = [
    "FixedRequest", "Http1Response", "Http1Transport", "SentRequest", "WaitClock", "origin_of",
]

_READ_SIZE = 64 * 1024
_DEFAULT_PORTS = {"http": 80, "https": 443}

Origin = tuple[str, str, int]
T = TypeVar("T")


class WaitClock:
    """A request's time waiting on its backend, in seconds (`waited`), added up as it goes."""

    __slots__ = ("waited",)

    def __init__(self) -> None:
        self.waited = 0.0


async def _waiting(waits: WaitClock, wait: Callable[..., Awaitable[T]], *args: Any) -> T:
    """`await wait(*args)`, its time added to `waits`."""
    began = trio.current_time()
    try:
        return await wait(*args)
    finally:
        waits.waited += trio.current_time() - began


class _Connection:
    """One socket to an origin, and the parser state of the response being read on it.

    The httptools parser calls the `on_*` methods back from `feed`.
    """

    __slots__ = (
        "origin",
        "sock",
        "tls",
        "idle_since",
        "parser",
        "headers",
        "body",
        "headers_done",
        "complete",
        "framed",
        "received",
        "keep_alive",
        "drained",
        "on_body",
        "waits",
        "waiting_since",
    )

    def __init__(self, origin: Origin, sock: socket.socket, tls: trio.SSLStream[Any] | None) -> None:
        self.origin = origin
        self.sock = sock
        self.tls = tls
        self.idle_since = 0.0
        self.parser: Any = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        # The parser hands each piece of body to `on_body`: the list's own append (a call per
        # chunk of a chunked body, a few hundred per streamed answer).
        self.on_body = self.body.append
        self.headers_done = False
        self.complete = False
        self.framed = False  # the body's end is marked (length or chunked), not the connection's close
        self.received = False  # any byte of the current response
        self.keep_alive = False
        self.drained = False  # the last read took less than it could: the socket is likely empty
        self.waits = WaitClock()  # the current request's (each request brings its own)
        self.waiting_since: float | None = None  # when the read waiting for the socket began (None: none waits)

    # -- the parser's callbacks ----------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.headers_done = True
        self.keep_alive = bool(self.parser.should_keep_alive())  # (reads False once the message is over)

    def on_message_complete(self) -> None:
        self.complete = True

    # -- one exchange ------------------------------------------------------
    def start_response(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.headers = []
        self.body.clear()
        self.headers_done = self.complete = self.framed = self.received = False

    def feed(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            raise httpx2.RemoteProtocolError("the backend sent malformed HTTP") from exc

    async def send(self, data: bytes, timeout: float) -> None:
        if self.tls is not None:
            with trio.move_on_after(timeout) as scope:
                try:
                    await _waiting(self.waits, self.tls.send_all, data)
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    raise httpx2.WriteError("the connection was lost while sending") from exc
            if scope.cancelled_caught:
                raise httpx2.WriteTimeout("timed out sending to the backend")
            return
        view = memoryview(data)
        while view:
            try:
                sent = self.sock.send(view)
            except BlockingIOError:
                sent = 0
            except OSError as exc:
                raise httpx2.WriteError("the connection was lost while sending") from exc
            view = view[sent:]
            if view:
                with trio.move_on_after(timeout) as scope:
                    await _waiting(self.waits, trio.lowlevel.wait_writable, self.sock)
                if scope.cancelled_caught:
                    raise httpx2.WriteTimeout("timed out sending to the backend")
        await trio.lowlevel.checkpoint_if_cancelled()

    async def receive(self, timeout: float) -> bytes:
        """The next bytes, b"" at the end of the connection.

        After a read that filled the buffer, data is likely waiting: it is
        taken without a timer or a trip through the scheduler (the turn's
        round yields on its own terms, at least every half millisecond while
        bytes keep coming).  After a short read the socket is waited for
        first: a read tried at once would almost always fail with EAGAIN.
        """
        if self.tls is not None:
            with trio.move_on_after(timeout) as scope:
                try:
                    return bytes(await _waiting(self.waits, self.tls.receive_some, _READ_SIZE))
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    raise httpx2.ReadError("the connection was lost") from exc
            raise httpx2.ReadTimeout("timed out reading from the backend")
        waited = False
        while True:
            if not self.drained:
                try:
                    data = self.sock.recv(_READ_SIZE)
                except BlockingIOError:
                    pass
                except OSError as exc:
                    raise httpx2.ReadError("the connection was lost") from exc
                else:
                    # A read that did not fill the buffer most likely took all there was: the
                    # next one waits for the socket first, rather than fail with EAGAIN.
                    self.drained = 0 < len(data) < _READ_SIZE
                    if not waited:  # (a read that waited was a checkpoint already)
                        await trio.lowlevel.checkpoint_if_cancelled()
                    return data
            self.drained = False
            waited = True
            clock = trio.lowlevel.current_clock().current_time  # (trio's clock, looked at directly)
            began = self.waiting_since = clock()  # (`_waiting` inlined: this wait is the hot path's)
            timed_out = False
            try:
                if timeout == math.inf:  # no timer: none to keep, or the caller bounds the wait (see _Body)
                    await trio.lowlevel.wait_readable(self.sock)
                else:
                    with trio.move_on_after(timeout) as scope:
                        await trio.lowlevel.wait_readable(self.sock)
                    timed_out = scope.cancelled_caught
            except trio.ClosedResourceError as exc:  # the body was stopped (`_Body.abort`)
                raise httpx2.ReadError("the read was stopped") from exc
            finally:
                self.waiting_since = None
            self.waits.waited += clock() - began
            if timed_out:
                raise httpx2.ReadTimeout("timed out reading from the backend")

    def is_alive(self) -> bool:
        """False when the server closed this idle connection (or sent something it should not)."""
        try:
            return not self.sock.recv(1, socket.MSG_PEEK)  # any byte on an idle connection is wrong
        except BlockingIOError:
            return True
        except OSError:
            return False

    def close(self) -> None:
        if self.tls is not None:
            self.tls.transport_stream.socket.close()  # no close_notify: the peer may be gone
        self.sock.close()


class _Body(httpx2.AsyncByteStream):
    """A response body: each step yields what one read completed (chunk framing removed).

    A reader that bounds the body's reads itself sets `read_timeout` to
    math.inf (no timer per read: a cancel scope costs several microseconds
    per read, more than the rest of a relayed read's work) and stops a read
    it no longer wants with `abort`.  Or it hands the bound to a ticker
    (`watched`, then `beat` at each look): a read that has waited for the
    socket longer than the read timeout is stopped there and ends with
    `httpx2.ReadTimeout`, as its own timer would have ended it, a look later
    at most.  (At 50 paced streams the timer per read cost about a sixth of
    the turn's CPU per relayed event; the load lab's paced row.)
    """

    def __init__(self, transport: Http1Transport, conn: _Connection, read_timeout: float, keep_alive: bool) -> None:
        self._transport = transport
        self._conn = conn
        self.read_timeout = read_timeout  # seconds each read may wait for the socket
        self._keep_alive = keep_alive
        self._closed = False
        self._eof = False
        self._aborted = False
        self._bound: float | None = None  # the read timeout a ticker keeps (`watched`)
        self._timed_out = False  # a read was stopped by the ticker, past the bound
        self.waits = conn.waits  # the request's time waiting on the backend, its reads' included

    def __aiter__(self) -> _Body:
        return self

    @property
    def finished(self) -> bool:
        """The body has been read to its end: the next step ends the iteration."""
        return self._conn.complete and not self._conn.body

    async def __anext__(self) -> bytes:
        conn = self._conn
        while True:
            body = conn.body
            if body:
                data = body[0] if len(body) == 1 else b"".join(body)
                body.clear()
                return data
            if conn.complete or self._eof or self._closed:
                raise StopAsyncIteration
            if self._aborted:
                raise self._stopped()
            try:
                data = await conn.receive(self.read_timeout)
            except httpx2.ReadError:
                if self._aborted:  # stopped by `abort`: by the ticker past the bound, or by the reader
                    raise self._stopped() from None
                raise
            if not data:
                self._eof = True
                if conn.framed:
                    raise httpx2.RemoteProtocolError("the backend closed the connection before the body's end")
                continue
            conn.feed(data)

    def _stopped(self) -> httpx2.ReadError | httpx2.ReadTimeout:
        if self._timed_out:
            return httpx2.ReadTimeout("timed out reading from the backend")
        return httpx2.ReadError("the read was stopped")

    def watched(self) -> float | None:
        """Let a ticker keep the read timeout (its `beat` from the deadline this returns on): the
        reads keep no timer of their own.  None, and nothing changes, over TLS or with no timeout."""
        if self._conn.tls is not None or self.read_timeout == math.inf or self._bound is not None:
            return None
        self._bound, self.read_timeout = self.read_timeout, math.inf
        return trio.current_time() + self._bound

    def beat(self, now: float, stall_timeout: float | None) -> float | None:
        """The ticker's look: when to look again; None once the body is over, or stopped because
        its read has waited past the bound (then it ends with `httpx2.ReadTimeout`)."""
        bound = self._bound
        if bound is None or self._closed or self._eof or self._aborted or self._conn.complete:
            return None
        since = self._conn.waiting_since
        if since is None:  # not waiting on the backend (the reader is busy elsewhere)
            return now + bound
        if now < since + bound:
            return since + bound
        self._timed_out = True
        self.abort()
        return None

    def abort(self) -> None:
        """Stop reading: a read waiting for the socket ends now, and every later one at once,
        with `httpx2.ReadError`; the connection is closed, not reused.  (Safe from another task.)"""
        if self._aborted or self._closed:
            return
        self._aborted = True
        conn = self._conn
        trio.lowlevel.notify_closing(conn.tls.transport_stream.socket if conn.tls is not None else conn.sock)

    async def aclose(self) -> None:
        self.close()

    def close(self) -> None:
        """`aclose` without its await: the connection goes back to the pool, or is closed."""
        if self._closed:
            return
        self._closed = True
        reusable = self._keep_alive and self._conn.complete and not self._conn.body and not self._aborted
        self._transport._release(self._conn, reusable=reusable)


class Http1Response:
    """A response whose head has arrived: its status, raw headers and body (`_Body`, read as it comes)."""

    __slots__ = ("status_code", "raw_headers", "stream")

    def __init__(self, status_code: int, raw_headers: list[tuple[bytes, bytes]], stream: _Body) -> None:
        self.status_code = status_code
        self.raw_headers = raw_headers
        self.stream = stream

    @property
    def headers(self) -> httpx2.Headers:
        return httpx2.Headers(self.raw_headers)

    @property
    def waits(self) -> WaitClock:
        """The request's time waiting on the backend so far (growing as its body is read)."""
        return self.stream.waits

    async def aclose(self) -> None:
        await self.stream.aclose()


class FixedRequest:
    """Requests to one URL with the same method and headers, their head built once.

    The headers are checked and written by httpx2 once, here (its `Host`
    among them); each request adds only its own: any `extra` headers, the
    body's length, and the gateways it passed (`x-gateway-hops`).  `timeouts`
    are what `Http1Transport.open` takes (connect, read, write; None: none).
    """

    def __init__(
        self, method: str, url: httpx2.URL | str, headers: Mapping[str, str], timeout: httpx2.Timeout | None = None
    ) -> None:
        request = httpx2.Request(method, url, headers=headers)
        self.origin = origin_of(request.url)
        limits = timeout or httpx2.Timeout(None)
        self.timeouts = (_seconds(limits.connect), _seconds(limits.read), _seconds(limits.write))
        fixed = [(name, value) for name, value in request.headers.raw if name.lower() not in _FRAMING]
        self._names = {name.decode("ascii").lower() for name, _ in fixed} | {"content-length", "transfer-encoding", HOP_HEADER}
        lines = [method.encode("ascii"), b" ", request.url.raw_path, b" HTTP/1.1\r\n"]
        for name, value in fixed:
            lines += (name, b": ", value, b"\r\n")
        self._head = b"".join(lines)

    def message(self, body: bytes, extra: Mapping[str, str] | None = None) -> bytes | None:
        """The whole request with `body`; None when `extra` would replace a fixed header or is
        not a plain header value (the caller then builds the request the general way)."""
        head = [self._head]
        if extra:
            for name, value in extra.items():
                if name.lower() in self._names or not _PLAIN_HEADER.fullmatch(name) or not _PLAIN_VALUE.fullmatch(value):
                    return None
                head.append(b"%b: %b\r\n" % (name.encode("ascii"), value.encode("ascii")))
        head.append(b"Content-Length: %d\r\n%b: %b\r\n\r\n" % (len(body), _HOP, outgoing_hops().encode("ascii")))
        head.append(body)
        return b"".join(head)


_HOP = HOP_HEADER.encode("ascii")
_FRAMING = (b"content-length", b"transfer-encoding")
_PLAIN_HEADER = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # a token (RFC 9110)
_PLAIN_VALUE = re.compile(r"[\x20-\x7e]*")  # printable ASCII: nothing that could end the line


def origin_of(url: httpx2.URL) -> Origin:
    """(scheme, host, port) of an http or https URL.

    Raises:
        httpx2.UnsupportedProtocol: another scheme.
    """
    scheme = url.scheme
    if scheme not in _DEFAULT_PORTS:
        raise httpx2.UnsupportedProtocol(f"unsupported URL scheme {scheme!r}")
    return (scheme, url.host, url.port or _DEFAULT_PORTS[scheme])


class SentRequest:
    """A request sent on one of the transport's connections, its answer not yet read.

    It holds one of the transport's slots and the connection until
    `response` hands both to the response's body, or `close` lets them go
    (the connection closed: the backend stops working on the request).
    """

    __slots__ = ("_transport", "_origin", "_message", "_unsent", "_connect_timeout", "_write_timeout", "_conn", "_reused", "_held", "waits")

    def __init__(
        self, transport: Http1Transport, origin: Origin, message: bytes, connect_timeout: float, write_timeout: float
    ) -> None:
        self._transport = transport
        self._origin = origin
        self._message = message
        self._connect_timeout = connect_timeout
        self._write_timeout = write_timeout
        self._unsent = b""  # what `send_now` could not send at once: `response` sends it first
        self._conn: _Connection | None = None
        self._reused = False
        self._held = True  # the slot (and the connection, once there is one)
        self.waits = WaitClock()  # this request's time waiting on the backend

    @classmethod
    def now(
        cls, transport: Http1Transport, origin: Origin, conn: _Connection, message: bytes, connect_timeout: float, write_timeout: float
    ) -> SentRequest | None:
        """`message` started on the idle `conn` (its slot taken), as far as it goes without
        waiting; None, with the slot given back, when the connection turned out closed."""
        sent = cls(transport, origin, message, connect_timeout, write_timeout)
        sent._conn, sent._reused = conn, True
        conn.waits = sent.waits
        conn.start_response()
        try:
            count = conn.sock.send(message)
        except BlockingIOError:
            count = 0
        except OSError:
            sent.close()
            return None
        sent._unsent = message[count:]
        return sent

    async def send(self, *, fresh: bool = False) -> None:
        """Send the request on a pooled connection, or a new one (`fresh`: never a pooled one).

        Raises:
            httpx2.TransportError: it could not be connected or sent.
        """
        transport = self._transport
        while True:
            conn = None if fresh else transport._reuse(self._origin)
            self._reused = conn is not None
            if conn is None:
                conn = await transport._connect(self._origin, self._connect_timeout, self.waits)
            self._conn = conn
            conn.waits = self.waits
            conn.start_response()
            try:
                await conn.send(self._message, self._write_timeout)
            except httpx2.WriteError:
                if not self._reused:
                    raise
                # A keep-alive connection the server had closed: the request goes on another.
                conn.close()
                self._conn = None
                continue
            return

    async def response(self, read_timeout: float, *, bodiless: bool = False) -> Http1Response:
        """The answer once its head has arrived; its body (still to read) now holds the
        connection and the slot.

        Raises:
            httpx2.TransportError: as `Http1Transport.open`.
        """
        try:
            while True:
                conn = self._conn
                assert conn is not None and self._held, "a sent request is answered once"
                try:
                    if self._unsent:
                        unsent, self._unsent = self._unsent, b""
                        await conn.send(unsent, self._write_timeout)
                    while not conn.headers_done:
                        data = await conn.receive(read_timeout)
                        if not data:
                            raise httpx2.RemoteProtocolError("the backend closed the connection without a response")
                        conn.received = True
                        conn.feed(data)
                except (httpx2.RemoteProtocolError, httpx2.ReadError, httpx2.WriteError):
                    if not self._reused or conn.received:
                        raise
                    # A keep-alive connection the server had closed (llama.cpp closes
                    # one when the next request arrives, without saying so before):
                    # nothing was answered, so the request goes again on a new one.
                    conn.close()
                    self._conn = None
                    await self.send(fresh=True)
                    continue
                break
            status = conn.parser.get_status_code()
            conn.framed = any(name.lower() in _FRAMING for name, _ in conn.headers)
            keep_alive = conn.keep_alive
            if bodiless:  # no body follows, whatever the headers say
                conn.complete, keep_alive = True, False  # (and the parser would wait for one: not reused)
            body = _Body(self._transport, conn, read_timeout, keep_alive=keep_alive)
        except BaseException:
            self.close()
            raise
        self._held, self._conn = False, None
        return Http1Response(status, conn.headers, body)

    def close(self) -> None:
        """Let the request go unanswered (nothing once `response` returned)."""
        if not self._held:
            return
        self._held = False
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._transport._slots.release()


class Http1Transport(httpx2.AsyncBaseTransport):
    """An httpx2 transport for HTTP/1.1 backends (see the module's docstring)."""

    def __init__(
        self,
        *,
        max_connections: int,
        keepalive_expiry: float = 30.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._max = max(1, max_connections)
        self._slots = trio.Semaphore(self._max)
        self._idle: dict[Origin, list[_Connection]] = {}
        self._idle_count = 0
        self._expiry = keepalive_expiry
        self._ssl = ssl_context
        self._closed = False

    @property
    def connections(self) -> int:
        """Open connections: in use and idle."""
        return self._max - self._slots.value + self._idle_count

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        timeouts = request.extensions.get("timeout") or {}
        origin = origin_of(request.url)
        # Every request to a backend says which gateways it has passed (see gateway.ops.loops).
        request.headers[HOP_HEADER] = outgoing_hops()
        message = _request_bytes(request.method, request.url.raw_path, request.headers.raw, request.content)
        answer = await self.open(
            origin,
            message,
            connect_timeout=_seconds(timeouts.get("connect")),
            read_timeout=_seconds(timeouts.get("read")),
            write_timeout=_seconds(timeouts.get("write")),
            bodiless=request.method == "HEAD",
        )
        return httpx2.Response(
            answer.status_code, headers=answer.raw_headers, stream=answer.stream, request=request,
            extensions={"http_version": b"HTTP/1.1"},
        )

    async def open(
        self,
        origin: Origin,
        message: bytes,
        *,
        connect_timeout: float,
        read_timeout: float,
        write_timeout: float,
        bodiless: bool = False,
    ) -> Http1Response:
        """Send a whole request (`message`: its head and body, as bytes) to `origin`; its
        response once the head has arrived, the body still to read.

        The chat path calls this directly with a head built once (`FixedRequest`):
        no httpx2 request or response objects per call.

        Raises:
            httpx2.TransportError: as `handle_async_request` (connect, read, write,
                timeouts, a malformed answer).
        """
        sent = await self.send(origin, message, connect_timeout=connect_timeout, write_timeout=write_timeout)
        return await sent.response(read_timeout, bodiless=bodiless)

    async def send(self, origin: Origin, message: bytes, *, connect_timeout: float, write_timeout: float) -> SentRequest:
        """`open` in two steps: the request is sent now, and its answer read by the
        `SentRequest`'s `response` (or the request let go with its `close`), so that
        what the caller does in between overlaps the backend's work.

        Raises:
            httpx2.TransportError: it could not be connected or sent.
        """
        slots = self._slots
        try:
            slots.acquire_nowait()  # no pass through the scheduler while there is room
        except trio.WouldBlock:
            await slots.acquire()
        sent = SentRequest(self, origin, message, connect_timeout, write_timeout)
        try:
            await sent.send()
        except BaseException:
            sent.close()
            raise
        return sent

    def send_now(self, origin: Origin, message: bytes, *, connect_timeout: float, write_timeout: float) -> SentRequest | None:
        """`send` without waiting for anything: on an idle kept-alive plain-HTTP connection, with
        a slot free, as much of `message` as the socket takes now (the rest goes when its
        answer is read).  None when that cannot be done; the caller then sends with `open`.
        (A connection that fails later is replaced when the answer is read, as `open` does;
        `connect_timeout` bounds that.)"""
        if origin[0] != "http" or not self._idle.get(origin):
            return None
        try:
            self._slots.acquire_nowait()
        except trio.WouldBlock:
            return None
        conn = self._reuse(origin)
        if conn is None:
            self._slots.release()
            return None
        return SentRequest.now(self, origin, conn, message, connect_timeout, write_timeout)

    def _reuse(self, origin: Origin) -> _Connection | None:
        idle = self._idle.get(origin)
        now = trio.current_time()
        while idle:
            conn = idle.pop()
            self._idle_count -= 1
            if now - conn.idle_since < self._expiry and conn.is_alive():
                return conn
            conn.close()
        return None

    async def _connect(self, origin: Origin, timeout: float, waits: WaitClock) -> _Connection:
        if self.connections > self._max:  # (this request's slot counts already) drop an idle one to another origin
            self._drop_one_idle()
        with trio.move_on_after(timeout) as scope:
            return await _waiting(waits, self._open, origin)
        raise httpx2.ConnectTimeout("timed out connecting to the backend")

    async def _open(self, origin: Origin) -> _Connection:
        scheme, host, port = origin
        try:
            infos = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise httpx2.ConnectError("could not resolve the backend's host") from exc
        failure: OSError | None = None
        for family, kind, proto, _, address in infos:
            sock = socket.socket(family, kind, proto)
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                try:
                    sock.connect(address)
                except BlockingIOError:
                    await trio.lowlevel.wait_writable(sock)
                    error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if error:
                        raise OSError(error, os.strerror(error)) from None
            except OSError as exc:
                sock.close()
                failure = exc
                continue
            except BaseException:
                sock.close()
                raise
            break
        else:
            raise httpx2.ConnectError("could not connect to the backend") from failure
        if scheme != "https":
            return _Connection(origin, sock, None)
        if self._ssl is None:
            self._ssl = httpx2.create_ssl_context()  # once: building one loads the CA bundle
        context = self._ssl
        tls = trio.SSLStream(
            trio.SocketStream(trio.socket.from_stdlib_socket(sock)), context, server_hostname=host, https_compatible=True
        )
        try:
            await tls.do_handshake()
        except trio.BrokenResourceError as exc:
            sock.close()
            raise httpx2.ConnectError("the TLS handshake with the backend failed") from exc
        except BaseException:
            sock.close()
            raise
        return _Connection(origin, sock, tls)

    def _drop_one_idle(self) -> None:
        oldest = min(
            (conn for idle in self._idle.values() for conn in idle), key=lambda c: c.idle_since, default=None
        )
        if oldest is not None:
            self._idle[oldest.origin].remove(oldest)
            self._idle_count -= 1
            oldest.close()

    def _release(self, conn: _Connection, *, reusable: bool) -> None:
        self._slots.release()
        if reusable and not self._closed:
            conn.idle_since = trio.current_time()
            self._idle.setdefault(conn.origin, []).append(conn)
            self._idle_count += 1
        else:
            conn.close()

    async def aclose(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()
        self._idle_count = 0


def _seconds(value: float | None) -> float:
    return math.inf if value is None else float(value)


def _request_bytes(method: str, target: bytes, headers: Iterable[tuple[bytes, bytes]], body: bytes) -> bytes:
    head = [method.encode("ascii"), b" ", target, b" HTTP/1.1\r\n"]
    for name, value in headers:
        head += (name, b": ", value, b"\r\n")
    head.append(b"\r\n")
    head.append(body)
    return b"".join(head)
