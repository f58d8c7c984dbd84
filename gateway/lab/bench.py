"""`just bench`: the standard scenarios, measured side by side in one run.

Starts the backend simulator and the gateway as separate processes (so that
each has its own interpreter and its CPU time can be read from /proc), runs
the load generator in this process, and prints one table whose ratios were
all measured in the same run.  Results also go to `bench-results/` as JSON
and a self-contained HTML page per scenario.

Every comparison runs in interleaved rounds (the simulator direct, then the
gateway, round after round; the scenarios' rounds take turns over the whole
run, `_spread`) and reports the median with the range: every path
a client uses (streamed, JSON and WebSocket Responses, chat completions relayed
and with the session, Messages) at c=1 and c=50, a paced load like a batched
model server's, and the floor (`floor.py`, a bare trio relay) on that load.
The table's heading says how busy the machine was.

This module only orchestrates: the simulator (`simulator.py`) and the load
generator (`loadtest/`) do the work.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import functools
import json
import os
import pathlib
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Iterator, Sequence
from typing import Any

import httpx2
import trio

from .fdlimit import raise_fd_limit
from .loadtest import LoadConfig, LoadReport, cpu_model, run_load
from .loadtest.config import ApiKind

__all__ = ["add_arguments", "main", "run_bench"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _wait_healthy(url: str, process: trio.Process) -> None:
    async with httpx2.AsyncClient(timeout=2) as http:
        with trio.fail_after(60):
            while True:
                if process.returncode is not None:
                    raise RuntimeError(f"{url} exited with status {process.returncode} before answering")
                try:
                    if (await http.get(url + "/health")).status_code == 200:
                        return
                except httpx2.TransportError:
                    pass
                await trio.sleep(0.05)  # polling a child that is starting up; no event to wait on


@dataclasses.dataclass
class Placement:
    """Which cores the load tools (this process's load generator, the simulator) and the gateway run on.

    From three cores up, the tools share the first and the gateway has the
    rest, so that what is measured does not compete with what measures it.
    On two cores nothing is pinned: at c=50 the simulator and the load
    generator need more than one core between them (pinned to one, they were
    the bottleneck: the simulator alone served 634 responses/s instead of
    982), so the OS places all three.  `--workers 2` gets a free core for
    each worker only from three cores up.
    """

    tools: set[int] | None
    gateway: set[int] | None
    cores: int = 0  # the machine's, for this process before it was pinned
    why: str = ""  # why nothing is pinned

    @classmethod
    def of_this_machine(cls) -> Placement:
        return cls.for_cores(_cores())

    @classmethod
    def for_light_load(cls, cores: list[int]) -> Placement:
        """For a load the tools serve with one core between them (one paced stream at a
        time): from two cores up, the tools get the first and the gateway the rest."""
        if len(cores) < 2:
            return cls.for_cores(cores)
        return cls({cores[0]}, set(cores[1:]), len(cores))

    @classmethod
    def for_cores(cls, cores: list[int]) -> Placement:
        count = len(cores) or os.cpu_count() or 1
        if not cores:
            return cls(None, None, count, "no CPU affinity on this system")
        if len(cores) < 3:
            return cls(None, None, count, f"{count} cores: the load tools need more than one")
        return cls({cores[0]}, set(cores[1:]), count)

    def describe(self) -> str:
        if self.tools is None or self.gateway is None:
            return f"not pinned ({self.why or 'asked with --no-pin'})"
        return f"load generator and simulator pinned to core {sorted(self.tools)}, the gateway to {sorted(self.gateway)}"

    def pin(self, pid: int, cores: set[int] | None) -> None:
        """Put `pid` (0: this thread) on `cores`; None: on every core of the machine, said
        explicitly, since a process inherits the affinity of the thread that started it (trio
        starts processes from its worker threads, which a pinned scenario may have made)."""
        wanted = cores if cores is not None else _MACHINE_CORES
        if wanted:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(pid, wanted)  # type: ignore[attr-defined,unused-ignore]


PLACEMENT = Placement(None, None)  # set by run_bench


@contextlib.contextmanager
def _placed(placement: Placement) -> Iterator[Placement]:
    """Processes started inside go where `placement` says, and so does this one (the load generator)."""
    global PLACEMENT
    before, mine = PLACEMENT, _cores()
    PLACEMENT = placement
    placement.pin(0, placement.tools)
    try:
        yield placement
    finally:
        PLACEMENT = before
        placement.pin(0, set(mine) if mine else None)


def _cores() -> list[int]:
    """The cores this process may run on (empty where the system does not say)."""
    getaffinity = getattr(os, "sched_getaffinity", None)
    return sorted(getaffinity(0)) if getaffinity is not None else []


# Every core the bench may use, as it started (before any scenario pinned anything).
_MACHINE_CORES = set(_cores())


@contextlib.asynccontextmanager
async def _process(
    args: Sequence[str], url: str, env: dict[str, str] | None = None, *, cores: set[int] | None = None
) -> AsyncIterator[trio.Process]:
    """A child process serving `url` (on `cores`), stopped (SIGTERM, then SIGKILL) on exit."""
    process = await trio.lowlevel.open_process(
        list(args), env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    PLACEMENT.pin(process.pid, cores)
    try:
        await _wait_healthy(url, process)
        yield process
    finally:
        with trio.CancelScope(shield=True):
            process.terminate()
            with trio.move_on_after(10):
                await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()


@contextlib.asynccontextmanager
async def _simulator(**options: Any) -> AsyncIterator[tuple[str, trio.Process]]:
    port = _free_port()
    args = [sys.executable, "-m", "gateway", "simulate-backend", "--host", "127.0.0.1", "--port", str(port)]
    for key, value in options.items():
        args += [f"--{key}", str(value)]
    url = f"http://127.0.0.1:{port}"
    async with _process(args, url, cores=PLACEMENT.tools) as process:
        yield url, process


@contextlib.asynccontextmanager
async def _gateway(
    backend: str, *, workers: int = 1, heartbeat: float = 15.0, extra: dict[str, str] | None = None, module: str = "gateway"
) -> AsyncIterator[tuple[str, trio.Process]]:
    port = _free_port()
    args = [sys.executable, "-m", module, "serve", "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers)]
    env = {
        "OPENAI_BASE_URL_INTERNAL": backend,
        "LOG_LEVEL": "WARNING",
        "LOG_FILE_PATH": "",
        "HEARTBEAT_INTERVAL": str(heartbeat),
        "STREAM_TIMEOUT": "300",
        **(extra or {}),
    }
    url = f"http://127.0.0.1:{port}"
    # One worker gets the gateway's cores; several share the machine (their children inherit).
    cores = PLACEMENT.gateway if workers == 1 else None
    async with _process(args, url, env, cores=cores) as process:
        yield url, process


@dataclasses.dataclass
class Row:
    scenario: str
    measured: str
    gateway: str
    direct: str
    ratio: str
    target: str
    met: str
    # The row's figure, round by round: its ratio to the simulator (or to the hot route) where
    # it has one, which the machine's drift between runs cancels out of, else its own figure.
    # A later run reproduces this row when its median lies within this range (`reproduced`).
    figure: list[float] = dataclasses.field(default_factory=list)

    CELLS = 7


class Bench:
    def __init__(self, out: pathlib.Path, duration: float, quick: bool, *, rounds: int = 3) -> None:
        self.out = out
        self.duration = duration
        self.quick = quick
        self.rounds = rounds
        self.rows: list[Row] = []
        self.reports: dict[str, Any] = {}
        # How busy the machine was before the bench loaded it (1, 5, 15 minutes), and after:
        # CPU figures measured beside other work are higher.
        self.load_average: tuple[float, float, float] | None = _load_average()
        self.load_average_after: tuple[float, float, float] | None = None
        self._machine_cpu = _machine_cpu_seconds()
        self._own_cpu = _own_cpu_seconds()
        self._began = time.monotonic()
        self.others_cpu: float | None = None  # cores' worth of CPU used by other processes during the run

    async def load(self, name: str, config: LoadConfig, pids: Sequence[int] = ()) -> LoadReport:
        print(f"  running {name} ...", flush=True)
        report = await run_load(config, server_pids=pids)
        self.reports[name] = json.loads(report.to_json())
        (self.out / f"{name}.json").write_text(report.to_json())
        return report

    def row(self, *cells: str, figure: Spread | None = None) -> None:
        scenario, measured, gateway, direct, ratio, target, met = cells
        self.rows.append(Row(scenario, measured, gateway, direct, ratio, target, met, list(figure.values) if figure else []))

    def finish(self) -> None:
        """Note how busy the machine was: the load average now, and the CPU that processes other
        than the bench's own (this one and the servers it started) used while it ran."""
        self.load_average_after = _load_average()
        machine, own = _machine_cpu_seconds(), _own_cpu_seconds()
        wall = time.monotonic() - self._began
        if machine is not None and self._machine_cpu is not None and wall > 0:
            self.others_cpu = max(0.0, (machine - self._machine_cpu) - (own - self._own_cpu)) / wall

    def busy(self) -> str | None:
        """Why the figures may be high because of other work, or None for a quiet machine."""
        cores = os.cpu_count() or 1
        reasons = []
        if self.load_average is not None and self.load_average[0] > BUSY_LOAD_PER_CORE * cores:
            reasons.append(f"the load average was {self.load_average[0]:.2f} before the run ({cores} cores)")
        if self.others_cpu is not None and self.others_cpu > BUSY_OTHERS_CORES:
            reasons.append(f"other processes used {self.others_cpu:.2f} of a core while it ran")
        return "; ".join(reasons) or None


# A machine is busy when, before the run, its 1-minute load average passes this share of its
# cores, or when, during it, other processes use more than this much of a core.
BUSY_LOAD_PER_CORE = 0.5
BUSY_OTHERS_CORES = 0.1


def _machine_cpu_seconds() -> float | None:
    """Busy CPU time of the whole machine since boot (/proc/stat), None where there is none."""
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _own_cpu_seconds() -> float:
    """CPU time of this process and of its children that have ended (every server the bench
    started has ended by the time `finish` asks)."""
    import resource

    mine, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return mine.ru_utime + mine.ru_stime + children.ru_utime + children.ru_stime


def _load_average() -> tuple[float, float, float] | None:
    getloadavg = getattr(os, "getloadavg", None)
    try:
        return getloadavg() if getloadavg is not None else None
    except OSError:
        return None


def _met(ok: bool) -> str:
    return "yes" if ok else "NO"


# Rounds every comparison runs in, at least: one favourable run is not a measurement.
ROUNDS = 3
# JSON answers and WebSocket turns may cost this much more CPU per response than the hot route.
TRANSPORT_CPU_RATIO_TARGET = 1.2
# The chat completions byte relay keeps at least this share of the simulator's throughput (c=50).
RELAY_THROUGHPUT_TARGET = 0.8
# The hot route keeps at least this share of the simulator's throughput on the burst (c=50).
BURST_THROUGHPUT_TARGET = 0.5
# The Messages front end may cost this much more CPU per streamed event than the Responses route.
MESSAGES_CPU_RATIO_TARGET = 1.2
# CPU per relayed event on the paced scenario, SQLite store on: at most this many times the
# decoding floor's (`FLOORS`: the least a relay that decodes and encodes each chunk spends).
PACED_FLOOR_RATIO_TARGET = 2.0
# What the gateway may add to an event of a paced stream (its first text delta, its last event).
PACED_ADDED_TARGET_MS = {"p50": 5.0, "p99": 20.0}
# What the gateway may add to the first text delta at c=1.
FIRST_DELTA_TARGET_MS = {"p50": 1.0, "p99": 2.0}
# The paced scenario: a model server under batch load sends each stream one token per step.
PACED_STREAMS = 50
PACED_STEP = 0.02
PACED_TOKENS = 100
PACED_MODEL = f"sim:delay={PACED_STEP},step={PACED_STEP},tokens={PACED_TOKENS}"
# The heartbeat scenarios: no client waits longer than this many intervals for a byte, and the
# gateway holds its open streams in no more memory than this (10,000 streams, 2026-11-29: 485 MiB).
HEARTBEAT_SILENCE_TARGET = 1.2
HEARTBEAT_RSS_TARGET_MIB = 485
# The paced streams' wave: the same load with one-token replies, what each response costs the
# gateway besides its events (its request, its set-up, its stored end).
PACED_WAVE_MODEL = f"sim:delay={PACED_STEP},step={PACED_STEP},tokens=1"
# The scale rows: the paced load at these many streams, one worker and then two.
SCALE_STREAMS = (500, 2000)


async def run_bench(
    out: pathlib.Path,
    *,
    duration: float = 5.0,
    quick: bool = False,
    slow_streams: int = 10000,
    only: str = "all",
    pin: bool = True,
    rounds: int = ROUNDS,
) -> Bench:
    """Run every scenario (or `only` one part); returns the bench with its table rows.

    Every scenario that compares the gateway with the simulator runs in `rounds` (at least
    three) interleaved rounds, the simulator direct and the gateway alternating, and its rows
    give the median with the range of the rounds."""
    global PLACEMENT
    raise_fd_limit()
    out.mkdir(parents=True, exist_ok=True)
    if quick:
        duration = min(duration, 2.0)
    bench = Bench(out, duration, quick, rounds=max(ROUNDS, rounds))
    PLACEMENT = Placement.of_this_machine() if pin else Placement(None, None, len(_cores()) or os.cpu_count() or 1)
    PLACEMENT.pin(0, PLACEMENT.tools)  # this process runs the load generator
    floors = only in ("all", "throughput", "floor")
    latency = _LatencyScenario(bench, pin, gateway=only in ("all", "throughput", "latency"), floors=floors)
    scenarios: list[_Scenario] = [latency] if latency.measured else []
    if only in ("all", "throughput", "paths"):
        scenarios.append(_PathsScenario(bench))
    paced = _PacedScenario(bench) if only in ("all", "throughput", "paced") else None
    if paced is not None:
        scenarios.append(paced)
    if only in ("all", "parsers"):
        scenarios.append(_ParsersScenario(bench))
    if floors:
        floor = _FloorScenario(bench, latency)
        scenarios.append(floor)
        if paced is not None:
            paced.floor = floor
    if only in ("all", "throughput", "scale"):
        scenarios.append(_ScaleScenario(bench))
    await _spread(bench, scenarios)
    if only == "all":
        await _workers_scenario(bench)
    if only in ("all", "shared"):
        await _shared_service_scenario(bench, rounds=bench.rounds)
    if only in ("all", "dispatch"):
        await _dispatch_scenario(bench)
    if only in ("all", "disconnects"):
        await _disconnect_scenario(bench)
    if only in ("all", "heartbeats") and slow_streams > 0:
        for streams in sorted({min(5000, slow_streams), slow_streams}):
            await _heartbeat_scenario(bench, streams)
    bench.finish()
    return bench


@dataclasses.dataclass(frozen=True)
class Path:
    """One way a client reaches the gateway, measured against the simulator direct."""

    name: str
    api: ApiKind
    stream: bool = True
    websocket: bool = False
    limited: bool = False  # with the key that has a token limit (the chat path's session)

    def config(self, url: str, concurrency: int, duration: float | None, keys: dict[str, str], **more: Any) -> LoadConfig:
        secret = keys["limited" if self.limited else "plain"]
        header = ("x-api-key", secret) if self.api == "messages" else ("authorization", f"Bearer {secret}")
        return LoadConfig(
            url=url, api=self.api, stream=self.stream, websocket=self.websocket, concurrency=concurrency,
            duration=duration, headers=(header,), **more,
        )

    @property
    def direct(self) -> str:
        """Which of the simulator's answers this path is compared with: streamed or JSON."""
        return "stream" if self.stream else "json"


PATHS = (
    Path("/v1/responses streamed (the hot route)", "responses"),
    Path("/v1/responses JSON", "responses", stream=False),
    Path("/v1/responses WebSocket, sequential turns", "responses", websocket=True),
    Path("/v1/chat/completions relayed as bytes", "chat"),
    Path("/v1/chat/completions with the session (a key with a token limit)", "chat", limited=True),
    Path("/v1/messages streamed", "messages"),
)
HOT = PATHS[0]


@contextlib.asynccontextmanager
async def _keyed_store() -> AsyncIterator[tuple[dict[str, str], dict[str, str]]]:
    """A SQLite store (in a temporary folder) holding two keys, `plain` (no limits) and
    `limited` (a token limit, so that chat completions run their session); yields the keys'
    secrets and the gateway's environment for that store."""
    with tempfile.TemporaryDirectory() as folder:
        env = {"STORE_BACKEND": "sqlite", "SQLITE_PATH": os.path.join(folder, "bench.sqlite3")}
        keys: dict[str, str] = {}
        for name, limits in (("plain", ()), ("limited", ("--tpm", "1000000000000"))):
            made = await trio.run_process(
                [sys.executable, "-m", "gateway", "keys", "create", name, *limits],
                env={**os.environ, **env, "LOG_FILE_PATH": ""},
                capture_stdout=True,
                capture_stderr=True,
            )
            keys[name] = made.stdout.decode().strip()
        yield keys, env


class _Scenario:
    """A comparison whose rounds the bench spreads over the whole run (`_spread`): its processes
    start once and stay up (`open`), its rounds take turns with every other scenario's
    (`round`), then what follows the last round (`after`: a profile), then its rows from all
    its rounds (`rows`).  A machine that drifts while the bench runs (a neighbour's load, a
    warming host) moves every scenario's rounds alike, so that each median is the whole run's,
    not that of the minutes when its scenario happened to run."""

    name = ""

    def __init__(self, bench: Bench) -> None:
        self.bench = bench

    async def open(self, stack: contextlib.AsyncExitStack) -> None:
        raise NotImplementedError

    async def round(self, round_: int) -> None:
        raise NotImplementedError

    async def after(self) -> None:
        pass

    def rows(self) -> None:
        raise NotImplementedError


async def _spread(bench: Bench, scenarios: Sequence[_Scenario]) -> None:
    """Every scenario's processes up, then round after round each scenario's round in turn,
    then every scenario's rows in order."""
    async with contextlib.AsyncExitStack() as stack:
        for scenario in scenarios:
            print(f"  starting {scenario.name} ...", flush=True)
            await scenario.open(stack)
        for round_ in range(bench.rounds):
            for scenario in scenarios:
                await scenario.round(round_)
        for scenario in scenarios:
            await scenario.after()
    for scenario in scenarios:
        scenario.rows()


class _PathsScenario(_Scenario):
    """Every path a client uses, on the 200-chunk burst, at c=1 and c=50, SQLite store on and
    keys required: the gateway's CPU per response, and its throughput as a share of the
    simulator's (streamed or JSON, as the path answers)."""

    name = "every path"

    def __init__(self, bench: Bench, concurrencies: Sequence[int] = (1, 50)) -> None:
        super().__init__(bench)
        self.concurrencies = concurrencies
        self.runs: dict[tuple[str, int], list[LoadReport]] = {}

    async def open(self, stack: contextlib.AsyncExitStack) -> None:
        self.keys, env = await stack.enter_async_context(_keyed_store())
        self.sim_url, self.sim = await stack.enter_async_context(_simulator(tokens=200))
        self.gw_url, self.gw = await stack.enter_async_context(_gateway(self.sim_url, extra=env))
        for path in PATHS:  # warm every path (connections, caches, the store's tables)
            await _checked(path.name, run_load(path.config(self.gw_url, 4, 1.0, self.keys, requests=40)))

    async def round(self, round_: int) -> None:
        bench = self.bench
        for concurrency in self.concurrencies:
            for direct in ("stream", "json"):
                config = LoadConfig(
                    url=self.sim_url, api="chat", stream=direct == "stream", concurrency=concurrency, duration=bench.duration
                )
                report = await bench.load(f"direct-{direct}-c{concurrency}-r{round_}", config, [self.sim.pid])
                self.runs.setdefault((f"direct-{direct}", concurrency), []).append(report)
            for path in PATHS:
                config = path.config(self.gw_url, concurrency, bench.duration, self.keys)
                report = await bench.load(f"{_slug(path.name)}-c{concurrency}-r{round_}", config, [self.gw.pid])
                self.runs.setdefault((path.name, concurrency), []).append(report)

    def rows(self) -> None:
        for concurrency in self.concurrencies:
            _path_rows(self.bench, self.runs, concurrency)


def _path_rows(bench: Bench, runs: dict[tuple[str, int], list[LoadReport]], concurrency: int) -> None:
    hot = runs[(HOT.name, concurrency)]
    for path in PATHS:
        via, direct = runs[(path.name, concurrency)], runs[(f"direct-{path.direct}", concurrency)]
        failed = sum(r.requests_failed for r in via)
        share = Spread([_share(v, d) for v, d in zip(via, direct)])
        target, met = "", ""
        if path is HOT and concurrency == 50:
            target, met = f"≥ {BURST_THROUGHPUT_TARGET:.2f}", _met(share.median >= BURST_THROUGHPUT_TARGET)
        elif path.api == "chat" and not path.limited and concurrency == 50:
            target, met = f"≥ {RELAY_THROUGHPUT_TARGET:.2f}", _met(share.median >= RELAY_THROUGHPUT_TARGET)
        bench.row(
            f"{path.name}, 200-chunk burst, c={concurrency}" + (f" ({failed} failed)" if failed else ""),
            "CPU per response; responses/s; share of direct",
            _cpu_and_rate(via),
            _cpu_and_rate(direct)
            + (" (JSON)" if path.direct == "json" else ""),
            share.plain(2),
            target,
            "NO" if failed and target else met,
            figure=share,
        )
        if path is HOT:
            continue
        # Compared with the hot route round by round: JSON and WebSocket by CPU per response,
        # Messages by CPU per event (its replies frame into another number of events).
        per_event = path.api == "messages"
        if not (per_event or path.websocket or not path.stream):
            continue
        ratio = Spread([_cpu_ratio(v, h, per_event) for v, h in zip(via, hot)])
        limit = MESSAGES_CPU_RATIO_TARGET if per_event else TRANSPORT_CPU_RATIO_TARGET
        bench.row(
            f"{path.name} against the hot route, c={concurrency}",
            "CPU per event" if per_event else "CPU per response",
            _per_event(via) if per_event else _cpu(via),
            (_per_event(hot) if per_event else _cpu(hot)) + " (hot route)",
            f"{ratio.plain(2)}×",
            f"≤ {limit:g}×",
            _met(ratio.median <= limit and not failed),
            figure=ratio,
        )


def _slug(name: str) -> str:
    words = "".join(c if c.isalnum() else " " for c in name.split(" (")[0])
    return "-".join(words.split()).lower()


def _cpu_ms(report: LoadReport) -> float:
    return (report.server.cpu_per_response_ms or 0.0) if report.server else 0.0


def _share(via: LoadReport, direct: LoadReport) -> float:
    return via.throughput_rps / direct.throughput_rps if direct.throughput_rps else 0.0


def _event_us(report: LoadReport) -> float:
    return _cpu_ms(report) / (report.events_per_response or 1.0) * 1000


def _per_event(reports: list[LoadReport]) -> str:
    return Spread([_event_us(r) for r in reports]).plain(1, "µs")


def _cpu(reports: list[LoadReport]) -> str:
    return Spread([_cpu_ms(r) for r in reports]).ms()


def _cpu_and_rate(reports: list[LoadReport]) -> str:
    """CPU per response and responses per second, each a median with its range."""
    return f"{_cpu(reports)}; {Spread([r.throughput_rps for r in reports]).plain(0)}/s"


def _cpu_ratio(via: LoadReport, hot: LoadReport, per_event: bool) -> float:
    mine, theirs = (_event_us(via), _event_us(hot)) if per_event else (_cpu_ms(via), _cpu_ms(hot))
    return mine / theirs if theirs else 0.0


def _added(via: LoadReport, direct: LoadReport, measure: str, q: str) -> float:
    return (getattr(getattr(via, measure), q) or 0.0) - (getattr(getattr(direct, measure), q) or 0.0)


async def _checked(name: str, load: Awaitable[LoadReport]) -> LoadReport:
    """A warm-up that must succeed: a path that fails here would measure its failures."""
    report = await load
    if report.requests_failed:
        raise RuntimeError(f"{name}: {report.requests_failed} of the warm-up's requests failed ({report.failures})")
    return report


@dataclasses.dataclass(frozen=True)
class Spread:
    """A figure's rounds: the median, and the range."""

    values: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else 0.0

    def plain(self, digits: int, unit: str = "", *, signed: bool = False) -> str:
        sign = "+" if signed else ""
        unit = f" {unit}" if unit else ""
        low, high = (min(self.values), max(self.values)) if self.values else (0.0, 0.0)
        return f"{self.median:{sign}.{digits}f}{unit} [{low:{sign}.{digits}f} to {high:{sign}.{digits}f}]"

    def ms(self) -> str:
        return self.plain(2, "ms")


PARSER_PATHS = (PATHS[0], PATHS[2], PATHS[3])  # SSE (the hot route), WebSocket, the byte relay


class _ParsersScenario(_Scenario):
    """The gateway's own connections with their own framing (llhttp, checked as strictly as h11)
    against the same shell on h11 (`gateway.lab.h11framing`), on the SSE, WebSocket and relay
    paths at c=50: CPU per response, interleaved round by round (docs/http-server.md: which parser, and why)."""

    name = "parsers (llhttp against h11)"

    def __init__(self, bench: Bench, concurrency: int = 50) -> None:
        super().__init__(bench)
        self.concurrency = concurrency
        self.runs: dict[tuple[str, str], list[LoadReport]] = {}

    async def open(self, stack: contextlib.AsyncExitStack) -> None:
        self.keys, env = await stack.enter_async_context(_keyed_store())
        sim_url, _ = await stack.enter_async_context(_simulator(tokens=200))
        self.gateways = {
            "llhttp": await stack.enter_async_context(_gateway(sim_url, extra=env)),
            "h11": await stack.enter_async_context(_gateway(sim_url, extra=env, module="gateway.lab.h11framing")),
        }
        for url, _ in self.gateways.values():
            for path in PARSER_PATHS:
                await _checked(path.name, run_load(path.config(url, 4, 1.0, self.keys, requests=40)))

    async def round(self, round_: int) -> None:
        for path in PARSER_PATHS:
            for parser, (url, process) in self.gateways.items():
                config = path.config(url, self.concurrency, self.bench.duration, self.keys)
                report = await self.bench.load(f"parser-{parser}-{_slug(path.name)}-r{round_}", config, [process.pid])
                self.runs.setdefault((parser, path.name), []).append(report)

    def rows(self) -> None:
        for path in PARSER_PATHS:
            ours, theirs = self.runs[("llhttp", path.name)], self.runs[("h11", path.name)]
            ratio = Spread([_cpu_ms(t) / _cpu_ms(o) if _cpu_ms(o) else 0.0 for o, t in zip(ours, theirs)])
            self.bench.row(
                f"{path.name}, 200-chunk burst, c={self.concurrency}: h11 framing against the gateway's own",
                "CPU per response (h11 | llhttp)",
                _cpu(theirs),
                _cpu(ours),
                f"{ratio.plain(2)}×",
                "",
                "",
                figure=ratio,
            )


class _PacedScenario(_Scenario):
    """50 streams, each chunk its own upstream write 20 ms apart (a 100-token reply lasts 2 s),
    SQLite store on and keys required: the gateway's CPU per relayed event (the row the target
    applies to) and the time it adds to each event, against the simulator direct, round after
    round; after the last round, the same load under py-spy, CPU per event by layer."""

    name = "the paced load"

    def __init__(self, bench: Bench) -> None:
        super().__init__(bench)
        self.via: list[LoadReport] = []
        self.direct: list[LoadReport] = []
        self.wave: list[LoadReport] = []  # one-token replies on the same load: the per-response CPU
        # The same load with the streams' starts spread over one stream's length: they end and
        # start again one by one, not as a wave (the simulator direct and the gateway).
        self.spread_direct: list[LoadReport] = []
        self.spread_via: list[LoadReport] = []
        self.profile: list[tuple[str, ...]] = []  # the profile's rows, written after the paced ones
        self.floor: _FloorScenario | None = None  # the floors measured in the same run, if they are

    async def open(self, stack: contextlib.AsyncExitStack) -> None:
        seconds = max(self.bench.duration, 3 * PACED_STEP * PACED_TOKENS)
        keys, env = await stack.enter_async_context(_keyed_store())
        sim_url, self.sim = await stack.enter_async_context(_simulator(tokens=200))
        gw_url, self.gw = await stack.enter_async_context(_gateway(sim_url, extra=env))
        self.gateway = HOT.config(gw_url, PACED_STREAMS, seconds, keys, model=PACED_MODEL)
        self.direct_config = LoadConfig(url=sim_url, api="chat", model=PACED_MODEL, concurrency=PACED_STREAMS, duration=seconds)
        self.wave_config = HOT.config(gw_url, PACED_STREAMS, None, keys, model=PACED_WAVE_MODEL, requests=4 * PACED_STREAMS)
        spread = PACED_STEP * PACED_TOKENS
        self.spread_configs = (
            dataclasses.replace(self.direct_config, ramp_up=spread),
            dataclasses.replace(self.gateway, ramp_up=spread),
        )
        await _checked("paced", run_load(dataclasses.replace(self.gateway, duration=None, requests=PACED_STREAMS)))

    async def round(self, round_: int) -> None:
        self.direct.append(await self.bench.load(f"paced-direct-r{round_}", self.direct_config, [self.sim.pid]))
        self.via.append(await self.bench.load(f"paced-gateway-r{round_}", self.gateway, [self.gw.pid]))
        self.wave.append(await self.bench.load(f"paced-wave-r{round_}", self.wave_config, [self.gw.pid]))
        direct, via = self.spread_configs
        self.spread_direct.append(await self.bench.load(f"paced-spread-direct-r{round_}", direct, [self.sim.pid]))
        self.spread_via.append(await self.bench.load(f"paced-spread-gateway-r{round_}", via, [self.gw.pid]))

    async def after(self) -> None:
        per_event = Spread([_event_us(r) for r in self.via]).median
        self.profile = await _profile_scenario(self.bench, self.gateway, self.gw.pid, per_event, "paced")

    def rows(self) -> None:
        bench, via_runs, direct_runs = self.bench, self.via, self.direct
        per_event = Spread([_event_us(r) for r in via_runs])
        to_simulator = Spread([_cpu_ratio(v, d, per_event=True) for v, d in zip(via_runs, direct_runs)])
        failed = sum(r.requests_failed for r in via_runs)
        floor_runs = self.floor.runs.get("decoding-paced", []) if self.floor is not None else []
        if floor_runs:  # measured in the same rounds: the machine's drift cancels out of the ratio
            to_floor = Spread([_event_us(v) / _event_us(f) if _event_us(f) else 0.0 for v, f in zip(via_runs, floor_runs)])
            target = f"≤ {PACED_FLOOR_RATIO_TARGET:g}× the decoding floor"
            over = per_event.median - PACED_FLOOR_RATIO_TARGET * Spread([_event_us(f) for f in floor_runs]).median
            met = _met(to_floor.median <= PACED_FLOOR_RATIO_TARGET and not failed)
            if over > 0:
                met += f": {over:.0f} µs above it (the profile below)"
            ratio = f"{to_floor.plain(2)}× the floor; {to_simulator.plain(2)}× the simulator"
        else:
            to_floor, target, met = None, f"≤ {PACED_FLOOR_RATIO_TARGET:g}× the decoding floor", "n/a: the floor runs with --only throughput or floor"
            ratio = f"{to_simulator.plain(2)}× the simulator"
        bench.row(
            f"CPU per relayed event, paced: {PACED_STREAMS} streams, a chunk per write {PACED_STEP * 1000:.0f} ms apart"
            + (f" ({failed} failed)" if failed else ""),
            "CPU µs per event",
            per_event.plain(1, "µs"),
            f"{_per_event(direct_runs)} (simulator)" + (f"; {_per_event(floor_runs)} (decoding floor)" if floor_runs else ""),
            ratio,
            target,
            met,
            figure=to_floor or to_simulator,
        )
        wave = Spread([_cpu_ms(r) for r in self.wave])
        # The streams end on one step and start again together: the one `ahead` of a stream in
        # the wave (half of them at p50, all but one at p99) are each served their set-up and
        # their end first, on one core, so that stream's first and last events wait that long.
        ahead = {"p50": PACED_STREAMS // 2, "p99": PACED_STREAMS - 1}
        bench.row(
            f"the paced streams' wave: {PACED_STREAMS} streams end on the same {PACED_STEP * 1000:.0f} ms step and start again together",
            "CPU ms per response besides its events (one-token replies)",
            wave.ms(),
            f"× {PACED_STREAMS} streams = {wave.median * PACED_STREAMS:.0f} ms of CPU per wave, "
            f"{wave.median * PACED_STREAMS / (PACED_STEP * 1000):.1f} steps",
            "",
            "",
            "",
            figure=wave,
        )
        spread = f"starts spread over {PACED_STEP * PACED_TOKENS:g} s (the streams end and start one by one)"
        for together, via_of, direct_of in ((True, via_runs, direct_runs), (False, self.spread_via, self.spread_direct)):
            if not via_of:
                continue
            self._added_rows(via_of, direct_of, wave, ahead if together else None, "" if together else f", {spread}")
        for cells in self.profile:
            bench.row(*cells)

    def _added_rows(
        self, via_runs: list[LoadReport], direct_runs: list[LoadReport], wave: Spread, ahead: dict[str, int] | None, how: str
    ) -> None:
        """The time added to the first and the last event; where a target is missed and the wave
        (`ahead`: the responses served before a stream's, when they come together) costs more than
        it, the met cell names that floor."""
        for what, measure in (("first text delta", "time_to_first_text_ms"), ("last event", "total_latency_ms")):
            for q in ("p50", "p99"):
                added = Spread([_added(v, d, measure, q) for v, d in zip(via_runs, direct_runs)])
                limit = PACED_ADDED_TARGET_MS[q]
                met = _met(added.median <= limit)
                floor = ahead[q] * wave.median if ahead is not None else 0.0
                if ahead is not None and added.median > limit and floor > limit:
                    # Which floor stands in the way: the wave's CPU ahead of this stream; the
                    # target needs the responses ahead of it to cost at most `need` ms each.
                    need = limit / ahead[q]
                    met += (
                        f": the wave ahead of it, {ahead[q]} × {wave.median:.2f} ms = {floor:.0f} ms of CPU; "
                        f"≤ +{limit:g} ms needs ≤ {need:.2f} ms per response"
                    )
                self.bench.row(
                    f"time added to each event, paced, c={PACED_STREAMS}{how}: the {what} ({q})",
                    "added by the gateway",
                    added.plain(2, "ms", signed=True),
                    "",
                    "",
                    f"≤ +{limit:g} ms",
                    met,
                    figure=added,
                )


def _tools_behind(direct: list[LoadReport], streams: int) -> str:
    """What the direct column must say when the simulator and the load generator themselves fall
    behind the load (their streams last longer than the tokens' pace): the row is then the
    machine's limit, not the gateway's."""
    paced_for = PACED_STEP * PACED_TOKENS
    lasted = Spread([(r.total_latency_ms.p50 or 0.0) / 1000 for r in direct]).median
    if lasted <= 1.1 * paced_for + 2 * PACED_STEP:
        return ""
    return f"; the tools fall behind: a {paced_for:g} s stream lasts {lasted:.1f} s direct"


class _ScaleScenario(_Scenario):
    """The paced load at `SCALE_STREAMS` streams (a chunk per 20 ms step each, SQLite store on
    and keys required), against the simulator direct, one gateway worker and then two (`--workers
    2`, the same load): CPU per event, the time added to the last event (p50, p99), and whether
    the gateway keeps up (its responses/s at least 0.95 of direct's: streams last no longer
    through it).  What an operator sizes a deployment by."""

    name = "the paced load at scale"

    def __init__(self, bench: Bench, streams: Sequence[int] = SCALE_STREAMS) -> None:
        super().__init__(bench)
        self.streams = streams
        self.runs: dict[tuple[str, int], list[LoadReport]] = {}

    async def open(self, stack: contextlib.AsyncExitStack) -> None:
        self.seconds = max(self.bench.duration, 3 * PACED_STEP * PACED_TOKENS)
        self.keys, env = await stack.enter_async_context(_keyed_store())
        self.sim_url, self.sim = await stack.enter_async_context(_simulator(tokens=200))
        self.gateways: dict[str, tuple[str, trio.Process]] = {}
        for workers in (1, 2):
            url, proc = await stack.enter_async_context(_gateway(self.sim_url, workers=workers, extra=env))
            await _checked("scale", run_load(HOT.config(url, 50, 1.0, self.keys, requests=100, model=PACED_MODEL)))
            self.gateways[f"{workers}w"] = (url, proc)

    async def round(self, round_: int) -> None:
        for streams in self.streams:
            direct = LoadConfig(url=self.sim_url, api="chat", model=PACED_MODEL, concurrency=streams, duration=self.seconds)
            self.runs.setdefault(("direct", streams), []).append(
                await self.bench.load(f"scale-{streams}-direct-r{round_}", direct, [self.sim.pid])
            )
            for name, (url, proc) in self.gateways.items():
                config = HOT.config(url, streams, self.seconds, self.keys, model=PACED_MODEL)
                self.runs.setdefault((name, streams), []).append(
                    await self.bench.load(f"scale-{streams}-gateway-{name}-r{round_}", config, [proc.pid])
                )

    def rows(self) -> None:
        for streams in self.streams:
            direct = self.runs[("direct", streams)]
            for name, label in (("1w", "one worker"), ("2w", "--workers 2")):
                via = self.runs[(name, streams)]
                share = Spread([_share(v, d) for v, d in zip(via, direct)])
                failed = sum(r.requests_failed for r in via)
                added = [Spread([_added(v, d, "total_latency_ms", q) for v, d in zip(via, direct)]) for q in ("p50", "p99")]
                self.bench.row(
                    f"paced at scale: {streams} streams, a chunk per 20 ms each, {label}" + (f" ({failed} failed)" if failed else ""),
                    "CPU per event; added to the last event p50 / p99; share of direct's responses/s",
                    f"{_per_event(via)}; {added[0].plain(1, 'ms', signed=True)} / {added[1].plain(1, 'ms', signed=True)}",
                    f"{_per_event(direct)} (simulator)" + _tools_behind(direct, streams),
                    share.plain(2),
                    "keeps up: ≥ 0.95",
                    _met(share.median >= 0.95 and not failed),
                    figure=share,
                )


class _LatencyScenario(_Scenario):
    """What the gateway adds to the first text delta at c=1, on a stream paced like a fast model.

    The tokens come 5 ms apart (200 tokens/s).  On the 200-chunk burst the
    simulator writes all its chunks within a millisecond and the gateway
    translates them as they come: on a two-core machine both cores are then
    busy, and the load generator reads the gateway's first delta only when
    one of them is free.  A paced stream leaves the load generator a core to
    read with, and one paced stream at a time is light enough for the tools
    to share one core, so from two cores up the gateway gets a core of its
    own.  SQLite store on and keys required, as on every path.

    With `floors`, the floors (`floor.py`, see `_FloorScenario`) are measured in the same
    rounds, on the same simulator and placement: each round runs the simulator direct, the
    gateway and the floors one after the other, so that the gateway's row and its floors'
    rows come from the same minutes.
    """

    name = "the first text delta at c=1"

    def __init__(self, bench: Bench, pin: bool, *, gateway: bool = True, floors: bool = False) -> None:
        super().__init__(bench)
        self.placement = Placement.for_light_load(_cores()) if pin else PLACEMENT
        self.measured = (["gateway"] if gateway else []) + ([server for server, _, _ in FLOORS] if floors else [])
        self.runs: dict[str, list[LoadReport]] = {}

    async def open(self, stack: contextlib.AsyncExitStack) -> None:
        with _placed(self.placement) as placement:
            sim_url, sim = await stack.enter_async_context(_simulator(tokens=_PACED_TOKENS, delay=_PACED_DELAY))
            self.configs: list[tuple[str, LoadConfig, int]] = [
                ("direct", LoadConfig(url=sim_url, api="chat", concurrency=1, duration=self.bench.duration), sim.pid)
            ]
            for name in self.measured:
                if name == "gateway":
                    keys, env = await stack.enter_async_context(_keyed_store())
                    url, proc = await stack.enter_async_context(_gateway(sim_url, extra=env))
                    config = HOT.config(url, 1, self.bench.duration, keys)
                else:
                    url, proc = await stack.enter_async_context(_floor(name, sim_url, placement.gateway))
                    config = LoadConfig(url=url, concurrency=1, duration=self.bench.duration)
                await _checked(f"c=1 {name}", run_load(dataclasses.replace(config, duration=None, requests=20)))
                self.configs.append((name, config, proc.pid))

    async def round(self, round_: int) -> None:
        with _placed(self.placement):
            for name, config, pid in self.configs:
                label = f"{name}-c1-paced-r{round_}" if name in ("direct", "gateway") else f"floor-{name}-c1-paced-r{round_}"
                self.runs.setdefault(name, []).append(await self.bench.load(label, config, [pid]))

    def rows(self) -> None:
        if "gateway" not in self.measured:
            return
        placement, via_runs, direct_runs = self.placement, self.runs["gateway"], self.runs["direct"]
        where = ""
        if placement is not PLACEMENT and placement.tools is not None and placement.gateway is not None:
            where = f"; tools on core {min(placement.tools)}, gateway on {', '.join(map(str, sorted(placement.gateway)))}"
        for q, target in (("p50", FIRST_DELTA_TARGET_MS["p50"]), ("p99", FIRST_DELTA_TARGET_MS["p99"])):
            added = Spread([_added(v, d, "time_to_first_text_ms", q) for v, d in zip(via_runs, direct_runs)])
            self.bench.row(
                f"time to first text delta, c=1, tokens {_PACED_DELAY * 1000:.0f} ms apart{where} ({q})",
                "added by the gateway",
                added.plain(2, "ms", signed=True),
                Spread([getattr(d.time_to_first_text_ms, q) or 0.0 for d in direct_runs]).ms() + " direct",
                "",
                f"≤ {target:g} ms",
                _met(added.median <= target),
                figure=added,
            )

    def floor_rows(self) -> None:
        """The floors' rows (written with the other floors')."""
        for server, what, _ in FLOORS:
            if server not in self.runs:
                continue
            for q in ("p50", "p99"):
                added = Spread([_added(v, d, "time_to_first_text_ms", q) for v, d in zip(self.runs[server], self.runs["direct"])])
                self.bench.row(
                    f"floor: {what}, time to first text delta, c=1, tokens {_PACED_DELAY * 1000:.0f} ms apart ({q})",
                    "added by the relay",
                    added.plain(2, "ms", signed=True),
                    Spread([getattr(d.time_to_first_text_ms, q) or 0.0 for d in self.runs["direct"]]).ms() + " direct",
                    "",
                    f"≤ {FIRST_DELTA_TARGET_MS[q]:g} ms (the gateway's)",
                    "floor above" if added.median > FIRST_DELTA_TARGET_MS[q] else "",
                    figure=added,
                )


_PACED_TOKENS = 10
_PACED_DELAY = 0.005


# The two floors: the bare relay on raw trio sockets, and the same relay as an ASGI app under
# hypercorn's trio worker, the server the gateway runs on (`gateway.lab.floor`).
# Each floor: its `--server`, what it is, and what it does not do of the gateway's work.
FLOORS = (
    ("trio", "a bare trio relay", "no parsing, translation, store or keys"),
    ("hypercorn", "the same relay on hypercorn (ASGI)", "no parsing, translation, store or keys"),
    ("decoding", "the trio relay decoding each chunk and encoding each event", "no state machine, store or keys"),
)


@contextlib.asynccontextmanager
async def _floor(server: str, sim_url: str, cores: set[int] | None) -> AsyncIterator[tuple[str, trio.Process]]:
    port = _free_port()
    args = [sys.executable, "-m", "gateway.lab.floor", "--port", str(port), "--backend", sim_url, "--server", server]
    url = f"http://127.0.0.1:{port}"
    async with _process(args, url, cores=cores) as process:
        yield url, process


class _FloorScenario(_Scenario):
    """The floors: what a relay costs that does none of the gateway's work (`gateway.lab.floor`:
    one SSE frame out per chunk in, no parsing, translation, store, keys or framework), on raw
    trio sockets and as a bare ASGI app under hypercorn, and on raw trio sockets doing the least
    per chunk any translator must (its JSON decoded, a whole delta event encoded), measured the same way as the gateway
    on each load a target applies to: CPU per event on the paced load, the share of the
    simulator's throughput on the burst at c=50, WebSocket messages against SSE on hypercorn,
    and (`latency`, measured in its rounds) the time added to the first text delta at c=1.
    No Python relay on this stack does better; the gap between a floor and the gateway is
    what the gateway's layers cost."""

    name = "the floors"

    def __init__(self, bench: Bench, latency: _LatencyScenario) -> None:
        super().__init__(bench)
        self.latency = latency
        self.runs: dict[str, list[LoadReport]] = {}

    async def open(self, stack: contextlib.AsyncExitStack) -> None:
        seconds = max(self.bench.duration, 3 * PACED_STEP * PACED_TOKENS)
        sim_url, sim = await stack.enter_async_context(_simulator(tokens=200))
        duration = self.bench.duration
        paced: list[tuple[str, LoadConfig, int]] = []
        burst: list[tuple[str, LoadConfig, int]] = []
        for server, _, _ in FLOORS:
            url, proc = await stack.enter_async_context(_floor(server, sim_url, PLACEMENT.gateway))
            load = LoadConfig(url=url, model=PACED_MODEL, concurrency=PACED_STREAMS, duration=seconds)
            await _checked("floor", run_load(dataclasses.replace(load, duration=None, requests=PACED_STREAMS)))
            await _checked("floor", run_load(LoadConfig(url=url, concurrency=4, requests=40)))
            paced.append((f"{server}-paced", load, proc.pid))
            burst.append((server, LoadConfig(url=url, concurrency=50, duration=duration), proc.pid))
            if server == "hypercorn":
                hyper_url, hyper_proc = url, proc
        await _checked("floor", run_load(LoadConfig(url=hyper_url, websocket=True, concurrency=4, requests=40)))
        self.configs = (
            *paced,
            ("direct", LoadConfig(url=sim_url, api="chat", concurrency=50, duration=duration), sim.pid),
            *burst,
            ("hypercorn-c1", LoadConfig(url=hyper_url, concurrency=1, duration=duration), hyper_proc.pid),
            ("websocket-c1", LoadConfig(url=hyper_url, websocket=True, concurrency=1, duration=duration), hyper_proc.pid),
        )

    async def round(self, round_: int) -> None:
        for name, config, pid in self.configs:
            label = f"floor-{name.removesuffix('-paced')}-paced-r{round_}" if name.endswith("-paced") else f"floor-{name}-burst-r{round_}"
            self.runs.setdefault(name, []).append(await self.bench.load(label, config, [pid]))

    def rows(self) -> None:
        bench, runs = self.bench, self.runs
        for server, what, leaves_out in FLOORS:
            per_event = Spread([_event_us(r) for r in runs[f"{server}-paced"]])
            bench.row(
                f"floor: {what}, paced, c={PACED_STREAMS} ({leaves_out})",
                "CPU µs per event",
                per_event.plain(1, "µs"),
                "",
                "",
                "",
                "",
                figure=per_event,
            )
        for server, what, _ in FLOORS:
            share = Spread([_share(v, d) for v, d in zip(runs[server], runs["direct"])])
            bench.row(
                f"floor: {what}, 200-chunk burst, c=50",
                "CPU per response; responses/s; share of direct",
                _cpu_and_rate(runs[server]),
                _cpu_and_rate(runs["direct"]),
                share.plain(2),
                f"≥ {BURST_THROUGHPUT_TARGET:.2f} / ≥ {RELAY_THROUGHPUT_TARGET:.2f} (the gateway's)",
                "floor below" if share.median < RELAY_THROUGHPUT_TARGET else "",
                figure=share,
            )
        ratio = Spread([_cpu_ratio(w, h, per_event=False) for w, h in zip(runs["websocket-c1"], runs["hypercorn-c1"])])
        bench.row(
            "floor: WebSocket turns on hypercorn (a message per event) against its SSE, 200-chunk burst, c=1",
            "CPU per response",
            _cpu(runs["websocket-c1"]),
            _cpu(runs["hypercorn-c1"]) + " (SSE)",
            f"{ratio.plain(2)}×",
            f"≤ {TRANSPORT_CPU_RATIO_TARGET:g}× (the gateway's)",
            "floor above" if ratio.median > TRANSPORT_CPU_RATIO_TARGET else "",
            figure=ratio,
        )
        self.latency.floor_rows()


async def _workers_scenario(bench: Bench) -> None:
    """`gateway serve --workers 2` against one worker, on the burst at c=50, in rounds."""
    one: list[LoadReport] = []
    two: list[LoadReport] = []
    async with _simulator(tokens=200) as (sim_url, _sim_proc):
        async with _gateway(sim_url) as (gw1_url, gw1_proc), _gateway(sim_url, workers=2) as (gw2_url, gw2_proc):
            for url in (gw1_url, gw2_url):
                await _checked("workers", run_load(LoadConfig(url=url, concurrency=4, requests=40)))
            for round_ in range(bench.rounds):
                one.append(await bench.load(f"gateway-1worker-c50-r{round_}", LoadConfig(url=gw1_url, concurrency=50, duration=bench.duration), [gw1_proc.pid]))
                two.append(await bench.load(f"gateway-2workers-c50-r{round_}", LoadConfig(url=gw2_url, concurrency=50, duration=bench.duration), [gw2_proc.pid]))
    scale = Spread([t.throughput_rps / o.throughput_rps if o.throughput_rps else 0.0 for t, o in zip(two, one)])
    cores = PLACEMENT.cores
    free_core = cores >= 3  # two workers need a core each beside the load tools' one
    bench.row(
        "gateway serve --workers 2, 200-chunk burst, c=50",
        "responses/s",
        Spread([t.throughput_rps for t in two]).plain(0),
        Spread([o.throughput_rps for o in one]).plain(0) + " (1 worker)",
        scale.plain(2),
        "≥ 1.6" if free_core else "≥ 1.6 with a free core",
        _met(scale.median >= 1.6) if free_core else f"n/a: {cores} cores, none free for a 2nd worker",
    )


# Where a sample's CPU goes: the first frame from the leaf up that one of these names (trio's
# own frames are skipped, so a channel's or a socket's cost lands on the layer that called it).
_LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("event encoding (orjson, SSE frames)", ("encode_event", "event_json", "encode_done")),
    ("upstream read (httptools, SSE and JSON decoding)", ("backends/", "streams/chunks.py", "streams/sse.py")),
    ("translation (translator, session, turn)", ("streams/", "turn/")),
    ("store (record, SQLite)", ("store/", "sqlite3", "zstandard")),
    ("client write (body loop, the HTTP server, quart)", ("transport/", "gateway/server/", "gateway/app.py:_send_response", "quart", "hypercorn", "h11", "wsproto")),
    ("request handling (edge, parse, keys, metrics)", ("gateway/", "werkzeug", "pydantic", "prometheus_client", "opentelemetry")),
]
_SCHEDULER = "trio's scheduler and I/O polling"


def _layer_of(frames: list[str]) -> str:
    for frame in reversed(frames):
        name, _, where = frame.partition(" (")
        path = where.rsplit(":", 1)[0]
        if "trio/" in path or path.startswith("<"):
            continue
        if path.endswith(("gateway/server/loop.py", "gateway/server/workers.py", "gateway/serving.py", "gateway/cli.py", "gateway/__main__.py")):
            return _SCHEDULER  # the run loop itself, below every task
        for layer, marks in _LAYERS:
            for mark in marks:
                if ":" in mark:
                    file, function = mark.split(":")
                    if path.endswith(file) and name.endswith(function):
                        return layer
                elif mark in name.split(".")[-1] or mark in path:
                    return layer
        if "site-packages" not in path and "/lib/python" in path:
            continue  # the standard library: the caller's layer
        return "other"
    return _SCHEDULER


def profile_layers(raw: str) -> dict[str, float]:
    """Shares of the samples in py-spy's raw output (`frames;... count` lines), by layer."""
    counts: dict[str, int] = {}
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        if "_thread_cache.py" in frames[-1] and frames[-1].partition(" (")[0].endswith("_work"):
            continue  # an idle worker thread waiting for a job, which py-spy takes for a busy one
        layer = _layer_of(frames)
        counts[layer] = counts.get(layer, 0) + int(count)
    total = sum(counts.values()) or 1
    return {layer: n / total for layer, n in sorted(counts.items(), key=lambda kv: -kv[1])}


def _py_spy() -> str | None:
    import shutil

    beside = pathlib.Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


async def _profile_scenario(bench: Bench, load: LoadConfig, pid: int, per_event_us: float, label: str) -> list[tuple[str, ...]]:
    """The same load again, under py-spy (sampling, not pausing the gateway): the CPU per event
    by layer, as shares of `per_event_us`: the cells of its rows."""
    spy = _py_spy()
    if spy is None:
        return [(f"profile, {label}: CPU per event by layer", "", "py-spy not installed", "", "", "", "")]
    seconds = max(3, int(load.duration or bench.duration) - 1)
    out = bench.out / f"profile-{label}.txt"
    async with trio.open_nursery() as nursery:  # the load and the profiler, side by side
        nursery.start_soon(functools.partial(run_load, dataclasses.replace(load, duration=seconds + 2)))
        await trio.sleep(1)  # into the steady state
        result = await trio.run_process(
            [spy, "record", "--pid", str(pid), "--duration", str(seconds), "--rate", "250", "--nonblocking",
             "--format", "raw", "--output", str(out)],
            capture_stdout=True, capture_stderr=True, check=False,
        )
    if result.returncode != 0 or not out.exists():
        return [(f"profile, {label}: CPU per event by layer", "", "py-spy could not attach", "", "", "", "")]
    return [
        (f"profile, {label}: {layer}", "CPU µs per event", f"{share * per_event_us:.2f} µs", "", f"{share:.0%}", "", "")
        for layer, share in profile_layers(out.read_text()).items()
    ]


DISCONNECT_TARGET_MS = 10.0


async def _disconnect_scenario(bench: Bench) -> None:
    """A client leaves a stream (or a JSON answer, or an MCP call): milliseconds until the
    backend's connection closes, by the backend's own clock (`gateway.lab.disconnects`)."""
    from .disconnects import measure

    figures = await measure(repeats=5 if bench.quick else 20, progress=lambda line: print(line, flush=True))
    for transport, phase, median, worst in figures.rows():
        bench.row(
            f"disconnect: {transport}, {phase}",
            "client's close → gateway let go (ms, median [max])",
            f"{median:.2f} [{worst:.2f}]",
            "",
            "",
            f"≤ {DISCONNECT_TARGET_MS:g} ms",
            _met(worst <= DISCONNECT_TARGET_MS),
        )


async def _heartbeat_scenario(bench: Bench, streams: int) -> None:
    ramp = 30.0 * streams / 5000
    interval = 2.0
    async with _simulator(tokens=5, ttft=30) as (sim_url, _sim_proc):
        async with _gateway(sim_url, heartbeat=interval) as (gw_url, gw_proc):
            report = await bench.load(
                f"heartbeat-{streams}",
                LoadConfig(
                    url=gw_url,
                    api="responses",
                    concurrency=streams,
                    requests=streams,
                    timeout=150,
                    # All streams are open together: the last one starts before
                    # the first one gets its first token (after 30 s).
                    ramp_up=ramp,
                ),
                [gw_proc.pid],
            )
    silence = report.longest_silence_max_ms
    bench.row(
        f"heartbeats, {streams} streams (started over {ramp:.0f} s), first token after 30 s",
        "longest silence",
        f"{silence / 1000:.2f} s" if silence is not None else "-",
        f"{report.requests_completed} ok, {report.requests_failed} failed",
        f"{(silence or 0) / 1000 / interval:.2f} × interval",
        f"≤ {HEARTBEAT_SILENCE_TARGET:g} × {interval:g} s",
        _met(silence is not None and silence <= HEARTBEAT_SILENCE_TARGET * interval * 1000 and report.requests_failed == 0),
    )
    rss = report.server.rss_peak_bytes if report.server else None
    bench.row(
        f"gateway RSS, {streams} open streams",
        "peak RSS",
        f"{(rss or 0) / 2**20:.0f} MiB",
        "",
        f"{report.requests_completed}/{streams} completed",
        f"≤ {HEARTBEAT_RSS_TARGET_MIB} MiB",
        _met(rss is not None and rss <= HEARTBEAT_RSS_TARGET_MIB * 2**20),
    )


async def _shared_service_scenario(bench: Bench, rounds: int = 3) -> None:
    """What keys, limits and metrics cost per request: CPU per response of three gateways on
    short replies (so that the per-request work is most of the work).  The three run side by
    side and are loaded in turn, `rounds` times; each figure is the median of its rounds, so
    that a drift of the machine does not land on one of them."""
    import statistics
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        keyed = {"STORE_BACKEND": "sqlite", "SQLITE_PATH": os.path.join(folder, "keyed.sqlite3")}
        made = await trio.run_process(
            [sys.executable, "-m", "gateway", "keys", "create", "bench", "--rpm", "100000000", "--tpm", "1000000000000",
             "--concurrency", "100000"],
            env={**os.environ, **keyed, "LOG_FILE_PATH": ""},
            capture_stdout=True,
            capture_stderr=True,
        )
        secret = made.stdout.decode().strip()
        setups = [
            ("neither", {"METRICS_ENABLED": "false", "SQLITE_PATH": os.path.join(folder, "a.sqlite3")}, ()),
            ("metrics", {"SQLITE_PATH": os.path.join(folder, "b.sqlite3")}, ()),
            ("keys + limits + metrics", keyed, (("authorization", f"Bearer {secret}"),)),
        ]
        cpu: dict[str, list[float]] = {label: [] for label, _, _ in setups}
        async with _simulator(tokens=5) as (sim_url, _sim_proc), contextlib.AsyncExitStack() as stack:
            servers = [await stack.enter_async_context(_gateway(sim_url, extra=extra)) for _, extra, _ in setups]
            for (label, _, headers), (gw_url, _) in zip(setups, servers):
                await run_load(LoadConfig(url=gw_url, api="responses", concurrency=20, requests=300, headers=headers))
            for round_ in range(rounds):
                for (label, _, headers), (gw_url, gw_proc) in zip(setups, servers):
                    report = await bench.load(
                        f"shared-{label.replace(' ', '').replace('+', '-')}-{round_}",
                        LoadConfig(url=gw_url, api="responses", concurrency=20, duration=bench.duration, headers=headers),
                        [gw_proc.pid],
                    )
                    if report.requests_failed:
                        raise RuntimeError(f"{label}: {report.requests_failed} requests failed")
                    cpu[label].append((report.server.cpu_per_response_ms if report.server else 0.0) or 0.0)
    median = {label: statistics.median(values) * 1000 for label, values in cpu.items()}
    for label in ("metrics", "keys + limits + metrics"):
        bench.row(
            f"CPU per request added by {label} (5-token replies, c=20, median of {rounds})",
            "CPU µs",
            f"{median[label]:.0f} µs",
            f"{median['neither']:.0f} µs (neither)",
            f"{median[label] - median['neither']:+.0f} µs",
            "",
            "",
        )


async def _dispatch_scenario(bench: Bench) -> None:
    """What Quart's router costs a request, in-process (`gateway.lab.dispatch`): the route
    table serves a row ahead of it only where this passes 0.1 ms."""
    from .dispatch import measure

    cost = await measure(requests=500 if bench.quick else 2000, rounds=bench.rounds)
    added = Spread(cost.added)
    bench.row(
        f"Quart's router and request objects, a POST row in-process (median of {bench.rounds})",
        "CPU µs added per request",
        Spread(cost.framework).plain(0, "µs") + " (through Quart)",
        Spread(cost.ahead).plain(0, "µs") + " (served ahead)",
        added.plain(0, "µs", signed=True),
        "> 100 µs: the turn rows go ahead of it",
        "yes" if added.median > 100 else "NO",
        figure=added,
    )


@dataclasses.dataclass(frozen=True)
class Reproduction:
    """A row of this run against the same row of an earlier one."""

    scenario: str
    median: float
    low: float
    high: float

    @property
    def inside(self) -> bool:
        return self.low <= self.median <= self.high


def reproduced(earlier: Sequence[dict[str, Any]], rows: Sequence[Row]) -> list[Reproduction]:
    """Each row with a figure in both runs: this run's median against the earlier run's range
    (rows matched by scenario; `earlier` is the `rows` list of an earlier run's bench.json)."""
    before = {r["scenario"]: r.get("figure") or [] for r in earlier}
    found = []
    for row in rows:
        values = before.get(row.scenario)
        if row.figure and values:
            found.append(Reproduction(row.scenario, statistics.median(row.figure), min(values), max(values)))
    return found


def render_reproduction(found: Sequence[Reproduction], source: str) -> str:
    inside = sum(r.inside for r in found)
    lines = [f"Against {source}: {inside} of {len(found)} medians inside the earlier run's ranges."]
    for r in found:
        if not r.inside:
            lines.append(f"- outside: {r.scenario}: {r.median:.3g} against [{r.low:.3g} to {r.high:.3g}]")
    return "\n".join(lines)


def render(bench: Bench) -> str:
    header = ("scenario", "measure", "gateway", "direct", "ratio / added", "target", "met")
    rows = [header] + [dataclasses.astuple(r)[: Row.CELLS] for r in bench.rows]
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(header))]
    lines = []
    for n, row in enumerate(rows):
        lines.append("| " + " | ".join(str(cell).ljust(widths[i]) for i, cell in enumerate(row)) + " |")
        if n == 0:
            lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def machine() -> str:
    cpu = cpu_model() or "unknown CPU"
    idle = idle_policy()
    return (
        f"{os.cpu_count()} cores ({cpu}{'; ' + idle if idle else ''}), Python {platform.python_version()}, "
        f"{datetime.date.today().isoformat()}"
    )


