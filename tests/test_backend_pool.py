"""The upstream connection pool: shards fill in order, so a quiet gateway reuses one pool."""

from __future__ import annotations

import contextlib

from gateway.backends.openai import _SHARD_SIZE, _ShardedPool


def test_leases_stay_on_the_first_shard_until_it_is_full():
    pool = _ShardedPool(max_connections=_SHARD_SIZE * 3)
    with contextlib.ExitStack() as stack:
        first = [stack.enter_context(pool.lease()) for _ in range(_SHARD_SIZE)]
        assert len(set(map(id, first))) == 1 and len(pool.transports) == 1
        spill = stack.enter_context(pool.lease())
        assert spill is pool.transports[1]
    # Everything released: the next lease goes back to the first shard.
    with pool.lease() as transport:
        assert transport is pool.transports[0]


def test_when_every_shard_is_full_the_least_busy_one_is_used():
    pool = _ShardedPool(max_connections=2)  # one shard of two
    with contextlib.ExitStack() as stack:
        leases = [stack.enter_context(pool.lease()) for _ in range(5)]
    assert len(pool.transports) == 1 and all(t is pool.transports[0] for t in leases)
