"""The upstream HTTP/1.1 transport (httptools on trio sockets), against real scripted servers.

Each server here is a real TCP listener on port 0 whose handler reads the
request's head and answers with bytes the test chose, so keep-alive,
framing, stale connections and limits are exercised on real sockets.
"""

from __future__ import annotations

import math
import socket
from typing import Any

import httpx2
import pytest
import trio
import trio.testing

from gateway.backends.http1 import _READ_SIZE, FixedRequest, Http1Transport, SentRequest, _Connection, _request_bytes
from gateway.ops.loops import HOP_HEADER, outgoing_hops


class Server:
    """A TCP server that answers each request with `answer(n)` bytes (n counts requests)."""

    def __init__(self, answer, *, close_after: bool = False) -> None:
        self.answer = answer
        self.close_after = close_after
        self.connections = 0
        self.open_now = 0
        self.most_open = 0
        self.requests: list[bytes] = []
        self.closed = trio.Event()  # set when a client closes a connection
        self.url = ""

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.url = "http://127.0.0.1:%d" % listeners[0].socket.getsockname()[1]
        task_status.started(self.url)
        await trio.serve_listeners(self.handle, listeners)

    async def handle(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        self.open_now += 1
        self.most_open = max(self.most_open, self.open_now)
        buffer = b""
        try:
            while True:
                while b"\r\n\r\n" not in buffer:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    buffer += data
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                length = next(
                    (int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")), 0
                )
                while len(buffer) < length:
                    buffer += await stream.receive_some(65536)
                self.requests.append(head + b"\r\n\r\n" + buffer[:length])
                buffer = buffer[length:]
                answer = self.answer(len(self.requests))
                if answer is None:  # say nothing; wait for the client to leave
                    while await stream.receive_some(65536):
                        pass
                    return
                if answer == b"":  # close without a word
                    return
                for part in answer if isinstance(answer, list) else [answer]:
                    await stream.send_all(part)
                if self.close_after:
                    return
        except trio.BrokenResourceError:
            pass
        finally:
            self.open_now -= 1
            self.closed.set()
            await stream.aclose()


def chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def request(url: str, *, read: float | None = 5.0) -> httpx2.Request:
    timeout = {"connect": 5.0, "read": read, "write": 5.0, "pool": None}
    return httpx2.Request("POST", url + "/v1/chat/completions", content=b'{"x": 1}', extensions={"timeout": timeout})


async def body_of(response: httpx2.Response) -> bytes:
    try:
        return b"".join([part async for part in response.stream])  # type: ignore[union-attr]
    finally:
        await response.aclose()


async def test_a_chunked_stream_is_reassembled_and_its_connection_reused(nursery):
    server = Server(lambda n: [HEAD + b"5\r\nhel", b"lo\r\n", b"6\r\n world\r\n0\r\n\r\n"])
    url = await nursery.start(server.serve)
    transport = Http1Transport(max_connections=4)
    with trio.fail_after(10):
        for _ in range(3):
            response = await transport.handle_async_request(request(url))
            assert response.status_code == 200 and response.headers["content-type"] == "text/event-stream"
            assert await body_of(response) == b"hello world"
    assert server.connections == 1 and len(server.requests) == 3
    assert server.requests[0].startswith(b"POST /v1/chat/completions HTTP/1.1\r\n") and server.requests[0].endswith(b'{"x": 1}')
    await transport.aclose()


async def test_a_keep_alive_connection_the_server_dropped_is_retried_once_on_a_new_one(nursery):
    # Like llama.cpp: it advertises keep-alive, then closes when the next request arrives.
    dropping = Server(lambda n: HEAD + chunked(b"ok") if n % 2 else b"", close_after=False)
    url = await nursery.start(dropping.serve)
    transport = Http1Transport(max_connections=4)
    with trio.fail_after(10):
        assert await body_of(await transport.handle_async_request(request(url))) == b"ok"
        # the second request reaches the kept connection, which the server closes unanswered
        assert await body_of(await transport.handle_async_request(request(url))) == b"ok"
    assert dropping.connections == 2 and len(dropping.requests) == 3
    await transport.aclose()


async def test_a_new_connection_closed_without_an_answer_is_an_error_not_a_retry(nursery):
    server = Server(lambda n: b"", close_after=True)
    url = await nursery.start(server.serve)
    transport = Http1Transport(max_connections=4)
    with trio.fail_after(10), pytest.raises(httpx2.RemoteProtocolError):
        await transport.handle_async_request(request(url))
    assert len(server.requests) == 1
    assert transport.connections == 0


async def test_a_silent_backend_is_a_read_timeout(nursery):
    server = Server(lambda n: None)
    url = await nursery.start(server.serve)
    transport = Http1Transport(max_connections=4)
    with trio.fail_after(10), pytest.raises(httpx2.ReadTimeout):
        await transport.handle_async_request(request(url, read=0.2))
    with trio.fail_after(10):
        await server.closed.wait()  # and the connection is closed, not pooled
    assert transport.connections == 0


async def test_a_body_that_stops_mid_stream_times_out_and_one_cut_short_is_an_error(nursery):
    server = Server(lambda n: [HEAD + b"5\r\nhello\r\n"])
    url = await nursery.start(server.serve)
    transport = Http1Transport(max_connections=4)
    with trio.fail_after(10):
        response = await transport.handle_async_request(request(url, read=0.2))
        stream = response.stream.__aiter__()  # type: ignore[union-attr]
        assert await stream.__anext__() == b"hello"
        with pytest.raises(httpx2.ReadTimeout):
            await stream.__anext__()
        await response.aclose()
    cut = Server(lambda n: [HEAD + b"5\r\nhello\r\n"], close_after=True)
    url = await nursery.start(cut.serve)
    with trio.fail_after(10):
        response = await transport.handle_async_request(request(url))
        with pytest.raises(httpx2.RemoteProtocolError):
            await body_of(response)


async def test_a_body_whose_read_timeout_a_ticker_keeps_reads_without_a_timer_and_times_out_the_same(nursery, autojump_clock):
    from gateway.transport.heartbeats import Heartbeats

    server = Server(lambda n: [HEAD + b"5\r\nhello\r\n"])  # and then nothing
    url = await nursery.start(server.serve)
    ticker = Heartbeats(1.6)  # looks every 0.025 s (a sixty-fourth of its interval)
    await nursery.start(ticker.run)
    transport = Http1Transport(max_connections=4)
    response = await transport.handle_async_request(request(url, read=2.0))
    body = response.stream
    due = body.watched()  # type: ignore[union-attr]
    assert due == pytest.approx(trio.current_time() + 2.0)
    assert body.read_timeout == math.inf  # type: ignore[union-attr]
    assert body.watched() is None  # type: ignore[union-attr]  # (handed over once)
    ticket = ticker.add(body, due)
    stream = body.__aiter__()  # type: ignore[union-attr]
    assert await stream.__anext__() == b"hello"
    # Busy elsewhere (not waiting on the backend) for longer than the bound: not a timeout.
    await trio.sleep(5.0)
    began = trio.current_time()
    with pytest.raises(httpx2.ReadTimeout):
        await stream.__anext__()
    # Stopped at the ticker's first look past the bound: 2 s after the read began waiting.
    assert 2.0 <= trio.current_time() - began <= 2.0 + 0.2
    assert ticket.stream is None and body.beat(trio.current_time(), None) is None  # type: ignore[union-attr]  # (let go)
    with trio.fail_after(10):
        await response.aclose()
        await server.closed.wait()  # and the connection is closed, not pooled
    assert transport.connections == 0


async def test_a_body_over_its_bound_but_given_data_in_time_is_read_to_its_end(nursery, autojump_clock):
    from gateway.transport.heartbeats import Heartbeats

    parts = [HEAD + b"5\r\nhello\r\n", b"5\r\nworld\r\n", b"0\r\n\r\n"]

    async def slowly(stream: trio.SocketStream) -> None:
        await stream.receive_some(65536)
        for part in parts:
            await stream.send_all(part)
            await trio.sleep(1.5)  # each under the 2 s bound; the whole body over it
        await trio.sleep_forever()

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    url = "http://127.0.0.1:%d" % listeners[0].socket.getsockname()[1]
    nursery.start_soon(trio.serve_listeners, slowly, listeners)
    ticker = Heartbeats(1.6)
    await nursery.start(ticker.run)
    transport = Http1Transport(max_connections=4)
    response = await transport.handle_async_request(request(url, read=2.0))
    due = response.stream.watched()  # type: ignore[union-attr]
    ticker.add(response.stream, due)
    assert await body_of(response) == b"helloworld"


async def test_closing_a_body_early_closes_its_connection_at_once(nursery):
    server = Server(lambda n: [HEAD + b"5\r\nhello\r\n"])  # and then nothing: a long generation
    url = await nursery.start(server.serve)
    transport = Http1Transport(max_connections=4)
    with trio.fail_after(10):
        response = await transport.handle_async_request(request(url))
        assert await response.stream.__aiter__().__anext__() == b"hello"  # type: ignore[union-attr]
        await response.aclose()  # the client left
        await server.closed.wait()
    assert server.open_now == 0 and transport.connections == 0


async def test_a_body_read_without_a_timer_is_stopped_by_abort_at_once_and_its_connection_closed(nursery):
    # A reader that bounds the reads itself (the byte relay) gives them no timer and stops the
    # one in progress with abort(): it ends at once, as does every later read, and the
    # connection (mid-body) is closed rather than pooled.
    server = Server(lambda n: [HEAD + b"5\r\nhello\r\n"])  # and then nothing: a long generation
    url = await nursery.start(server.serve)
    transport = Http1Transport(max_connections=4)
    with trio.fail_after(10):
        response = await transport.handle_async_request(request(url, read=0.2))
        body = response.stream
        body.read_timeout = math.inf  # type: ignore[union-attr]
        stream = body.__aiter__()  # type: ignore[union-attr]
        assert await stream.__anext__() == b"hello"
        failed: list[BaseException] = []

        async def read() -> None:
            try:
                await stream.__anext__()
            except httpx2.ReadError as exc:
                failed.append(exc)

        async with trio.open_nursery() as readers:
            readers.start_soon(read)
            await trio.testing.wait_all_tasks_blocked()
            await trio.sleep(0.5)  # past the 0.2 s the request asked for: this read keeps no timer
            assert failed == []
            body.abort()  # type: ignore[union-attr]
        assert len(failed) == 1
        with pytest.raises(httpx2.ReadError):
            await stream.__anext__()
        await response.aclose()
        await server.closed.wait()
    assert server.open_now == 0 and transport.connections == 0


async def test_no_more_than_max_connections_requests_are_in_flight(nursery):
    release = trio.Event()
    server = Server(lambda n: [HEAD + b"2\r\nok\r\n0\r\n\r\n"])
    url = await nursery.start(server.serve)
    transport = Http1Transport(max_connections=2)
    done: list[int] = []

    async def one(i: int) -> None:
        response = await transport.handle_async_request(request(url))
        await release.wait()
        assert await body_of(response) == b"ok"
        done.append(i)

    with trio.fail_after(10):
        async with trio.open_nursery() as inner:
            for i in range(5):
                inner.start_soon(one, i)
            await trio.testing.wait_all_tasks_blocked()
            assert server.most_open == 2 and len(server.requests) == 2
            release.set()
    assert sorted(done) == [0, 1, 2, 3, 4] and server.most_open == 2


async def test_malformed_answers_and_refused_connections_are_httpx2_errors(nursery):
    server = Server(lambda n: b"HTTP/1.1 banana\r\n\r\n", close_after=True)
    url = await nursery.start(server.serve)
    transport = Http1Transport(max_connections=2)
    with trio.fail_after(10), pytest.raises(httpx2.RemoteProtocolError):
        await transport.handle_async_request(request(url))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: refused
        with trio.fail_after(10), pytest.raises(httpx2.ConnectError):
            await transport.handle_async_request(request(f"http://127.0.0.1:{port}"))
    assert transport.connections == 0


async def test_a_length_delimited_body_and_a_body_until_close(nursery):
    answers = {1: b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello", 2: b"HTTP/1.0 200 OK\r\n\r\nuntil close"}
    server = Server(lambda n: answers[n if n <= 2 else 2], close_after=False)
    url = await nursery.start(server.serve)
    transport = Http1Transport(max_connections=2)
    with trio.fail_after(10):
        assert await body_of(await transport.handle_async_request(request(url))) == b"hello"
    closing = Server(lambda n: answers[2], close_after=True)
    url2 = await nursery.start(closing.serve)
    with trio.fail_after(10):
        assert await body_of(await transport.handle_async_request(request(url2))) == b"until close"
    assert server.connections == 1 and transport.connections == 1  # the first kept, the second closed



def _self_signed(tmp_path) -> tuple[str, str]:
    """A certificate for 127.0.0.1/localhost and its key, as PEM files."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return str(cert_path), str(key_path)


async def test_https_backends_are_reached_over_verified_tls_and_kept_alive(nursery, tmp_path):
    import ssl

    cert, key = _self_signed(tmp_path)
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(cert, key)
    server = Server(lambda n: [HEAD + b"5\r\nhel", b"lo\r\n0\r\n\r\n"])

    async def serve_tls(*, task_status=trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        task_status.started(f"https://localhost:{port}")
        await trio.serve_listeners(server.handle, [trio.SSLListener(l, server_context) for l in listeners])

    url = await nursery.start(serve_tls)
    trusting = ssl.create_default_context(cafile=cert)
    transport = Http1Transport(max_connections=2, ssl_context=trusting)
    with trio.fail_after(10):
        for _ in range(2):
            assert await body_of(await transport.handle_async_request(request(url))) == b"hello"
    assert server.connections == 1
    # A client that does not trust the certificate does not get through.
    with trio.fail_after(10), pytest.raises(httpx2.ConnectError):
        await Http1Transport(max_connections=2, ssl_context=ssl.create_default_context()).handle_async_request(request(url))


def test_a_fixed_request_writes_the_bytes_httpx2_would_write_with_its_own_headers_last():
    headers = {"authorization": "Bearer k", "content-type": "application/json", "accept": "text/event-stream"}
    url = "http://127.0.0.1:8000/v1/chat/completions"
    fixed = FixedRequest("POST", url, headers)
    assert fixed.origin == ("http", "127.0.0.1", 8000)
    general = httpx2.Request("POST", url, content=b'{"a":1}', headers={**headers, "traceparent": "00-ab-cd-01"})
    general.headers[HOP_HEADER] = outgoing_hops()
    assert fixed.message(b'{"a":1}', {"traceparent": "00-ab-cd-01"}) == _request_bytes(
        "POST", general.url.raw_path, general.headers.raw, general.content
    )
    # A header that would replace a fixed one, or is not a plain line, is the general path's (None).
    assert fixed.message(b"{}", {"Authorization": "Bearer other"}) is None
    assert fixed.message(b"{}", {"content-length": "1"}) is None
    assert fixed.message(b"{}", {"x-a": "a\r\nx-injected: 1"}) is None
    assert fixed.message(b"{}", {"bad name": "v"}) is None
    assert FixedRequest("POST", "https://example.com/v1/chat/completions?x=1", {}).origin == ("https", "example.com", 443)
    assert fixed.timeouts == (float("inf"),) * 3  # none given: none
    timed = FixedRequest("POST", url, headers, httpx2.Timeout(connect=1.0, read=None, write=3.0, pool=None))
    assert timed.timeouts == (1.0, float("inf"), 3.0)
    with pytest.raises(httpx2.UnsupportedProtocol):
        FixedRequest("POST", "ftp://example.com/x", {})


async def test_a_prebuilt_request_is_sent_whole_and_answered_through_the_same_pool(nursery):
    server = Server(lambda n: [HEAD + b"5\r\nhel", b"lo\r\n0\r\n\r\n"])
    url = await nursery.start(server.serve)
    transport = Http1Transport(max_connections=1)
    fixed = FixedRequest("POST", url + "/v1/chat/completions", {"content-type": "application/json"})
    with trio.fail_after(10):
        for _ in range(2):
            message = fixed.message(b'{"x": 1}')
            assert message is not None
            answer = await transport.open(fixed.origin, message, connect_timeout=5, read_timeout=5, write_timeout=5)
            assert answer.status_code == 200 and answer.headers["content-type"] == "text/event-stream"
            try:
                assert b"".join([part async for part in answer.stream]) == b"hello"
            finally:
                await answer.aclose()
        # the general path takes the same (pooled) connection
        assert await body_of(await transport.handle_async_request(request(url))) == b"hello"
    assert server.connections == 1 and server.requests[0] == message
    await transport.aclose()


class CountingSocket:
    """A real socket whose reads are counted, and those that found nothing (EAGAIN)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reads = 0
        self.empty = 0

    def fileno(self) -> int:
        return self.sock.fileno()

    def recv(self, size: int, *flags: int) -> bytes:
        self.reads += 1
        try:
            return self.sock.recv(size, *flags)
        except BlockingIOError:
            self.empty += 1
            raise


async def test_after_a_read_that_did_not_fill_the_buffer_the_next_waits_for_the_socket_before_reading():
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    counted = CountingSocket(ours)
    conn = _Connection(None, counted, None)  # type: ignore[arg-type]
    got: list[bytes] = []

    async def read() -> None:
        got.append(await conn.receive(5.0))

    with trio.fail_after(10):
        theirs.sendall(b"first")
        assert await conn.receive(5.0) == b"first"  # data waiting: read at once
        assert counted.reads == 1
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            await trio.testing.wait_all_tasks_blocked()
            assert got == [] and counted.reads == 1  # parked on the socket, no read that finds nothing
            theirs.sendall(b"second")
        assert got == [b"second"] and counted.empty == 0
        # A read that fills the buffer is followed by another at once: more is likely waiting.
        theirs.sendall(b"x" * (_READ_SIZE + 10))
        whole = b""
        while len(whole) < _READ_SIZE + 10:
            before = counted.reads
            part = await conn.receive(5.0)
            whole += part
            assert counted.reads == before + 1  # each read took data; none found the socket empty
        assert whole == b"x" * (_READ_SIZE + 10) and counted.empty == 0
    ours.close()
    theirs.close()


class Chat:
    """One prebuilt request to a test server's chat path, on `transport`: asked whole (`ask`),
    or begun at once (`begin`, the answer read later)."""

    def __init__(self, transport: Http1Transport, url: str, body: bytes = b"{}") -> None:
        fixed = FixedRequest("POST", url + "/v1/chat/completions", {"content-type": "application/json"})
        message = fixed.message(body)
        assert message is not None
        self.transport, self.origin, self.message = transport, fixed.origin, message

    async def ask(self) -> bytes:
        return await read_answer(await self.transport.open(self.origin, self.message, connect_timeout=5, read_timeout=5, write_timeout=5))

    def begin(self) -> SentRequest | None:
        return self.transport.send_now(self.origin, self.message, connect_timeout=5, write_timeout=5)


async def read_answer(answer: Any) -> bytes:
    try:
        return b"".join([part async for part in answer.stream])
    finally:
        await answer.aclose()


async def test_a_request_sent_now_reaches_the_backend_before_its_answer_is_asked_for(nursery):
    # `send_now` writes the request on a kept-alive connection at once, waiting for nothing:
    # the server has it while the caller does other work; `response` then reads the answer.
    arrived = trio.Event()

    def answer(n: int) -> bytes:
        arrived.set()
        return HEAD + chunked(b"answer %d" % n)

    server = Server(answer)
    url = await nursery.start(server.serve)
    transport = Http1Transport(max_connections=1)
    chat = Chat(transport, url, b'{"x": 1}')
    with trio.fail_after(10):
        assert chat.begin() is None  # no kept-alive connection yet: nothing sent, the caller uses `open`
        assert await chat.ask() == b"answer 1"
        arrived = trio.Event()
        sent = chat.begin()
        assert sent is not None
        await arrived.wait()  # the server answered before anyone asked for the answer
        assert await read_answer(await sent.response(5)) == b"answer 2"
        sent.close()  # (nothing, once answered)
    assert server.connections == 1 and server.requests == [chat.message, chat.message]
    assert transport.connections == 1  # the connection is back in the pool, its slot free
    https = ("https", "127.0.0.1", 1)
    assert transport.send_now(https, chat.message, connect_timeout=5, write_timeout=5) is None  # TLS waits for its handshake
    await transport.aclose()


async def test_a_request_sent_now_waits_for_no_slot_and_one_let_go_closes_its_connection(nursery):
    server = Server(lambda n: [HEAD + b"5\r\nhello\r\n0\r\n\r\n"] if n == 1 else None)  # then: silence
    url = await nursery.start(server.serve)
    transport = Http1Transport(max_connections=1)
    chat = Chat(transport, url)
    with trio.fail_after(10):
        assert await chat.ask() == b"hello"
        sent = chat.begin()
        assert sent is not None
        assert chat.begin() is None  # the one slot is taken: another is not begun (it would wait)
        sent.close()  # nobody will read its answer: the backend is told by the connection's close
        await server.closed.wait()
    assert transport.connections == 0 and server.open_now == 0
    with trio.fail_after(10):  # and its slot is free again
        sent = await transport.send(chat.origin, chat.message, connect_timeout=5, write_timeout=5)
        sent.close()


async def test_a_request_sent_now_on_a_connection_the_server_dropped_goes_again_on_a_new_one(nursery):
    # Like llama.cpp: it advertises keep-alive, then closes when the next request arrives.
    # The early send succeeds (the kernel takes the bytes); reading the answer finds the
    # connection closed unanswered, and the request goes again, once, on a new connection.
    dropping = Server(lambda n: HEAD + chunked(b"ok") if n % 2 else b"")
    url = await nursery.start(dropping.serve)
    transport = Http1Transport(max_connections=4)
    chat = Chat(transport, url)
    with trio.fail_after(10):
        assert await chat.ask() == b"ok"
        sent = chat.begin()
        assert sent is not None
        assert await read_answer(await sent.response(5)) == b"ok"
    assert dropping.connections == 2 and len(dropping.requests) == 3
    await transport.aclose()