def idle_policy(sys_root: pathlib.Path = pathlib.Path("/sys")) -> str | None:
    """How this machine's idle cores wait, when Linux says: the c=1 latency rows depend on it.

    A VM whose idle vCPUs halt at once (the `haltpoll` driver with
    `guest_halt_poll_ns=0`) wakes a core through the host each time, and a
    core that sat idle longer wakes slower; on one such VM that was ~0.7 ms
    of the gateway's added first delta at c=1 (docs/load-lab.md)."""
    try:
        driver = (sys_root / "devices/system/cpu/cpuidle/current_driver").read_text().strip()
    except OSError:
        return None
    if driver != "haltpoll":
        return f"cpuidle {driver}" if driver else None
    try:
        poll_ns = int((sys_root / "module/haltpoll/parameters/guest_halt_poll_ns").read_text())
    except (OSError, ValueError):
        return "cpuidle haltpoll"
    if poll_ns == 0:
        return "cpuidle haltpoll, guest_halt_poll_ns=0: idle cores halt at once"
    return f"cpuidle haltpoll, idle cores poll {poll_ns / 1000:g} µs before halting"


def commit() -> str:
    """The commit the bench ran from, and whether the working tree differed from it."""
    here = pathlib.Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=here, capture_output=True, text=True, check=True)
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return "commit unknown (not a git checkout)"
    return f"commit {head.stdout.strip()}" + (" with uncommitted changes" if status.stdout.strip() else "")


