"""One contract, every store: memory, SQLite and Redis behave the same."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
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


async def start_redis(nursery: trio.Nursery, tmp_path: Any, *, appendonly: bool = False) -> str:
    """A real redis-server on a free port, stopped with the test's nursery."""
    url, _process = await start_redis_process(nursery, tmp_path, appendonly=appendonly)
    return url


async def run_stoppable_redis(
    directory: Any, port: int, *, task_status: trio.TaskStatus[tuple[str, trio.Process, trio.CancelScope]]
) -> None:
    """A redis-server the test can stop (cancel the scope it reports) and start again on the same port."""
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as inner:
            url, process = await start_redis_process(inner, directory, port=port)
            task_status.started((url, process, scope))


async def start_redis_process(
    nursery: trio.Nursery, directory: Any, *, appendonly: bool = False, port: int = 0
) -> tuple[str, trio.Process]:
    """A real redis-server (on `port`, or a free one) keeping its files in `directory`, and its process."""
    import socket

    if not port:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
    assert REDIS is not None
    os.makedirs(directory, exist_ok=True)
    persistence = ["--appendonly", "yes", "--appendfsync", "everysec"] if appendonly else ["--appendonly", "no"]
    process: trio.Process = await nursery.start(
        lambda task_status: trio.run_process(
            [REDIS, "--port", str(port), "--bind", "127.0.0.1", "--save", "", *persistence, "--dir", str(directory)],
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
            except (redis.ConnectionError, redis.exceptions.BusyLoadingError):
                await trio.sleep(0.02)  # the server process is starting; nothing to wait on but its port
    client.close()
    return f"redis://127.0.0.1:{port}/0", process


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


TTL = 10.0


@pytest.fixture(params=["memory", "sqlite", "redis"])
async def expiring(
    request: Any, tmp_path: Any, nursery: trio.Nursery
) -> AsyncIterator[tuple[Any, Callable[[float], Awaitable[None]]]]:
    """A store keeping records for `TTL` seconds, and `advance(seconds)`, which makes that time pass.

    Memory and SQLite read an injected clock.  Redis expires keys on its own
    clock, so there time passes by shortening what is left of every key's
    expiry (a key left with none is gone, as Redis's expiry would have it);
    a key without an expiry is left alone, as time would leave it.
    """
    now = [1_800_000_000.0]
    closers: list[Callable[[], Any]] = []

    async def advance(seconds: float) -> None:
        now[0] += seconds

    if request.param == "memory":
        instance: Any = MemoryStore(max_entries=100, ttl=TTL, clock=lambda: now[0])
    elif request.param == "sqlite":
        instance = SQLiteStore(str(tmp_path / "store.sqlite3"), ttl=TTL, clock=lambda: now[0])
    else:
        if REDIS is None:
            pytest.skip("redis-server is not installed (.ci/run installs it)")
        import redis

        from gateway.store.redis import RedisStore

        url = await start_redis(nursery, tmp_path)
        instance = RedisStore(url, ttl=TTL)
        client = redis.Redis.from_url(url)
        closers.append(client.close)

        def shorten(milliseconds: int) -> None:
            for key in client.scan_iter():
                left = client.pttl(key)
                if left >= 0:  # -1: no expiry
                    client.pexpire(key, left - milliseconds)  # not positive: the key is deleted

        async def advance(seconds: float) -> None:
            await trio.to_thread.run_sync(shorten, int(seconds * 1000))

    yield instance, advance
    await instance.aclose()
    for close in closers:
        close()


async def test_a_record_older_than_the_ttl_is_unknown_by_id_and_by_item(expiring):
    store, advance = expiring
    await store.save(record("resp_old"))
    await advance(TTL - 1)
    assert await store.load("resp_old") is not None
    assert await store.holder_of("msg_in_resp_old") is not None
    await advance(2)
    assert await store.load("resp_old") is None
    assert await store.holder_of("msg_in_resp_old") is None
    assert await store.holder_of("msg_out_resp_old") is None
    assert await store.update("resp_old", bump) is None
    assert await store.delete("resp_old") is False


async def test_an_update_starts_the_ttl_again(expiring):
    store, advance = expiring
    await store.save(record("resp_kept"))
    await advance(TTL - 1)
    await store.update("resp_kept", bump)  # what a background response's progress save does
    await advance(TTL - 1)
    assert (await store.load("resp_kept")).response["count"] == 1
    assert (await store.holder_of("msg_out_resp_kept")).id == "resp_kept"
    await advance(2)
    assert await store.load("resp_kept") is None
    assert await store.holder_of("msg_out_resp_kept") is None


async def test_a_running_record_outlives_the_ttl_and_expires_once_its_lease_is_cleared(expiring):
    store, advance = expiring
    running = record("resp_running")
    running.lease_until = 1.0  # any lease: the record's process renews it, or ends it as lost
    await store.save(running)
    await advance(TTL * 10)
    assert (await store.load("resp_running")).lease_until == 1.0
    assert (await store.holder_of("msg_in_resp_running")).id == "resp_running"
    assert await store.expired_leases(2.0) == ["resp_running"]

    def release(r: StoredResponse) -> StoredResponse:
        r.lease_until = None
        return r

    await store.update("resp_running", release)  # the response ended: its TTL starts now
    await advance(TTL - 1)
    assert await store.load("resp_running") is not None
    await advance(2)
    assert await store.load("resp_running") is None
    assert await store.holder_of("msg_in_resp_running") is None


async def test_a_saved_record_loads_back_equal(store):
    saved = record("resp_a")
    await store.save(saved)
    loaded = await store.load("resp_a")
    assert loaded == saved


async def test_unknown_ids_load_as_none(store):
    assert await store.load("resp_missing") is None
    assert await store.holder_of("msg_missing") is None
    assert await store.delete("resp_missing") is False


async def test_saving_again_replaces_the_record_and_its_items(store):
    await store.save(record("resp_b", text="first"))
    await store.save(record("resp_b", text="second"))
    loaded = await store.load("resp_b")
    assert loaded.input_items[0]["content"][0]["text"] == "second"


async def test_items_are_found_by_their_own_id(store):
    await store.save(record("resp_c"))
    assert (await store.holder_of("msg_in_resp_c")).find_item("msg_in_resp_c")["role"] == "user"
    assert (await store.holder_of("msg_out_resp_c")).find_item("msg_out_resp_c")["role"] == "assistant"


async def test_delete_removes_the_record_and_its_items(store):
    await store.save(record("resp_d"))
    assert await store.delete("resp_d") is True
    assert await store.load("resp_d") is None
    assert await store.holder_of("msg_in_resp_d") is None
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
    assert await store.holder_of("msg_in_resp_2") is None


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


def bump(record: StoredResponse) -> StoredResponse:
    record.response["count"] = record.response.get("count", 0) + 1
    return record


async def test_update_changes_a_record_atomically_under_concurrent_writers(store):
    await store.save(record("resp_u"))

    async def bump_ten_times() -> None:
        for _ in range(10):
            await store.update("resp_u", bump)

    async with trio.open_nursery() as nursery:
        for _ in range(5):
            nursery.start_soon(bump_ten_times)
    assert (await store.load("resp_u")).response["count"] == 50


async def test_update_that_declines_leaves_the_record_and_an_unknown_id_is_none(store):
    await store.save(record("resp_v"))
    current = await store.update("resp_v", lambda r: None)
    assert current == record("resp_v")
    assert await store.load("resp_v") == record("resp_v")
    called: list[str] = []
    assert await store.update("resp_missing", lambda r: called.append(r.id)) is None
    assert called == []


async def test_expired_leases_are_found_and_a_cleared_lease_is_forgotten(store):
    for name, until in (("resp_old", 100.0), ("resp_new", 300.0), ("resp_none", None)):
        held = record(name)
        held.lease_until = until
        await store.save(held)
    assert sorted(await store.expired_leases(200.0)) == ["resp_old"]
    assert (await store.load("resp_old")).lease_until == 100.0

    def release(r: StoredResponse) -> StoredResponse:
        r.lease_until = None
        return r

    await store.update("resp_old", release)
    assert await store.expired_leases(200.0) == []
    assert sorted(await store.expired_leases(400.0)) == ["resp_new"]
    await store.delete("resp_new")
    assert await store.expired_leases(400.0) == []


async def test_sqlite_creates_its_files_readable_by_their_owner_only(tmp_path):
    path = tmp_path / "fresh" / "responses.sqlite3"
    store = SQLiteStore(str(path))
    await store.save(record("resp_perm"))
    assert (path.parent.stat().st_mode & 0o777) == 0o700
    for name in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        assert (name.stat().st_mode & 0o777) == 0o600, name
    await store.aclose()
    loose = tmp_path / "loose.sqlite3"
    loose.touch(mode=0o644)
    loose.chmod(0o644)
    await SQLiteStore(str(loose)).aclose()
    assert (loose.stat().st_mode & 0o777) == 0o600


async def test_sqlite_files_of_an_earlier_version_gain_leases_at_start_up(tmp_path):
    import sqlite3

    path = tmp_path / "old.sqlite3"
    conn = sqlite3.connect(path)
    conn.executescript(
        "CREATE TABLE responses (id TEXT PRIMARY KEY, data BLOB NOT NULL, saved_at REAL NOT NULL);"
        "CREATE TABLE items (id TEXT PRIMARY KEY, response_id TEXT NOT NULL);"
    )
    from gateway.store.base import encode_record

    conn.execute("INSERT INTO responses VALUES (?, ?, 0)", ("resp_old", encode_record(record("resp_old"))))
    conn.commit()
    conn.close()
    store = SQLiteStore(str(path))
    assert await store.load("resp_old") == record("resp_old")
    held = record("resp_held")
    held.lease_until = 5.0
    await store.save(held)
    assert await store.expired_leases(10.0) == ["resp_held"]
    await store.aclose()


async def test_a_store_that_fails_raises_store_unavailable_without_library_text(tmp_path, nursery):
    from gateway.errors import StoreUnavailable

    path = tmp_path / "locked.sqlite3"
    store = SQLiteStore(str(path))
    await store.save(record("resp_l"))
    import sqlite3

    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")  # another process holding the database
    store._file.conn.execute("PRAGMA busy_timeout = 50")  # (the waiting connection, used once the other finds it locked)
    with pytest.raises(StoreUnavailable) as caught:
        await store.save(record("resp_l2"))
    assert caught.value.code == "store_unavailable" and caught.value.status == 503
    assert "locked" not in caught.value.message
    blocker.execute("ROLLBACK")
    blocker.close()
    await store.save(record("resp_l2"))  # the store works again once the lock is gone
    await store.aclose()


async def test_sqlite_keeps_records_compressed_and_reads_the_plain_json_of_earlier_versions(tmp_path):
    import sqlite3

    import orjson

    path = tmp_path / "store.sqlite3"
    store = SQLiteStore(str(path))
    big = record("resp_big")
    big.events = [{"type": "response.output_text.delta", "sequence_number": n, "delta": " word"} for n in range(200)]
    await store.save(big)
    plain = orjson.dumps({"id": "resp_old", "response": {"id": "resp_old", "output": []}, "events": [], "input_items": []})
    with sqlite3.connect(path) as conn:
        blob = conn.execute("SELECT data FROM responses WHERE id = 'resp_big'").fetchone()[0]
        conn.execute("INSERT INTO responses (id, data, saved_at) VALUES ('resp_old', ?, 0)", (plain,))
    assert blob[:4] == b"\x28\xb5\x2f\xfd" and len(blob) * 5 < len(orjson.dumps(big.events))
    assert (await store.load("resp_big")).events == big.events
    old = await store.load("resp_old")
    assert old is not None and old.response == {"id": "resp_old", "output": []}
    await store.aclose()


@pytest.mark.skipif(REDIS is None, reason="redis-server is not installed (.ci/run installs it)")
async def test_redis_warns_at_start_up_when_it_keeps_no_append_only_file(tmp_path, nursery):
    from gateway.store.redis import RedisStore

    without = RedisStore(await start_redis(nursery, tmp_path / "a"))
    warning = await without.durability_warning()
    assert warning is not None and "appendonly" in warning
    await without.aclose()
    durable = RedisStore(await start_redis(nursery, tmp_path / "b", appendonly=True))
    assert await durable.durability_warning() is None
    await durable.aclose()


async def test_sqlite_saves_of_one_pass_share_a_commit_and_a_failure_reaches_every_caller(tmp_path):
    from gateway.errors import StoreUnavailable

    path = tmp_path / "batched.sqlite3"
    store = SQLiteStore(str(path))
    conn = store._file.fast
    assert conn is not None
    commits = 0

    def count(statement: str) -> None:
        nonlocal commits
        commits += statement == "COMMIT"

    conn.set_trace_callback(count)
    async with trio.open_nursery() as nursery:
        for n in range(20):
            nursery.start_soon(store.save, record(f"resp_b{n}", text=str(n)))
    assert commits == 1  # twenty records, one transaction
    for n in range(20):
        assert (await store.load(f"resp_b{n}")).input_items[0]["content"][0]["text"] == str(n)

    import sqlite3

    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    store._file.conn.execute("PRAGMA busy_timeout = 50")
    failures: list[str] = []

    async def save(n: int) -> None:
        try:
            await store.save(record(f"resp_f{n}"))
        except StoreUnavailable as exc:
            failures.append(exc.code or "")

    async with trio.open_nursery() as nursery:
        for n in range(5):
            nursery.start_soon(save, n)
    assert failures == ["store_unavailable"] * 5  # none of them is told its record was kept
    blocker.execute("ROLLBACK")
    blocker.close()
    for n in range(5):
        assert await store.load(f"resp_f{n}") is None
    await store.aclose()


# --- conversations ---------------------------------------------------------------------------------


def conversation(conversation_id: str = "conv_1", **fields: Any) -> Any:
    from gateway.store.base import StoredConversation

    items = [{"id": "msg_a", "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}]
    return StoredConversation(id=conversation_id, created_at=1_800_000_000, metadata={"topic": "x"}, items=items, **fields)


async def test_a_conversation_is_kept_changed_atomically_and_deleted_with_its_items(store):
    await store.save_conversation(conversation(owner="key_a"))
    loaded = await store.load_conversation("conv_1")
    assert loaded == conversation(owner="key_a")
    assert await store.load_conversation("conv_nope") is None

    def append(n: int) -> Any:
        def change(current: Any) -> Any:
            current.items.append({"id": f"msg_{n}", "type": "message", "role": "user", "content": []})
            return current

        return change

    async with trio.open_nursery() as nursery:  # concurrent appends: none is lost
        for n in range(10):
            nursery.start_soon(store.update_conversation, "conv_1", append(n))
    items = (await store.load_conversation("conv_1")).items
    assert len(items) == 11 and {item["id"] for item in items} >= {f"msg_{n}" for n in range(10)}
    assert await store.update_conversation("conv_1", lambda current: None) is not None  # declined: left as it is
    assert await store.update_conversation("conv_nope", append(99)) is None
    assert await store.delete_conversation("conv_1") and not await store.delete_conversation("conv_1")
    assert await store.load_conversation("conv_1") is None


async def test_a_conversation_expires_ttl_after_its_last_change(expiring):
    store, advance = expiring
    await store.save_conversation(conversation())
    await advance(TTL - 1)
    assert await store.update_conversation("conv_1", lambda current: current) is not None  # a change starts it again
    await advance(TTL - 1)
    assert await store.load_conversation("conv_1") is not None
    await advance(2)
    assert await store.load_conversation("conv_1") is None


# --- message threads ----------------------------------------------------------------------------


def thread(thread_id: str = "msg_1", **fields: Any) -> Any:
    from gateway.store.base import StoredThread

    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "text", "text": "hello"}]},
    ]
    return StoredThread(
        id=thread_id,
        created_at=1_800_000_000,
        messages=messages,
        system=[{"type": "text", "text": "Be brief."}],
        tools=[{"name": "get_weather", "input_schema": {"type": "object"}}],
        **fields,
    )


