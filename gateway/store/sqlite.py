"""SQLite store: the embedded default.  Survives restarts; safe for several
worker processes on one machine (WAL journal, busy timeout, one transaction
per record).

Each call first runs on the event loop's own thread, on a connection that
never waits for a lock (`SQLiteFile`): a record is a small compressed blob,
written faster than a hop to a worker thread and back would take.  Only when another process (a worker of
the same machine) holds the write lock does the call wait for it, in a
worker thread on a second connection.  The WAL is checkpointed from that
thread too, so the loop never waits for a checkpoint's disk writes.
The database holds conversations: its file is created readable by its owner
only (0600, and the -wal/-shm files SQLite derives from it), in a directory
created 0700.

Retention: a record expires `ttl` seconds after its last write (a save, an
update, a background response's progress save) and then reads as unknown.
A record holding a lease (a running background response) does not expire;
it does `ttl` after the write that clears its lease.  `run_maintenance`
deletes expired records every `_SWEEP_EVERY` seconds, off the loop's thread
and `_SWEEP_BATCH` records per transaction (other writers wait milliseconds,
not the whole sweep), then gives the freed pages back to the file system
(`PRAGMA incremental_vacuum`, in steps of `_VACUUM_STEP` pages) and
truncates the WAL.

New files are created with `auto_vacuum=INCREMENTAL`.  A file an earlier
version created has none, and only a `VACUUM` can switch it: a rewrite of
the whole file, holding the write lock throughout and needing as much free
disk again.  It is done at start-up, before anything is served, when the
file's live data is at most `_VACUUM_AT_START_UP` bytes (so that start-up
waits a second or two at most on an SSD).  A
larger file is left as it is, with a warning: its expired records are still
swept and their pages reused, so it stops growing; a later start-up
converts it once sweeps have brought its live data under the limit (or run
`sqlite3 FILE 'PRAGMA auto_vacuum=INCREMENTAL; VACUUM;'` with the gateway
stopped).  Rewriting a large file at start-up instead would hold a restart
up for minutes, and doing it while serving would stop every write as long.

Listing (newest first) reads an index on `created_at` and id, columns
written with each record; a file from before them gains them at start-up,
filled in from its records.
"""

from __future__ import annotations

import logging
import os
import pathlib
import sqlite3
import time
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

import trio

from ..errors import StoreUnavailable
from .base import (
    Change,
    ConversationChange,
    StoredConversation,
    StoredResponse,
    StoredThread,
    ThreadChange,
    decode_conversation,
    decode_thread,
    decode_record,
    encode_conversation,
    encode_thread,
    encode_record,
    list_limit,
    response_created_at,
)

T = TypeVar("T")

__all__ = ["PassBatches", "SQLiteStore"]

log = logging.getLogger("gateway.store")

