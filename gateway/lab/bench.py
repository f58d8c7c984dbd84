"""`just bench`: the standard scenarios, measured side by side in one run.

Starts the backend simulator and the gateway as separate processes (so that
each has its own interpreter and its CPU time can be read from /proc), runs
the load generator in this process, and prints one table whose ratios were
all measured in the same run.  Results also go to `bench-results/` as JSON
and a self-contained HTML page per scenario.

This module only orchestrates: the simulator (`simulator.py`) and the load
generator (`loadtest.py`) do the work.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import os
import pathlib
import platform
import resource
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx2
import trio

from .loadtest import LoadConfig, LoadReport, run_load

__all__ = ["add_arguments", "main", "run_bench"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


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


@contextlib.asynccontextmanager
async def _process(args: Sequence[str], url: str, env: dict[str, str] | None = None) -> AsyncIterator[trio.Process]:
    """A child process serving `url`, stopped (SIGTERM, then SIGKILL) on exit."""
    process = await trio.lowlevel.open_process(
        list(args), env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
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
    async with _process(args, url) as process:
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
    async with _process(args, url, env) as process:
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

    async def load(self, name: str, config: LoadConfig, pids: Sequence[int] = ()) -> LoadReport:
        print(f"  running {name} ...", flush=True)
        report = await run_load(config, server_pids=pids)
        self.reports[name] = json.loads(report.to_json())
        (self.out / f"{name}.json").write_text(report.to_json())
        return report

    def row(self, *cells: str) -> None:
        self.rows.append(Row(*cells))


def _fmt_ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.2f} ms"


def _met(ok: bool) -> str:
    return "yes" if ok else "NO"


async def run_bench(
    out: pathlib.Path, *, duration: float = 8.0, quick: bool = False, slow_streams: int = 5000, only: str = "all"
) -> Bench:
    """Run every scenario (or `only` one part); returns the bench with its table rows."""
    _raise_fd_limit()
    out.mkdir(parents=True, exist_ok=True)
    bench = Bench(out, duration, quick)
    if only == "shared":
        await _shared_service_scenario(bench)
        return bench
    if only == "heartbeats":
        for streams in sorted({min(2000, slow_streams), slow_streams}):
            await _heartbeat_scenario(bench, streams)
        return bench
    # --- throughput and added latency: 200-chunk replies without delay --------
    async with _simulator(tokens=200) as (sim_url, sim_proc):
        async with _gateway(sim_url) as (gw_url, gw_proc):
            warm = LoadConfig(url=gw_url, api="responses", concurrency=4, requests=40)
            await run_load(warm)
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
                        through = getattr(via.time_to_first_text_ms, q) or 0.0
                        straight = getattr(direct.time_to_first_text_ms, q) or 0.0
                        added = through - straight
                        target = "≤ 1 ms" if (concurrency == 1 and q == "p50") else ""
                        bench.row(
                            f"time to first text delta, c={concurrency} ({q})",
                            "added by the gateway",
                            f"{through:.2f} ms",
                            f"{straight:.2f} ms",
                            f"{added:+.2f} ms",
                            target,
                            _met(added <= 1.0) if target else "",
                        )
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
                        "≤ 8 ms",
                        _met(cpu is not None and cpu <= 8.0),
                    )
                    bench.row(
                        "server CPU per relayed event, c=50",
                        "CPU µs",
                        f"{(cpu or 0) / events * 1000:.1f} µs",
                        f"{events:.0f} events/response",
                        "",
                        "",
                        "",
                    )
                    single = via.throughput_rps

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
            bench.row(
                "gateway serve --workers 2, c=50",
                "responses/s",
                f"{two.throughput_rps:.1f}",
                f"{single:.1f} (1 worker)",
                f"{scale:.2f}",
                "≥ 1.6",
                _met(scale >= 1.6),
            )

    await _shared_service_scenario(bench)

    # --- heartbeats under load: slow first token ---------------------------------
    if slow_streams <= 0:
        return bench
    for streams in sorted({min(2000, slow_streams), slow_streams}):
        await _heartbeat_scenario(bench, streams)
    return bench


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
    cpu = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return f"{os.cpu_count()} cores ({cpu}), Python {platform.python_version()}, {datetime.date.today().isoformat()}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="bench-results", help="folder for JSON and HTML results")
    parser.add_argument("--duration", type=float, default=8.0, help="seconds per throughput run")
    parser.add_argument("--slow-streams", type=int, default=5000, help="concurrent streams in the heartbeat scenario")
    parser.add_argument("--quick", action="store_true", help="shorter runs (smoke test)")
    parser.add_argument(
        "--only",
        choices=["all", "throughput", "shared", "heartbeats"],
        default="all",
        help="one part: throughput (one worker, c=1/50/200), shared (the cost of keys, limits and metrics), heartbeats",
    )


def main(args: argparse.Namespace) -> int:
    out = pathlib.Path(args.out)
    bench = trio.run(
        lambda: run_bench(out, duration=args.duration, quick=args.quick, slow_streams=args.slow_streams, only=args.only)
    )
    table = render(bench)
    header = f"Responses gateway benchmark — {machine()}"
    print()
    print(header)
    print()
    print(table)
    (out / "table.md").write_text(header + "\n\n" + table + "\n")
    (out / "bench.json").write_text(json.dumps({"machine": machine(), "rows": [dataclasses.asdict(r) for r in bench.rows], "runs": bench.reports}, indent=2))
    return 0 if all(r.met != "NO" for r in bench.rows) else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m gateway.lab.bench", description=__doc__)
    add_arguments(parser)
    sys.exit(main(parser.parse_args()))
