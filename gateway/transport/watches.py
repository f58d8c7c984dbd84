"""The disconnect watch of every streamed response, started once the response has run a while.

A streamed response ends at once when its client leaves (`asgi.stream`): a
task waits for `http.disconnect` beside the send loop and cancels both.
Spawned for every response, that task and its cancellation cost about
0.1 ms of CPU per request on this stack, a quarter of what a short relayed
answer costs in all, for responses that are mostly over within a few dozen
milliseconds.  So the process runs one task (`LateWatches.run`, owned by
the app's nursery, beside the heartbeat ticker) that starts a response's
watch only once the response has run `WATCH_AFTER`: a response still
running then is watched from then on, one over by then never had a watch.
The starts are batched, one wake-up per half `WATCH_AFTER` at most.

So a client that leaves a response in its first moments is noticed at most
1.5 × `WATCH_AFTER` after it started (the backend's work on it stops then);
later, at once.  A write that finds the client gone waits for the watch
(the HTTP layer's `send`), which then ends the response the same way.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Awaitable, Callable

import trio

__all__ = ["WATCH_AFTER", "LateWatches", "Pending", "Watch", "start_watch"]

# Seconds a streamed response runs before its disconnect watch starts.
WATCH_AFTER = 0.25

# Waits until the client has left, then cancels the scope it is given.
Watch = Callable[[trio.CancelScope], Awaitable[None]]


def start_watch(nursery: trio.Nursery, watch: Watch, watches: LateWatches | None) -> Pending | None:
    """Run `watch(nursery.cancel_scope)` in `nursery`: now without `watches`, else once the
    response has run a while (then cancel the `Pending` it returns when the response is over)."""
    if watches is None:
        nursery.start_soon(watch, nursery.cancel_scope)
        return None
    return watches.watch(nursery, watch)


class Pending:
    """A watch waiting for its time; `cancel` (the response is over) forgets it."""

    __slots__ = ("due", "start")

    def __init__(self, due: float, nursery: trio.Nursery, watch: Watch) -> None:
        self.due = due
        self.start: Callable[[], None] | None = functools.partial(nursery.start_soon, watch, nursery.cancel_scope)

    def cancel(self) -> None:
        self.start = None


class LateWatches:
    """Starts each response's disconnect watch `after` seconds in, unless it is over (see the module docstring)."""

    def __init__(self, after: float = WATCH_AFTER) -> None:
        self.after = after
        self._pending: collections.deque[Pending] = collections.deque()  # in the order they are due
        self._idle: trio.Event | None = None  # set when a watch arrives while the task waits for one

    def watch(self, nursery: trio.Nursery, watch: Watch) -> Pending:
        """Run `watch(nursery.cancel_scope)` in `nursery` `after` seconds from now, unless cancelled first."""
        pending = Pending(trio.current_time() + self.after, nursery, watch)
        self._pending.append(pending)
        if self._idle is not None:
            self._idle.set()
            self._idle = None
        return pending

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start the watches that are due, until cancelled."""
        pending, step = self._pending, self.after / 2
        task_status.started()
        while True:
            if not pending:
                self._idle = trio.Event()
                await self._idle.wait()
                continue
            await trio.sleep_until(pending[0].due + step)  # (those due meanwhile start with it)
            now = trio.current_time()
            while pending and pending[0].due <= now:
                start = pending.popleft().start
                if start is None:
                    continue  # the response is over
                try:
                    start()
                except RuntimeError:  # its nursery closed meanwhile: nothing left to watch
                    pass
