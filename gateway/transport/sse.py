"""Server-sent events: response bodies that run a turn and write its events as they come.

Every body is written by the HTTP layer's send loop (`write`), which the
body runs in `serve`.  A streamed body owns the request's nursery, opened and
closed in `serve` (never inside an async generator): the turn runs in the
task that called it, so that it reaches its backend before anything else is
set up, and the send loop (and the disconnect watch the HTTP layer may ask
for) run beside it, linked by one memory channel of encoded bytes, which the
process's one heartbeat ticker (heartbeats.py) also feeds:

    the turn (backend rounds, tool calls) --bytes--> send loop (writes)
    the process's heartbeat ticker        --bytes--/

Each write coalesces what is queued.  The turn ends its stream with a
terminal event whatever fails; only a client that leaves (cancellation
from the connection) ends it without one.  These bodies turn event batches
into bytes and decide nothing about the protocol.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import orjson
import trio

from ..observe import Telemetry
from ..streams.sse import (
    OBFUSCATED,
    encode_comment,
    encode_done,
    encode_event,
    obfuscated,
)
from ..turn import Turn
from ..turn.base import Delivery
from ..turn.chat import ChatTurn
from .body import DeferredHeadBody, Write
from .heartbeats import Heartbeats, OpenStream, Ticket
from .leaving import Watch
from .render import Dialect, answer

__all__ = [
    "SSE_HEADERS",
    "ChatEventStream",
    "EventChannelBody",
    "MessagesEventStream",
    "TurnEventStream",
    "TurnStream",
    "send_soon",
]

log = logging.getLogger("gateway.sse")
_COMMENT = encode_comment()  # the keep-alive of a quiet stream

SSE_HEADERS = {
    "content-type": "text/event-stream; charset=utf-8",
    "cache-control": "no-cache",
    "x-accel-buffering": "no",
}
# How long a stream's status may wait for the backend's first answer: an
# error status it gives by then (unknown model, context too long) is passed
# on as that status; later, the stream is committed.
_MAX_HEAD_WAIT = 1.0


class EventChannelBody(DeferredHeadBody):
    """A streamed body fed by a memory channel of encoded bytes, kept alive by the process's ticker.

    Writes coalesce what is already queued.  `produce` is the one producer,
    run by `serve` in its caller's task; it owns the sending end it is
    given.  The `Heartbeats` ticker looks at the body once per interval
    (`beat`): after `interval` seconds without a write it queues a
    keep-alive, and a write the client has left unread for the ticker's
    `stall_timeout` closes the stream (`stalled`; the HTTP layer then drops
    the connection).
    """

    def __init__(self, heartbeats: Heartbeats, telemetry: Telemetry | None = None) -> None:
        self._heartbeats = heartbeats
        self._interval = heartbeats.interval
        self._telemetry = telemetry or Telemetry()
        self._out_recv: trio.MemoryReceiveChannel[bytes] | None = None
        self._beat_send: trio.MemorySendChannel[bytes] | None = None  # the ticker's way in
        self._last_write = 0.0  # a write, or a keep-alive queued (the ticker's reckoning)
        self._handed_at: float | None = None  # a write is with the HTTP layer since then
        # For the operator's list of live streams (Heartbeats.open_streams):
        self._opened_at = 0.0
        self._wrote_at = 0.0  # the last write with events in it (a keep-alive alone ends no silence)
        self._longest_silence = 0.0  # the longest gap between two such writes
        self._pinged = False  # a keep-alive was queued since the last write
        self.events = 0  # events the producer queued
        self._nursery: trio.Nursery | None = None
        self._over = False
        self._beats_over = False
        self._ticket: Ticket | None = None
        self.client_left = False
        self.stalled = False
        self.first_write_at: float | None = None

    async def produce(self, out: trio.MemorySendChannel[bytes]) -> None:
        raise NotImplementedError

    async def serve(self, write: Write, watch: Watch | None = None) -> None:
        self._last_write = self._opened_at = self._wrote_at = now = trio.current_time()
        out_send: trio.MemorySendChannel[bytes]
        out_send, out_recv = trio.open_memory_channel(256)  # (unsubscripted: no typing work per stream)
        self._out_recv = out_recv
        self._beat_send = out_send.clone()
        try:
            async with trio.open_nursery() as nursery:  # owned here: the send loop and the watch beside the producer
                self._nursery = nursery
                nursery.start_soon(self._run_writer, write, watch, now + self._interval)
                await self._run_producer(out_send)
        finally:
            self._stop_beats()
            self._over = True
            if self._ticket is not None:
                self._ticket.cancel()  # the wheel lets go of this body (and its response) now
            out_recv.close()
            self.closed()

    async def _run_writer(self, write: Write, watch: Watch | None, first_beat: float) -> None:
        # The send loop's first step comes when the producer first waits (for its backend, or
        # a hosted MCP server): what only the waits need (the watch, the ticker's look) is set
        # up from here, after the backend was asked.
        assert self._nursery is not None
        forget = watch(self._nursery) if watch is not None else None
        self._ticket = self._heartbeats.add(self, first_beat)
        try:
            await write(self)
        except trio.Cancelled:
            self.client_left = True  # (the watch saw the client leave, or the server ended the request)
            raise
        finally:
            if forget is not None:
                forget()
            if self.stalled:
                self.client_left = True
            # Everything useful has been sent (or the client left): the producer and the watch stop.
            self._nursery.cancel_scope.cancel()

    def __aiter__(self) -> EventChannelBody:
        return self

    async def __anext__(self) -> bytes:
        self._handed_at = None  # the HTTP layer is back for more: the last write went out
        data = await self._next_write()
        if self.first_write_at is None:
            self.first_write_at = self._last_write
        self._handed_at = self._last_write
        return data

    def closed(self) -> None:
        """Called once the body is done (sent, or the client left)."""

    def _stop_beats(self) -> None:
        """No more keep-alives (the producer is done); the ticker still watches for a stall."""
        self._beats_over = True
        if self._beat_send is not None:
            self._beat_send.close()

    async def _run_producer(self, out_send: trio.MemorySendChannel[bytes]) -> None:
        async with out_send:
            try:
                await self.produce(out_send)
            finally:
                self._stop_beats()  # with the producer's end closed, the writer sees the channel's end

    async def _next_write(self) -> bytes:
        """Everything queued, as one write; StopAsyncIteration when the producers are done."""
        assert self._out_recv is not None
        receive_nowait = self._out_recv.receive_nowait
        try:
            try:
                # What is queued already is taken at once: a channel's `receive` would
                # first pass through the scheduler, delaying every write by a round.
                first = receive_nowait()
            except trio.WouldBlock:
                first = await self._out_recv.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None
        parts = [first]
        while True:
            try:
                parts.append(receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel):
                break
        now = self._last_write = trio.current_time()
        if self._pinged:  # (rare: a quiet stream)
            self._pinged = False
            if len(parts) == 1:  # the keep-alive alone: the client still waits for events
                return first
        if now - self._wrote_at > self._longest_silence:
            self._longest_silence = now - self._wrote_at
        self._wrote_at = now
        return first if len(parts) == 1 else b"".join(parts)

    def keep_alive(self) -> bytes:
        """What a quiet stream is sent: an SSE comment."""
        return _COMMENT

    def beat(self, now: float, stall_timeout: float | None) -> float | None:
        """The ticker's look (see the class): when to look again, None once the body is over."""
        if self._over:
            return None
        handed = self._handed_at
        if handed is not None:
            if stall_timeout is None:  # the server bounds the write's progress itself
                return now + self._interval
            if now - handed >= stall_timeout:
                self._stall()
                return None
            return min(handed + stall_timeout, now + self._interval)
        due = self._last_write + self._interval
        if now < due:
            return due
        if self._beats_over:  # the last writes are queued: only a stall is left to watch for
            return now + self._interval
        assert self._beat_send is not None
        try:
            self._beat_send.send_nowait(self.keep_alive())
        except trio.WouldBlock:
            pass  # a full queue is on its way to the client already
        else:
            self._pinged = True
            self._telemetry.heartbeat()
        self._last_write = now
        return now + self._interval

    def _stall(self) -> None:
        """The client has not read a write for the stall bound: end the stream, connection and all."""
        log.info("closing a stream whose client stopped reading")
        self.stalled = True
        self._over = True
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()  # the stuck write too


