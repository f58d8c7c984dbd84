"""`just bench`: the standard scenarios, measured side by side in one run.

Starts the backend simulator and the gateway as separate processes (so that
each has its own interpreter and its CPU time can be read from /proc), runs
the load generator in this process, and prints one table whose ratios were
all measured in the same run.  Results also go to `bench-results/` as JSON
and a self-contained HTML page per scenario.

The throughput part measures Anthropic's Messages front end (`/v1/messages`)
beside the Responses route, on the same gateway and backend, right after it:
the CPU per streamed event of the two is compared in one run.

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
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import httpx2
import trio

from .fdlimit import raise_fd_limit
from .loadtest import LoadConfig, LoadReport, cpu_model, run_load

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
        if cores is not None:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(pid, cores)  # type: ignore[attr-defined,unused-ignore]


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
    backend: str, *, workers: int = 1, heartbeat: float = 15.0, extra: dict[str, str] | None = None
) -> AsyncIterator[tuple[str, trio.Process]]:
    port = _free_port()
    args = [sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers)]
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


class Bench:
    def __init__(self, out: pathlib.Path, duration: float, quick: bool) -> None:
        self.out = out
        self.duration = duration
        self.quick = quick
        self.rows: list[Row] = []
        self.reports: dict[str, Any] = {}
        # How busy the machine was before the bench loaded it (1, 5, 15 minutes): CPU figures
        # measured beside other work are higher.
        self.load_average: tuple[float, float, float] | None = _load_average()

    async def load(self, name: str, config: LoadConfig, pids: Sequence[int] = ()) -> LoadReport:
        print(f"  running {name} ...", flush=True)
        report = await run_load(config, server_pids=pids)
        self.reports[name] = json.loads(report.to_json())
        (self.out / f"{name}.json").write_text(report.to_json())
        return report

    def row(self, *cells: str) -> None:
        self.rows.append(Row(*cells))


def _load_average() -> tuple[float, float, float] | None:
    getloadavg = getattr(os, "getloadavg", None)
    try:
        return getloadavg() if getloadavg is not None else None
    except OSError:
        return None


def _fmt_ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.2f} ms"


def _met(ok: bool) -> str:
    return "yes" if ok else "NO"


async def run_bench(
    out: pathlib.Path,
    *,
    duration: float = 8.0,
    quick: bool = False,
    slow_streams: int = 10000,
    only: str = "all",
    pin: bool = True,
) -> Bench:
    """Run every scenario (or `only` one part); returns the bench with its table rows."""
    global PLACEMENT
    raise_fd_limit()
    out.mkdir(parents=True, exist_ok=True)
    bench = Bench(out, duration, quick)
    PLACEMENT = Placement.of_this_machine() if pin else Placement(None, None, len(_cores()) or os.cpu_count() or 1)
    PLACEMENT.pin(0, PLACEMENT.tools)  # this process runs the load generator
    if only == "shared":
        await _shared_service_scenario(bench)
        return bench
    if only == "heartbeats":
        for streams in sorted({min(5000, slow_streams), slow_streams}):
            await _heartbeat_scenario(bench, streams)
        return bench
    # --- added latency on a stream paced like a fast model ------------------------
    await _paced_latency_scenario(bench, pin)
    # --- throughput and added latency: 200-chunk replies without delay --------
    async with _simulator(tokens=200) as (sim_url, sim_proc):
        async with _gateway(sim_url) as (gw_url, gw_proc):
            for api in ("responses", "messages"):
                await run_load(LoadConfig(url=gw_url, api=api, concurrency=4, requests=40))
            for concurrency in (1, 50, 200):
                direct = await bench.load(
                    f"direct-c{concurrency}",
                    LoadConfig(url=sim_url, api="chat", concurrency=concurrency, duration=duration),
                    [sim_proc.pid],
                )
                via = await bench.load(
                    f"gateway-c{concurrency}",
                    LoadConfig(url=gw_url, api="responses", concurrency=concurrency, duration=duration),
                    [gw_proc.pid],
                )
                ratio = via.throughput_rps / direct.throughput_rps if direct.throughput_rps else 0.0
                target = "≥ 0.50" if concurrency == 50 else ""
                bench.row(
                    f"throughput, 200 chunks, c={concurrency}",
                    "responses/s",
                    f"{via.throughput_rps:.1f}",
                    f"{direct.throughput_rps:.1f}",
                    f"{ratio:.2f}",
                    target,
                    _met(ratio >= 0.5) if target else "",
                )
                if concurrency in (1, 50):
                    for q in ("p50", "p99"):
                        _first_delta_row(bench, f"time to first text delta, c={concurrency}, 200-chunk burst ({q})", via, direct, q)
                if concurrency == 50:
                    cpu = via.server.cpu_per_response_ms if via.server else None
                    direct_cpu = direct.server.cpu_per_response_ms if direct.server else None
                    events = via.events_per_response or 1.0
                    bench.row(
                        "server CPU per relayed response, c=50",
                        "CPU ms",
                        f"{cpu or 0:.2f} ms",
                        f"{direct_cpu or 0:.2f} ms (simulator)",
                        "",
                        "≤ 1.6 ms",
                        _met(cpu is not None and cpu <= 1.6),
                    )
                    per_event = (cpu or 0) / events * 1000
                    bench.row(
                        "server CPU per relayed event, c=50",
                        "CPU µs",
                        f"{per_event:.1f} µs",
                        f"{events:.0f} events/response",
                        "",
                        "≤ 8 µs",
                        _met(cpu is not None and per_event <= 8.0),
                    )
                    single = via.throughput_rps
                    # The Messages front end on the same gateway, right after the Responses route.
                    messages = await bench.load(
                        f"messages-c{concurrency}",
                        LoadConfig(url=gw_url, api="messages", concurrency=concurrency, duration=duration),
                        [gw_proc.pid],
                    )
                    _messages_rows(bench, via, messages, concurrency)
                    await _profile_scenario(bench, gw_url, gw_proc.pid, per_event)

        # --- two workers -------------------------------------------------------
        if only == "throughput":
            return bench
        async with _gateway(sim_url, workers=2) as (gw2_url, gw2_proc):
            await run_load(LoadConfig(url=gw2_url, api="responses", concurrency=4, requests=40))
            two = await bench.load(
                "gateway-2workers-c50",
                LoadConfig(url=gw2_url, api="responses", concurrency=50, duration=duration),
                [gw2_proc.pid],
            )
            scale = two.throughput_rps / single if single else 0.0
            # Two workers need a core each beside the load tools' one.
            cores = PLACEMENT.cores
            free_core = cores >= 3
            bench.row(
                "gateway serve --workers 2, c=50",
                "responses/s",
                f"{two.throughput_rps:.1f}",
                f"{single:.1f} (1 worker)",
                f"{scale:.2f}",
                "≥ 1.6" if free_core else "≥ 1.6 with a free core",
                _met(scale >= 1.6) if free_core else f"n/a: {cores} cores, none free for a 2nd worker",
            )

    await _shared_service_scenario(bench)

    # --- heartbeats under load: slow first token ---------------------------------
    if slow_streams <= 0:
        return bench
    for streams in sorted({min(5000, slow_streams), slow_streams}):
        await _heartbeat_scenario(bench, streams)
    return bench


# The Messages front end may cost this much more CPU per streamed event than the Responses route.
MESSAGES_CPU_RATIO_TARGET = 1.2


def _messages_rows(bench: Bench, responses: LoadReport, messages: LoadReport, concurrency: int) -> None:
    """CPU per streamed message and per streamed event on /v1/messages, beside the Responses
    route's figures from the same gateway in the same run, and their ratios. The target is on
    the CPU per event (the two APIs frame one reply in slightly different numbers of events);
    a run with failed requests does not meet it."""
    cpu = responses.server.cpu_per_response_ms if responses.server else None
    m_cpu = messages.server.cpu_per_response_ms if messages.server else None
    events = responses.events_per_response or 1.0
    m_events = messages.events_per_response or 1.0
    per_event = (cpu or 0.0) / events * 1000
    m_per_event = (m_cpu or 0.0) / m_events * 1000
    counts = " vs ".join(f"{r.events_per_response:.0f}" if r.events_per_response else "-" for r in (messages, responses))
    failed = f", {messages.requests_failed} failed" if messages.requests_failed else ""
    bench.row(
        f"server CPU per streamed message, /v1/messages, c={concurrency}",
        "CPU ms",
        f"{m_cpu or 0:.2f} ms",
        f"{cpu or 0:.2f} ms (/v1/responses)",
        f"{m_cpu / cpu:.2f}×" if m_cpu and cpu else "-",
        "",
        "",
    )
    ratio = m_per_event / per_event if m_cpu and cpu else None
    target = MESSAGES_CPU_RATIO_TARGET
    bench.row(
        f"server CPU per streamed event, /v1/messages, c={concurrency} ({counts} events/response{failed})",
        "CPU µs",
        f"{m_per_event:.1f} µs",
        f"{per_event:.1f} µs (/v1/responses)",
        f"{ratio:.2f}×" if ratio is not None else "-",
        f"≤ {target:g}×",
        _met(ratio is not None and ratio <= target and not messages.requests_failed),
    )


def _first_delta_row(bench: Bench, scenario: str, via: LoadReport, direct: LoadReport, q: str, target: bool = False) -> None:
    through = getattr(via.time_to_first_text_ms, q) or 0.0
    straight = getattr(direct.time_to_first_text_ms, q) or 0.0
    added = through - straight
    bench.row(
        scenario,
        "added by the gateway",
        f"{through:.2f} ms",
        f"{straight:.2f} ms",
        f"{added:+.2f} ms",
        "≤ 1 ms" if target else "",
        _met(added <= 1.0) if target else "",
    )


async def _paced_latency_scenario(bench: Bench, pin: bool) -> None:
    """What the gateway adds to the first text delta at c=1, on a stream paced like a fast model.

    The tokens come 5 ms apart (200 tokens/s).  On the 200-chunk burst the
    simulator writes all its chunks within a millisecond and the gateway
    translates them as they come: on a two-core machine both cores are then
    busy, and the load generator reads the gateway's first delta only when
    one of them is free (the gateway has sent it ~0.6 ms earlier by then).
    A paced stream leaves the load generator a core to read with, and one
    paced stream at a time is light enough for the tools to share one core,
    so from two cores up the gateway gets a core of its own.
    """
    placement = Placement.for_light_load(_cores()) if pin else PLACEMENT
    with _placed(placement):
        async with _simulator(tokens=_PACED_TOKENS, delay=_PACED_DELAY) as (sim_url, sim_proc):
            async with _gateway(sim_url) as (gw_url, gw_proc):
                await run_load(LoadConfig(url=gw_url, api="responses", concurrency=1, requests=20))
                direct = await bench.load(
                    "direct-c1-paced", LoadConfig(url=sim_url, api="chat", concurrency=1, duration=bench.duration), [sim_proc.pid]
                )
                via = await bench.load(
                    "gateway-c1-paced", LoadConfig(url=gw_url, api="responses", concurrency=1, duration=bench.duration), [gw_proc.pid]
                )
    where = ""
    if placement is not PLACEMENT and placement.tools is not None and placement.gateway is not None:
        where = f"; tools on core {min(placement.tools)}, gateway on {', '.join(map(str, sorted(placement.gateway)))}"
    for q in ("p50", "p99"):
        scenario = f"time to first text delta, c=1, tokens {_PACED_DELAY * 1000:.0f} ms apart{where} ({q})"
        _first_delta_row(bench, scenario, via, direct, q, target=q == "p50")


_PACED_TOKENS = 10
_PACED_DELAY = 0.005


# Where a sample's CPU goes: the first frame from the leaf up that one of these names (trio's
# own frames are skipped, so a channel's or a socket's cost lands on the layer that called it).
_LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("event encoding (orjson, SSE frames)", ("encode_event", "event_json", "encode_done")),
    ("upstream read (httptools, SSE and JSON decoding)", ("backends/", "streams/chunks.py", "streams/sse.py")),
    ("translation (translator, session, turn)", ("streams/", "turn/")),
    ("store (record, SQLite)", ("store/", "sqlite3", "zstandard")),
    ("client write (body loop, quart, hypercorn, h11)", ("transport/", "gateway/app.py:_send_response", "quart", "hypercorn", "h11")),
    ("request handling (edge, parse, keys, metrics)", ("gateway/", "werkzeug", "pydantic", "prometheus_client", "opentelemetry")),
]
_SCHEDULER = "trio's scheduler and I/O polling"


def _layer_of(frames: list[str]) -> str:
    for frame in reversed(frames):
        name, _, where = frame.partition(" (")
        path = where.rsplit(":", 1)[0]
        if "trio/" in path or path.startswith("<"):
            continue
        if path.endswith(("gateway/server.py", "gateway/cli.py", "gateway/__main__.py")):
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
        layer = _layer_of(stack.split(";"))
        counts[layer] = counts.get(layer, 0) + int(count)
    total = sum(counts.values()) or 1
    return {layer: n / total for layer, n in sorted(counts.items(), key=lambda kv: -kv[1])}


def _py_spy() -> str | None:
    import shutil

    beside = pathlib.Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


async def _profile_scenario(bench: Bench, gw_url: str, pid: int, per_event_us: float) -> None:
    """A separate c=50 run under py-spy (sampling, not pausing the gateway): µs per event by layer."""
    spy = _py_spy()
    if spy is None:
        bench.row("profile: CPU per event by layer", "", "py-spy not installed", "", "", "", "")
        return
    seconds = max(3, int(bench.duration) - 2)
    out = bench.out / "profile.txt"
    async with trio.open_nursery() as nursery:  # the load and the profiler, side by side
        nursery.start_soon(functools.partial(run_load, LoadConfig(url=gw_url, api="responses", concurrency=50, duration=seconds + 2)))
        await trio.sleep(1)  # into the steady state
        result = await trio.run_process(
            [spy, "record", "--pid", str(pid), "--duration", str(seconds), "--rate", "250", "--nonblocking",
             "--format", "raw", "--output", str(out)],
            capture_stdout=True, capture_stderr=True, check=False,
        )
    if result.returncode != 0 or not out.exists():
        bench.row("profile: CPU per event by layer", "", "py-spy could not attach", "", "", "", "")
        return
    for layer, share in profile_layers(out.read_text()).items():
        bench.row(f"profile, c=50: {layer}", "CPU µs per event", f"{share * per_event_us:.2f} µs", "", f"{share:.0%}", "", "")


async def _heartbeat_scenario(bench: Bench, streams: int) -> None:
    ramp = 30.0 * streams / 5000
    async with _simulator(tokens=5, ttft=30) as (sim_url, _sim_proc):
        async with _gateway(sim_url, heartbeat=2.0) as (gw_url, gw_proc):
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
        f"{(silence or 0) / 2000:.2f} × interval",
        "≤ 1.5 × 2 s",
        _met(silence is not None and silence <= 3000 and report.requests_failed == 0),
    )
    rss = report.server.rss_peak_bytes if report.server else None
    bench.row(
        f"gateway RSS, {streams} open streams",
        "peak RSS",
        f"{(rss or 0) / 2**20:.0f} MiB",
        "",
        f"{report.requests_completed}/{streams} completed",
        "≤ 1 GiB",
        _met(rss is not None and rss <= 2**30),
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


def render(bench: Bench) -> str:
    header = ("scenario", "measure", "gateway", "direct", "ratio / added", "target", "met")
    rows = [header] + [dataclasses.astuple(r) for r in bench.rows]
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(header))]
    lines = []
    for n, row in enumerate(rows):
        lines.append("| " + " | ".join(str(cell).ljust(widths[i]) for i, cell in enumerate(row)) + " |")
        if n == 0:
            lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def machine() -> str:
    cpu = cpu_model() or "unknown CPU"
    return f"{os.cpu_count()} cores ({cpu}), Python {platform.python_version()}, {datetime.date.today().isoformat()}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="bench-results", help="folder for JSON and HTML results")
    parser.add_argument("--duration", type=float, default=8.0, help="seconds per throughput run")
    parser.add_argument(
        "--slow-streams", type=int, default=10000, help="concurrent streams in the largest heartbeat scenario (and 5000)"
    )
    parser.add_argument("--quick", action="store_true", help="shorter runs (smoke test)")
    parser.add_argument(
        "--no-pin", dest="pin", action="store_false", help="let the OS place the processes (default from 3 cores: tools and gateway on separate cores)"
    )
    parser.add_argument(
        "--only",
        choices=["all", "throughput", "shared", "heartbeats"],
        default="all",
        help="one part: throughput (one worker, c=1/50/200; /v1/messages beside /v1/responses at c=50), "
        "shared (the cost of keys, limits and metrics), heartbeats",
    )


def main(args: argparse.Namespace) -> int:
    out = pathlib.Path(args.out)
    bench = trio.run(
        lambda: run_bench(
            out, duration=args.duration, quick=args.quick, slow_streams=args.slow_streams, only=args.only, pin=args.pin
        )
    )
    table = render(bench)
    header = f"Responses gateway benchmark — {machine()}; {PLACEMENT.describe()}"
    if bench.load_average is not None:
        header += "; load average before the run " + ", ".join(f"{n:.2f}" for n in bench.load_average)
    print()
    print(header)
    print()
    print(table)
    (out / "table.md").write_text(header + "\n\n" + table + "\n")
    results = {
        "machine": machine(),
        "load_average": bench.load_average,
        "rows": [dataclasses.asdict(r) for r in bench.rows],
        "runs": bench.reports,
    }
    (out / "bench.json").write_text(json.dumps(results, indent=2))
    return 0 if all(r.met != "NO" for r in bench.rows) else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m gateway.lab.bench", description=__doc__)
    add_arguments(parser)
    sys.exit(main(parser.parse_args()))
