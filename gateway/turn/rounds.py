"""The backend rounds: the one loop that drives a turn's session through its backend and its tools.

    run_rounds     a session (Responses events, chat chunks, Anthropic's
                   events) driven through backend rounds and the gateway's
                   tool calls until it is done; each batch to `emit`
    begin_round    a round's request begun by the backend before the round
    failed_with    a session's terminal failure for an error
    report_outcome how a turn went, to telemetry and the log line

Nothing here knows HTTP, the front end, or how events become bytes.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

import trio

from ..backends import ChatBackend, ChatOpening, NativeRequest, ReadWatch, WaitClock
from ..errors import GatewayError
from ..observe import Telemetry
from ..observe.outcome import TurnOutcome, log_outcome
from ..streams.translator import RoundCall
from .tools import RequestTools, ToolOutcome, run_calls

if TYPE_CHECKING:
    from .engine import Resources

__all__ = ["Emit", "Session", "begin_round", "failed_with", "report_outcome", "run_rounds"]

log = logging.getLogger("gateway.turn")

Emit = Callable[[list[dict[str, Any]]], Awaitable[None]]


class Session(Protocol):
    """What `run_rounds` drives: a pure state machine over backend rounds (see streams.session)."""

    @property
    def request(self) -> dict[str, Any]:
        """The next backend round's chat request."""
        ...

    @property
    def calls(self) -> list[RoundCall]:
        """The gateway's calls of the round just ended, awaiting results."""
        ...

    @property
    def native(self) -> NativeRequest | None:
        """The round's request in a backend's own API, where the client sent one."""
        ...

    @property
    def done(self) -> bool: ...

    def feed_batch(self, batch: list[Any]) -> list[Any]: ...

    def end_of_stream(self) -> list[Any]: ...

    def fail(self, code: str, message: str, *, type: str = ..., param: str | None = ..., status: int = ...) -> list[Any]: ...

    def tool_result(
        self, call: RoundCall, *, output: str | None = ..., error: str | None = ..., detail: dict[str, Any] | None = ...
    ) -> list[Any]: ...

    def tools_done(self) -> list[Any]: ...


def begin_round(resources: Resources, session: Session) -> ChatOpening | None:
    """The session's next round's request, begun by the backend now (see `ChatBackend`), unless
    it cannot begin one or a trace context must go with it (its round's span, which opens
    with the round)."""
    begin_chat = getattr(resources.backend, "begin_chat", None)
    if begin_chat is None or resources.telemetry.trace_headers():
        return None
    opening: ChatOpening | None = begin_chat(session.request, native=session.native)
    return opening


def failed_with(session: Session, error: GatewayError) -> list[Any]:
    """The session's terminal failure for `error` (its code, message, type, param and status)."""
    return session.fail(error.code or "server_error", error.message, type=error.type, param=error.param, status=error.status)