class TurnStream(EventChannelBody):
    """A streamed body of one turn: its status and headers, and its outcome once it is done.

    With a `dialect`, the head waits for the turn's first answer for half a
    heartbeat interval (at most `_MAX_HEAD_WAIT`): the client never waits
    longer than a heartbeat for its first bytes, and a turn that failed by
    then (`turn.rejection`) is answered with its status, as JSON in that
    API's shape, instead of a stream (what the turn produced is not sent).
    Without one (chat completions), the stream is committed at once.

    The turn's first backend request is begun before the stream sets up
    (`begin`): the backend works on it meanwhile.
    """

    dialect: Dialect | None = None
    transport = route = ""  # how the operator's list of live streams names it (see `open_stream`)

    def __init__(self, turn: Any, *, heartbeats: Heartbeats, request_id: str | None = None) -> None:
        super().__init__(heartbeats, turn.resources.telemetry)
        self.turn = turn
        self._request_id = request_id
        self._json_error: bytes | None = None
        self._status: int | None = None  # a refusal answered as JSON, instead of the stream

    async def serve(self, write: Write, watch: Watch | None = None) -> None:
        self.turn.begin()  # the backend starts on the request while the stream sets up
        try:
            await super().serve(write, watch)
        finally:
            self.turn.abandon()  # (a begun request the turn never took: it did not run)

    async def head(self) -> tuple[int, dict[str, str]]:
        if self.dialect is None:
            return 200, dict(SSE_HEADERS)
        with trio.move_on_after(min(self._interval / 2, _MAX_HEAD_WAIT)):
            await self.turn.answered.wait()
        rejection = self.turn.rejection
        if rejection is not None:
            status, self._json_error, headers = answer(rejection, dialect=self.dialect, request_id=self._request_id)
            self._status = status
            return status, headers
        return 200, dict(SSE_HEADERS)

    async def __anext__(self) -> bytes:
        if self._json_error is not None:
            data, self._json_error = self._json_error, b""
            if not data:
                raise StopAsyncIteration
            return data
        return await super().__anext__()

    def open_stream(self, now: float) -> OpenStream | None:
        """The stream as the operator's list shows it; None once it is over."""
        if self._over:
            return None
        outcome = self.turn.outcome
        return OpenStream.seen(
            now,
            transport=self.transport,
            route=self.route,
            model=outcome.model,
            key=outcome.key,
            opened=self._opened_at,
            wrote=self._wrote_at,
            longest=self._longest_silence,
            events=self.events,
        )

    def closed(self) -> None:
        written = self.first_write_at is not None  # a stream lasts until its last write went out
        self.turn.finish(
            Delivery(
                client_left=self.client_left,
                first_event_at=self.first_write_at,
                finished_at=trio.current_time() if written else None,
                status=self._status,
            )
        )


