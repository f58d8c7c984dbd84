"""The byte relay: a relayed request's answer, streamed to the client as the backend sends it.

`PassthroughBody` sends a `Relay` (turn/relay.py) to the backend and
relays the answer: its status and headers, then its bytes as they come.
The body is watched as it passes (`UsageMeter`) for the usage it reports,
which settles the request's reservation and fills in its outcome.  A
backend that sends no data for its read timeout (`STREAM_TIMEOUT`; in an
event stream comments and keep-alives are not data) ends the body: an
event stream with an `error` event (`backend_timeout`) and `[DONE]` after
the last whole event.  A drain that runs out of time stops it the same way
(`server_shutting_down`); before the backend answered, the client gets a
503.  Decides nothing about the protocol.

A backend that is ahead (an event stream whose read took at least
`GATHER_AFTER` bytes: several events were waiting) is read again only
`GATHER` later (counted as the backend's wait, as a read's), so that what
it sends meanwhile goes out in the same write: on a bursting backend the
relay makes fewer reads and writes per answer, and its client fewer reads
(the load lab's relay row).  A stream read as it is written (a model's
tokens, one event per read) is never held; the first event never waits;
a body that is not an event stream is read as fast as it comes.

The reads keep no timer: a cancel scope per read cost more than the rest
of a relayed read's work.  The process's ticker (`Heartbeats`) looks at
the data deadline instead, at most a sixty-fourth of the heartbeat interval
after it passes, and a drain out of time stops the read the same way, by
aborting the backend's body (`Passthrough.abort`).
"""

from __future__ import annotations

import logging
from types import TracebackType
from typing import Any, cast

import trio

from ..backends import PassthroughBackend
from ..errors import BackendTimeout, GatewayError, ShuttingDown, error_json
from ..ops.drain import Drain
from ..streams.sse import encode_done
from ..streams.usage import UsageMeter
from ..turn import Resources
from ..turn.relay import Relay
from .body import DeferredHeadBody
from .heartbeats import Heartbeats, OpenStream, Ticket
from .render import answer

__all__ = ["GATHER", "GATHER_AFTER", "PassthroughBody", "passthrough"]

log = logging.getLogger("gateway")

# An event stream read in a piece this large is ahead of its client: the next read waits this long.
GATHER_AFTER = 2048  # bytes
GATHER = 0.0002  # seconds


