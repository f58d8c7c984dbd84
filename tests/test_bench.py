"""`just bench`'s own logic: the profile's layers and where the processes run."""

from __future__ import annotations

import pytest

from gateway.lab.bench import Placement, profile_layers

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