def _load(values: tuple[float, float, float] | None) -> str:
    return ", ".join(f"{n:.2f}" for n in values) if values is not None else "unknown"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="bench-results", help="folder for JSON and HTML results")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per load run (each of every round)")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help=f"interleaved rounds per comparison (at least {ROUNDS})")
    parser.add_argument(
        "--slow-streams", type=int, default=10000, help="concurrent streams in the largest heartbeat scenario (and 5000)"
    )
    parser.add_argument("--quick", action="store_true", help="2-second load runs (a smoke test; still every round)")
    parser.add_argument(
        "--against", metavar="BENCH_JSON", help="an earlier run's bench.json: say which rows' medians land inside its ranges"
    )
    parser.add_argument(
        "--no-pin", dest="pin", action="store_false", help="let the OS place the processes (default from 3 cores: tools and gateway on separate cores)"
    )
    parser.add_argument(
        "--only",
        choices=["all", "throughput", "latency", "paths", "paced", "floor", "scale", "parsers", "shared", "dispatch", "disconnects", "heartbeats"],
        default="all",
        help="one part: latency (first text delta added at c=1), paths (every path at c=1 and c=50), "
        "paced (50 streams a token per 20 ms, with its profile), floor (a bare trio relay on the paced load), "
        "scale (the paced load at 500 and 2,000 streams, one worker and two), throughput (those five), parsers (the gateway's own framing against h11's, on SSE, WebSocket and the relay), "
        "shared (the cost of keys, limits and metrics), dispatch (what Quart's router costs a request), "
        "disconnects (how soon a client that "
        "leaves is let go, on each transport), heartbeats",
    )


