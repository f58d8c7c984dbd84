"""WebSockets on the gateway's own HTTP/1.1 server: the handshake, the frames and the ASGI websocket scope.

Under hypercorn a WebSocket message goes through its stream object, wsproto's
serialiser and the connection's send path, which a streamed turn pays for
every event (what it cost against an SSE stream: the load lab's WebSocket
row, docs/load-lab.md).  A plain connection whose request
asks for a WebSocket (`GET`, `Upgrade: websocket`, version 13, a key) is
served here instead, in the connection's own task:

- the app's `receive` reads the socket itself and hands the bytes to
  wsproto, which parses the client's frames (masked, maybe fragmented, UTF-8
  checked); a ping is answered with its pong, a close with its close, a
  message larger than `websocket_max_message_size` ends the connection with
  1009, a protocol error with wsproto's code;
- a message the app sends is one frame built here (a server's frames are
  not masked: a header and the payload), written at once, or held with the
  others of a batch (the `gateway.batch` extension's `hold()`: a turn's burst of events in one write);
- no extension is negotiated (permessage-deflate would compress every
  small event; clients go on without it, as the RFC has them);
- refusing the handshake (`websocket.http.response.*`, or `websocket.close`
  before the accept: 403) answers with HTTP and closes; the app returning
  on an open socket closes it with 1000.

Anything else that asks to switch protocols still goes to hypercorn.
"""

from __future__ import annotations

import collections
import logging
import struct
from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any

import trio
from wsproto.connection import Connection, ConnectionState, ConnectionType
from wsproto.events import BytesMessage, CloseConnection, Ping, TextMessage
from wsproto.utilities import generate_accept_token

from ..errors import is_failure
from . import ext
from .h1 import InvalidResponse, check_lines

if TYPE_CHECKING:
    from .http11 import _Connection

__all__ = ["WebSocketExchange", "asks_for_websocket", "frame"]

log = logging.getLogger("gateway")

Message = MutableMapping[str, Any]
_ASGI = {"spec_version": "2.3", "version": "3.0"}
_TEXT, _BINARY = 0x1, 0x2
_TOO_BIG = 1009


def asks_for_websocket(method: str, headers: list[tuple[bytes, bytes]]) -> bool:
    """A request for a WebSocket this server can serve (RFC 6455, version 13)."""
    if method != "GET":
        return False
    upgrade = version = key = False
    for name, value in headers:
        if name == b"upgrade":
            upgrade = upgrade or b"websocket" in [token.strip() for token in value.lower().split(b",")]
        elif name == b"sec-websocket-version":
            version = value.strip() == b"13"
        elif name == b"sec-websocket-key":
            key = bool(value.strip())
    return upgrade and version and key


def frame(opcode: int, payload: bytes) -> bytes:
    """One unmasked, final frame (the server's side of RFC 6455)."""
    size = len(payload)
    if size < 126:
        return bytes((0x80 | opcode, size)) + payload
    if size < 65536:
        return struct.pack("!BBH", 0x80 | opcode, 126, size) + payload
    return struct.pack("!BBQ", 0x80 | opcode, 127, size) + payload