async def test_a_thread_loads_back_equal_and_is_a_copy(store):
    await store.save_thread(thread(owner="key_a"))
    loaded = await store.load_thread("msg_1")
    assert loaded == thread(owner="key_a")
    loaded.messages.append({"role": "user", "content": "changed"})
    assert await store.load_thread("msg_1") == thread(owner="key_a")
    assert await store.load_thread("msg_nope") is None


async def test_only_one_of_many_concurrent_claims_on_a_thread_wins(store):
    await store.save_thread(thread())
    winners: list[str] = []

    def claim(name: str) -> Any:
        def change(current: Any) -> Any:
            if current.next is not None:
                return None  # claimed by another: leave it
            current.next, current.next_until = name, 1_900_000_000.0
            return current

        return change

    async def attempt(name: str) -> None:
        stored = await store.update_thread("msg_1", claim(name))
        if stored is not None and stored.next == name:
            winners.append(name)

    async with trio.open_nursery() as nursery:
        for n in range(10):
            nursery.start_soon(attempt, f"msg_next{n}")
    assert len(winners) == 1
    assert (await store.load_thread("msg_1")).next == winners[0]
    assert await store.update_thread("msg_nope", claim("x")) is None


async def test_a_thread_expires_ttl_after_its_last_write(expiring):
    store, advance = expiring
    await store.save_thread(thread())
    await advance(TTL - 1)
    assert await store.update_thread("msg_1", lambda current: current) is not None  # a write starts it again
    await advance(TTL - 1)
    assert await store.load_thread("msg_1") is not None
    await advance(2)
    assert await store.load_thread("msg_1") is None


