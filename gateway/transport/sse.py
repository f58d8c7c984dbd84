"""Server-sent events: response bodies that run a turn and write its events as they come.

Every body is written by the HTTP layer's send loop (`write`), which the
body runs in `serve`.  A streamed body owns the request's nursery, opened and
closed in `serve` (never inside an async generator): the turn runs in a task
of it (its backend request begun before, on its way while the stream sets
up) and writes its own events whenever no send-loop task is at work; such a
task (and the disconnect watch the HTTP layer may ask for) runs beside it
only while there is waiting to do: the head for a slow backend, a
keep-alive the process's one heartbeat ticker (heartbeats.py) queued, a
write the client has not taken yet.

    the turn (backend rounds, tool calls) --bytes--> the socket, or the queue
    the process's heartbeat ticker        --keep-alives--> the queue --> a send-loop task

Each write coalesces what is queued.  The turn ends its stream with a
terminal event whatever fails; only a client that leaves (cancellation
from the connection) ends it without one.  These bodies turn event batches
into bytes and decide nothing about the protocol.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable
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
from ..streams.translator import TERMINAL_EVENTS
from ..turn import Turn
from ..turn.base import Delivery
from ..turn.chat import ChatTurn
from .body import DeferredHeadBody, SendPath, Write
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
]

log = logging.getLogger("gateway.sse")
_COMMENT = encode_comment()  # the keep-alive of a quiet stream
_DONE = encode_done()

SSE_HEADERS = {
    "content-type": "text/event-stream; charset=utf-8",
    "cache-control": "no-cache",
    "x-accel-buffering": "no",
}
# The producer's way out: bytes for the client (see EventChannelBody).
Send = Callable[[bytes], Awaitable[None]]
# Writes a client that reads slowly may have queued before its producer waits (backpressure).
_QUEUED = 256
# How long a stream's status may wait for the backend's first answer: an
# error status it gives by then (unknown model, context too long) is passed
# on as that status; later, the stream is committed.
_MAX_HEAD_WAIT = 1.0


class EventChannelBody(DeferredHeadBody):
    """A streamed body whose producer sends its own bytes whenever no send loop is at work,
    kept alive by the process's ticker.

    `produce` is the one producer, run by `serve` in a task of its nursery
    (a plain `Write`: in its caller's task), with `send` its way out.  Given a `SendPath` (the HTTP layer's send loop,
    `asgi.SendLoop`), the producer sends the head (once `head_now` can
    decide it) and its bytes itself: a token the backend sent wakes one
    task, the backend's reader (which is the turn), and is on the socket
    before that task next waits.  A task of the send loop runs only while
    there is waiting to do, and ends when there is none: the first one
    waits for the head (`head`: a backend slow to answer), and one is
    started for a keep-alive or for what the producer queues while a write
    is still on its way (`_drain`); the producer queues behind it, up to
    `_QUEUED` writes before it waits (backpressure), and a loop writes all
    that is queued in one write.  The two never send at once; the nursery
    of `serve` owns every such task.  A plain `Write` callable (a test's,
    an embedder's) is the send loop for every write instead.

    The `Heartbeats` ticker looks at the body once per interval (`beat`):
    after `interval` seconds without a write it queues a keep-alive, and a
    write the client has left unread for the ticker's `stall_timeout`
    closes the stream (`stalled`; the HTTP layer then drops the connection).
    """

    def __init__(self, heartbeats: Heartbeats, telemetry: Telemetry | None = None) -> None:
        self._heartbeats = heartbeats
        self._interval = heartbeats.interval
        self._telemetry = telemetry or Telemetry()
        self._queued: list[bytes] = []  # for a send loop, in order
        self._loop_waits = trio.lowlevel.ParkingLot()  # a send loop, waiting for bytes or for the producer's write
        self._room = trio.lowlevel.ParkingLot()  # the producer, waiting for a slow client
        self._path: SendPath | None = None  # the HTTP layer's, when the producer may take its steps
        self._committed: SendPath | None = None  # the same, once the head of a stream is out
        self._head_out = False  # the status line went (or is going) out
        self._sending = False  # the producer is sending
        self._loop_busy = False  # a send loop's task is at work: the producer queues behind it
        self._produced = False  # the producer is done: once the queue is empty, so is the body
        self._last_write = 0.0  # a write, or a keep-alive queued (the ticker's reckoning)
        self._handed_at: float | None = None  # a write is with the HTTP layer since then
        # For the operator's list of live streams (Heartbeats.open_streams):
        self._opened_at = 0.0
        self._wrote_at = 0.0  # the last write with events in it (a keep-alive alone ends no silence)
        self._longest_silence = 0.0  # the longest gap between two such writes
        self._pinged = False  # a keep-alive was queued since the last write
        self.events = 0  # events the producer sent
        self._nursery: trio.Nursery | None = None
        self._over = False
        self._beats_over = False
        self._ticket: Ticket | None = None
        self.client_left = False
        self.stalled = False
        self.first_write_at: float | None = None

    async def produce(self, send: Send) -> None:
        raise NotImplementedError

    def head_now(self) -> tuple[int, dict[str, str]] | None:
        """The status and headers of a stream that commits now, for the producer to send; None
        while they wait on something (the first send loop then sends them, from `head`)."""
        return None

    async def serve(self, write: Write, watch: Watch | None = None) -> None:
        self._last_write = self._opened_at = self._wrote_at = now = trio.current_time()
        path = self._path = write if isinstance(write, SendPath) else None
        forget = None
        try:
            async with trio.open_nursery() as nursery:  # owned here: the send loops and the watch beside the producer
                self._nursery = nursery
                if path is None:
                    nursery.start_soon(self._run_writer, write, watch, now + self._interval)
                    await self._run_producer()
                    return
                # (set up after the backend was asked: the turn began its request before serve)
                forget = watch(nursery) if watch is not None else None
                self._ticket = self._heartbeats.add(self, now + self._interval)
                nursery.start_soon(self._first_loop, path)
                nursery.start_soon(self._produce_then_end, path)
            if path is not None and nursery.cancel_scope.cancelled_caught and not path.ended:
                self.client_left = True  # (the watch saw the client leave, or the server ended the request)
        except trio.Cancelled:
            if path is not None and not path.ended:
                self.client_left = True
            raise
        finally:
            if forget is not None:
                forget()
            if self.stalled:
                self.client_left = True
            self._stop_beats()
            self._over = True
            if self._ticket is not None:
                self._ticket.cancel()  # the wheel lets go of this body (and its response) now
            self._queued = []
            self.closed()

    async def _run_writer(self, write: Write, watch: Watch | None, first_beat: float) -> None:
        """A plain `Write`: the send loop for every write, in a task of its own."""
        # The send loop's first step comes when the producer first waits (for its backend, or
        # a hosted MCP server): what only the waits need (the watch, the ticker's look) is set
        # up from here, after the backend was asked.
        assert self._nursery is not None
        forget = watch(self._nursery) if watch is not None else None
        self._ticket = self._heartbeats.add(self, first_beat)
        self._loop_busy = True
        try:
            await write(self)
        except trio.Cancelled:
            self.client_left = True  # (the watch saw the client leave, or the server ended the request)
            raise
        finally:
            if forget is not None:
                forget()
            # Everything useful has been sent (or the client left): the producer and the watch stop.
            self._nursery.cancel_scope.cancel()

    async def _produce_then_end(self, path: SendPath) -> None:
        """The producer, in a task of its own: resumed once per backend read, it is resumed
        through its own frames only, not the HTTP layer's and the app's beneath `serve`
        (a few microseconds per event on the paced load)."""
        await self._run_producer()
        if self._committed is not None and not self._loop_busy:  # (else a loop ends the response)
            await self._end(path)

    async def _first_loop(self, path: SendPath) -> None:
        """The head, unless the producer sends it first; then what was queued meanwhile."""
        status, headers = await self.head()
        if self._head_out:  # the producer sent it while the head waited: nothing else to do here
            return
        self._head_out = self._loop_busy = True
        await path.start(status, headers)
        if status == 200:
            self._committed = path
            await self._drain(path)
            return
        async for data in self:  # not a stream: the body's own answer (an error, as JSON), and the end
            await path.write(data)
        if not path.ended:
            await path.write(b"", last=True)
        assert self._nursery is not None
        self._nursery.cancel_scope.cancel()

    async def _drain(self, path: SendPath) -> None:
        """Write what is queued until nothing is; the response's end, once the producer is done.
        Run while `_loop_busy`, which it clears when it leaves the rest to the producer."""
        assert self._nursery is not None
        while True:
            if self._sending:  # the producer's write is on its way: wait for it
                await self._loop_waits.park()
            elif self._queued:
                data = self._take()
                self._handed_at = self._last_write
                await path.write(data)
                self._handed_at = None
            elif self._produced:
                await self._end(path)
                return
            else:
                self._loop_busy = False
                return

    async def _end(self, path: SendPath) -> None:
        """The response's end (with anything still queued), then nothing more of the body."""
        assert self._nursery is not None
        if not (self.stalled or path.ended):
            await self._send_now(path, b"", last=True)
        self._nursery.cancel_scope.cancel()  # (the producer is done, or its writes no longer go)

    def _wake_loop(self) -> None:
        """Something was queued: a send loop takes it (one is started when none is at work)."""
        self._loop_waits.unpark()
        if not self._loop_busy and self._committed is not None and self._nursery is not None and not self._over:
            self._loop_busy = True
            self._nursery.start_soon(self._drain, self._committed)

    async def _send(self, data: bytes) -> None:
        """The producer's way out (see the class)."""
        path = self._path
        if not self._loop_busy and path is not None:
            if self._committed is None and not self._head_out:
                head = self.head_now()
                if head is not None:
                    self._head_out = self._sending = True
                    try:
                        await path.start(*head)
                    finally:
                        self._sending = False
                    self._committed = path
            if self._committed is not None:
                await self._send_now(path, data)
                return
        self._queued.append(data)
        self._wake_loop()
        while len(self._queued) >= _QUEUED:
            await self._room.park()

    async def _send_last(self, data: bytes) -> None:
        """The producer's way out for what it sends last (a chat stream's `[DONE]`): queued for
        the response's end, which follows at once, so that they leave in one write; sent as
        `_send` sends while the head is not out."""
        if self._committed is None:
            await self._send(data)
            return
        self._queued.append(data)

    async def _send_now(self, path: SendPath, data: bytes, *, last: bool = False) -> None:
        """Send what is queued and `data` from this task (no send loop is at work)."""
        if self._queued:
            data = self._take() + data
        self._sending = True
        try:
            self._handed_at = self._wrote(events=bool(data))
            await path.write(data, last=last)
            self._handed_at = None
        finally:
            self._sending = False
            if self._queued:  # (a keep-alive came meanwhile: its loop waits for this write)
                self._loop_waits.unpark()

    def _take(self) -> bytes:
        """Everything queued, as one write (accounted as it goes out)."""
        parts, self._queued = self._queued, []
        if self._room:
            self._room.unpark_all()
        if self._pinged:  # (rare: a quiet stream)
            self._pinged = False
            if len(parts) == 1:  # the keep-alive alone: the client still waits for events
                self._wrote(events=False)
                return parts[0]
        self._wrote(events=True)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _wrote(self, *, events: bool) -> float:
        """A write goes out now; with events, it ends a silence."""
        now = self._last_write = trio.current_time()
        if self.first_write_at is None:
            self.first_write_at = now
        if events:
            if now - self._wrote_at > self._longest_silence:
                self._longest_silence = now - self._wrote_at
            self._wrote_at = now
        return now

    def __aiter__(self) -> EventChannelBody:
        return self

    async def __anext__(self) -> bytes:
        """For a plain `Write`: everything queued, as one write; the end once the producer is done."""
        self._handed_at = None  # the HTTP layer is back for more: the last write went out
        while not self._queued:
            if self._produced:
                raise StopAsyncIteration
            await self._loop_waits.park()
        data = self._take()
        self._handed_at = self._last_write
        return data

    def closed(self) -> None:
        """Called once the body is done (sent, or the client left)."""

    def _stop_beats(self) -> None:
        """No more keep-alives (the producer is done); the ticker still watches for a stall."""
        self._beats_over = True

    async def _run_producer(self) -> None:
        try:
            await self.produce(self._send)
        finally:
            self._stop_beats()
            self._produced = True
            self._loop_waits.unpark()  # a loop sees the end once the queue is empty

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
        if len(self._queued) < _QUEUED:  # (a full queue is on its way to the client already)
            self._queued.append(self.keep_alive())
            self._pinged = True
            self._wake_loop()
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

    def head_now(self) -> tuple[int, dict[str, str]] | None:
        """A stream commits at once without a dialect, else once its turn's backend answered."""
        if self.dialect is None or (self.turn.answered.is_set() and self.turn.rejection is None):
            return 200, dict(SSE_HEADERS)
        return None

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

    async def produce(self, send: Send) -> None:
        # `[DONE]` leaves with the terminal event, in its write: a client that acts on the
        # terminal event has the whole stream (the turn may still settle its slot after it).
        done = [False]

        def framed(events: list[dict[str, Any]], data: bytes) -> bytes:
            if events and events[-1]["type"] in TERMINAL_EVENTS:
                done[0] = True
                return data + _DONE
            return data

        async def emit(events: list[dict[str, Any]]) -> None:
            self.events += len(events)
            await send(framed(events, b"".join([encode_event(event) for event in events])))

        async def emit_obfuscated(events: list[dict[str, Any]]) -> None:
            self.events += len(events)
            # (padded as they are written: the turn keeps, stores and replays them unpadded)
            padded = [encode_event(obfuscated(e, os.urandom(32)) if e["type"] in OBFUSCATED else e) for e in events]
            await send(framed(events, b"".join(padded)))

        options = self.turn.req.stream_options
        await self.turn.run(emit_obfuscated if options is not None and options.include_obfuscation else emit)
        if not done[0]:  # (a turn always ends with its terminal event; this is the rule's backstop)
            await send(_DONE)

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

    async def produce(self, send: Send) -> None:
        async def emit(chunks: list[dict[str, Any]]) -> None:
            self.events += len(chunks)
            await send(b"".join([b"data: " + orjson.dumps(chunk) + b"\n\n" for chunk in chunks]))

        await self.turn.run(emit)
        await self._send_last(_DONE)  # (with the body's end, in one write)


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

    async def produce(self, send: Send) -> None:
        async def emit(events: list[dict[str, Any]]) -> None:
            self.events += len(events)
            await send(b"".join([encode_event(event) for event in events]))

        await self.turn.run(emit)

    def keep_alive(self) -> bytes:
        return _PING


_PING = encode_event({"type": "ping"})