async def run_rounds(
    session: Session,
    backend: ChatBackend,
    emit: Callable[[list[Any]], Awaitable[None]],
    tools: RequestTools,
    *,
    call_timeout: float,
    concurrency: int,
    on_answer: Callable[[GatewayError | None], None] | None = None,
    telemetry: Telemetry | None = None,
    admit_round: Callable[[dict[str, Any]], Awaitable[None]] | None = None,
    outcome: TurnOutcome | None = None,
    opening: ChatOpening | None = None,
    refit: Callable[[GatewayError], Awaitable[bool]] | None = None,
    watch: ReadWatch | None = None,
) -> GatewayError | None:
    """Drive `session` through backend rounds and the gateway's tool calls until it is done.

    Each batch of events goes to `emit` in order.  A backend failure ends
    the session (`error` + the failure) and is returned, for transports that
    answer with an HTTP error.  `on_answer` hears each round's backend
    answer (None) or failure before anything of it is emitted.
    `admit_round` is asked before every round after the first (a tool
    loop's next backend call) and may refuse it with a `GatewayError`,
    which ends the session the same way.  `outcome` hears which backend
    answered each round.  `opening`: the first round's request, begun by
    the backend already (`ChatBackend`).  `refit` hears a first round's
    refusal before anything of it is emitted; True: it changed the
    request (fitted it into the context window), which is sent once more.
    `watch`: the process's ticker, which keeps each round's read timeout
    where the backend's answer can hand it over (no timer per read).
    """
    telemetry = telemetry or _NO_TELEMETRY
    failure: GatewayError | None = None
    first = True
    while not session.done:
        if admit_round is not None and not first:
            try:
                await admit_round(session.request)
            except GatewayError as error:
                await emit(failed_with(session, error))
                return error
        first = False
        held: list[list[Any]] = []  # the round's last events, when it ends in the gateway's calls
        with telemetry.span("backend round", round=getattr(session, "rounds", 0)):
            failure = await _run_round(session, backend, emit, on_answer, telemetry, outcome, opening, refit, watch, held) or failure
            opening = refit = None
        if not session.calls:  # (no calls after all: nothing to wait for)
            await _release(held, emit)
        if session.calls:

            async def report(call: RoundCall, outcome: ToolOutcome) -> None:
                await emit(session.tool_result(call, output=outcome.output, error=outcome.error, detail=outcome.detail))

            async def begun() -> None:  # the calls' `in_progress` events, once they are
                await _release(held, emit)

            began = trio.current_time()
            try:
                await run_calls(
                    tools, session.calls, report, call_timeout=call_timeout, concurrency=concurrency, telemetry=telemetry,
                    begun=begun,
                )
            finally:
                if outcome is not None:  # (the calls are timed whole, whatever they wait on)
                    outcome.waited += trio.current_time() - began
            await emit(session.tools_done())
    return failure


_NO_TELEMETRY = Telemetry()


async def _run_round(
    session: Session,
    backend: ChatBackend,
    emit: Callable[[list[Any]], Awaitable[None]],
    on_answer: Callable[[GatewayError | None], None] | None,
    telemetry: Telemetry,
    outcome: TurnOutcome | None,
    opening: ChatOpening | None = None,
    refit: Callable[[GatewayError], Awaitable[bool]] | None = None,
    watch: ReadWatch | None = None,
    held: list[list[Any]] | None = None,
) -> GatewayError | None:
    while True:
        try:
            return await _one_round(session, backend, emit, on_answer, telemetry, outcome, opening, watch, held)
        except _Refused as refused:
            if refit is None or not await refit(refused.error):
                error = refused.error
                break
            refit = opening = None  # (the fitted request, sent once more: no second fitting)
    if on_answer is not None:
        on_answer(error)
    await emit(failed_with(session, error))
    return error


class _Refused(Exception):
    """A round's backend failed before it answered (`refit` may change the request)."""

    def __init__(self, error: GatewayError) -> None:
        self.error = error