# --- listing (the operator console's) ---------------------------------------------------------------


def dated(response_id: str, created: int) -> StoredResponse:
    made = record(response_id)
    made.response["created_at"] = created
    return made


def dated_conversation(conversation_id: str, created: int) -> Any:
    import dataclasses

    return dataclasses.replace(conversation(conversation_id), created_at=created)


async def test_responses_are_listed_newest_first_a_page_at_a_time(store):
    # Saved out of order, two created in the same second (then ordered by id, the larger first).
    for response_id, created in [("resp_b", 200), ("resp_a", 100), ("resp_d", 300), ("resp_c", 300), ("resp_e", 400)]:
        await store.save(dated(response_id, created))
    await store.save_thread(thread("msg_t"))  # threads are not listed
    listed = await store.list_responses()
    assert [r.id for r in listed] == ["resp_e", "resp_d", "resp_c", "resp_b", "resp_a"]
    assert listed[0] == dated("resp_e", 400)  # whole records
    pages, before = [], None
    while page := await store.list_responses(limit=2, before=before):
        pages.append([r.id for r in page])
        before = page[-1].id
    assert pages == [["resp_e", "resp_d"], ["resp_c", "resp_b"], ["resp_a"]]
    await store.update("resp_a", bump)  # a change does not move a record: it is listed by when it was created
    assert [r.id for r in await store.list_responses(limit=2, before="resp_c")] == ["resp_b", "resp_a"]
    assert await store.list_responses(before="resp_unknown") == []
    assert await store.list_responses(limit=0) == [] and await store.list_responses(limit=-5) == []


