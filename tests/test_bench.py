"""`just bench`'s own logic: the profile's layers, where the processes run, the rows of every
path (medians and ranges of the rounds, against the simulator and the hot route), how busy the
machine was, and the floor relay."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import signal
import subprocess
import sys
import time

import httpx2
import pytest
import trio

from gateway.lab import loadtest
from gateway.lab import floor
from gateway.lab.bench import (
    PATHS, Bench, Placement, Row, Spread, _PacedScenario, _ScaleScenario, _path_rows, _Scenario, _spread, idle_policy, profile_layers, render, render_reproduction, reproduced,
)
from gateway.lab.simulator import SimConfig, Simulator
from gateway.lab.loadtest import ApiKind, LoadConfig, LoadReport, RequestResult, ServerUsage

from conftest import parse_sse

RAW = """\
<module> (gateway/__main__.py:4);main (gateway/cli.py:80);run (trio/_core/_run.py:2532);unrolled_run (trio/_core/_run.py:2866);get_events (trio/_core/_io_epoll.py:243) 30
<module> (gateway/__main__.py:4);_run_round (gateway/turn/engine.py:195);__anext__ (gateway/backends/openai.py:100);receive (gateway/backends/http1.py:151) 20
<module> (gateway/__main__.py:4);_run_round (gateway/turn/engine.py:195);feed (gateway/streams/translator.py:490);_event (gateway/streams/translator.py:712) 25
<module> (gateway/__main__.py:4);emit (gateway/transport/sse.py:180);encode_event (gateway/streams/sse.py:129) 5
<module> (gateway/__main__.py:4);_next_write (gateway/transport/sse.py:140);send (trio/_channel.py:200) 10
<module> (gateway/__main__.py:4);save (gateway/store/sqlite.py:135);_write (gateway/store/sqlite.py:144) 10
"""


def test_profile_samples_are_grouped_by_the_layer_that_spent_them():
    layers = profile_layers(RAW)
    assert layers == pytest.approx(
        {
            "trio's scheduler and I/O polling": 0.30,
            "upstream read (httptools, SSE and JSON decoding)": 0.20,
            "translation (translator, session, turn)": 0.25,
            "event encoding (orjson, SSE frames)": 0.05,
            "client write (body loop, the HTTP server, quart)": 0.10,  # trio's channel, on the writer's account
            "store (record, SQLite)": 0.10,
        }
    )
    assert abs(sum(layers.values()) - 1.0) < 1e-9


def test_an_idle_worker_thread_waiting_for_a_job_is_not_counted_but_its_jobs_are():
    idle = "_bootstrap (threading.py:995);run (threading.py:975);WorkerThread._work (trio/_core/_thread_cache.py:211) 70"
    job = (
        "_bootstrap (threading.py:995);WorkerThread._work (trio/_core/_thread_cache.py:212);"
        "WorkerThread._handle_job (trio/_core/_thread_cache.py:189);_checkpoint (gateway/store/sqlite.py:163) 10"
    )
    layers = profile_layers(RAW + idle + "\n" + job + "\n")
    assert layers["store (record, SQLite)"] == pytest.approx(20 / 110)
    assert layers["trio's scheduler and I/O polling"] == pytest.approx(30 / 110)


def test_the_tools_and_the_gateway_get_cores_of_their_own_from_three_cores_up():
    spacious = Placement.for_cores([0, 1, 2, 3])
    assert spacious.tools == {0} and spacious.gateway == {1, 2, 3} and spacious.cores == 4
    assert "pinned to core [0]" in spacious.describe()
    # On two cores the simulator and the load generator need more than one between them.
    for cores in ([0, 1], [5]):
        placement = Placement.for_cores(cores)
        assert placement.tools is None and placement.gateway is None and placement.cores == len(cores)
        assert placement.describe().startswith("not pinned") and "cores" in placement.describe()
    assert "no CPU affinity" in Placement.for_cores([]).describe()


def test_a_light_load_gives_the_gateway_a_core_of_its_own_from_two_cores_up():
    light = Placement.for_light_load([0, 1])
    assert light.tools == {0} and light.gateway == {1}
    assert Placement.for_light_load([2, 3, 4]).gateway == {3, 4}
    alone = Placement.for_light_load([7])
    assert alone.tools is None and alone.gateway is None


def run_report(api: ApiKind, *, cpu_ms: float | None, events: int, completed: int = 100, failed: int = 0) -> LoadReport:
    """A c=50 run's report: `completed` streams of `events` events, the server's CPU per response."""
    config = LoadConfig(url="http://127.0.0.1:1", api=api, concurrency=50)
    results = [RequestResult(status=200, events=events, total=0.1, ended=0.1) for _ in range(completed)]
    results += [RequestResult(status=200, error="no_terminal", ended=0.1) for _ in range(failed)]
    report = loadtest._aggregate(config, results, loadtest._Counters(), 0.0, 1.0, 0.0, None)
    if cpu_ms is None:
        return report
    usage = ServerUsage([1], 1, cpu_ms * completed / 1000, cpu_ms, 0, 0, 0.0, 2)
    return dataclasses.replace(report, server=usage)


def burst_runs(cpu_ms: dict[str, list[float]], rps: dict[str, list[float]], events: int = 208) -> dict[tuple[str, int], list[LoadReport]]:
    """Three rounds at c=50 of every path and of the simulator direct (streamed and JSON)."""
    runs: dict[tuple[str, int], list[LoadReport]] = {}
    for name in [path.name for path in PATHS] + ["direct-stream", "direct-json"]:
        path = next((p for p in PATHS if p.name == name), None)
        api: ApiKind = path.api if path is not None else "chat"
        runs[(name, 50)] = [
            run_report(api, cpu_ms=cpu, events=1 if path is not None and not path.stream else events, completed=int(r))
            for cpu, r in zip(cpu_ms[name], rps[name])
        ]
    return runs


def path_rows(tmp_path: pathlib.Path, cpu_ms: dict[str, list[float]], rps: dict[str, list[float]]) -> dict[str, Row]:
    bench = Bench(tmp_path, 1.0, quick=True)
    _path_rows(bench, burst_runs(cpu_ms, rps), 50)
    return {row.scenario: row for row in bench.rows}


HOT_ROUTE, JSON, SOCKET, RELAY, SESSION, MESSAGES = (path.name for path in PATHS)


def test_every_path_is_a_median_with_its_range_over_the_rounds_against_the_simulator(tmp_path: pathlib.Path):
    cpu = {name: [2.0, 2.4, 2.2] for name in [p.name for p in PATHS] + ["direct-stream", "direct-json"]}
    cpu[SOCKET] = [2.3, 2.8, 2.5]  # 1.15x the hot route's, the median of the round-by-round ratios
    rps = {name: [100.0, 90.0, 110.0] for name in cpu}
    rps["direct-stream"] = [200.0, 200.0, 200.0]
    rps[RELAY] = [170.0, 150.0, 180.0]  # 0.85 of direct at the median
    rows = path_rows(tmp_path, cpu, rps)

    hot = rows[f"{HOT_ROUTE}, 200-chunk burst, c=50"]
    assert hot.gateway == "2.20 ms [2.00 to 2.40]; 100 [90 to 110]/s"
    assert hot.direct == "2.20 ms [2.00 to 2.40]; 200 [200 to 200]/s"
    assert (hot.ratio, hot.target, hot.met) == ("0.50 [0.45 to 0.55]", "≥ 0.50", "yes")
    relay = rows[f"{RELAY}, 200-chunk burst, c=50"]
    assert (relay.ratio, relay.target, relay.met) == ("0.85 [0.75 to 0.90]", "≥ 0.80", "yes")
    assert rows[f"{JSON}, 200-chunk burst, c=50"].direct.endswith("(JSON)")
    socket = rows[f"{SOCKET} against the hot route, c=50"]
    assert (socket.measured, socket.ratio, socket.target, socket.met) == ("CPU per response", "1.15 [1.14 to 1.17]×", "≤ 1.2×", "yes")
    messages = rows[f"{MESSAGES} against the hot route, c=50"]
    assert (messages.measured, messages.target, messages.met) == ("CPU per event", "≤ 1.2×", "yes")
    assert not any(row.scenario.startswith(f"{SESSION} against") for row in rows.values())  # chat is not compared so
    table = render(Bench(tmp_path, 1.0, quick=True)).splitlines()
    assert table[0].startswith("| scenario ")


@pytest.mark.parametrize(
    ("path", "cpu", "rps", "failed_row"),
    [
        (SOCKET, [3.0, 3.0, 3.0], None, f"{SOCKET} against the hot route, c=50"),  # 1.36x the hot route
        (MESSAGES, [2.9, 2.9, 2.9], None, f"{MESSAGES} against the hot route, c=50"),  # 1.32x per event
        (RELAY, None, [100.0, 100.0, 100.0], f"{RELAY}, 200-chunk burst, c=50"),  # 0.5 of direct
        (HOT_ROUTE, None, [80.0, 90.0, 95.0], f"{HOT_ROUTE}, 200-chunk burst, c=50"),  # under half of direct
    ],
)
def test_a_path_over_its_target_is_a_no(tmp_path: pathlib.Path, path: str, cpu: list[float] | None, rps: list[float] | None, failed_row: str):
    cpus = {name: [2.2, 2.2, 2.2] for name in [p.name for p in PATHS] + ["direct-stream", "direct-json"]}
    rates = {name: [200.0, 200.0, 200.0] for name in cpus}
    if cpu is not None:
        cpus[path] = cpu
    if rps is not None:
        rates[path] = rps
    rows = path_rows(tmp_path, cpus, rates)
    assert rows[failed_row].met == "NO"


def test_spread_says_the_median_and_the_range():
    assert Spread([3.0, 1.0, 2.0]).plain(1, "µs") == "2.0 µs [1.0 to 3.0]"
    assert Spread([0.5, -0.25, 1.0]).plain(2, "ms", signed=True) == "+0.50 ms [-0.25 to +1.00]"
    assert Spread([4.0, 1.0, 2.0, 3.0]).median == 2.5


def test_a_machine_that_was_busy_before_or_during_the_run_is_named_so(tmp_path: pathlib.Path, monkeypatch):
    bench = Bench(tmp_path, 1.0, quick=True)
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    bench.load_average, bench.others_cpu = (0.4, 0.3, 0.2), 0.02
    assert bench.busy() is None
    bench.load_average = (1.6, 1.0, 0.5)
    assert "load average was 1.60" in (bench.busy() or "")
    bench.load_average, bench.others_cpu = (0.2, 0.2, 0.2), 0.35
    assert "other processes used 0.35 of a core" in (bench.busy() or "")


def test_the_bench_notes_the_cpu_other_processes_used_while_it_ran(tmp_path: pathlib.Path):
    bench = Bench(tmp_path, 1.0, quick=True)
    busy = spawn_spinner()
    try:
        end = time.monotonic() + 0.6
        while time.monotonic() < end:  # this process waits; the spinner (not the bench's) burns a core
            time.sleep(0.05)
        bench.finish()
    finally:
        os.killpg(busy.pid, signal.SIGKILL)  # the shell and the spinner it started
        busy.wait()
    assert bench.others_cpu is not None and bench.others_cpu > 0.5
    assert bench.load_average_after is not None


def spawn_spinner() -> subprocess.Popen[bytes]:
    # started by another process, so that this one's children's CPU does not count it as the bench's own
    return subprocess.Popen(["/bin/sh", "-c", f"exec {sys.executable} -c 'while True: pass' & wait"], start_new_session=True)


async def test_the_floor_relays_a_paced_stream_one_frame_per_chunk(nursery: trio.Nursery):
    simulator = Simulator(SimConfig(tokens=5))
    sim_url = await nursery.start(simulator.serve)
    url = await nursery.start(floor.serve, 0, sim_url)
    with trio.fail_after(30):
        report = await loadtest.run_load(
            LoadConfig(url=url, model="sim:delay=0.01,step=0.01,tokens=5", requests=4, concurrency=2)
        )
    assert (report.requests_completed, report.requests_failed) == (4, 0), report.failure_examples
    assert report.terminals == {"response.completed": 4}
    assert report.events_per_response == 6  # a delta per token, and the terminal event


async def test_the_floor_on_hypercorn_relays_sse_and_a_websocket_message_per_event(nursery: trio.Nursery):
    simulator = Simulator(SimConfig(tokens=5))
    sim_url = await nursery.start(simulator.serve)
    url = await nursery.start(floor.serve_hypercorn, 0, sim_url)
    model = "sim:delay=0.01,step=0.01,tokens=5"
    with trio.fail_after(30):
        streamed = await loadtest.run_load(LoadConfig(url=url, model=model, requests=4, concurrency=2))
        turns = await loadtest.run_load(LoadConfig(url=url, model=model, websocket=True, requests=4, concurrency=2))
    for report in (streamed, turns):
        assert (report.requests_completed, report.requests_failed) == (4, 0), report.failure_examples
        assert report.terminals == {"response.completed": 4}
        assert report.events_per_response == 6  # a delta per token, and the terminal event, a message each


async def test_the_decoding_floor_writes_each_chunk_as_a_whole_delta_event_and_the_whole_text_at_the_end(
    nursery: trio.Nursery,
):
    simulator = Simulator(SimConfig(tokens=5))
    sim_url = await nursery.start(simulator.serve)
    url = await nursery.start(floor.serve, 0, sim_url, True)
    async with httpx2.AsyncClient() as client:
        with trio.fail_after(30):
            for _ in range(2):  # the second on the same kept-alive backend connection
                answer = await client.post(f"{url}/v1/responses", json={"model": "sim:delay=0.005,tokens=5"})
                events = [e for e in parse_sse(answer.content) if isinstance(e, dict)]
                deltas, (completed,) = events[:-1], events[-1:]
                assert [e["type"] for e in deltas] == ["response.output_text.delta"] * 5
                assert [e["sequence_number"] for e in deltas] == [0, 1, 2, 3, 4]
                for event in deltas:  # every field the spec gives the event, and a word of text
                    assert set(event) == {"type", "sequence_number", "item_id", "output_index", "content_index", "delta", "logprobs"}
                    assert event["delta"].strip()
                assert completed["type"] == "response.completed"
                assert completed["response"]["output"][0]["content"][0]["text"] == "".join(e["delta"] for e in deltas)


def test_the_machine_names_how_its_idle_cores_wait(tmp_path: pathlib.Path):
    assert idle_policy(tmp_path) is None  # no cpuidle: nothing said
    cpuidle = tmp_path / "devices/system/cpu/cpuidle"
    cpuidle.mkdir(parents=True)
    (cpuidle / "current_driver").write_text("intel_idle\n")
    assert idle_policy(tmp_path) == "cpuidle intel_idle"
    (cpuidle / "current_driver").write_text("haltpoll\n")
    assert idle_policy(tmp_path) == "cpuidle haltpoll"
    params = tmp_path / "module/haltpoll/parameters"
    params.mkdir(parents=True)
    (params / "guest_halt_poll_ns").write_text("0\n")
    assert idle_policy(tmp_path) == "cpuidle haltpoll, guest_halt_poll_ns=0: idle cores halt at once"
    (params / "guest_halt_poll_ns").write_text("200000\n")
    assert idle_policy(tmp_path) == "cpuidle haltpoll, idle cores poll 200 µs before halting"


def test_a_later_run_reproduces_a_row_when_its_median_lies_within_the_earlier_range(tmp_path: pathlib.Path):
    earlier = Bench(tmp_path, 1.0, quick=True)
    earlier.row("share, c=50", "share", "", "", "", "", "", figure=Spread([0.40, 0.43, 0.41]))
    earlier.row("ratio, c=1", "ratio", "", "", "", "", "", figure=Spread([1.50, 1.60, 1.55]))
    earlier.row("a note", "", "", "", "", "", "")  # no figure: not compared
    later = Bench(tmp_path, 1.0, quick=True)
    later.row("share, c=50", "share", "", "", "", "", "", figure=Spread([0.39, 0.42, 0.45]))  # median 0.42: inside
    later.row("ratio, c=1", "ratio", "", "", "", "", "", figure=Spread([1.70, 1.65, 1.75]))  # median 1.70: outside
    later.row("a note", "", "", "", "", "", "")
    later.row("new row", "", "", "", "", "", "", figure=Spread([1.0]))  # not in the earlier run
    as_saved = [dataclasses.asdict(r) for r in earlier.rows]  # bench.json's rows
    found = reproduced(as_saved, later.rows)
    assert [(r.scenario, r.inside) for r in found] == [("share, c=50", True), ("ratio, c=1", False)]
    text = render_reproduction(found, "run1/bench.json")
    assert text.splitlines() == [
        "Against run1/bench.json: 1 of 2 medians inside the earlier run's ranges.",
        "- outside: ratio, c=1: 1.7 against [1.5 to 1.6]",
    ]
    assert "figure" not in render(later).splitlines()[0]  # the table keeps its seven columns


async def test_the_scenarios_rounds_take_turns_over_the_whole_run_and_their_rows_keep_their_order(tmp_path: pathlib.Path):
    bench = Bench(tmp_path, 1.0, quick=True, rounds=3)
    calls: list[str] = []

    class Recorded(_Scenario):
        def __init__(self, name: str) -> None:
            super().__init__(bench)
            self.name = name

        async def open(self, stack) -> None:
            calls.append(f"open {self.name}")
            stack.callback(calls.append, f"close {self.name}")

        async def round(self, round_: int) -> None:
            calls.append(f"{self.name} r{round_}")

        async def after(self) -> None:
            calls.append(f"after {self.name}")

        def rows(self) -> None:
            bench.row(self.name, "", "", "", "", "", "")

    await _spread(bench, [Recorded("latency"), Recorded("paths"), Recorded("floors")])

    # Every process up first, then round 1 of each scenario, round 2 of each...: a drift of the
    # machine while the bench runs reaches every scenario's rounds alike.
    assert calls == [
        "open latency", "open paths", "open floors",
        "latency r0", "paths r0", "floors r0",
        "latency r1", "paths r1", "floors r1",
        "latency r2", "paths r2", "floors r2",
        "after latency", "after paths", "after floors",
        "close floors", "close paths", "close latency",
    ]
    assert [row.scenario for row in bench.rows] == ["latency", "paths", "floors"]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 if hasattr(os, "sched_getaffinity") else True, reason="needs two cores")
async def test_a_process_the_bench_starts_unpinned_may_run_on_every_core_after_a_pinned_scenario_started_its_own():
    # trio starts processes from its worker threads; one made while a scenario had this thread
    # pinned keeps that core, and a child it starts inherits it unless told otherwise (the
    # paths, paced and floor scenarios' gateways and simulators once all shared core 0).
    from gateway.lab import bench

    every = set(os.sched_getaffinity(0))
    first, second = sorted(every)[:2]
    async with contextlib.AsyncExitStack() as stack:
        with bench._placed(Placement({first}, {second}, len(every))):
            _, pinned = await stack.enter_async_context(bench._simulator(tokens=1))
        _, unpinned = await stack.enter_async_context(bench._simulator(tokens=1))
        assert os.sched_getaffinity(pinned.pid) == {first}
        assert os.sched_getaffinity(unpinned.pid) == every
    assert os.sched_getaffinity(0) == every


def paced_report(cpu_ms: float, first: float, total: float) -> LoadReport:
    """A paced run: 50 streams of 100 events, every stream's first text and end at these seconds."""
    config = LoadConfig(url="http://127.0.0.1:1", api="responses", concurrency=50)
    results = [RequestResult(status=200, events=100, time_to_first_text=first, total=total, ended=total) for _ in range(50)]
    report = loadtest._aggregate(config, results, loadtest._Counters(), 0.0, 1.0, 0.0, None)
    return dataclasses.replace(report, server=ServerUsage([1], 1, cpu_ms * 50 / 1000, cpu_ms, 0, 0, 0.0, 2))