def main(args: argparse.Namespace) -> int:
    out = pathlib.Path(args.out)
    # Read before the run, not after it: a wrong path fails at once, not after the whole bench.
    earlier = json.loads(pathlib.Path(args.against).read_text()) if args.against else None
    bench = trio.run(
        lambda: run_bench(
            out,
            duration=args.duration,
            quick=args.quick,
            slow_streams=args.slow_streams,
            only=args.only,
            pin=args.pin,
            rounds=args.rounds,
        )
    )
    table = render(bench)
    header = (
        f"Responses gateway benchmark — {machine()}; {commit()}; {PLACEMENT.describe()}; "
        f"medians of {bench.rounds} interleaved rounds [range]; load average before the run {_load(bench.load_average)}, "
        f"after it {_load(bench.load_average_after)}"
    )
    if bench.others_cpu is not None:
        header += f"; other processes used {bench.others_cpu:.2f} of a core while it ran"
    busy = bench.busy()
    print()
    print(header)
    if busy:
        print(f"\nWARNING: the machine was busy ({busy}): these figures are higher than on a quiet machine.")
    print()
    print(table)
    against = ""
    if earlier is not None:
        against = "\n\n" + render_reproduction(reproduced(earlier["rows"], bench.rows), f"{args.against} ({earlier.get('commit', '?')})")
        print(against.strip())
    (out / "table.md").write_text(header + ("\n\nWARNING: the machine was busy: " + busy if busy else "") + "\n\n" + table + against + "\n")
    results = {
        "machine": machine(),
        "commit": commit(),
        "rounds": bench.rounds,
        "load_average": bench.load_average,
        "load_average_after": bench.load_average_after,
        "others_cpu": bench.others_cpu,
        "busy": busy,
        "rows": [dataclasses.asdict(r) for r in bench.rows],
        "runs": bench.reports,
    }
    (out / "bench.json").write_text(json.dumps(results, indent=2))
    return 0 if not any(r.met.startswith("NO") for r in bench.rows) else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m gateway.lab.bench", description=__doc__)
    add_arguments(parser)
    sys.exit(main(parser.parse_args()))
