"""Graceful drain: what runs when the gateway is told to stop, and how it ends well.

When SIGTERM (or SIGINT) arrives the serve loop calls `Drain.run`: from
then on readiness answers 503 and the edge refuses new requests; streams,
WebSocket turns and background responses already running get `grace`
seconds to finish.  Whatever still runs then is stopped through the cancel
scope it registered (`stoppable`), and ends the way its transport ends
anything: a terminal event, stored (`server_shutting_down`), and for a
WebSocket a close frame.  Nothing is cut without an ending.

Knows cancel scopes and a clock, nothing of HTTP or the protocol.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Protocol

import trio

__all__ = ["Drain", "Stoppable"]


class Stoppable(Protocol):
    """What a drain out of time stops: a cancel scope, or anything with `cancel()`."""

    def cancel(self) -> None: ...

log = logging.getLogger("gateway")

_STOP_GRACE = 5.0  # after stopping, how long the stopped work may take to write its ending


class Drain:
    def __init__(self) -> None:
        self.draining = trio.Event()
        self._running: set[Stoppable] = set()
        self._watchers: set[Callable[[], None]] = set()
        self._changed = trio.Event()

    @contextlib.contextmanager
    def stoppable(self) -> Iterator[trio.CancelScope]:
        """Run the body in a cancel scope that a drain out of time cancels.

        Check `scope.cancelled_caught` afterwards to end the work well.
        """
        scope = trio.CancelScope()
        self._running.add(scope)
        try:
            with scope:
                yield scope
        finally:
            self._running.discard(scope)
            self._changed.set()

    def track(self, work: Stoppable) -> None:
        """Count `work` as running until `untrack`; a drain out of time calls its `cancel()`.

        For work that cannot sit inside one cancel scope (a body relayed read by read).
        """
        self._running.add(work)

    def untrack(self, work: Stoppable) -> None:
        self._running.discard(work)
        self._changed.set()

    @contextlib.contextmanager
    def on_drain(self, callback: Callable[[], None]) -> Iterator[None]:
        """Call `callback` (synchronously) when the drain begins, if it begins while inside."""
        if self.draining.is_set():
            callback()
        self._watchers.add(callback)
        try:
            yield
        finally:
            self._watchers.discard(callback)

    @property
    def running(self) -> int:
        return len(self._running)

    async def run(self, grace: float) -> None:
        """Drain: refuse new work, wait up to `grace` seconds, then stop what is left and let it end."""
        self.draining.set()
        for callback in list(self._watchers):
            callback()
        if self._running:
            log.info("draining: %d streams, turns and background responses may finish within %g s", len(self._running), grace)
        with trio.move_on_after(grace):
            await self._wait_empty()
        if self._running:
            log.info("stopping %d that did not finish; each ends with a terminal event", len(self._running))
            for work in list(self._running):
                work.cancel()
            with trio.move_on_after(_STOP_GRACE):
                await self._wait_empty()

    async def _wait_empty(self) -> None:
        while self._running:
            self._changed = trio.Event()
            await self._changed.wait()
