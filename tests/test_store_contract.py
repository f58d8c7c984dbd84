"""One contract, every store: memory, SQLite and Redis behave the same."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio

from gateway.store import MemoryStore, SQLiteStore, StoredResponse

REDIS = shutil.which("redis-server")


def record(response_id: str, *, previous: str | None = None, text: str = "hi") -> StoredResponse:
    return StoredResponse(
        id=response_id,
        response={
            "id": response_id,
            "status": "completed",
            "output": [{"id": f"msg_out_{response_id}", "type": "message", "role": "assistant", "content": []}],
        },
        input_items=[
            {"id": f"msg_in_{response_id}", "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
        ],
        events=[{"type": "response.created", "sequence_number": 0}],
        previous_response_id=previous,
    )


async def start_redis(nursery: trio.Nursery, tmp_path: Any) -> str:
    """A real redis-server on a free port, stopped with the test's nursery."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert REDIS is not None
    proc = await nursery.start(
        lambda task_status: trio.run_process(
            [REDIS, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
            task_status=task_status,
        )
    )
    import redis

    client = redis.Redis(port=port)
    with trio.fail_after(10):
        while True:
            try:
                if await trio.to_thread.run_sync(client.ping):
                    break
            except redis.ConnectionError:
                await trio.sleep(0.02)  # the server process is starting; nothing to wait on but its port
    client.close()
    return f"redis://127.0.0.1:{port}/0"


@pytest.fixture(params=["memory", "sqlite", "redis"])
async def store(request: Any, tmp_path: Any, nursery: trio.Nursery) -> AsyncIterator[Any]:
    if request.param == "memory":
        instance: Any = MemoryStore(max_entries=100)
    elif request.param == "sqlite":
        instance = SQLiteStore(str(tmp_path / "store.sqlite3"))
    else:
        if REDIS is None:
            pytest.skip("redis-server is not installed (.ci/run installs it)")
        from gateway.store.redis import RedisStore

        instance = RedisStore(await start_redis(nursery, tmp_path))
    yield instance
    await instance.aclose()


async def test_a_saved_record_loads_back_equal(store):
    saved = record("resp_a")
    await store.save(saved)
    loaded = await store.load("resp_a")
    assert loaded == saved


async def test_unknown_ids_load_as_none(store):
    assert await store.load("resp_missing") is None
    assert await store.find_item("msg_missing") is None
    assert await store.delete("resp_missing") is False


async def test_saving_again_replaces_the_record_and_its_items(store):
    await store.save(record("resp_b", text="first"))
    await store.save(record("resp_b", text="second"))
    loaded = await store.load("resp_b")
    assert loaded.input_items[0]["content"][0]["text"] == "second"


async def test_items_are_found_by_their_own_id(store):
    await store.save(record("resp_c"))
    assert (await store.find_item("msg_in_resp_c"))["role"] == "user"
    assert (await store.find_item("msg_out_resp_c"))["role"] == "assistant"


async def test_delete_removes_the_record_and_its_items(store):
    await store.save(record("resp_d"))
    assert await store.delete("resp_d") is True
    assert await store.load("resp_d") is None
    assert await store.find_item("msg_in_resp_d") is None
    assert await store.delete("resp_d") is False


async def test_a_loaded_record_is_a_copy(store):
    await store.save(record("resp_e"))
    loaded = await store.load("resp_e")
    loaded.response["status"] = "tampered"
    assert (await store.load("resp_e")).response["status"] == "completed"


async def test_concurrent_saves_and_loads_do_not_interfere(store):
    async with trio.open_nursery() as nursery:
        for n in range(30):
            nursery.start_soon(store.save, record(f"resp_{n}", text=str(n)))
    for n in range(30):
        assert (await store.load(f"resp_{n}")).input_items[0]["content"][0]["text"] == str(n)


async def test_memory_store_evicts_the_least_recently_used_first():
    store = MemoryStore(max_entries=2)
    await store.save(record("resp_1"))
    await store.save(record("resp_2"))
    await store.load("resp_1")  # now resp_2 is the least recently used
    await store.save(record("resp_3"))
    assert await store.load("resp_2") is None
    assert await store.load("resp_1") is not None and await store.load("resp_3") is not None
    assert await store.find_item("msg_in_resp_2") is None


async def test_memory_store_forgets_after_the_ttl():
    now = [0.0]
    store = MemoryStore(max_entries=None, ttl=10, clock=lambda: now[0])
    await store.save(record("resp_t"))
    now[0] = 9.0
    assert await store.load("resp_t") is not None
    now[0] = 20.0
    assert await store.load("resp_t") is None


async def test_sqlite_records_survive_a_restart(tmp_path):
    path = str(tmp_path / "persist.sqlite3")
    first = SQLiteStore(path)
    await first.save(record("resp_p"))
    await first.aclose()
    second = SQLiteStore(path)
    assert (await second.load("resp_p")) == record("resp_p")
    await second.aclose()


async def test_sqlite_is_shared_by_processes_on_one_machine(tmp_path):
    path = str(tmp_path / "shared.sqlite3")
    store = SQLiteStore(path)
    script = (
        "import sys, trio; from gateway.store import SQLiteStore; from gateway.store.base import StoredResponse\n"
        "async def main():\n"
        "    s = SQLiteStore(sys.argv[1])\n"
        "    for n in range(20):\n"
        "        await s.save(StoredResponse(id=f'resp_{sys.argv[2]}_{n}', response={'id': 'x', 'output': []}))\n"
        "    await s.aclose()\n"
        "trio.run(main)\n"
    )
    async with trio.open_nursery() as nursery:
        for worker in ("a", "b"):
            nursery.start_soon(lambda w=worker: trio.run_process([sys.executable, "-c", script, path, w], env=dict(os.environ)))
        for n in range(20):
            await store.save(StoredResponse(id=f"resp_main_{n}", response={"id": "x", "output": []}))
    for worker in ("a", "b", "main"):
        for n in range(20):
            assert await store.load(f"resp_{worker}_{n}") is not None
    await store.aclose()