class PassthroughBody(DeferredHeadBody):
    """Relays one request to the backend, streaming the answer (see the module docstring)."""

    def __init__(
        self, backend: PassthroughBackend, relay: Relay, *, heartbeats: Heartbeats, drain: Drain | None = None
    ) -> None:
        self._backend = backend
        self._relay = relay
        self._heartbeats = heartbeats
        self._drain = drain
        self._cm: Any = None
        self._upstream: Any = None
        self._error: bytes | None = None
        self._status = 502
        self._failed: str | None = None  # the error code the answer ended with
        self._chunks: Any = None
        self._meter: UsageMeter | None = None
        self._events = False  # the answer is an event stream
        self._opening: trio.CancelScope | None = None  # around the wait for the backend's answer
        self._stopped = False  # by a drain out of time
        self._timed_out = False  # by the data deadline
        self._ticket: Ticket | None = None  # the ticker's look at the data deadline
        self._ending = b""  # what an event stream needs before a last event (a blank line)
        self._data_timeout: float | None = None
        self._data_at = 0.0  # when data last came
        self._opened_at = 0.0  # for the operator's list of live streams (`open_stream`)
        self._longest_silence = 0.0  # the longest gap between data
        self._pieces = 0  # pieces of data relayed
        self._counted = False  # the backend's waits are in the outcome
        self._gather_until = 0.0  # the next read waits until then (the backend is ahead)

    async def __aenter__(self) -> PassthroughBody:
        if self._drain is not None:
            self._drain.track(self)
        relay = self._relay
        cm = self._backend.open_passthrough(relay.method, relay.path, relay.query, relay.headers, relay.body)
        try:
            with trio.CancelScope() as self._opening:
                if self._stopped:
                    self._opening.cancel()
                self._upstream = await cm.__aenter__()
        except GatewayError as error:
            self._fail_before_answer(error)
        except BaseException:
            self._stop_counting()
            raise
        else:
            if self._opening.cancelled_caught:
                self._upstream = None
                self._fail_before_answer(ShuttingDown.stopped())
                return self
            self._cm = cm
            self._chunks = self._upstream.__aiter__()
            self._events = "text/event-stream" in str(self._upstream.headers.get("content-type", ""))
            self._meter = UsageMeter(events=self._events)
            self._data_timeout = getattr(self._upstream, "data_timeout", None)
            self._data_at = self._opened_at = trio.current_time()
            if self._data_timeout:
                self._ticket = self._heartbeats.add(self, self._data_at + self._data_timeout)
            if relay.outcome is not None:
                relay.outcome.backend = getattr(self._upstream, "backend_label", None)
        finally:
            self._opening = None
        return self

    def _fail_before_answer(self, error: GatewayError) -> None:
        self._status, self._error, _ = answer(error, f"relaying /v1/{self._relay.path}")
        self._failed = error.code

    def cancel(self) -> None:
        """Stop (a drain out of time): the read in progress ends, and so does the body."""
        self._stopped = True
        self._interrupt()

    def beat(self, now: float, stall_timeout: float | None) -> float | None:
        """The ticker's look at the data deadline: when to look again; None once over (past it,
        the read in progress ends, and so does the body)."""
        if self._chunks is None or not self._data_timeout:
            return None
        due = self._data_at + self._data_timeout
        if now < due:
            return due
        self._timed_out = True
        self._interrupt()
        return None

    def open_stream(self, now: float) -> OpenStream | None:
        """The relay as the operator's list of live streams shows it (silence: since the backend's
        last data; keep-alive comments are not data); None once it is over."""
        if self._chunks is None:
            return None
        outcome = self._relay.outcome
        return OpenStream.seen(
            now,
            transport="relay",
            route=f"/v1/{self._relay.path}",
            model=outcome.model if outcome is not None else None,
            key=self._relay.caller.name,
            opened=self._opened_at,
            wrote=self._data_at,
            longest=self._longest_silence,
            events=self._pieces,
        )

    def _interrupt(self) -> None:
        # (Run by the ticker and the drain: never raises.)
        if self._opening is not None:  # still waiting for the answer
            self._opening.cancel()
        elif self._upstream is not None and self._chunks is not None:
            abort = getattr(self._upstream, "abort", None)
            if abort is not None:
                abort()

    async def head(self) -> tuple[int, dict[str, str]]:
        if self._upstream is None:
            return self._status, {"content-type": "application/json"}
        if self._upstream.status >= 500:  # the backend's own answer, passed on: the log says whose
            log.warning(
                "relayed /v1/%s: %s answered %d",
                self._relay.path,
                getattr(self._upstream, "backend", "the backend"),
                self._upstream.status,
            )
        return self._upstream.status, self._upstream.headers

    def __aiter__(self) -> PassthroughBody:
        return self

    @property
    def finished(self) -> bool:  # type: ignore[override]
        return self._upstream is not None and self._chunks is not None and getattr(self._upstream, "finished", False)

    async def __anext__(self) -> bytes:
        if self._error is not None:
            answer_bytes, self._error = self._error, None
            return answer_bytes
        if self._chunks is None:
            raise StopAsyncIteration
        if not (self._stopped or self._timed_out):
            if self._gather_until:
                outcome = self._relay.outcome
                began = trio.current_time()
                await trio.sleep_until(self._gather_until)
                self._gather_until = 0.0
                if outcome is not None:  # a wait for the backend's next bytes, as a read's is
                    outcome.waited += trio.current_time() - began
            try:
                data = await self._chunks.__anext__()
            except StopAsyncIteration:
                self._chunks = None  # (the ticker has nothing left to look at)
                raise
            except Exception as error:
                if not (self._stopped or self._timed_out):  # the backend dropped mid-body; nothing more can be said
                    log.warning("passthrough body from the backend was cut (%s)", type(error).__name__)
                    self._failed = "backend_stream_error"
                    raise StopAsyncIteration from None
            else:
                assert self._meter is not None
                if self._meter.feed(data):
                    now = trio.current_time()
                    if now - self._data_at > self._longest_silence:
                        self._longest_silence = now - self._data_at
                    self._data_at = now
                    self._pieces += 1
                    if self._relay.outcome is not None:
                        self._relay.outcome.note_events(now, True)
                if self._events:
                    self._ending = b"" if data.endswith((b"\n\n", b"\r\n\r\n")) else b"\n\n"
                    if len(data) >= GATHER_AFTER:
                        self._gather_until = trio.current_time() + GATHER
                return data
        ending: GatewayError
        if self._stopped:
            ending = ShuttingDown.stopped()
        else:
            log.warning(
                "the backend sent no data for %g s on a relayed /v1/%s; the body is ended",
                self._data_timeout,
                self._relay.path,
            )
            ending = BackendTimeout(f"the backend sent no data for {self._data_timeout:g} s")
        self._chunks = None
        self._failed = ending.code
        if not self._events:
            raise StopAsyncIteration
        return self._ending + b"data: " + error_json(ending) + b"\n\n" + encode_done()

    def _stop_counting(self) -> None:
        """The backend's waits (as its answer counted them) go to the outcome, once."""
        if self._counted:
            return
        self._counted = True
        outcome = self._relay.outcome
        if outcome is not None and self._upstream is not None:
            outcome.waited += getattr(self._upstream, "waited", 0.0)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop_counting()
        if self._ticket is not None:
            self._ticket.cancel()
        try:
            if self._drain is not None:
                self._drain.untrack(self)
            if self._cm is not None:
                await self._cm.__aexit__(exc_type, exc, tb)
        finally:
            client_left = exc_type is not None and issubclass(exc_type, trio.Cancelled)
            status = self._upstream.status if self._upstream is not None else self._status
            await self._relay.finish(  # (its settling is shielded)
                status=status,
                usage=self._meter.usage if self._meter is not None else None,
                failed=self._failed,
                client_left=client_left,
            )


def passthrough(resources: Resources, relay: Relay, heartbeats: Heartbeats) -> PassthroughBody:
    """The body that relays `relay` to the request's backend (every relaying route's one way to build it)."""
    return PassthroughBody(cast(PassthroughBackend, resources.backend), relay, heartbeats=heartbeats, drain=resources.drain)