_SWEEP_EVERY = 60.0  # seconds between two sweeps of expired records
_SWEEP_BATCH = 200  # records deleted per transaction: the write lock is held milliseconds, not the whole sweep
_VACUUM_STEP = 1024  # pages given back to the file system per transaction (a short hold of the write lock)
_VACUUM_AT_START_UP = 256 * 1024 * 1024  # the largest live data rewritten at start-up (module docstring)
_CHECKPOINT_WAIT_MS = 200  # how long a truncating checkpoint may hold up writers waiting for readers
_WAL_KEPT = 4 * 1024 * 1024  # bytes of WAL file kept after a checkpoint resets it (journal_size_limit)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    data BLOB NOT NULL,
    saved_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS items (
    id TEXT PRIMARY KEY,
    response_id TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS items_by_response ON items(response_id);
CREATE INDEX IF NOT EXISTS responses_by_age ON responses(saved_at);
CREATE TABLE IF NOT EXISTS conversations (
    id TEXT PRIMARY KEY,
    data BLOB NOT NULL,
    saved_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS conversations_by_age ON conversations(saved_at);
CREATE TABLE IF NOT EXISTS threads (
    id TEXT PRIMARY KEY,
    data BLOB NOT NULL,
    saved_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS threads_by_age ON threads(saved_at);
"""
# Added after the first release: existing files gain the column at start-up.
_LEASES = """
CREATE INDEX IF NOT EXISTS responses_by_lease ON responses(lease_until) WHERE lease_until IS NOT NULL;
"""
# Added for listing: existing files gain the columns (filled in from their records) at start-up.
_LISTING = """
CREATE INDEX IF NOT EXISTS responses_by_created ON responses(created_at, id);
CREATE INDEX IF NOT EXISTS conversations_by_created ON conversations(created_at, id);
"""
_FILL_BATCH = 500  # records given their created_at per transaction, in a file from before the column


class SQLiteFile:
    """Two connections to one SQLite file, and where each call runs (see the module's docstring).

    `run(fn, *args)` calls `fn(connection, *args)`: on the loop's thread with
    the connection that does not wait, or, when that one finds the database
    locked, in a worker thread with the one that waits (up to 30 s), one
    call at a time.  `run_in_thread(fn, *args)` always takes the second way:
    for work long enough to hold up the loop (maintenance).

    A new file is created with `auto_vacuum=INCREMENTAL` when asked (the
    setting can only be chosen before the first table exists).  Either
    connection truncates the WAL file to `_WAL_KEPT` bytes when it resets
    it, so that one burst of writes does not leave a large file behind.
    """

    _CHECKPOINT_EVERY = 1000  # rows changed on the loop's connection between checkpoints

    def __init__(
        self, path: str, setup: Callable[[sqlite3.Connection], None], *, auto_vacuum: bool = False
    ) -> None:
        if path != ":memory:":
            _create_private(pathlib.Path(path))
        self.conn = sqlite3.connect(path, timeout=30, check_same_thread=False, isolation_level=None)
        if auto_vacuum:
            self.conn.execute("PRAGMA auto_vacuum=INCREMENTAL")  # before WAL: switching to it writes the header
        # Switching a new file to WAL ignores the busy timeout: when several
        # workers start together on one file, all but one see "locked" at once.
        _retry_locked(lambda: self.conn.execute("PRAGMA journal_mode=WAL"))
        self.conn.execute("PRAGMA synchronous=NORMAL")  # durable across process crashes; WAL keeps it atomic
        self.conn.execute(f"PRAGMA journal_size_limit={_WAL_KEPT}")
        setup(self.conn)
        if path == ":memory:":
            self.fast: sqlite3.Connection | None = None  # a second connection would be another database
        else:
            self.fast = sqlite3.connect(path, timeout=0, check_same_thread=False, isolation_level=None)
            self.fast.execute("PRAGMA synchronous=NORMAL")
            self.fast.execute("PRAGMA wal_autocheckpoint=0")  # checkpoints run in a worker thread (below)
            self.fast.execute(f"PRAGMA journal_size_limit={_WAL_KEPT}")
        self._limiter = trio.CapacityLimiter(1)
        self._checkpointed_at = 0

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        fast = self.fast
        if fast is not None:
            try:
                result = fn(fast, *args)
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise
            else:
                if fast.total_changes - self._checkpointed_at >= self._CHECKPOINT_EVERY:
                    self._checkpointed_at = fast.total_changes
                    await trio.to_thread.run_sync(self._checkpoint, limiter=self._limiter)
                return result
        return await self.run_in_thread(fn, *args)

    async def run_in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        return await trio.to_thread.run_sync(fn, self.conn, *args, limiter=self._limiter)

    def _checkpoint(self) -> None:
        """Copy the WAL into the database file (PASSIVE: writers are not held up)."""
        self.conn.execute("PRAGMA wal_checkpoint(PASSIVE)")

    async def aclose(self) -> None:
        if self.fast is not None:
            self.fast.close()
        await trio.to_thread.run_sync(self.conn.close, limiter=self._limiter)


_FAILED = "The conversation store failed; try again."


def _store_failure(error: BaseException) -> BaseException:
    return error if isinstance(error, StoreUnavailable) else StoreUnavailable(_FAILED)


class PassBatches(Generic[T]):
    """Writes asked for in the same pass of the event loop, made in one transaction.

    The first call of a pass yields once, so that the others ready to write
    join it, then has `write_batch` make them all: a commit's page writes cost
    about the same however many rows it carries.  Each caller returns only
    once its own write is committed, or raises (`failed(error)` for every
    write of a failed batch; the caller that ran it gets the error as it
    happened).  Shielded: a batch carries other callers' writes.
    """

    def __init__(
        self, write_batch: Callable[[list[T]], Awaitable[None]], failed: Callable[[BaseException], BaseException]
    ) -> None:
        self._write_batch = write_batch
        self._failed = failed
        self._waiting: list[_Waiting[T]] = []  # the batch being gathered

    async def __call__(self, item: T) -> None:
        mine = _Waiting(item)
        self._waiting.append(mine)
        with trio.CancelScope(shield=True):
            if len(self._waiting) > 1:
                await mine.done.wait()  # another call is gathering the batch
            else:
                await trio.lowlevel.cancel_shielded_checkpoint()
                batch, self._waiting = self._waiting, []
                try:
                    await self._write_batch([waiting.item for waiting in batch])
                except BaseException as exc:
                    failed = self._failed(exc)
                    for waiting in batch:
                        waiting.error = failed
                    raise
                finally:
                    for waiting in batch:
                        waiting.done.set()
        if mine.error is not None:
            raise mine.error


class _Waiting(Generic[T]):
    """A write waiting in a batch, and what became of it."""

    __slots__ = ("item", "done", "error")

    def __init__(self, item: T) -> None:
        self.item = item
        self.done = trio.Event()
        self.error: BaseException | None = None


class SQLiteStore:
    """Stored responses in one SQLite file; `clock` (wall-clock seconds) dates records for the TTL."""

    def __init__(self, path: str, *, ttl: float | None = None, clock: Callable[[], float] = time.time) -> None:
        self._path = path
        self._ttl = ttl
        self._clock = clock
        self._file = SQLiteFile(path, self._setup, auto_vacuum=True)
        self._saves = PassBatches[tuple[bytes, StoredResponse]](self._save_batch, _store_failure)
        self._maintenance = trio.CancelScope()  # `run_maintenance`'s, cancelled by `aclose`

    def _setup(self, conn: sqlite3.Connection) -> None:
        _retry_locked(lambda: conn.executescript(_SCHEMA))
        _retry_locked(lambda: self._add_lease_column(conn))
        _retry_locked(lambda: self._add_created_columns(conn))
        _retry_locked(lambda: self._switch_to_incremental_vacuum(conn))

    @staticmethod
    def _add_lease_column(conn: sqlite3.Connection) -> None:
        columns = {row[1] for row in conn.execute("PRAGMA table_info(responses)")}
        if "lease_until" not in columns:
            try:
                conn.execute("ALTER TABLE responses ADD COLUMN lease_until REAL")
            except sqlite3.OperationalError as exc:
                if "duplicate column" not in str(exc):  # another worker added it first
                    raise
        conn.executescript(_LEASES)

    @staticmethod
    def _add_created_columns(conn: sqlite3.Connection) -> None:
        """The `created_at` columns listing sorts by, and their index; in a file from before them,
        filled in from the records (once: a record written since carries its own)."""
        for table in ("responses", "conversations"):
            columns = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
            if "created_at" not in columns:
                try:
                    conn.execute(f"ALTER TABLE {table} ADD COLUMN created_at REAL")
                except sqlite3.OperationalError as exc:
                    if "duplicate column" not in str(exc):  # another worker added it first
                        raise
        filled = 0
        for table, created in (("responses", _response_created), ("conversations", _conversation_created)):
            while True:
                with _transaction(conn):
                    rows = conn.execute(
                        f"SELECT id, data FROM {table} WHERE created_at IS NULL LIMIT {_FILL_BATCH}"
                    ).fetchall()
                    conn.executemany(
                        f"UPDATE {table} SET created_at = ? WHERE id = ?", [(created(row[1]), row[0]) for row in rows]
                    )
                filled += len(rows)
                if len(rows) < _FILL_BATCH:
                    break
        conn.executescript(_LISTING)
        if filled:
            log.info("the SQLite store's %d records were dated for listing", filled)

    def _switch_to_incremental_vacuum(self, conn: sqlite3.Connection) -> None:
        """Rewrite a file an earlier version created without auto-vacuum, if small enough (module docstring)."""
        if _pragma(conn, "auto_vacuum") != 0:  # INCREMENTAL, or FULL chosen by hand: leave it
            return
        live = (_pragma(conn, "page_count") - _pragma(conn, "freelist_count")) * _pragma(conn, "page_size")
        if live > _VACUUM_AT_START_UP:
            log.warning(
                "the SQLite file %s (%.1f MiB of responses) was created without auto-vacuum and is too large to "
                "rewrite at start-up: expired responses are swept and their space reused, but the file does not "
                "shrink until converted, at a start-up once sweeps have brought it under %d MiB, or by running "
                "sqlite3 FILE 'PRAGMA auto_vacuum=INCREMENTAL; VACUUM;' with the gateway stopped",
                self._path,
                live / 2**20,
                _VACUUM_AT_START_UP >> 20,
            )
            return
        started = time.perf_counter()
        conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
        try:
            conn.execute("VACUUM")  # the only way to switch an existing file; holds the write lock throughout
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc):
                raise  # another worker is rewriting it: tried again, and then found done
            # No room for the copy, say: the store works as before, without giving space back.
            log.warning(
                "the SQLite file %s could not be rewritten for auto-vacuum (%s); trying again at the next start-up",
                self._path,
                exc,
            )
            return
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()  # the rewrite went through the WAL
        log.info(
            "the SQLite file %s now gives freed space back (incremental auto-vacuum): %.1f MiB rewritten in %.2f s",
            self._path,
            live / 2**20,
            time.perf_counter() - started,
        )

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        try:
            return await self._file.run(fn, *args)
        except sqlite3.Error as exc:
            raise StoreUnavailable(_FAILED) from exc

    async def save(self, record: StoredResponse) -> None:
        """Records saved in the same pass of the event loop share one transaction (`PassBatches`)."""
        await self._saves((encode_record(record), record))

    async def _save_batch(self, batch: list[tuple[bytes, StoredResponse]]) -> None:
        await self._run(self._write_batch, batch)

    def _write_batch(self, conn: sqlite3.Connection, batch: list[tuple[bytes, StoredResponse]]) -> None:
        with _transaction(conn):
            for data, record in batch:
                self._write(conn, data, record)

    def _write(self, conn: sqlite3.Connection, data: bytes, record: StoredResponse) -> None:
        response_id = record.id
        conn.execute(
            "INSERT OR REPLACE INTO responses (id, data, saved_at, lease_until, created_at) VALUES (?, ?, ?, ?, ?)",
            (response_id, data, self._clock(), record.lease_until, response_created_at(record)),
        )
        conn.execute("DELETE FROM items WHERE response_id = ?", (response_id,))
        conn.executemany(
            "INSERT OR REPLACE INTO items (id, response_id) VALUES (?, ?)",
            [(item_id, response_id) for item_id in record.item_ids()],
        )

    async def update(self, response_id: str, change: Change) -> StoredResponse | None:
        return await self._run(self._update, response_id, change)

    def _update(self, conn: sqlite3.Connection, response_id: str, change: Change) -> StoredResponse | None:
        with _transaction(conn):  # BEGIN IMMEDIATE: no other writer between the read and the write
            data = self._load(conn, response_id, in_transaction=True)
            if data is None:
                return None
            current = decode_record(data)
            new = change(current)
            if new is None:
                return current
            self._write(conn, encode_record(new), new)
            return new

    async def expired_leases(self, now: float) -> list[str]:
        return await self._run(self._leases_ended, now)

    @staticmethod
    def _leases_ended(conn: sqlite3.Connection, now: float) -> list[str]:
        rows = conn.execute(
            "SELECT id FROM responses WHERE lease_until IS NOT NULL AND lease_until < ?", (now,)
        ).fetchall()
        return [str(row[0]) for row in rows]

    async def load(self, response_id: str) -> StoredResponse | None:
        data = await self._run(self._load, response_id)
        return decode_record(data) if data is not None else None

    def _load(self, conn: sqlite3.Connection, response_id: str, *, in_transaction: bool = False) -> bytes | None:
        row = conn.execute("SELECT data, saved_at, lease_until FROM responses WHERE id = ?", (response_id,)).fetchone()
        if row is None:
            return None
        if self._past_ttl(row[1], row[2]):
            if not in_transaction:  # inside one, an expired record is only ignored
                self._delete(conn, response_id)
            return None
        return bytes(row[0])

    async def delete(self, response_id: str) -> bool:
        return bool(await self._run(self._delete, response_id))

    @staticmethod
    def _delete(conn: sqlite3.Connection, response_id: str) -> bool:
        with _transaction(conn):
            gone = conn.execute("DELETE FROM responses WHERE id = ?", (response_id,)).rowcount
            conn.execute("DELETE FROM items WHERE response_id = ?", (response_id,))
        return gone > 0

    async def holder_of(self, item_id: str) -> StoredResponse | None:
        data = await self._run(self._find_item, item_id)
        return decode_record(data) if data is not None else None

    def _find_item(self, conn: sqlite3.Connection, item_id: str) -> bytes | None:
        row = conn.execute(
            "SELECT r.id FROM items i JOIN responses r ON r.id = i.response_id WHERE i.id = ?", (item_id,)
        ).fetchone()
        return self._load(conn, row[0]) if row is not None else None

    async def save_conversation(self, conversation: StoredConversation) -> None:
        await self._run(self._write_conversation, encode_conversation(conversation), conversation)

    def _write_conversation(self, conn: sqlite3.Connection, data: bytes, conversation: StoredConversation) -> None:
        with _transaction(conn):
            self._put_conversation(conn, data, conversation)

    def _put_conversation(self, conn: sqlite3.Connection, data: bytes, conversation: StoredConversation) -> None:
        conn.execute(
            "INSERT OR REPLACE INTO conversations (id, data, saved_at, created_at) VALUES (?, ?, ?, ?)",
            (conversation.id, data, self._clock(), float(conversation.created_at)),
        )

    async def load_conversation(self, conversation_id: str) -> StoredConversation | None:
        data = await self._run(self._load_conversation, conversation_id)
        return decode_conversation(data) if data is not None else None

    def _load_conversation(self, conn: sqlite3.Connection, conversation_id: str) -> bytes | None:
        row = conn.execute("SELECT data, saved_at FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        if row is None or self._past_ttl(row[1], None):
            return None  # an expired one is swept with the rest (`sweep`)
        return bytes(row[0])

    async def update_conversation(
        self, conversation_id: str, change: ConversationChange
    ) -> StoredConversation | None:
        return await self._run(self._update_conversation, conversation_id, change)

    def _update_conversation(
        self, conn: sqlite3.Connection, conversation_id: str, change: ConversationChange
    ) -> StoredConversation | None:
        with _transaction(conn):  # BEGIN IMMEDIATE: no other writer between the read and the write
            data = self._load_conversation(conn, conversation_id)
            if data is None:
                return None
            current = decode_conversation(data)
            new = change(current)
            if new is None:
                return current
            self._put_conversation(conn, encode_conversation(new), new)
            return new

    async def delete_conversation(self, conversation_id: str) -> bool:
        return bool(await self._run(self._delete_conversation, conversation_id))

    def _delete_conversation(self, conn: sqlite3.Connection, conversation_id: str) -> bool:
        with _transaction(conn):
            if self._load_conversation(conn, conversation_id) is None:
                return False
            conn.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))
        return True

    async def save_thread(self, thread: StoredThread) -> None:
        await self._run(self._write_thread, encode_thread(thread), thread.id)

    def _write_thread(self, conn: sqlite3.Connection, data: bytes, thread_id: str) -> None:
        with _transaction(conn):
            self._put_thread(conn, data, thread_id)

    def _put_thread(self, conn: sqlite3.Connection, data: bytes, thread_id: str) -> None:
        conn.execute("INSERT OR REPLACE INTO threads (id, data, saved_at) VALUES (?, ?, ?)", (thread_id, data, self._clock()))

    async def load_thread(self, thread_id: str) -> StoredThread | None:
        data = await self._run(self._load_thread, thread_id)
        return decode_thread(data) if data is not None else None

    def _load_thread(self, conn: sqlite3.Connection, thread_id: str) -> bytes | None:
        row = conn.execute("SELECT data, saved_at FROM threads WHERE id = ?", (thread_id,)).fetchone()
        if row is None or self._past_ttl(row[1], None):
            return None  # an expired one is swept with the rest (`sweep`)
        return bytes(row[0])

    async def update_thread(self, thread_id: str, change: ThreadChange) -> StoredThread | None:
        return await self._run(self._update_thread, thread_id, change)

    def _update_thread(self, conn: sqlite3.Connection, thread_id: str, change: ThreadChange) -> StoredThread | None:
        with _transaction(conn):  # BEGIN IMMEDIATE: no other writer, of any process, between the read and the write
            data = self._load_thread(conn, thread_id)
            if data is None:
                return None
            current = decode_thread(data)
            new = change(current)
            if new is None:
                return current
            self._put_thread(conn, encode_thread(new), thread_id)
            return new

    async def list_responses(self, *, limit: int = 50, before: str | None = None) -> list[StoredResponse]:
        rows = await self._run(self._list, "responses", "lease_until IS NOT NULL OR ", limit, before)
        return [decode_record(row) for row in rows]

    async def list_conversations(self, *, limit: int = 50, before: str | None = None) -> list[StoredConversation]:
        rows = await self._run(self._list, "conversations", "", limit, before)
        return [decode_conversation(row) for row in rows]

    def _list(self, conn: sqlite3.Connection, table: str, kept: str, limit: int, before: str | None) -> list[bytes]:
        """A page of `table`'s records, newest first, leaving out the expired (`kept`: what keeps
        a record past its TTL: a lease)."""
        where, args = [], []
        if before is not None:
            row = conn.execute(f"SELECT created_at FROM {table} WHERE id = ?", (before,)).fetchone()
            if row is None:
                return []
            where.append("(created_at < ? OR (created_at = ? AND id < ?))")
            args += [row[0], row[0], before]
        if self._ttl is not None:
            where.append(f"({kept}saved_at >= ?)")
            args.append(self._clock() - self._ttl)
        sql = f"SELECT data FROM {table}" + (" WHERE " + " AND ".join(where) if where else "")
        sql += " ORDER BY created_at DESC, id DESC LIMIT ?"
        return [bytes(row[0]) for row in conn.execute(sql, (*args, list_limit(limit))).fetchall()]

    def _past_ttl(self, saved_at: float, lease_until: float | None) -> bool:
        """Expired: written more than `ttl` ago, and not running (a running response's lease is set)."""
        return self._ttl is not None and lease_until is None and self._clock() - saved_at > self._ttl

    async def run_maintenance(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Sweep now and every `_SWEEP_EVERY` seconds, until cancelled or the store is closed.

        A sweep that fails (the file locked by another process for longer
        than the busy timeout, a full disk) is logged at DEBUG and tried
        again at the next one: expired records still read as unknown.
        """
        with self._maintenance:
            task_status.started()
            while True:
                try:
                    deleted = await self.sweep()
                except StoreUnavailable as exc:
                    log.debug(
                        "sweeping expired responses failed (%r); trying again in %.0f s", exc.__cause__, _SWEEP_EVERY
                    )
                else:
                    if deleted:
                        log.debug("swept %d expired responses", deleted)
                await trio.sleep(_SWEEP_EVERY)

    async def sweep(self) -> int:
        """Delete expired records and their items, give the freed pages back, truncate the WAL; how many were deleted.

        Runs in worker threads, one short transaction at a time: `_SWEEP_BATCH`
        records, then `_VACUUM_STEP` pages, so that other writers (this
        process's saves among them) wait milliseconds, not the whole sweep.

        Raises:
            StoreUnavailable: the file failed.
        """
        deleted = 0
        if self._ttl is not None:
            cutoff = self._clock() - self._ttl
            while True:
                count = await self._in_thread(self._sweep_batch, cutoff)
                deleted += count
                if count < _SWEEP_BATCH:
                    break
        freed = 0
        while step := await self._in_thread(self._vacuum_step):  # also what `delete` and loads freed
            freed += step
        if deleted or freed:
            await self._in_thread(self._truncate_wal)
        return deleted

    async def _in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        try:
            return await self._file.run_in_thread(fn, *args)
        except sqlite3.Error as exc:
            raise StoreUnavailable(_FAILED) from exc

    @staticmethod
    def _sweep_batch(conn: sqlite3.Connection, cutoff: float) -> int:
        with _transaction(conn):
            ids = conn.execute(
                "SELECT id FROM responses WHERE saved_at < ? AND lease_until IS NULL LIMIT ?", (cutoff, _SWEEP_BATCH)
            ).fetchall()
            conn.executemany("DELETE FROM items WHERE response_id = ?", ids)
            conn.executemany("DELETE FROM responses WHERE id = ?", ids)
            conversations = conn.execute(
                "SELECT id FROM conversations WHERE saved_at < ? LIMIT ?", (cutoff, _SWEEP_BATCH)
            ).fetchall()
            conn.executemany("DELETE FROM conversations WHERE id = ?", conversations)
            threads = conn.execute("SELECT id FROM threads WHERE saved_at < ? LIMIT ?", (cutoff, _SWEEP_BATCH)).fetchall()
            conn.executemany("DELETE FROM threads WHERE id = ?", threads)
        return len(ids) + len(conversations) + len(threads)

    @staticmethod
    def _vacuum_step(conn: sqlite3.Connection) -> int:
        """Give up to `_VACUUM_STEP` free pages back to the file system; how many were."""
        free = _pragma(conn, "freelist_count")
        if not free:
            return 0
        # executescript steps the pragma to its end: `execute` would free a single page.
        conn.executescript(f"PRAGMA incremental_vacuum({_VACUUM_STEP});")
        return free - _pragma(conn, "freelist_count")  # 0 in a file without incremental auto-vacuum

    @staticmethod
    def _truncate_wal(conn: sqlite3.Connection) -> None:
        """Checkpoint the whole WAL and truncate it to nothing, or leave it if readers hold it for long.

        While it waits for readers, a truncating checkpoint holds up writers:
        it waits `_CHECKPOINT_WAIT_MS` at most, and the next sweep tries again.
        """
        waited = _pragma(conn, "busy_timeout")
        conn.execute(f"PRAGMA busy_timeout={_CHECKPOINT_WAIT_MS}")
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        finally:
            conn.execute(f"PRAGMA busy_timeout={waited}")

    async def aclose(self) -> None:
        self._maintenance.cancel()
        await self._file.aclose()


def _response_created(data: bytes) -> float:
    try:
        return response_created_at(decode_record(bytes(data)))
    except Exception:  # a record that cannot be read is listed last (loading it still fails as before)
        return 0.0


def _conversation_created(data: bytes) -> float:
    try:
        return float(decode_conversation(bytes(data)).created_at)
    except Exception:
        return 0.0


def _pragma(conn: sqlite3.Connection, name: str) -> int:
    return int(conn.execute(f"PRAGMA {name}").fetchall()[0][0])


def _create_private(path: pathlib.Path) -> None:
    """Create the database file (and its directory) for its owner only; tighten an existing one."""
    if not path.parent.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)  # no O_EXCL: another worker may create it too
    try:
        os.fchmod(fd, 0o600)
    except PermissionError:
        pass  # not ours to change; SQLite still opens it
    finally:
        os.close(fd)
    for suffix in ("-wal", "-shm"):
        derived = path.with_name(path.name + suffix)
        try:
            os.chmod(derived, 0o600)
        except (FileNotFoundError, PermissionError):
            pass


def _retry_locked(step: Any, *, budget: float = 30.0) -> None:
    """Run a start-up statement, retrying while another process holds the database."""
    deadline = time.monotonic() + budget
    delay = 0.01
    while True:
        try:
            step()
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(delay)  # start-up, before the event loop serves anything
            delay = min(delay * 2, 0.25)


class _transaction:
    """BEGIN IMMEDIATE ... COMMIT, rolled back on error: a record is all or nothing."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def __enter__(self) -> None:
        self._conn.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self._conn.execute("COMMIT" if exc_type is None else "ROLLBACK")