async def _one_round(
    session: Session,
    backend: ChatBackend,
    emit: Callable[[list[Any]], Awaitable[None]],
    on_answer: Callable[[GatewayError | None], None] | None,
    telemetry: Telemetry,
    outcome: TurnOutcome | None,
    opening: ChatOpening | None,
    watch: ReadWatch | None = None,
    held: list[list[Any]] | None = None,
) -> GatewayError | None:
    """One backend round.  Its last events go to `held` rather than `emit` when the round ends
    in the gateway's calls: they say the calls are in progress, and leave once the calls have
    begun (`run_calls`' `begun`), so that a client that leaves on seeing them leaves calls that
    are running, and cancels them."""
    headers = telemetry.trace_headers()
    if opening is None:
        opened = backend.open_chat_stream(session.request, headers=headers, native=session.native)
    else:  # (only a backend that began it takes `opening`)
        opened = backend.open_chat_stream(session.request, headers=headers, native=session.native, opening=opening)  # type: ignore[call-arg]
    answered = False
    stream: Any = None
    ticket: Any = None  # the read timeout's place on `watch`, when the answer handed it over
    try:
        async with opened as stream:
            answered = True
            if watch is not None:
                watched_by = getattr(stream, "watched_by", None)
                ticket = watched_by(watch) if watched_by is not None else None
            if outcome is not None:
                outcome.backend = getattr(stream, "backend", None)
            if on_answer is not None:
                on_answer(None)
            clock = trio.lowlevel.current_clock().current_time  # (trio's, without two calls around it per look)
            eager_until = clock() + _EAGER_TIME
            window_end = clock() + _BATCH_WINDOW
            waits = stream if hasattr(stream, "waited") else _NO_WAITS  # (an embedder's stream may not say)
            waited = waits.waited
            async for batch in stream:
                # At a stream's start, a read that brought many chunks is worked
                # through in growing slices, so that its first ones leave before
                # the rest is done; later reads go whole (fewer, larger writes).
                now = clock()
                eager = now < eager_until
                fresh = waits.waited != waited
                if fresh:
                    # The read waited for the backend: the writer has had its turn
                    # meanwhile, so the window starts again (a model's paced tokens
                    # cost no extra trip through the scheduler each, nor a look at
                    # the clock: the next read that does not wait looks).
                    waited = waits.waited
                    window_end = now + _BATCH_WINDOW
                sliced = eager and len(batch) > _FIRST_SLICE
                for part in _slices(batch) if sliced else (batch,):
                    events = session.feed_batch(part)
                    if held is not None and session.calls:  # the round ended in the gateway's calls
                        held.append(events)
                    else:
                        await emit(events)
                    if session.done and not stream.saw_done:
                        return None  # failed on a chunk: nothing more to read
                    # Batching buys throughput but must not hold tokens back: at
                    # the start the turn yields after every part, so that the
                    # writer's few steps (the head, the first write) each wait
                    # for one part rather than a whole window; later, at least
                    # every window.
                    if eager or (not fresh and clock() >= window_end):
                        await trio.lowlevel.checkpoint()
                        window_end = clock() + _BATCH_WINDOW
            last = session.end_of_stream()
            if held is not None and session.calls:
                held.append(last)
            else:
                await emit(last)
    except GatewayError as error:
        telemetry.backend_error(error.code or "backend_error", route=_model(session.request))
        if not answered:
            raise _Refused(error) from None
        if on_answer is not None:
            on_answer(error)
        if held is not None:  # (no calls will run: what was held goes first)
            await _release(held, emit)
        await emit(failed_with(session, error))
        return error
    finally:
        if ticket is not None:
            ticket.cancel()
        if outcome is not None and stream is not None:  # what the backend kept the turn waiting
            outcome.waited += getattr(stream, "waited", 0.0)
    return None


_NO_WAITS = WaitClock()


async def _release(held: list[list[Any]], emit: Callable[[list[Any]], Awaitable[None]]) -> None:
    """Emit the batches a round held back (`_one_round`), in order, and forget them."""
    while held:
        await emit(held.pop(0))


def _model(request: dict[str, Any]) -> str | None:
    """The model route a backend request asked for, for the backend-error record."""
    model = request.get("model")
    return model if isinstance(model, str) else None

# While the backend's bytes are already buffered the round does not yield on
# its own; it is made to, so that no token waits longer than this to be sent.
_BATCH_WINDOW = 0.0005
_EAGER_TIME = 0.002  # a round's first 2 ms: yield after every part
_FIRST_SLICE = 4


def _slices(batch: list[Any]) -> Iterator[list[Any]]:
    """`batch` in slices of 4, 8, 16, ... chunks."""
    start, size = 0, _FIRST_SLICE
    while start < len(batch):
        yield batch[start : start + size]
        start += size
        size *= 2


def report_outcome(resources: Resources, outcome: TurnOutcome) -> None:
    """A response (or chat completion, or relayed generation) ended: count it and log its line."""
    resources.telemetry.turn_finished(outcome)
    log_outcome(outcome, trio.current_time())
