"""The run: workers, their request slots, the warm-up, the background sampling and progress.

It owns `run_load`: how many workers run (one `Client` each), when each starts (the ramp-up),
which requests count (the warm-up's do not), when the run ends (a request count, a duration,
whichever comes first; requests in flight finish) and what runs beside it (the server sampler,
the progress line). It knows nothing of HTTP bytes, SSE frames or report formats: the client
measures, `report.aggregate` sums up.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import trio

from .client import Client, Target
from .collector import quiet_collector
from .config import LoadConfig
from .progress import run_progress
from .report import Counters, LoadReport, RequestResult, aggregate
from .sampler import ProcessSampler
from .wsclient import WebSocketClient

__all__ = ["run_load"]


class _Plan:
    """Hands out request slots until the count or the deadline is reached."""

    def __init__(self, limit: int | None, deadline: float | None) -> None:
        self._left = limit
        self._deadline = deadline

    def take(self) -> bool:
        if self._left is not None:
            if self._left <= 0:
                return False
        if self._deadline is not None and time.perf_counter() >= self._deadline:
            return False
        if self._left is not None:
            self._left -= 1
        return True


async def _run_phase(
    clients: list[Client | WebSocketClient],
    plan: _Plan,
    timeout: float | None,
    run_start: float,
    sink: list[RequestResult] | None,
    counters: Counters | None,
    ramp_up: float = 0.0,
) -> None:
    async def run_worker(client: Client | WebSocketClient, start_at: float) -> None:
        if start_at > 0:
            await trio.sleep_until(trio.current_time() + start_at)
        while plan.take():
            result = await client.request(timeout, run_start)
            if sink is not None and counters is not None:
                sink.append(result)
                if result.error is None:
                    counters.completed += 1
                else:
                    counters.failed += 1

    step = ramp_up / len(clients) if clients else 0.0
    async with trio.open_nursery() as nursery:
        for index, client in enumerate(clients):
            nursery.start_soon(run_worker, client, index * step)


async def run_load(config: LoadConfig, *, server_pids: Sequence[int] = ()) -> LoadReport:
    """Run the load described by `config` and aggregate it.

    Requests that fail are counted, never raised. In-flight requests are allowed to finish
    after the duration ends (bounded by `config.timeout`), so slow streams are not dropped from
    the distributions. Raises `ValueError` only for an invalid configuration. While it runs, the
    process's collector is kept quiet (`quiet_collector`): the load generator's own pauses are
    not the server's.
    """
    target = Target.of(config)
    counters = Counters()
    clients: list[Client | WebSocketClient] = [
        WebSocketClient(config, counters) if config.websocket else Client(target, config.api, counters)
        for _ in range(config.concurrency)
    ]
    results: list[RequestResult] = []
    sampler = ProcessSampler(server_pids) if server_pids else None
    try:
        with quiet_collector():  # (the warm-up's and the run's)
            if config.warmup:
                await _run_phase(
                    clients, _Plan(config.warmup, None), config.timeout, time.perf_counter(), None, None
                )
            warm_connections = counters.connections_opened
            warm_retries = counters.stale_retries
            started_at = time.time()
            cpu_start = time.process_time()
            run_start = time.perf_counter()
            deadline = None if config.duration is None else run_start + config.duration
            if sampler is not None:
                sampler.sample()
            async with trio.open_nursery() as background:
                if sampler is not None:
                    background.start_soon(sampler.run_sampling)
                if config.progress:
                    background.start_soon(run_progress, config, counters, run_start)
                await _run_phase(
                    clients,
                    _Plan(config.request_limit, deadline),
                    config.timeout,
                    run_start,
                    results,
                    counters,
                    config.ramp_up,
                )
                background.cancel_scope.cancel()
            wall = time.perf_counter() - run_start
            loader_cpu = time.process_time() - cpu_start
            if sampler is not None:
                sampler.sample()
    finally:
        for client in clients:
            await client.aclose()
    counters.connections_opened -= warm_connections
    counters.stale_retries -= warm_retries
    return aggregate(config, results, counters, started_at, wall, loader_cpu, sampler)