async def test_deleted_responses_and_conversations_are_not_listed(store):
    for n in range(4):
        await store.save(dated(f"resp_{n}", 100 + n))
        await store.save_conversation(dated_conversation(f"conv_{n}", 100 + n))
    assert await store.delete("resp_2") and await store.delete_conversation("conv_2")
    assert [r.id for r in await store.list_responses()] == ["resp_3", "resp_1", "resp_0"]
    assert [c.id for c in await store.list_conversations()] == ["conv_3", "conv_1", "conv_0"]
    assert await store.list_responses(before="resp_2") == []  # a cursor that is gone: nothing after it
    assert [c.id for c in await store.list_conversations(limit=1, before="conv_3")] == ["conv_1"]


async def test_conversations_are_listed_newest_first_and_a_page_is_at_most_the_list_limit(store):
    from gateway.store.base import LIST_LIMIT

    for n in range(LIST_LIMIT + 3):
        await store.save_conversation(dated_conversation(f"conv_{n:03}", 1_800_000_000 + n // 2))
    listed = await store.list_conversations(limit=LIST_LIMIT + 50)
    assert len(listed) == LIST_LIMIT
    expected = sorted((f"conv_{n:03}" for n in range(LIST_LIMIT + 3)), key=lambda c: (int(c[5:]) // 2, c), reverse=True)
    assert [c.id for c in listed] == expected[:LIST_LIMIT]
    assert [c.id for c in await store.list_conversations(before=listed[-1].id)] == expected[LIST_LIMIT:]
    assert listed[0] == dated_conversation(expected[0], 1_800_000_000 + (LIST_LIMIT + 2) // 2)
    await store.update_conversation(expected[-1], lambda c: c)  # a change does not move it
    assert (await store.list_conversations(before=expected[-2]))[0].id == expected[-1]


async def test_expired_responses_and_conversations_are_not_listed_and_a_running_one_is(expiring):
    store, advance = expiring
    await store.save(dated("resp_old", 100))
    running = dated("resp_running", 50)
    running.lease_until = 1.0
    await store.save(running)
    await store.save_conversation(dated_conversation("conv_old", 100))
    await advance(TTL - 1)
    await store.save(dated("resp_new", 200))
    await store.save_conversation(dated_conversation("conv_new", 200))
    assert [r.id for r in await store.list_responses()] == ["resp_new", "resp_old", "resp_running"]
    await advance(2)
    assert [r.id for r in await store.list_responses()] == ["resp_new", "resp_running"]
    assert [c.id for c in await store.list_conversations()] == ["conv_new"]
    assert [r.id for r in await store.list_responses(before="resp_new")] == ["resp_running"]
    await advance(TTL)
    assert [r.id for r in await store.list_responses()] == ["resp_running"]
    assert await store.list_conversations() == []


async def test_sqlite_files_from_before_listing_are_dated_from_their_records_at_start_up(tmp_path):
    import sqlite3

    from gateway.store.base import encode_conversation, encode_record

    path = tmp_path / "old.sqlite3"
    conn = sqlite3.connect(path)
    conn.executescript(
        "CREATE TABLE responses (id TEXT PRIMARY KEY, data BLOB NOT NULL, saved_at REAL NOT NULL, lease_until REAL);"
        "CREATE TABLE items (id TEXT PRIMARY KEY, response_id TEXT NOT NULL);"
        "CREATE TABLE conversations (id TEXT PRIMARY KEY, data BLOB NOT NULL, saved_at REAL NOT NULL);"
    )
    for response_id, created in [("resp_1", 300), ("resp_2", 100), ("resp_3", 200)]:
        conn.execute("INSERT INTO responses VALUES (?, ?, 0, NULL)", (response_id, encode_record(dated(response_id, created))))
    conn.execute("INSERT INTO responses VALUES ('resp_bad', x'00', 0, NULL)")  # a damaged record does not stop start-up
    conn.execute("INSERT INTO conversations VALUES ('conv_1', ?, 0)", (encode_conversation(conversation("conv_1")),))
    conn.commit()
    conn.close()
    store = SQLiteStore(str(path))
    assert [r.id for r in await store.list_responses(limit=3)] == ["resp_1", "resp_3", "resp_2"]
    assert [c.id for c in await store.list_conversations()] == ["conv_1"]
    await store.save(dated("resp_4", 400))
    assert (await store.list_responses(limit=1))[0].id == "resp_4"
    await store.aclose()


@pytest.mark.skipif(REDIS is None, reason="redis-server is not installed (.ci/run installs it)")
async def test_the_redis_listing_index_lets_go_of_expired_records_as_writes_go_on(tmp_path, nursery):
    import redis

    from gateway.store.redis import RedisStore

    now = [1_800_000_000.0]
    url = await start_redis(nursery, tmp_path)
    store = RedisStore(url, ttl=TTL, clock=lambda: now[0])
    client = redis.Redis.from_url(url)
    for n in range(30):
        await store.save(dated(f"resp_{n}", 100 + n))
        await store.save_conversation(dated_conversation(f"conv_{n}", 100 + n))
    running = dated("resp_running", 50)
    running.lease_until = 1.0
    await store.save(running)
    assert client.zcard("gateway:index:responses") == 31 and client.zcard("gateway:index:conversations") == 30
    for key in client.scan_iter("gateway:response:*"):  # Redis expires them (its clock), and the gateway's clock moves on
        if client.pttl(key) > 0:
            client.delete(key)
    for key in client.scan_iter("gateway:conversation:*"):
        client.delete(key)
    now[0] += TTL + 1
    await store.save(dated("resp_new", 500))
    await store.save_conversation(dated_conversation("conv_new", 500))
    # Each write drops a few; a listing drops what it finds gone.
    assert client.zcard("gateway:index:responses") == 31 + 1 - 20
    assert [r.id for r in await store.list_responses()] == ["resp_new", "resp_running"]
    assert client.zcard("gateway:index:responses") == 2  # the running one stays: it does not expire
    assert [c.id for c in await store.list_conversations()] == ["conv_new"]
    assert client.zcard("gateway:index:conversations") == 1
    client.close()
    await store.aclose()
