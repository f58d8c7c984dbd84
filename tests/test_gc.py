"""The garbage collector, settled once `gateway serve` serves (thousands of open streams made its
full collections stall every stream); a program that embeds the gateway keeps its own settings."""

from __future__ import annotations

import gc

from gateway.server.loop import GC_THRESHOLDS as _GC_THRESHOLDS, settle_garbage_collector


def test_settling_freezes_what_start_up_made_and_collects_less_often():
    before = gc.get_threshold()
    try:
        settle_garbage_collector()
        assert gc.get_threshold() == _GC_THRESHOLDS
        assert gc.get_freeze_count() > 0  # the modules and the app are out of the collector's sight
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


async def test_an_embedded_gateway_leaves_the_programs_collector_alone(start_gateway, client):
    before = gc.get_threshold()
    url = await start_gateway()
    assert (await client.get(url + "/health")).status_code == 200
    assert gc.get_threshold() == before
