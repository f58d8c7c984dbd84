"""The load generator's garbage collector while a run measures: its pauses must not count as the server's.

A run of 10,000 slow streams holds a client, a connection and a result for
each, and the interpreter's default thresholds then walk them all in full
collections: on two cores such a collection stopped the load generator for
up to 0.26 s, and every stream it was reading from seemed that much longer
silent (`gateway bench --only heartbeats` charged it to the gateway:
docs/load-lab.md).  So while a run lasts the young generations are kept
small and a full collection waits for 6,000 middle ones (about 120 million
allocations: none in a run), as the gateway's own server does for the same
heap shape.  Nothing is frozen: a program that runs loads keeps its own
`gc.freeze()` as it was.  Runs may overlap in one process (the bench's); the
first to start sets the thresholds, the last to end restores them.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["LOADER_GC_THRESHOLDS", "quiet_collector"]

# Young collections of at most 5,000 × 4 objects (tens of milliseconds at
# 10,000 streams), a full one after 6,000 of those.
LOADER_GC_THRESHOLDS = (5_000, 4, 6_000)

_runs = 0
_before: tuple[int, int, int] | None = None


@contextlib.contextmanager
def quiet_collector() -> Iterator[None]:
    """Collect in small steps, and fully almost never, until the last overlapping run ends."""
    global _runs, _before
    if _runs == 0:
        _before = gc.get_threshold()
        gc.set_threshold(*LOADER_GC_THRESHOLDS)
    _runs += 1
    try:
        yield
    finally:
        _runs -= 1
        if _runs == 0:
            if _before is not None:
                gc.set_threshold(*_before)
            _before = None
