"""The load generator's WebSocket client: one worker's Responses turns on one WebSocket.

The Responses API's WebSocket mode (`/v1/responses`): a connection opened once, then one
`response.create` frame per request, answered by the same events an SSE stream carries, one per
message, up to the turn's terminal event. This client owns that connection (the handshake and
frames by wsproto, the state machine hypercorn serves with) and the timing of each turn; every
failure becomes `RequestResult.error`, none escapes. Like `client.py` it classifies events by a
few byte comparisons, never parsing the JSON of an event that is not a failure.

A turn's times start when its frame is written; the handshake counts in the first turn's
`connect`, as a new HTTP connection does in `client.py`.
"""

from __future__ import annotations

import math
import time

import orjson
import trio
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, CloseConnection, Message, Ping, RejectConnection, Request

from .config import LoadConfig
from .failures import error_fields
from .report import Counters, RequestResult

__all__ = ["WebSocketClient"]

_READ_SIZE = 65536
_TEXT = b'"type":"response.output_text.delta"'
_ENDINGS = {
    b'"type":"response.completed"': "response.completed",
    b'"type":"response.incomplete"': "response.incomplete",
}
_FAILURES = (b'"type":"response.failed"', b'"type":"error"')


class _Failure(Exception):
    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail


class WebSocketClient:
    """One worker's WebSocket: sequential turns, the connection kept until it fails."""

    def __init__(self, config: LoadConfig, counters: Counters) -> None:
        endpoint = config.endpoint()
        self._host, self._port, self._authority, self._path = endpoint.host, endpoint.port, endpoint.authority, endpoint.path
        self._headers = [(name.encode(), value.encode()) for name, value in config.headers]
        body: dict[str, object] = {"type": "response.create", "model": config.model, "input": config.input}
        if config.max_output_tokens is not None:
            body["max_output_tokens"] = config.max_output_tokens
        self._frame = orjson.dumps(body).decode()
        self._counters = counters
        self._stream: trio.SocketStream | None = None
        self._ws: WSConnection | None = None
        self._events: list[object] = []  # received and not yet taken

    async def aclose(self) -> None:
        stream, self._stream, self._ws = self._stream, None, None
        self._events = []
        if stream is not None:
            with trio.move_on_after(1, shield=True):
                await stream.aclose()

    async def request(self, timeout: float | None, run_start: float) -> RequestResult:
        """One turn; every failure becomes `RequestResult.error`, none escapes."""
        result = RequestResult()
        t_start = time.perf_counter()
        result.started = t_start - run_start
        try:
            with trio.fail_after(math.inf if timeout is None else timeout):
                await self._turn(result, t_start)
        except trio.TooSlowError:
            result.error, result.error_detail = "timeout", f"no terminal event within {timeout} s"
            await self.aclose()
        except _Failure as failure:
            result.error, result.error_detail = failure.kind, failure.detail
            if failure.kind != "failed_event":
                await self.aclose()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as error:
            result.error, result.error_detail = "read", f"{type(error).__name__}: {error}"
            await self.aclose()
        result.ended = time.perf_counter() - run_start
        return result

    async def _open(self, result: RequestResult) -> tuple[trio.SocketStream, WSConnection]:
        try:
            stream = await trio.open_tcp_stream(self._host, self._port)
        except OSError as error:
            raise _Failure("connect", f"{type(error).__name__}: {error}") from None
        self._counters.connections_opened += 1
        result.new_connection = True
        ws = WSConnection(ConnectionType.CLIENT)
        self._stream, self._ws = stream, ws
        await stream.send_all(ws.send(Request(host=self._authority, target=self._path, extra_headers=self._headers)))
        while True:
            for event in await self._receive(stream, ws):
                if isinstance(event, AcceptConnection):
                    return stream, ws
                if isinstance(event, RejectConnection):
                    result.status = event.status_code
                    raise _Failure("http_status", f"{event.status_code}: the WebSocket handshake was refused")

    async def _receive(self, stream: trio.SocketStream, ws: WSConnection) -> list[object]:
        if self._events:
            events, self._events = self._events, []
            return events
        data = await stream.receive_some(_READ_SIZE)
        ws.receive_data(data or None)
        return list(ws.events())

    async def _turn(self, result: RequestResult, t_start: float) -> None:
        if self._stream is None or self._ws is None:
            stream, ws = await self._open(result)
        else:
            stream, ws = self._stream, self._ws
        result.status = 101
        await stream.send_all(ws.send(Message(data=self._frame)))
        last = first_event = first_text = None
        events, reads = 0, 0
        parts: list[str] = []
        while True:
            received = await self._receive(stream, ws)
            now = time.perf_counter()
            reads += 1
            for index, event in enumerate(received):
                if isinstance(event, Ping):
                    await stream.send_all(ws.send(event.response()))
                    continue
                if isinstance(event, CloseConnection):
                    raise _Failure("read", f"the server closed the WebSocket ({event.code})")
                if not isinstance(event, Message):
                    continue
                parts.append(event.data if isinstance(event.data, str) else event.data.decode())
                if not event.message_finished:
                    continue
                frame = "".join(parts).encode()
                parts = []
                if last is not None:
                    result.gaps.append(now - last)
                else:
                    first_event = now - t_start
                    result.time_to_first_byte = first_event
                last = now
                events += 1
                if first_text is None and _TEXT in frame:
                    first_text = now - t_start
                ending = next((name for marker, name in _ENDINGS.items() if marker in frame), None)
                failed = ending is None and any(marker in frame for marker in _FAILURES)
                if ending is None and not failed:
                    continue
                self._events = received[index + 1 :]
                result.events, result.reads = events, reads
                result.time_to_first_event, result.time_to_first_text = first_event, first_text
                result.total = now - t_start
                if failed:
                    try:
                        result.code, message = error_fields(orjson.loads(frame))
                    except orjson.JSONDecodeError:
                        message = ""
                    raise _Failure("failed_event", message or "the turn failed")
                result.terminal = ending
                return
            if not received and ws.state.name != "OPEN":
                raise _Failure("read", "the WebSocket ended before the turn's terminal event")

