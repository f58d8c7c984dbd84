"""The serve loop's connections: released as soon as their client closes, reset when their client stops reading.

Over real sockets: a real `gateway serve` (its sockets seen through psutil,
its log read as it comes), and the serve loop embedded in the test with a
raw ASGI app where the test must own what the app writes and when.
"""

from __future__ import annotations

import errno
import functools
import select
import socket
import struct
from typing import Any

import orjson
import psutil
import trio

import gateway
from asgi_helpers import answer_lifespan
from conftest import make_settings
from test_drain import KeptAlive, Served, served

_RELEASED_WITHIN = 2.0  # seconds; hypercorn alone held such sockets in CLOSE-WAIT for the 75 s keep-alive timer
_RESET_MARGIN = 2.0  # seconds past the stall bound for the reset to reach the client (the ticker's look, a busy loop)
_HANGUP = select.POLLHUP | select.POLLERR | select.POLLRDHUP  # not POLLIN: unread data must not wake the poll


def server_sides(gateway: Served, client_ports: set[int]) -> list[Any]:
    """The gateway's own sockets (held by its process) toward these client ports."""
    return [
        connection
        for connection in psutil.Process(gateway.process.pid).net_connections(kind="tcp")
        if connection.raddr and connection.raddr.port in client_ports and connection.laddr.port == gateway.port
    ]


def request_bytes(path: str, body: dict[str, Any]) -> bytes:
    data = orjson.dumps(body)
    head = f"POST {path} HTTP/1.1\r\nhost: gateway\r\ncontent-type: application/json\r\ncontent-length: {len(data)}\r\n\r\n"
    return head.encode() + data


def wait_hangup(sock: socket.socket, within: float) -> int:
    """(In a thread.) The poll events that say the connection was reset or closed, 0 if none came `within` s."""
    poller = select.poll()
    poller.register(sock, _HANGUP)
    events = poller.poll(within * 1000)
    return events[0][1] if events else 0


