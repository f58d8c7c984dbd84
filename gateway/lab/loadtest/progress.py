"""The live progress line of a load test, rewritten in place on stderr.

It owns what the line says (`progress_line`: a bar, requests done of those asked or seconds of
the duration, ok and failed counts, the rate, the time elapsed) and how often it is written
(`run_progress`: four times a second, then once more, with a newline, when the run ends). It
knows nothing of requests or sockets: it reads the run's `Counters`. Whether to show it at all
is the command line's decision (by default, when stderr is a terminal).

Plain text and `\\r`, no display library: the load generator must run after a plain install of
the package, and a line rewritten four times a second costs nothing next to the streams.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

import trio

from .config import LoadConfig
from .report import Counters

__all__ = ["progress_line", "run_progress"]

_BAR_WIDTH = 24
# Four rewrites a second read as live; more would only cost the machine under test.
_INTERVAL = 0.25


def progress_line(config: LoadConfig, ok: int, failed: int, elapsed: float) -> str:
    """The line after `elapsed` seconds of the run with `ok` and `failed` requests ended.
    A run bounded by a request count shows requests done of the limit; one bounded only by its
    duration shows the seconds of it gone by."""
    limit = config.request_limit
    if limit is not None:
        fraction = (ok + failed) / limit
        done = f"{ok + failed}/{limit}"
    else:
        duration = config.duration or 0.0  # without a request limit there is a duration
        fraction = elapsed / duration if duration else 1.0
        done = f"{min(elapsed, duration):.1f}/{duration:g} s"
    filled = round(_BAR_WIDTH * min(1.0, max(0.0, fraction)))
    bar = "#" * filled + "-" * (_BAR_WIDTH - filled)
    rate = ok / elapsed if elapsed > 0 else 0.0
    seconds = int(elapsed)
    clock = f"{seconds // 3600}:{seconds // 60 % 60:02}:{seconds % 60:02}"
    return f"loadtest [{bar}] {done}  {ok} ok  {failed} failed  {rate:.1f}/s  {clock}"


async def run_progress(
    config: LoadConfig, counters: Counters, run_start: float, stream: TextIO | None = None
) -> None:
    """Rewrite the progress line on `stream` (stderr by default) until cancelled, then write it
    a last time with the final counts and end it with a newline, so that what follows starts on
    a line of its own. `run_start` is the run's `time.perf_counter()` at its start."""
    out = sys.stderr if stream is None else stream
    width = 0

    def write(end: str) -> None:
        nonlocal width
        line = progress_line(config, counters.completed, counters.failed, time.perf_counter() - run_start)
        # `\r` goes back to the start of the line; spaces cover what a longer line left there.
        out.write("\r" + line.ljust(width) + end)
        out.flush()
        width = len(line)

    try:
        while True:
            await trio.sleep(_INTERVAL)
            write("")
    finally:
        write("\n")
