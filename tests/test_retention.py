"""Retention in the SQLite store: expired records are swept, and the file gives their space back.

The contract suite (test_store_contract.py) holds that every store forgets
a record after the TTL; these tests hold what only the SQLite file has to
do about it: delete the rows, shrink the file and its WAL, never touch a
running response, and keep sweeping when the file is briefly unavailable.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
import trio

from gateway.store import SQLiteStore, StoredResponse
from gateway.store import sqlite as sqlite_store
from gateway.store.base import encode_record

TTL = 3600.0
T0 = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def record(response_id: str, *, event_bytes: int = 8000) -> StoredResponse:
    """A response with `event_bytes` of text in its events (hex digits: half that once compressed)."""
    text = os.urandom(event_bytes // 2).hex()
    return StoredResponse(
        id=response_id,
        response={
            "id": response_id,
            "status": "completed",
            "output": [{"id": f"msg_out_{response_id}", "type": "message"}],
        },
        input_items=[{"id": f"msg_in_{response_id}", "type": "message", "role": "user", "content": []}],
        events=[{"type": "response.output_text.delta", "sequence_number": n, "delta": text[n::8]} for n in range(8)],
    )


async def save_all(store: SQLiteStore, records: list[StoredResponse]) -> None:
    for start in range(0, len(records), 250):
        async with trio.open_nursery() as nursery:
            for saved in records[start : start + 250]:
                nursery.start_soon(store.save, saved)


def on_disk(path: Path) -> dict[str, int]:
    """The file's pages (as SQLite counts them, the WAL included) and its bytes on disk."""
    with closing(sqlite3.connect(path)) as conn:
        pages, free = (conn.execute(f"PRAGMA {name}").fetchone()[0] for name in ("page_count", "freelist_count"))
    wal = path.with_name(path.name + "-wal")
    return {"pages": pages, "free": free, "main": path.stat().st_size, "wal": wal.stat().st_size if wal.exists() else 0}


def rows(path: Path, table: str) -> int:
    with closing(sqlite3.connect(path)) as conn:
        return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])


async def test_a_sweep_deletes_expired_records_with_their_items_and_shrinks_the_file_and_its_wal(tmp_path):
    path = tmp_path / "responses.sqlite3"
    clock = Clock()
    store = SQLiteStore(str(path), ttl=TTL, clock=clock)
    await save_all(store, [record(f"resp_old{n}") for n in range(3000)])
    clock.now += TTL / 2
    await save_all(store, [record(f"resp_new{n}") for n in range(20)])
    clock.now += TTL / 2 + 1  # the first 3000 are past the TTL, the last 20 are not
    before = on_disk(path)

    started = time.perf_counter()
    assert await store.sweep() == 3000
    seconds = time.perf_counter() - started
    after = on_disk(path)
    print(f"sweep of 3000 records: {seconds * 1000:.0f} ms; {before} -> {after}")

    assert rows(path, "responses") == 20 and rows(path, "items") == 40
    assert await store.load("resp_old0") is None and await store.holder_of("msg_in_resp_old0") is None
    assert (await store.load("resp_new0")) is not None and (await store.holder_of("msg_out_resp_new19")) is not None
    assert before["pages"] > 3000 and after["free"] == 0 and after["pages"] * 20 < before["pages"]
    assert after["main"] * 20 < before["main"] + before["wal"]
    assert after["wal"] == 0  # checkpointed and truncated
    assert await store.sweep() == 0  # nothing left to do
    await store.aclose()


async def test_a_running_background_record_is_not_swept_until_its_lease_is_cleared(tmp_path):
    path = tmp_path / "responses.sqlite3"
    clock = Clock()
    store = SQLiteStore(str(path), ttl=TTL, clock=clock)
    running = record("resp_running")
    running.lease_until = T0 + 15  # renewed by its process; here it is never renewed, and still kept
    await store.save(running)
    await store.save(record("resp_done"))
    clock.now += TTL * 100
    assert await store.sweep() == 1
    assert (await store.load("resp_running")) == running
    assert (await store.holder_of("msg_in_resp_running")).id == "resp_running"

    def release(r: StoredResponse) -> StoredResponse:
        r.lease_until = None
        return r

    await store.update("resp_running", release)
    assert await store.sweep() == 0  # its TTL starts with the write that cleared the lease
    clock.now += TTL + 1
    assert await store.sweep() == 1
    assert rows(path, "responses") == 0 and rows(path, "items") == 0
    await store.aclose()


async def test_a_save_during_a_sweep_waits_for_one_batch_at_most_not_the_whole_sweep(tmp_path):
    clock = Clock()
    store = SQLiteStore(str(tmp_path / "responses.sqlite3"), ttl=TTL, clock=clock)
    batches = 6
    await save_all(store, [record(f"resp_old{n}", event_bytes=500) for n in range(sqlite_store._SWEEP_BATCH * batches)])
    clock.now += TTL + 1
    done: list[int] = []  # records each batch deleted, appended from the sweep's thread
    sweep_batch = store._sweep_batch

    def counted(conn: sqlite3.Connection, cutoff: float) -> int:
        done.append(sweep_batch(conn, cutoff))
        return done[-1]

    store._sweep_batch = counted  # type: ignore[method-assign]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(store.sweep)
        await trio.sleep(0)  # the sweep's first batch is under way in its thread
        await store.save(record("resp_during"))
        assert len(done) <= 1  # it waited for the batch under way, if any, and went first after it
    assert done == [sqlite_store._SWEEP_BATCH] * batches + [0]
    assert await store.load("resp_during") is not None
    await store.aclose()