def paced_rows(tmp_path: pathlib.Path, wave_ms: float, added_s: float) -> dict[str, Row]:
    bench = Bench(tmp_path, 1.0, quick=True)
    paced = _PacedScenario(bench)
    paced.direct = [paced_report(4.0, 0.040, 2.02) for _ in range(3)]
    paced.via = [paced_report(12.0, 0.040 + added_s, 2.02 + added_s) for _ in range(3)]
    paced.wave = [paced_report(wave_ms, 0.040, 0.040) for _ in range(3)]
    paced.spread_direct = [paced_report(4.0, 0.001, 2.0) for _ in range(3)]
    paced.spread_via = [paced_report(12.0, 0.0025, 2.0) for _ in range(3)]
    paced.rows()
    return {row.scenario: row for row in bench.rows}


def test_a_paced_streams_added_time_over_its_target_names_the_wave_of_responses_ahead_of_it(tmp_path: pathlib.Path):
    rows = paced_rows(tmp_path, wave_ms=2.0, added_s=0.030)
    wave = rows["the paced streams' wave: 50 streams end on the same 20 ms step and start again together"]
    assert wave.gateway == "2.00 ms [2.00 to 2.00]"
    assert wave.direct == "× 50 streams = 100 ms of CPU per wave, 5.0 steps"
    first = rows["time added to each event, paced, c=50: the first text delta (p50)"]
    assert first.gateway == "+30.00 ms [+30.00 to +30.00]"
    # Half the wave ahead of the median stream: 25 × 2 ms; +5 ms needs 0.2 ms per response.
    assert first.met == "NO: the wave ahead of it, 25 × 2.00 ms = 50 ms of CPU; ≤ +5 ms needs ≤ 0.20 ms per response"
    last = rows["time added to each event, paced, c=50: the last event (p99)"]
    assert last.met.startswith("NO: the wave ahead of it, 49 × 2.00 ms = 98 ms of CPU")
    # Started one by one, the same streams are within the targets, and no wave is named.
    spread = rows["time added to each event, paced, c=50, starts spread over 2 s (the streams end and start one by one): the first text delta (p50)"]
    assert (spread.gateway, spread.met) == ("+1.50 ms [+1.50 to +1.50]", "yes")
    # Per event: 12 µs against the simulator's 4 µs.
    assert rows["CPU per relayed event, paced: 50 streams, a chunk per write 20 ms apart"].ratio == "3.00 [3.00 to 3.00]× the simulator"


