"""`just bench`'s own logic: the profile's layers, where the processes run, and the rows that
compare the Messages front end with the Responses route."""

from __future__ import annotations

import dataclasses
import pathlib

import pytest

from gateway.lab import loadtest
from gateway.lab.bench import Bench, Placement, _messages_rows, profile_layers, render
from gateway.lab.loadtest import ApiKind, LoadConfig, LoadReport, RequestResult, ServerUsage

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
            "client write (body loop, quart, hypercorn, h11)": 0.10,  # trio's channel, on the writer's account
            "store (record, SQLite)": 0.10,
        }
    )
    assert abs(sum(layers.values()) - 1.0) < 1e-9


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


def messages_rows(tmp_path: pathlib.Path, responses: LoadReport, messages: LoadReport) -> Bench:
    bench = Bench(tmp_path, 1.0, quick=True)
    _messages_rows(bench, responses, messages, 50)
    return bench


def test_the_messages_route_is_measured_per_message_and_per_event_beside_the_responses_route(tmp_path: pathlib.Path):
    # 1.60 ms over 208 events is 7.7 µs an event; 1.80 ms over 205 events is 8.8 µs: 1.14×.
    bench = messages_rows(
        tmp_path, run_report("responses", cpu_ms=1.60, events=208), run_report("messages", cpu_ms=1.80, events=205)
    )
    per_message, per_event = bench.rows

    assert dataclasses.astuple(per_message) == (
        "server CPU per streamed message, /v1/messages, c=50", "CPU ms", "1.80 ms", "1.60 ms (/v1/responses)",
        "1.12×", "", "",
    )  # fmt: skip
    assert dataclasses.astuple(per_event) == (
        "server CPU per streamed event, /v1/messages, c=50 (205 vs 208 events/response)", "CPU µs", "8.8 µs",
        "7.7 µs (/v1/responses)", "1.14×", "≤ 1.2×", "yes",
    )  # fmt: skip
    table = render(bench).splitlines()
    assert table[0].startswith("| scenario ") and len(table) == 4
    cells = [cell.strip() for cell in table[3].strip("|").split("|")]
    assert cells == list(dataclasses.astuple(per_event))


@pytest.mark.parametrize(
    ("messages", "ratio"),
    [
        (run_report("messages", cpu_ms=2.00, events=208), "1.25×"),  # over the target
        (run_report("messages", cpu_ms=1.60, events=208, failed=3), "1.00×"),  # on target, but requests failed
        (run_report("messages", cpu_ms=None, events=208), "-"),  # the gateway's CPU was not sampled
        (run_report("messages", cpu_ms=None, events=0, completed=0, failed=5), "-"),  # nothing completed
    ],
)
def test_the_messages_target_is_missed_over_1_2x_with_failures_or_without_figures(
    tmp_path: pathlib.Path, messages: LoadReport, ratio: str
):
    bench = messages_rows(tmp_path, run_report("responses", cpu_ms=1.60, events=208), messages)
    per_event = bench.rows[-1]

    assert (per_event.ratio, per_event.target, per_event.met) == (ratio, "≤ 1.2×", "NO")
    if messages.requests_failed:
        assert f"{messages.requests_failed} failed)" in per_event.scenario
    if not messages.requests_completed:
        assert "(- vs 208 events/response, 5 failed)" in per_event.scenario