class WebSocketExchange:
    """One WebSocket on a plain connection: its scope, `receive` and `send`, from handshake to close."""

    def __init__(
        self, connection: _Connection, target: tuple[str, bytes, bytes], headers: list[tuple[bytes, bytes]], version: str
    ) -> None:
        self.connection = connection
        self.target = target  # the path, raw path and query string (`http11.request_target`)
        self.headers = headers
        self.version = version
        self.protocol = Connection(ConnectionType.SERVER)
        self.connect_said = False
        self.accepted = False
        self.answered = False  # refused with an HTTP response (or it began)
        self.refusal: tuple[int, list[tuple[bytes, bytes]]] | None = None
        self.refusal_body: list[bytes] = []
        self.closed_code: int | None = None  # the socket is over: what `receive` says next
        self.pending: collections.deque[Message] = collections.deque()
        self.partial: list[Any] = []
        self.partial_size = 0
        self.max_size = int(connection.server.config.websocket_max_message_size)

    def take(self, data: bytes) -> None:
        """Bytes read after the handshake's head: the client's frames."""
        if data and self.protocol.state in (ConnectionState.OPEN, ConnectionState.LOCAL_CLOSING):
            self.protocol.receive_data(data)

    def scope(self) -> dict[str, Any]:
        connection = self.connection
        path, raw_path, query = self.target
        subprotocols: list[str] = []
        for name, value in self.headers:
            if name == b"sec-websocket-protocol":
                subprotocols += [token.strip() for token in value.decode("latin-1").split(",") if token.strip()]
        return {
            "type": "websocket",
            "asgi": _ASGI,
            "http_version": self.version,
            "scheme": "ws",
            "path": path,
            "raw_path": raw_path,
            "query_string": query,
            "root_path": connection.server.config.root_path,
            "headers": self.headers,
            "client": connection.client,
            "server": connection.local,
            "subprotocols": subprotocols,
            "state": connection.server.state.copy(),
            "extensions": {"websocket.http.response": {}, ext.BATCH: {"hold": connection.hold}},
        }

    async def run(self, app: Any) -> None:
        """The app, then what it left unsaid: a refusal (500) before the accept, a close after
        (1000; 1011 when the app failed)."""
        connection = self.connection
        code = 1000
        try:
            await app(self.scope(), self.receive, self.send)
        except BaseException as exc:
            if not is_failure(exc):
                raise
            log.error("the app failed on a WebSocket (%s); its connection is closed", type(exc).__name__)
            log.debug("app failure", exc_info=exc)
            code = 1011
        if connection.write_over:
            return
        if not self.accepted and not self.answered:
            await connection.refuse(500)
        elif self.accepted and self.protocol.state is ConnectionState.OPEN:
            await self._close(code)

    # --- what the client sends ------------------------------------------------------------

    async def receive(self) -> Message:
        if not self.connect_said:
            self.connect_said = True
            return {"type": "websocket.connect"}
        connection = self.connection
        while True:
            if self.pending:
                return self.pending.popleft()
            if self.closed_code is not None:
                await trio.lowlevel.checkpoint()
                return {"type": "websocket.disconnect", "code": self.closed_code}
            await self._read_events()
            if self.pending or self.closed_code is not None:
                continue
            if connection.read_over:
                if self.protocol.state is not ConnectionState.CLOSED:
                    self.protocol.receive_data(None)  # gone without a close frame: 1006
                continue
            await connection.read_more()

    async def _read_events(self) -> None:
        for event in self.protocol.events():
            if isinstance(event, (TextMessage, BytesMessage)):
                self.partial.append(event.data)
                self.partial_size += len(event.data)
                if self.partial_size > self.max_size:
                    await self._close(_TOO_BIG)
                    self.closed_code = _TOO_BIG
                    return
                if event.message_finished:
                    parts, self.partial, self.partial_size = self.partial, [], 0
                    if isinstance(event, TextMessage):
                        self.pending.append({"type": "websocket.receive", "text": "".join(parts)})
                    else:
                        self.pending.append({"type": "websocket.receive", "bytes": b"".join(parts)})
            elif isinstance(event, Ping):
                await self._write_control(self.protocol.send(event.response()))
            elif isinstance(event, CloseConnection):
                state = self.protocol.state
                if state is ConnectionState.REMOTE_CLOSING:
                    await self._write_control(self.protocol.send(event.response()))
                elif state is ConnectionState.OPEN:  # a frame wsproto could not parse: its code says why
                    await self._close(event.code)
                self.closed_code = event.code  # (1005 for a close frame without one, 1006 for none at all)
                return

    # --- what the app sends ---------------------------------------------------------------

    async def send(self, message: Message) -> None:
        kind = message["type"]
        connection = self.connection
        if kind == "websocket.send":
            if not self.accepted:
                if self.answered:
                    return  # (refused: the connection is closing)
                raise RuntimeError("a WebSocket message was sent before the accept")
            if self.protocol.state is not ConnectionState.OPEN or connection.write_over:
                return  # closing or gone: `receive` tells the app
            text = message.get("text")
            if text is not None:
                await connection.write(frame(_TEXT, text.encode()))
            else:
                await connection.write(frame(_BINARY, bytes(message.get("bytes") or b"")))
        elif kind == "websocket.accept":
            if self.accepted or self.answered:
                raise RuntimeError("a WebSocket was accepted twice, or after its refusal")
            try:
                head = self._switching_head(message)
            except InvalidResponse as error:
                log.error("the app's WebSocket accept could not be sent (%s); answered 500 instead", error)
                self.answered = True
                await connection.refuse(500)
                return
            self.accepted = True
            await connection.write_now(head)
        elif kind == "websocket.close":
            if self.accepted:
                if self.protocol.state is ConnectionState.OPEN:
                    await self._close(int(message.get("code") or 1000), message.get("reason") or "")
            elif not self.answered:
                self.answered = True  # a close before the accept refuses the handshake (ASGI)
                await connection.refuse(403)
        elif kind == "websocket.http.response.start":
            if self.accepted or self.answered:
                raise RuntimeError("a WebSocket refusal came after the accept, or twice")
            self.answered = True
            self.refusal = (int(message["status"]), list(message.get("headers", ())))
        elif kind == "websocket.http.response.body":
            if self.refusal is None:
                raise RuntimeError("a WebSocket refusal's body came before its start")
            self.refusal_body.append(bytes(message.get("body", b"")))
            if not message.get("more_body", False):
                status, headers = self.refusal
                await connection.answer_and_close(status, headers, b"".join(self.refusal_body))
        else:
            raise RuntimeError(f"unexpected ASGI message {kind!r}")

    def _switching_head(self, message: Message) -> bytes:
        key = next(value for name, value in self.headers if name == b"sec-websocket-key")
        lines = [
            b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\n",
            b"sec-websocket-accept: %b\r\n" % generate_accept_token(key.strip()),
        ]
        given = []
        subprotocol = message.get("subprotocol")
        if subprotocol:
            given.append(b"sec-websocket-protocol: %b\r\n" % subprotocol.encode("latin-1"))
        for name, value in message.get("headers", ()):
            if name.lower() not in _OWN_HEADERS:
                given.append(b"%b: %b\r\n" % (name, value))
        check_lines(given)  # (what the app gives goes out checked, as on any response)
        return b"".join([*lines, *given, b"date: %b\r\n\r\n" % self.connection.server.date()])

    async def _close(self, code: int, reason: str = "") -> None:
        await self._write_control(self.protocol.send(CloseConnection(code=code, reason=reason or None)))

    async def _write_control(self, data: bytes) -> None:
        if not self.connection.write_over:
            await self.connection.write_now(data)


_OWN_HEADERS = frozenset(
    {b"upgrade", b"connection", b"sec-websocket-accept", b"sec-websocket-protocol", b"sec-websocket-extensions", b"date"}
)
