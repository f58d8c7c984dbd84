"""The load generator's garbage collector while a run measures: its pauses must not count as the server's.

A run of 10,000 slow streams holds a client, a connection and a result for
each, and the interpreter's default thresholds then walk them all in full
collections: on two cores such a collection stopped the load generator for
up to 0.26 s, and every stream it was reading from seemed that much longer
silent (`gateway bench --only heartbeats` charged it to the gateway:
docs/load-lab.md).  So while a run lasts, what existed before it is frozen
out of the collector's sight and the young generations are kept small, as
the gateway's own server does for the same heap shape.  Runs may overlap in
one process (the bench's); the first to start settles, the last to end
restores.
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
    """Freeze what is alive and collect in small steps until the last overlapping run ends."""
    global _runs, _before
    if _runs == 0:
        _before = gc.get_threshold()
        gc.freeze()
        gc.set_threshold(*LOADER_GC_THRESHOLDS)
    _runs += 1
    try:
        yield
    finally:
        _runs -= 1
        if _runs == 0:
            gc.unfreeze()
            if _before is not None:
                gc.set_threshold(*_before)
            _before = None
