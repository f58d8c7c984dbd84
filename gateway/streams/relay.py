"""The async shells around the translator: streaming relay and collector.

`ResponseEventStream` is a Quart response body that owns the per-request
nursery (opened in `__aenter__`, closed in `__aexit__`, both in the task that
runs Quart's send loop; never inside an async generator).  Its siblings are
linked by memory channels:

    upstream reader --chunks--> translator --bytes--> send loop (Quart)
                                heartbeat  --bytes--/

Each sibling catches its own failures and turns them into data, so that any
failure ends the stream with `error` + `response.failed`; only a client that
leaves (cancellation from Quart's connection nursery) ends it without a
terminal event.  The shells move data and make no protocol decisions.

`collect_response` runs the same translator without streaming.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from types import TracebackType
from typing import Any

import trio
from quart.wrappers.response import ResponseBody

from ..backend import ChatBackend
from ..errors import BackendStatusError, BackendStreamError, GatewayError, InternalError, StoreUnavailable, error_json
from .chunks import DONE
from .sse import encode_comment, encode_done, encode_event
from .toolloop import ToolLoop, ToolOutcome, next_round_body
from .translator import ResponseTranslator, RoundCall

__all__ = [
    "SSE_HEADERS",
    "DeferredHeadBody",
    "EventChannelBody",
    "ResponseEventStream",
    "StreamOutcome",
    "collect_response",
    "fail_with",
    "store_before_terminal",
]

log = logging.getLogger("gateway.relay")

SSE_HEADERS = {
    "content-type": "text/event-stream; charset=utf-8",
    "cache-control": "no-cache",
    "x-accel-buffering": "no",
}
_JSON_HEADERS = {"content-type": "application/json"}


class _EndOfStream:
    """The backend closed the stream without `[DONE]`."""


_EOF = _EndOfStream()


class StreamOutcome:
    """What the request log line needs to know about one relayed stream."""

    __slots__ = ("status", "http_status", "first_byte_at", "client_left")

    def __init__(self) -> None:
        self.status = "in_progress"
        self.http_status = 200
        self.first_byte_at: float | None = None
        self.client_left = False


class DeferredHeadBody(ResponseBody):
    """A response body that decides its status and headers after starting.

    The HTTP layer enters the body, awaits `head()` and only then sends the
    status line: the body may first wait (bounded) for its upstream's answer.
    """

    async def head(self) -> tuple[int, dict[str, str]]:
        raise NotImplementedError

    def __aiter__(self) -> AsyncIterator[bytes]:
        raise NotImplementedError


class EventChannelBody(DeferredHeadBody):
    """A streamed body fed by a memory channel of encoded bytes, with a heartbeat.

    Writes coalesce what is already queued; the heartbeat sends an SSE
    comment after `interval` seconds without a write.  Subclasses own the
    nursery and the producers.
    """

    def __init__(self, heartbeat_interval: float) -> None:
        self._interval = heartbeat_interval
        self._out_recv: trio.MemoryReceiveChannel[bytes] | None = None
        self._last_write = 0.0
        self._heartbeat_scope = trio.CancelScope()

    def __aiter__(self) -> EventChannelBody:
        return self

    async def __anext__(self) -> bytes:
        return await self._next_write()

    async def _next_write(self) -> bytes:
        """Everything queued, as one write; StopAsyncIteration when the producers are done."""
        assert self._out_recv is not None
        try:
            first = await self._out_recv.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None
        parts = [first]
        receive_nowait = self._out_recv.receive_nowait
        while True:
            try:
                parts.append(receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel):
                break
        self._last_write = trio.current_time()
        return first if len(parts) == 1 else b"".join(parts)

    async def _run_heartbeat(self, out_send: trio.MemorySendChannel[bytes]) -> None:
        comment = encode_comment()
        async with out_send:
            with self._heartbeat_scope:
                while True:
                    deadline = self._last_write + self._interval
                    if trio.current_time() >= deadline:
                        await out_send.send(comment)
                        self._last_write = trio.current_time()
                        continue
                    await trio.sleep_until(deadline)


class ResponseEventStream(EventChannelBody):
    """A streamed `/v1/responses` body; see the module docstring."""

    def __init__(
        self,
        *,
        backend: ChatBackend,
        body: dict[str, Any],
        translator: ResponseTranslator,
        heartbeat_interval: float,
        on_close: Callable[[StreamOutcome], None] | None = None,
        on_terminal: Callable[[list[dict[str, Any]]], Awaitable[None]] | None = None,
        loop: ToolLoop | None = None,
        setup: Callable[[contextlib.AsyncExitStack], Awaitable[tuple[list[dict[str, Any]], ToolLoop | None]]]
        | None = None,
    ) -> None:
        """`on_terminal` receives every event of the stream and is awaited
        before the terminal event is sent (to store the response first).
        `loop` runs gateway tools between backend calls (several rounds).
        `setup` runs first, with resources (hosted MCP sessions) entered into
        an exit stack this body owns; it returns the opening events and,
        possibly, the tool loop."""
        super().__init__(heartbeat_interval)
        self._loop = loop
        self._setup = setup
        self._stack = contextlib.AsyncExitStack()
        self._prelude: list[dict[str, Any]] = []
        self._backend = backend
        self._on_terminal = on_terminal
        self._log: list[dict[str, Any]] | None = [] if on_terminal is not None else None
        self._body = body
        self._translator = translator
        self._on_close = on_close
        self.outcome = StreamOutcome()
        self._nursery_cm: Any = None
        # One scope per sibling: cancelling the nursery's own scope would also
        # cancel Quart's send loop, which runs inside it.
        self._upstream_scope = trio.CancelScope()
        self._translator_scope = trio.CancelScope()
        self._upstream_answered = trio.Event()
        self._upstream_error: GatewayError | None = None
        self._json_error: bytes | None = None

    # --- ResponseBody protocol ------------------------------------------------

    async def __aenter__(self) -> ResponseEventStream:
        self._last_write = trio.current_time()
        await self._stack.__aenter__()
        if self._setup is not None:
            try:
                self._prelude, loop = await self._setup(self._stack)
                self._loop = loop or self._loop
            except Exception as exc:
                # Returning normally matters: __aexit__ then closes what the
                # setup opened (sessions own nurseries of their own).
                error = exc if isinstance(exc, GatewayError) else InternalError("The gateway failed to prepare the response.")
                if not isinstance(exc, GatewayError):
                    log.debug("response setup failed", exc_info=True)
                self._json_error = error_json(error)
                self.outcome.http_status = error.status
                self.outcome.status = "rejected"
        self._nursery_cm = trio.open_nursery()
        nursery = await self._nursery_cm.__aenter__()
        if self._json_error is not None:
            return self
        chunk_send, chunk_recv = trio.open_memory_channel[Any](64)
        out_send, out_recv = trio.open_memory_channel[bytes](256)
        # The translator asks the reader for each round: the first body, then
        # (with a tool loop) one more per round of gateway tool calls.
        round_send, round_recv = trio.open_memory_channel[dict[str, Any]](1)
        round_send.send_nowait(self._body)
        rounds: trio.MemorySendChannel[dict[str, Any]] | None = round_send
        if self._loop is None:
            round_send.close()
            rounds = None
        self._out_recv = out_recv
        nursery.start_soon(self._run_upstream, chunk_send, round_recv)
        nursery.start_soon(self._run_heartbeat, out_send.clone())
        nursery.start_soon(self._run_translator, chunk_recv, out_send, rounds)
        return self

    async def head(self) -> tuple[int, dict[str, str]]:
        """Status and headers, decided before the first byte is sent.

        Waits for the backend's answer for half a heartbeat interval (at most
        a second): an error status it gives by then (unknown model, context
        too long) is passed on as that status; after that the stream is
        committed, so the client never waits longer than a heartbeat for its
        first bytes, and a later failure arrives as `error` + `response.failed`.
        """
        if self._json_error is not None:  # the setup refused the request
            return self.outcome.http_status, dict(_JSON_HEADERS)
        with trio.move_on_after(min(self._interval / 2, _MAX_HEAD_WAIT)):
            await self._upstream_answered.wait()
        error = self._upstream_error
        if isinstance(error, BackendStatusError) and 400 <= error.status < 500:
            self._json_error = error_json(error)
            self.outcome.http_status = error.status
            self.outcome.status = "rejected"
            return error.status, dict(_JSON_HEADERS)
        return 200, dict(SSE_HEADERS)

    async def __anext__(self) -> bytes:
        if self._json_error is not None:
            data, self._json_error = self._json_error, b""
            if not data:
                raise StopAsyncIteration
            return data
        data = await self._next_write()
        if self.outcome.first_byte_at is None:
            self.outcome.first_byte_at = self._last_write
        return data

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is not None and issubclass(exc_type, trio.Cancelled):
            self.outcome.client_left = True
        # Everything useful has been sent (or the client left): stop the siblings.
        self._stop_siblings()
        try:
            await self._nursery_cm.__aexit__(exc_type, exc, tb)
        finally:
            if self._out_recv is not None:
                self._out_recv.close()
            try:
                # At the level it was entered (no new cancel scope around it):
                # the sessions in it own nurseries entered before ours.
                await self._stack.aclose()
            finally:
                if self._on_close is not None:
                    self._on_close(self.outcome)

    def _stop_siblings(self) -> None:
        self._upstream_scope.cancel()
        self._heartbeat_scope.cancel()
        self._translator_scope.cancel()

    # --- siblings ----------------------------------------------------------------

    async def _run_upstream(
        self, chunk_send: trio.MemorySendChannel[Any], round_recv: trio.MemoryReceiveChannel[dict[str, Any]]
    ) -> None:
        async with chunk_send, round_recv:
            with self._upstream_scope:
                async for body in round_recv:
                    await self._read_round(body, chunk_send)

    async def _read_round(self, body: dict[str, Any], chunk_send: trio.MemorySendChannel[Any]) -> None:
        try:
            async with self._backend.open_chat_stream(body) as upstream:
                self._upstream_answered.set()
                eager = _EAGER_BATCHES
                window_end = trio.current_time() + _BATCH_WINDOW
                async for batch in upstream:
                    await _send_soon(chunk_send, batch)
                    # Batching buys throughput but must not hold tokens
                    # back: the first batches leave at once, later ones at
                    # least every _BATCH_WINDOW.
                    if eager or trio.current_time() >= window_end:
                        eager = max(0, eager - 1)
                        await trio.lowlevel.checkpoint()
                        window_end = trio.current_time() + _BATCH_WINDOW
                if not upstream.saw_done:
                    await chunk_send.send(_EOF)
        except GatewayError as error:
            self._upstream_error = error
            self._upstream_answered.set()
            await chunk_send.send(error)
        except Exception:
            log.debug("upstream reader failed", exc_info=True)
            self._upstream_answered.set()
            await chunk_send.send(InternalError("the gateway failed while reading the backend"))

    async def _run_translator(
        self,
        chunk_recv: trio.MemoryReceiveChannel[Any],
        out_send: trio.MemorySendChannel[bytes],
        round_send: trio.MemorySendChannel[dict[str, Any]] | None,
    ) -> None:
        async with out_send, chunk_recv, contextlib.AsyncExitStack() as stack:
            if round_send is not None:
                await stack.enter_async_context(round_send)
            with self._translator_scope:
                await self._translate(self._translator, chunk_recv, out_send, round_send)

    async def _translate(
        self,
        translator: ResponseTranslator,
        chunk_recv: trio.MemoryReceiveChannel[Any],
        out_send: trio.MemorySendChannel[bytes],
        round_send: trio.MemorySendChannel[dict[str, Any]] | None,
    ) -> None:
        """Feed the reader's messages to the translator, one write per drained batch.

        Without a tool loop the backend's end finishes the response; with one,
        it ends a round, and `_after_round` decides whether another follows.
        """
        loop = self._loop if round_send is not None else None
        end = _RoundEnd() if loop is not None else None
        body = self._body
        text: list[str] = []  # the round's text, for the next round's assistant message
        try:
            await self._emit(out_send, self._prelude + translator.start(), translator)
            async for message in chunk_recv:
                events = _translate_message(translator, message, end)
                # Whatever else the reader has queued becomes part of the same write.
                while not translator.done and not (end is not None and end.ended):
                    try:
                        events += _translate_message(translator, chunk_recv.receive_nowait(), end)
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                if end is not None and end.ended and loop is not None and round_send is not None:
                    end.ended = False
                    closing, calls = translator.end_round()
                    events += closing
                    text += [e["text"] for e in events if e["type"] == "response.output_text.done"]
                    await self._emit(out_send, events, translator)
                    step = await _after_round(loop, translator, body, "".join(text), calls, self._emit_to(out_send))
                    text = []
                    if step is None:
                        break
                    body = step
                    await round_send.send(body)
                    continue
                if loop is not None:
                    text += [e["text"] for e in events if e["type"] == "response.output_text.done"]
                await self._emit(out_send, events, translator)
                if translator.done:
                    break
            if not translator.done:  # the reader stopped without a word
                await self._emit(out_send, fail_with(translator, _cut()), translator)
        except Exception:
            log.debug("translator failed", exc_info=True)
            events = fail_with(translator, InternalError("the gateway failed while translating the response"))
            await self._emit(out_send, events, translator)
        finally:
            self.outcome.status = translator.response.get("status", "failed")
            self._upstream_scope.cancel()
            self._heartbeat_scope.cancel()
        await out_send.send(encode_done())

    def _emit_to(self, out_send: trio.MemorySendChannel[bytes]) -> Callable[[list[dict[str, Any]]], Awaitable[None]]:
        async def emit(events: list[dict[str, Any]]) -> None:
            await self._emit(out_send, events, self._translator)

        return emit

    async def _emit(
        self, out_send: trio.MemorySendChannel[bytes], events: list[dict[str, Any]], translator: ResponseTranslator
    ) -> None:
        if not events:
            return
        if self._log is None or not translator.done:
            if self._log is not None:
                self._log += events
            await _send_soon(out_send, _encode(events))
            return
        # The terminal event is last: everything before it goes out, then the
        # response is stored, then the terminal event tells the client it may
        # continue from this response.
        recorded = self._log
        recorded += events
        if len(events) > 1:
            await _send_soon(out_send, _encode(events[:-1]))
        on_terminal = self._on_terminal
        assert on_terminal is not None
        tail = await store_before_terminal(translator, events[-1:], lambda: on_terminal(recorded))
        recorded[-1:] = tail
        await _send_soon(out_send, _encode(tail))


async def store_before_terminal(
    translator: ResponseTranslator, terminal: list[dict[str, Any]], store: Callable[[], Awaitable[None]]
) -> list[dict[str, Any]]:
    """What ends the response once `store` has run: the held-back `terminal`
    event, or, when storing failed, `error` (`store_unavailable`) and
    `response.failed` in its place, so that no client is told it may
    continue from a response that was not kept."""
    try:
        await store()
    except Exception as exc:
        log.warning("response %s could not be stored (%s)", translator.response.get("id"), type(exc).__name__)
        if not isinstance(exc, StoreUnavailable):
            log.debug("store failure", exc_info=True)
        return translator.retract_terminal(StoreUnavailable.code or "store_unavailable", _NOT_STORED) or terminal
    return terminal


_NOT_STORED = (
    "The response was generated but could not be stored, so it cannot be retrieved or continued; "
    "retry the request."
)


async def _send_soon(channel: trio.MemorySendChannel[Any], value: Any) -> None:
    """Queue without yielding when there is room.

    A plain `send` is a scheduling round per chunk: the reader, translator
    and writer would take turns for every token, and every token would
    become its own write to the client.  Queueing lets a burst of chunks
    that arrived together leave together; a full buffer still pushes back.
    """
    try:
        channel.send_nowait(value)
    except trio.WouldBlock:
        await channel.send(value)


_MAX_HEAD_WAIT = 1.0
# While the backend's bytes are already buffered the reader does not yield on
# its own; it is made to, so that no token waits longer than this to be sent.
_BATCH_WINDOW = 0.0005
_EAGER_BATCHES = 2


def _cut() -> BackendStreamError:
    return BackendStreamError(
        "the backend closed the stream before finishing the response", code="backend_stream_ended"
    )


class _RoundEnd:
    """Ends a round instead of the response: the tool loop decides what follows."""

    def __init__(self) -> None:
        self.ended = False

    def __call__(self) -> list[dict[str, Any]]:
        self.ended = True
        return []


def _translate_message(
    translator: ResponseTranslator, message: Any, end: Callable[[], list[dict[str, Any]]] | None = None
) -> list[dict[str, Any]]:
    """Events for one message from the upstream reader: a batch of chunks, an error, or EOF.

    The backend's stream ending calls `end` (default: finish the response).
    """
    finish = end if end is not None else translator.finish
    if isinstance(message, GatewayError):
        return fail_with(translator, message)
    if message is _EOF:  # the backend hung up without [DONE]
        return finish() if translator.finish_reason else fail_with(translator, _cut())
    events: list[dict[str, Any]] = []
    for chunk in message:
        if chunk is DONE:
            events += finish()
            break
        if isinstance(chunk, GatewayError):
            events += fail_with(translator, chunk)
            break
        events += translator.feed(chunk)
    return events


def _encode(events: list[dict[str, Any]]) -> bytes:
    return b"".join([encode_event(event) for event in events])


def fail_with(translator: ResponseTranslator, error: GatewayError) -> list[dict[str, Any]]:
    """The closing events for `error`: `error` then `response.failed`."""
    return translator.fail(error.code or "server_error", error.message, type=error.type, param=error.param)


async def _after_round(
    loop: ToolLoop,
    translator: ResponseTranslator,
    body: dict[str, Any],
    text: str,
    calls: list[RoundCall],
    emit: Callable[[list[dict[str, Any]]], Awaitable[None]],
) -> dict[str, Any] | None:
    """Run the round's gateway calls; the next round's body, or None when the response ended."""
    gateway_calls = [c for c in calls if c.server is not None and not c.approval]
    results: dict[str, ToolOutcome] = {}
    if gateway_calls:

        async def on_result(call: RoundCall, outcome: ToolOutcome) -> None:
            await emit(translator.complete_mcp_call(call.item_id, output=outcome.output, error=outcome.error))

        results = await loop.run_calls(gateway_calls, on_result)
    loop.rounds += 1
    if not gateway_calls or len(gateway_calls) < len(calls):
        # Nothing for the gateway to answer, or the client has calls to run
        # (its own functions, or approvals to give).
        await emit(translator.finish())
        return None
    if loop.rounds >= loop.max_rounds:
        await emit(translator.finish(incomplete_reason="max_tool_calls"))
        return None
    return next_round_body(body, text, gateway_calls, results)


async def collect_response(
    backend: ChatBackend,
    body: dict[str, Any],
    translator: ResponseTranslator,
    *,
    on_events: Callable[[list[dict[str, Any]]], None] | None = None,
    loop: ToolLoop | None = None,
) -> dict[str, Any]:
    """Run a whole chat stream through the translator; the final response.

    `on_events` receives every batch of events as it is produced.

    Raises:
        GatewayError: the backend refused (its 4xx), failed, timed out, or
            reported an error inside the stream.
    """
    keep = on_events if on_events is not None else (lambda events: None)
    keep(translator.start())
    end = _RoundEnd() if loop is not None else None
    next_body: dict[str, Any] | None = body
    while next_body is not None:
        body = next_body
        next_body = None
        text: list[str] = []

        def record(events: list[dict[str, Any]]) -> None:
            text.extend(e["text"] for e in events if e["type"] == "response.output_text.done")
            keep(events)

        async with backend.open_chat_stream(body) as upstream:
            async for batch in upstream:
                record(_translate_message(translator, batch, end))
                if translator.done and not upstream.saw_done:
                    break
            else:
                if not upstream.saw_done:
                    record(_translate_message(translator, _EOF, end))
        if end is not None and end.ended and loop is not None:
            end.ended = False
            closing, calls = translator.end_round()
            record(closing)

            async def emit(events: list[dict[str, Any]]) -> None:
                keep(events)

            next_body = await _after_round(loop, translator, body, "".join(text), calls, emit)
    response = translator.response
    if response["status"] == "failed":
        error = response.get("error") or {}
        raise BackendStreamError(error.get("message") or "the backend reported an error", code=error.get("code"))
    return response