class TurnEventStream(TurnStream):
    """A streamed `/v1/responses` body: one turn, its events as SSE, then `[DONE]` (a backend's
    refusal within the head's wait is its own status)."""

    dialect = "openai"
    transport, route = "sse", "/v1/responses"

    def __init__(self, turn: Turn, *, heartbeats: Heartbeats) -> None:
        super().__init__(turn, heartbeats=heartbeats)

    async def produce(self, out: trio.MemorySendChannel[bytes]) -> None:
        async def emit(events: list[dict[str, Any]]) -> None:
            self.events += len(events)
            await send_soon(out, b"".join([encode_event(event) for event in events]))

        async def emit_obfuscated(events: list[dict[str, Any]]) -> None:
            self.events += len(events)
            # (padded as they are written: the turn keeps, stores and replays them unpadded)
            chunk = b"".join(
                [encode_event(obfuscated(e, os.urandom(32)) if e["type"] in OBFUSCATED else e) for e in events]
            )
            await send_soon(out, chunk)

        options = self.turn.req.stream_options
        await self.turn.run(emit_obfuscated if options is not None and options.include_obfuscation else emit)
        await out.send(encode_done())

    def keep_alive(self) -> bytes:
        """A numbered `ping` event in the required_action protocol (when it can go in order)."""
        ping = self.turn.ping()
        return encode_event(ping) if ping is not None else _COMMENT


class ChatEventStream(TurnStream):
    """A streamed `/v1/chat/completions` body: one chat turn, its chunks as SSE, then `[DONE]`.

    Heartbeats are SSE comments, so clients wait through tool rounds.
    """

    transport, route = "chat", "/v1/chat/completions"

    def __init__(self, turn: ChatTurn, *, heartbeats: Heartbeats) -> None:
        super().__init__(turn, heartbeats=heartbeats)

    async def produce(self, out: trio.MemorySendChannel[bytes]) -> None:
        async def emit(chunks: list[dict[str, Any]]) -> None:
            self.events += len(chunks)
            await send_soon(out, b"".join([b"data: " + orjson.dumps(chunk) + b"\n\n" for chunk in chunks]))

        await self.turn.run(emit)
        await out.send(encode_done())


class MessagesEventStream(TurnStream):
    """A streamed `/v1/messages` body: one chat-shaped turn whose events are Anthropic's.

    Its keep-alive is Anthropic's `ping` event, from the stream's first
    moment.  A failure before the model's first content (an unknown model, a
    backend down) is answered with its HTTP status in Anthropic's shape, as
    Anthropic answers; later, it is an `error` event.
    """

    dialect = "anthropic"
    transport, route = "messages", "/v1/messages"

    def __init__(self, turn: ChatTurn, *, heartbeats: Heartbeats, request_id: str | None = None) -> None:
        super().__init__(turn, heartbeats=heartbeats, request_id=request_id)

    async def produce(self, out: trio.MemorySendChannel[bytes]) -> None:
        async def emit(events: list[dict[str, Any]]) -> None:
            self.events += len(events)
            await send_soon(out, b"".join([encode_event(event) for event in events]))

        await self.turn.run(emit)

    def keep_alive(self) -> bytes:
        return _PING


_PING = encode_event({"type": "ping"})


async def send_soon(channel: trio.MemorySendChannel[Any], value: Any) -> None:
    """Queue without yielding when there is room.

    A plain `send` is a scheduling round per chunk: the turn and the writer
    would take turns for every token, and every token would become its own
    write to the client.  Queueing lets a burst of chunks that arrived
    together leave together; a full buffer still pushes back.
    """
    try:
        channel.send_nowait(value)
    except trio.WouldBlock:
        await channel.send(value)