def stalled_client(port: int, body: dict[str, Any]) -> socket.socket:
    """A client that asks for a stream and will never read it: small buffers, so they fill fast."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(request_bytes("/v1/responses", body))
    return sock


async def test_connections_whose_client_closed_or_reset_them_are_released_at_once_not_after_the_keep_alive_timer(
    tmp_path, backend
):
    with trio.fail_after(60):
        async with served(tmp_path, backend.url) as gateway, trio.open_nursery() as nursery:
            idle = [await KeptAlive.open(gateway.url) for _ in range(20)]
            for connection in idle:
                response, _ = await connection.request("GET", "/health")
                assert response.status_code == 200  # and the connection is kept alive, idle
            # One connection has a request in progress when its client leaves: the app sees it go.
            busy = await KeptAlive.open(gateway.url)
            await busy.stream.send_all(request_bytes("/v1/responses", {"model": "text-then-wait", "input": "hi", "stream": True}))
            seen = b""
            with trio.fail_after(5):
                while b"output_text.delta" not in seen:
                    seen += await busy.stream.receive_some()
            ports = {connection.port for connection in [*idle, busy]}
            assert len(server_sides(gateway, ports)) == len(ports)
            process = psutil.Process(gateway.process.pid)
            fds = process.num_fds()

            for index, connection in enumerate([*idle, busy]):
                if index % 2:  # half of them reset rather than closed
                    connection.stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                await connection.stream.aclose()
            closed = trio.current_time()
            await backend.client_left.wait()  # the stream's request saw its client leave, and hung up upstream
            with trio.fail_after(_RELEASED_WITHIN):
                # None left in CLOSE-WAIT (closed) and none held (reset: the kernel lists those nowhere).
                while server_sides(gateway, ports) or process.num_fds() > fds - len(ports):
                    await trio.sleep(0.02)  # polling the condition, bounded above
            print(f"{len(ports)} connections released {trio.current_time() - closed:.3f} s after their clients closed them")
            await gateway.until_logged("client_left")
            nursery.cancel_scope.cancel()


async def test_a_client_that_stops_reading_is_reset_within_the_stall_bound_and_logged_as_client_left(tmp_path, backend):
    stall = 1.0
    with trio.fail_after(60):
        async with served(tmp_path, backend.url, CLIENT_STALL_TIMEOUT=str(stall)) as gateway:
            sock = stalled_client(gateway.port, {"model": "big-stream", "input": "hi", "stream": True})
            try:
                asked = trio.current_time()
                with trio.fail_after(stall + _RESET_MARGIN):
                    events = await trio.to_thread.run_sync(
                        wait_hangup, sock, stall + _RESET_MARGIN, abandon_on_cancel=True
                    )
                took = trio.current_time() - asked
                assert events & (select.POLLHUP | select.POLLERR), f"no reset within {took:.2f} s (poll: {events:#x})"
                assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == errno.ECONNRESET  # a reset, not a FIN
                client_port = sock.getsockname()[1]
            finally:
                sock.close()
            with trio.fail_after(5):
                line = await gateway.until_logged("client_left")
            assert "model=big-stream" in line
            assert not server_sides(gateway, {client_port})  # the gateway holds nothing of it any more
            assert "reset a connection whose client stopped reading (no progress for 1 s)" in "\n".join(gateway.lines)
            assert "Traceback" not in "\n".join(gateway.lines)
    print(f"stall bound {stall} s; reset seen by the client {took:.2f} s after its request")


# --- the serve loop embedded, with an app that writes one large body --------------------------------

_BIG = 16 * 1024 * 1024


class OneBigWrite:
    """An ASGI app that answers every request with one 16 MiB body in a single `send`, then waits for the end."""

    def __init__(self) -> None:
        self.wrote = trio.Event()
        self.next_message: dict[str, Any] | None = None
        self.heard = trio.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        await receive()  # the (empty) request body
        headers = [(b"content-type", b"application/octet-stream"), (b"content-length", str(_BIG).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"x" * _BIG, "more_body": False})
        self.wrote.set()
        self.next_message = await receive()
        self.heard.set()


async def serve_one_big_write(nursery: trio.Nursery, stall: float) -> tuple[OneBigWrite, int]:
    app = OneBigWrite()
    settings = make_settings("http://127.0.0.1:9", client_stall_timeout=stall)
    url = await nursery.start(functools.partial(gateway.serve, settings, app=app))  # type: ignore[arg-type]
    return app, int(url.rsplit(":", 1)[1])


async def test_a_write_that_makes_no_progress_is_reset_and_the_app_sees_http_disconnect(nursery):
    stall = 0.5
    app, port = await serve_one_big_write(nursery, stall)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        await trio.to_thread.run_sync(sock.connect, ("127.0.0.1", port))
        sock.sendall(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        with trio.fail_after(stall + _RESET_MARGIN):
            events = await trio.to_thread.run_sync(wait_hangup, sock, stall + _RESET_MARGIN, abandon_on_cancel=True)
            assert events & (select.POLLHUP | select.POLLERR)
            await app.heard.wait()  # the app's write returned, and its next receive says why
    finally:
        sock.close()
    assert app.next_message == {"type": "http.disconnect"}


async def test_a_large_write_to_a_slow_reader_is_not_cut_while_it_makes_progress(nursery):
    stall = 0.5
    app, port = await serve_one_big_write(nursery, stall)
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    async with stream:
        await stream.send_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        began = trio.current_time()
        head = b""
        body = 0
        with trio.fail_after(60):
            while body < _BIG:
                data = await stream.receive_some(65536)
                assert data, f"the connection was closed after {body} bytes of the body"
                if b"\r\n\r\n" not in head:
                    head += data
                    body = len(head.partition(b"\r\n\r\n")[2])
                else:
                    body += len(data)
                await trio.sleep(0.01)  # the client's own pace: ~6 MB/s at most
            await app.wrote.wait()
        took = trio.current_time() - began
    assert head.startswith(b"HTTP/1.1 200") and body == _BIG
    assert took > 3 * stall  # one write, much longer than the bound: only progress was bounded


# --- the keep-alive timer: one per connection, stopped while a request runs ------------------------


class HeldFirstAnswer:
    """An ASGI app that answers `ok`, the first request only once the test lets it."""

    def __init__(self) -> None:
        self.first_began = trio.Event()
        self.release = trio.Event()
        self.requests = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        self.requests += 1
        if self.requests == 1:
            self.first_began.set()
            await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok", "more_body": False})


async def test_the_keep_alive_timer_never_cuts_a_running_request_and_closes_the_connection_once_idle(nursery):
    keep_alive = 0.5
    app = HeldFirstAnswer()
    settings = make_settings("http://127.0.0.1:9", keep_alive_timeout=keep_alive)
    url = await nursery.start(functools.partial(gateway.serve, settings, app=app))  # type: ignore[arg-type]
    request = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"
    answer = b"\r\n\r\nok"
    async with await trio.open_tcp_stream("127.0.0.1", int(url.rsplit(":", 1)[1])) as stream:
        await stream.send_all(request)
        with trio.fail_after(5):
            await app.first_began.wait()
        with trio.move_on_after(3 * keep_alive):  # a request running for longer than the timer: time has to pass
            data = await stream.receive_some()
            raise AssertionError(f"the connection ended while its request ran: {data!r}")
        app.release.set()
        data = b""
        with trio.fail_after(5):
            while not data.endswith(answer):
                data += await stream.receive_some()
        for _ in range(20):  # many requests on one connection, each restarting the one timer
            await stream.send_all(request)
            data = b""
            with trio.fail_after(5):
                while not data.endswith(answer):
                    data += await stream.receive_some()
            assert data.startswith(b"HTTP/1.1 200")
        idle_from = trio.current_time()
        with trio.fail_after(5):
            assert await stream.receive_some() == b""  # closed by the server once idle for the timer's length
        idled = trio.current_time() - idle_from
    assert app.requests == 21
    assert idled >= keep_alive * 0.9
