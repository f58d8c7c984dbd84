"""WebSocket mode (`/v1/responses`): `response.create` frames answered in order with the events SSE sends.

One connection runs its turns one after another, each to its terminal
event.  The connection keeps its latest response (id, and the items it
continues from), so that a `previous_response_id` naming it is answered
from there (`store: false` turns can continue).  Each frame is a request
of its own: counted against the key's requests per minute, read by the
intake (`stream` and `stream_options` are ignored, as OpenAI does),
refused with the error envelope of `render.ws_error` when it cannot run.
A drain ends the wait for the next frame and closes with 1001 once the
turn in progress has ended; the connection's age is bounded by
`WEBSOCKET_MAX_AGE`.  Knows the turn and the intake; nothing of Quart.

`serve_asgi_websocket` runs it on an ASGI socket: the accept, then a reader
task beside the turns (in a nursery it owns) that queues the client's frames
(a few may wait while a turn runs) and ends everything when the client
leaves, so that a turn in progress is cancelled and its backend call closed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import trio

from ..errors import GatewayError, InvalidRequest
from ..streams.sse import event_json
from ..turn import Resources, prepare_turn
from ..turn.base import Delivery
from ..turn.context import RequestContext
from ..wire.requests import ws_create_request
from .heartbeats import Heartbeats, OpenStream
from .render import ws_error

__all__ = ["serve_asgi_websocket", "serve_websocket"]

Receive = Callable[[], Awaitable[str | bytes]]
SendText = Callable[[str], Awaitable[None]]
Close = Callable[[int], Awaitable[None]]
Message = MutableMapping[str, Any]
Hold = Callable[[], contextlib.AbstractAsyncContextManager[Any]]
_QUEUED_FRAMES = 8  # frames a client may send ahead of the turn in progress before its reads wait


class _Listed:
    """A connection on the heartbeat wheel only to be listed among the live streams
    (`Heartbeats.open_streams`): WebSocket keep-alives are the server's pings, not the wheel's."""

    def __init__(self, ctx: RequestContext, interval: float) -> None:
        self.opened = self.wrote = trio.current_time()
        self.interval = interval
        self.key = ctx.caller.name
        self.model: str | None = None
        self.events = 0
        self.longest = 0.0
        self.over = False

    def sent(self, count: int) -> None:
        now = trio.current_time()
        self.longest = max(self.longest, now - self.wrote)
        self.wrote = now
        self.events += count

    def beat(self, now: float, stall_timeout: float | None) -> float | None:
        return None if self.over else now + self.interval

    def open_stream(self, now: float) -> OpenStream | None:
        if self.over:
            return None
        return OpenStream.seen(
            now,
            transport="websocket",
            route="/v1/responses",
            model=self.model,
            key=self.key,
            opened=self.opened,
            wrote=self.wrote,
            longest=self.longest,
            events=self.events,
        )


async def serve_asgi_websocket(
    resources: Resources,
    ctx: RequestContext,
    receive: Callable[[], Awaitable[Message]],
    send: Callable[[Message], Awaitable[None]],
    hold: Hold | None = None,
    heartbeats: Heartbeats | None = None,
) -> None:
    """Accept an ASGI WebSocket and serve it (`serve_websocket`) until either side ends it; with
    `hold` (the server's `gateway.batch`), a batch of events leaves in one write; with
    `heartbeats`, the connection is listed among the live streams while it is open."""
    if (await receive())["type"] != "websocket.connect":
        return
    await send({"type": "websocket.accept"})
    frames_in, frames = trio.open_memory_channel[str | bytes](_QUEUED_FRAMES)

    async def read() -> None:
        async with frames_in:
            while True:
                message = await receive()
                if message["type"] == "websocket.disconnect":
                    nursery.cancel_scope.cancel()  # the client left: the turn in progress ends here
                    return
                if message["type"] == "websocket.receive":
                    text = message.get("text")
                    await frames_in.send(text if text is not None else bytes(message.get("bytes") or b""))

    async def send_text(text: str) -> None:
        await send({"type": "websocket.send", "text": text})

    async def close(code: int) -> None:
        await send({"type": "websocket.close", "code": code})

    listed = ticket = None
    if heartbeats is not None:
        listed = _Listed(ctx, heartbeats.interval)
        ticket = heartbeats.add(listed, listed.opened + heartbeats.interval)
    try:
        async with frames, trio.open_nursery() as nursery:  # owned here: the socket's reader beside its turns
            nursery.start_soon(read)
            await serve_websocket(resources, ctx, frames.receive, send_text, close, hold, listed)
            nursery.cancel_scope.cancel()
    finally:
        if listed is not None and ticket is not None:
            listed.over = True
            ticket.cancel()


async def serve_websocket(
    resources: Resources,
    ctx: RequestContext,
    receive: Receive,
    send_text: SendText,
    close: Close,
    hold: Hold | None = None,
    listed: _Listed | None = None,
) -> None:
    """Serve one accepted WebSocket until the client leaves, the drain begins or its time is up
    (`listed`: how the live streams list shows it)."""
    together = hold if hold is not None else contextlib.nullcontext
    settings, drain = resources.settings, resources.drain
    opened = trio.current_time()
    latest: dict[str, Any] = {}  # the connection's latest response: id -> the items it continues from

    async def send(events: list[dict[str, Any]]) -> None:
        async with together():  # a message per event, one write for them all
            for event in events:
                await send_text(event_json(event).decode())
        if listed is not None:
            listed.sent(len(events))

    # The connection's age bounds the waits for a frame, not a turn: a turn running when the
    # time is up ends with its terminal event, then the connection closes.
    expires = opened + settings.websocket_max_age
    waiting = trio.CancelScope(deadline=expires)  # around each wait for a frame: a drain ends it
    with drain.on_drain(lambda: waiting.cancel()):
        while not drain.draining.is_set():
            with waiting:
                raw = await receive()
            if waiting.cancelled_caught:
                break
            waiting = trio.CancelScope(deadline=expires)
            arrived = trio.current_time()
            await _turn(resources, ctx, raw if isinstance(raw, bytes) else raw.encode(), latest, send, arrived, listed)
    if drain.draining.is_set():
        await close(1001)  # going away: the turn in progress has ended first
    elif trio.current_time() >= expires:
        expired = InvalidRequest(
            "This connection reached its time limit; open a new one.", code="websocket_connection_limit_reached"
        )
        await send([ws_error(expired)])
        await close(1000)


async def _turn(
    resources: Resources,
    ctx: RequestContext,
    frame: bytes,
    latest: dict[str, Any],
    send: Callable[[list[dict[str, Any]]], Awaitable[None]],
    arrived: float,
    listed: _Listed | None = None,
) -> None:
    """One `response.create`, to its terminal event (or its error envelope); `arrived`: when
    its frame did."""
    previous: Any = None
    try:
        req, body = ws_create_request(frame)
        await resources.limiter.admit_request(ctx.caller)  # each response.create is a request
        previous = body.get("previous_response_id")
        cached = latest.get(previous) if isinstance(previous, str) else None
        turn = await prepare_turn(
            resources,
            req,
            transport="websocket",
            caller=ctx.caller,
            gateway_tools=ctx.gateway_tools((req.model_extra or {}).get("gateway_tools")),
            cached=(str(previous), cached) if cached is not None else None,
            request_id=ctx.request_id,
            arrived=arrived,
        )
    except GatewayError as error:
        if isinstance(previous, str):
            latest.pop(previous, None)  # a failed continuation forgets the id
        await send([ws_error(error)])
        return
    if listed is not None:
        listed.model = turn.outcome.model
    left = True  # until the turn ran to its end: the client went away mid-turn
    try:
        await turn.run(send)
        left = False
    finally:
        turn.finish(Delivery(client_left=left, socket=True))  # (a turn on a socket has no status line of its own)
    final = turn.response
    if final.get("status") == "failed" and isinstance(previous, str):
        latest.pop(previous, None)
    latest.clear()  # only the latest response is kept on the connection
    latest[final["id"]] = turn.conversation_so_far()

