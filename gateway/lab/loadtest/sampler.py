"""The server's cost during a run: CPU time and memory of its processes, read through psutil.

It owns `ProcessSampler` (which processes count, from which moment, and what a process that
exits or a reused pid does to the figures) and `ServerUsage`, the figures a report carries. It
works wherever psutil does (Linux, macOS, Windows, the BSDs). It knows nothing of HTTP or of
requests: the run samples it before, during and after the load.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import psutil
import trio

__all__ = ["ProcessSampler", "ServerUsage"]


@dataclass(frozen=True)
class ServerUsage:
    """CPU time and RSS of the server's processes (the pids given and their descendants)."""

    pids: list[int]
    processes_seen: int
    cpu_seconds: float
    cpu_per_response_ms: float | None
    rss_start_bytes: int
    rss_peak_bytes: int
    # Peak minus start, divided by the concurrency: the memory one more open stream costs.
    rss_growth_per_stream_bytes: float
    samples: int


class ProcessSampler:
    """CPU time (user+sys) and summed RSS of some processes and their descendants, read through
    psutil, so it works wherever psutil does (Linux, macOS, Windows, the BSDs).

    A process is identified by (pid, create time), so a reused pid counts as a new process. A
    process first seen after the first sample was born during the run: all its CPU time counts.
    A process that exits keeps the time it had at its last sample. Processes that vanish or may
    not be read between two calls are skipped, never raised.
    """

    def __init__(self, pids: Sequence[int]) -> None:
        self.pids = list(pids)
        self._baseline: dict[tuple[int, float], float] = {}
        self._latest: dict[tuple[int, float], float] = {}
        self.samples = 0
        self.rss_start_bytes = 0
        self.rss_peak_bytes = 0

    @property
    def cpu_seconds(self) -> float:
        return sum(self._latest[key] - self._baseline[key] for key in self._latest)

    @property
    def processes_seen(self) -> int:
        return len(self._latest)

    def sample(self) -> None:
        """Read every process once: a few small reads each, cheap enough for the event loop."""
        first = self.samples == 0
        rss = 0
        for process in self._processes():
            try:
                with process.oneshot():  # the create and CPU times come from one read
                    key = (process.pid, process.create_time())
                    times = process.cpu_times()
                    memory = process.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            cpu = times.user + times.system
            # Born during the run when first seen after the first sample. Comparing its create
            # time with the first sample's clock instead would misjudge: on Linux psutil derives
            # it from the boot time in whole seconds, so a newborn child can look a second older.
            self._baseline.setdefault(key, cpu if first else 0.0)
            self._latest[key] = cpu
            rss += memory
        if first:
            self.rss_start_bytes = rss
        self.rss_peak_bytes = max(self.rss_peak_bytes, rss)
        self.samples += 1

    async def run_sampling(self, interval: float = 0.1) -> None:
        """Sample every `interval` seconds until cancelled."""
        while True:
            await trio.sleep(interval)
            self.sample()

    def _processes(self) -> list[psutil.Process]:
        found: dict[int, psutil.Process] = {}
        for pid in self.pids:
            try:
                root = psutil.Process(pid)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            found.setdefault(root.pid, root)
            try:
                children = root.children(recursive=True)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue  # the root exited between the two calls; its last sample stands
            for child in children:
                found.setdefault(child.pid, child)
        return list(found.values())
