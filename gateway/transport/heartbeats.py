"""One ticker for every open stream of a process: keep-alives, and the bound on clients that stop reading.

A task and a timer per stream cost memory and scheduler work for each of
thousands of mostly silent streams.  Here one task owns a timer wheel:
each stream sits in the slot of the tick at which it is next due, and a
write does not touch the wheel at all (a stream whose slot comes up checks
when it last wrote and, if it has written since, moves to its new slot).
So a stream costs the wheel one look per heartbeat interval, and a
keep-alive is one `send_nowait` onto the stream's own channel.

The same look finds a client that stopped reading: a write handed to the
HTTP layer that has not returned for `stall_timeout` seconds means the
client's buffers are full and it does not read.  (Under `gateway.serve` the
server bounds each write's progress itself, and resets the connection, so
the ticker leaves that to it: a whole write's time would also cut a slow
reader that still reads.)  That stream is closed
(its `beat` ends it), so a stuck client holds at most its channel's bound of
queued events and never grows memory without limit.

The ticker is run by whoever owns the streams (the app's nursery); the
tick is a sixty-fourth of the interval, so a quiet stream hears from the
gateway within 1.016 intervals plus however late the loop is (a tick looks
only at the streams due then, so finer ticks cost nothing per stream; at
10,000 streams a sixteenth let the longest silence reach 2.51 s of a 2 s
interval, a sixty-fourth 2.43 s, and with the collector's pauses cut as
well 2.13 s: docs/load-lab.md).

Since every open stream is on the wheel, the wheel is also where the
operator's list of live streams comes from (`open_streams`): each stream
describes itself (`Described.open_stream`) from what it already keeps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import trio

__all__ = ["Beating", "Described", "Heartbeats", "OpenStream", "Ticket"]


@dataclass(frozen=True)
class OpenStream:
    """A live stream as the operator sees it (times in seconds)."""

    transport: str  # "sse" (Responses), "chat" (chat completions), "messages" (Anthropic), "relay" (a relayed body)
    route: str  # the request's path (`/v1/responses`, `/v1/chat/completions`, ...)
    model: str | None
    key: str | None  # the API key's name (None: no key)
    age: float  # since the stream opened
    silence: float  # since it last sent the client events (keep-alives are not events: the client still waits)
    longest_silence: float  # the longest such gap so far, the current one included
    events: int  # events sent (a relay: pieces of the body relayed)

    @classmethod
    def seen(
        cls,
        now: float,
        *,
        transport: str,
        route: str,
        model: str | None,
        key: str | None,
        opened: float,
        wrote: float,
        longest: float,
        events: int,
    ) -> OpenStream:
        """A stream opened at `opened` that last sent events at `wrote`, its longest gap between
        sends so far `longest`, as it stands at `now`: the current gap counts too."""
        silence = max(0.0, now - wrote)
        return cls(transport, route, model, key, max(0.0, now - opened), silence, max(longest, silence), events)


class Beating(Protocol):
    def beat(self, now: float, stall_timeout: float | None) -> float | None:
        """Send a keep-alive if due (or close a stalled stream); when to look again, None when over."""
        ...


class Described(Protocol):
    def open_stream(self, now: float) -> OpenStream | None:
        """The stream as `Heartbeats.open_streams` lists it; None once it is over."""
        ...


class Ticket:
    """A stream's place on the wheel; `cancel` lets go of the stream at once.

    The wheel drops a ticket only when its slot comes up, up to an interval
    later: holding the stream itself that long would keep every finished
    response (all its events) alive for an interval at any rate of requests.
    """

    __slots__ = ("stream",)

    def __init__(self, stream: Beating) -> None:
        self.stream: Beating | None = stream

    def cancel(self) -> None:
        self.stream = None


class Heartbeats:
    def __init__(self, interval: float, *, stall_timeout: float | None = 60.0) -> None:
        """`stall_timeout`: None when the server itself bounds writes that make no progress."""
        self.interval = interval
        self.stall_timeout = stall_timeout
        self._period = interval / 64
        self._wheel: dict[int, list[Ticket]] = {}
        self._tick: int | None = None  # the last tick looked at; None until running

    def add(self, stream: Beating, due: float) -> Ticket:
        """Look at `stream` at `due` (and then whenever it says), until the ticket is cancelled."""
        ticket = Ticket(stream)
        self._put(ticket, due)
        return ticket

    def open_streams(self, now: float | None = None) -> list[OpenStream]:
        """Every open stream on the wheel that describes itself, the oldest first (`now`: trio time)."""
        now = trio.current_time() if now is None else now
        found: list[OpenStream] = []
        for tickets in list(self._wheel.values()):
            for ticket in tickets:
                describe = getattr(ticket.stream, "open_stream", None)  # (None: a cancelled ticket)
                if describe is not None:
                    stream = describe(now)
                    if stream is not None:
                        found.append(stream)
        found.sort(key=lambda stream: -stream.age)
        return found

    def _put(self, ticket: Ticket, due: float) -> None:
        slot = math.ceil(due / self._period - 1e-9)
        if self._tick is not None and slot <= self._tick:
            slot = self._tick + 1
        self._wheel.setdefault(slot, []).append(ticket)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Tick until cancelled."""
        period = self._period
        self._tick = math.floor(trio.current_time() / period)
        task_status.started()
        while True:
            await trio.sleep_until((self._tick + 1) * period)
            now = trio.current_time()
            last = math.floor(now / period + 1e-9)
            while self._tick < last:  # every tick due, when the loop ran late
                self._tick += 1
                for ticket in self._wheel.pop(self._tick, ()):
                    stream = ticket.stream
                    if stream is None:
                        continue
                    due = stream.beat(now, self.stall_timeout)
                    if due is None:
                        ticket.cancel()
                    else:
                        self._put(ticket, due)