def test_a_paced_stream_within_its_target_is_a_plain_yes_and_a_light_wave_names_no_floor(tmp_path: pathlib.Path):
    assert paced_rows(tmp_path, wave_ms=2.0, added_s=0.003)["time added to each event, paced, c=50: the last event (p50)"].met == "yes"
    # Over the target, but the wave ahead of it is lighter than the target: not the floor.
    light = paced_rows(tmp_path, wave_ms=0.1, added_s=0.030)
    assert light["time added to each event, paced, c=50: the first text delta (p50)"].met == "NO"


def test_a_scale_row_says_cpu_per_event_the_added_time_whether_the_gateway_keeps_up_and_when_the_tools_fall_behind(tmp_path: pathlib.Path):
    bench = Bench(tmp_path, 1.0, quick=True)
    scale = _ScaleScenario(bench, streams=(500,))
    # Direct: a 2 s stream lasts 2.5 s (the tools themselves behind); one worker keeps 0.96 of it.
    direct = [dataclasses.replace(paced_report(4.0, 0.001, 2.5), throughput_rps=100.0) for _ in range(3)]
    scale.runs[("direct", 500)] = direct
    scale.runs[("1w", 500)] = [dataclasses.replace(paced_report(6.0, 0.001, 2.6), throughput_rps=96.0) for _ in range(3)]
    scale.runs[("2w", 500)] = [dataclasses.replace(paced_report(8.0, 0.001, 3.0), throughput_rps=50.0) for _ in range(3)]
    scale.rows()
    rows = {row.scenario: row for row in bench.rows}
    one = rows["paced at scale: 500 streams, a chunk per 20 ms each, one worker"]
    assert one.gateway == "60.0 µs [60.0 to 60.0]; +100.0 ms [+100.0 to +100.0] / +100.0 ms [+100.0 to +100.0]"
    assert one.direct == "40.0 µs [40.0 to 40.0] (simulator); the tools fall behind: a 2 s stream lasts 2.5 s direct"
    assert (one.ratio, one.target, one.met) == ("0.96 [0.96 to 0.96]", "keeps up: ≥ 0.95", "yes")
    two = rows["paced at scale: 500 streams, a chunk per 20 ms each, --workers 2"]
    assert (two.ratio, two.met) == ("0.50 [0.50 to 0.50]", "NO")