async def test_the_maintenance_task_logs_a_failed_sweep_at_debug_and_sweeps_at_a_later_round(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sqlite_store, "_SWEEP_EVERY", 0)  # one round after another; the test paces them
    path = tmp_path / "responses.sqlite3"
    clock = Clock()
    store = SQLiteStore(str(path), ttl=TTL, clock=clock)
    await store.save(record("resp_old"))
    clock.now += TTL + 1
    rounds_send, rounds_recv = trio.open_memory_channel[str](0)
    sweep = store.sweep

    async def observed_sweep() -> int:
        try:
            deleted = await sweep()
        except BaseException:
            await rounds_send.send("failed")
            raise
        await rounds_send.send("swept")
        return deleted

    store.sweep = observed_sweep  # type: ignore[method-assign]
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")  # another process holding the file
    store._file.conn.execute("PRAGMA busy_timeout = 20")
    caplog.set_level(logging.DEBUG, logger="gateway.store")
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run_maintenance)
        with trio.fail_after(10):
            assert await rounds_recv.receive() == "failed"
            blocker.execute("ROLLBACK")
            blocker.close()
            while await rounds_recv.receive() != "swept":
                pass
        nursery.cancel_scope.cancel()
    failures = [r for r in caplog.records if r.name == "gateway.store" and "sweeping" in r.getMessage()]
    assert failures and all(r.levelno == logging.DEBUG for r in failures)
    assert rows(path, "responses") == 0
    await store.aclose()


async def test_closing_the_store_stops_its_maintenance_task(tmp_path, nursery):
    store = SQLiteStore(str(tmp_path / "responses.sqlite3"), ttl=TTL)
    stopped = trio.Event()

    async def maintain(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await store.run_maintenance(task_status=task_status)
        stopped.set()

    await nursery.start(maintain)
    await store.aclose()
    with trio.fail_after(5):
        await stopped.wait()


def old_file(path: Path, *, expired: int, kept: int) -> None:
    """A file as an earlier version left it: no auto-vacuum, no lease column."""
    with closing(sqlite3.connect(path)) as conn:
        conn.executescript(
            "CREATE TABLE responses (id TEXT PRIMARY KEY, data BLOB NOT NULL, saved_at REAL NOT NULL);"
            "CREATE TABLE items (id TEXT PRIMARY KEY, response_id TEXT NOT NULL);"
        )
        for n in range(expired + kept):
            saved = record(f"resp_{n}")
            saved_at = T0 - TTL - 1 if n < expired else T0
            conn.execute("INSERT INTO responses VALUES (?, ?, ?)", (saved.id, encode_record(saved), saved_at))
            conn.executemany("INSERT INTO items VALUES (?, ?)", [(i, saved.id) for i in saved.item_ids()])
        conn.commit()
        assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 0


async def test_a_file_an_earlier_version_made_is_rewritten_at_start_up_and_then_shrinks_after_a_sweep(tmp_path):
    path = tmp_path / "responses.sqlite3"
    old_file(path, expired=1000, kept=10)
    clock = Clock()
    store = SQLiteStore(str(path), ttl=TTL, clock=clock)
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2  # INCREMENTAL
    before = on_disk(path)
    assert before["wal"] == 0  # the rewrite went through the WAL, which was truncated
    assert await store.sweep() == 1000
    after = on_disk(path)
    assert after["main"] * 20 < before["main"] and after["free"] == 0
    assert await store.load("resp_1009") is not None
    await store.aclose()


async def test_a_file_too_large_to_rewrite_at_start_up_is_left_as_it_is_with_a_warning_and_still_swept(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sqlite_store, "_VACUUM_AT_START_UP", 64 * 1024)
    path = tmp_path / "responses.sqlite3"
    old_file(path, expired=100, kept=10)
    with caplog.at_level(logging.WARNING, logger="gateway.store"):
        store = SQLiteStore(str(path), ttl=TTL, clock=Clock())
    assert any("too large to rewrite" in r.getMessage() for r in caplog.records)
    before = on_disk(path)
    assert await store.sweep() == 100
    after = on_disk(path)
    assert after["free"] > 0 and after["pages"] == before["pages"]  # the space is reused, not given back
    assert rows(path, "responses") == 10
    await store.aclose()


async def test_new_files_are_created_with_incremental_auto_vacuum(tmp_path):
    path = tmp_path / "fresh" / "responses.sqlite3"
    await SQLiteStore(str(path)).aclose()
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2


async def test_the_gateway_sweeps_its_sqlite_store_from_start_up(
    start_gateway: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "responses.sqlite3"
    store = SQLiteStore(str(path), clock=lambda: 0.0)  # saved in 1970: past the default TTL of 30 days
    await store.save(record("resp_1970"))
    await store.aclose()
    swept = trio.Event()
    sweep = SQLiteStore.sweep

    async def observed_sweep(self: SQLiteStore) -> int:
        deleted = await sweep(self)
        swept.set()
        return deleted

    monkeypatch.setattr(SQLiteStore, "sweep", observed_sweep)
    await start_gateway(store_backend="sqlite", sqlite_path=str(path))
    with trio.fail_after(10):
        await swept.wait()
    assert rows(path, "responses") == 0
