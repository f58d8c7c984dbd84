"""SQLite store: the embedded default.  Survives restarts; safe for several
worker processes on one machine (WAL journal, busy timeout, one transaction
per record).

Each call first runs on the event loop's own thread, on a connection that
never waits for a lock (`SQLiteFile`): a record is a compressed blob of a
few KiB, written in tens of µs, where a hop to a worker thread and back
would cost several times as much.  Only when another process (a worker of
the same machine) holds the write lock does the call wait for it, in a
worker thread on a second connection.  The WAL is checkpointed from that
thread too, so the loop never waits for a checkpoint's disk writes.
The database holds conversations: its file is created readable by its owner
only (0600, and the -wal/-shm files SQLite derives from it), in a directory
created 0700.
"""

from __future__ import annotations

import os
import pathlib
import sqlite3
import time
from collections.abc import Callable
from typing import Any, TypeVar

import trio

from ..errors import StoreUnavailable
from .base import Change, StoredResponse, decode_record, encode_record

T = TypeVar("T")

__all__ = ["SQLiteStore"]

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
"""
# Added after the first release: existing files gain the column at start-up.
_LEASES = """
CREATE INDEX IF NOT EXISTS responses_by_lease ON responses(lease_until) WHERE lease_until IS NOT NULL;
"""


class SQLiteFile:
    """Two connections to one SQLite file, and where each call runs (see the module's docstring).

    `run(fn, *args)` calls `fn(connection, *args)`: on the loop's thread with
    the connection that does not wait, or, when that one finds the database
    locked, in a worker thread with the one that waits (up to 30 s), one
    call at a time.
    """

    _CHECKPOINT_EVERY = 1000  # rows changed on the loop's connection between checkpoints

    def __init__(self, path: str, setup: Callable[[sqlite3.Connection], None]) -> None:
        if path != ":memory:":
            _create_private(pathlib.Path(path))
        self.conn = sqlite3.connect(path, timeout=30, check_same_thread=False, isolation_level=None)
        # Switching a new file to WAL ignores the busy timeout: when several
        # workers start together on one file, all but one see "locked" at once.
        _retry_locked(lambda: self.conn.execute("PRAGMA journal_mode=WAL"))
        self.conn.execute("PRAGMA synchronous=NORMAL")  # durable across process crashes; WAL keeps it atomic
        setup(self.conn)
        if path == ":memory:":
            self.fast: sqlite3.Connection | None = None  # a second connection would be another database
        else:
            self.fast = sqlite3.connect(path, timeout=0, check_same_thread=False, isolation_level=None)
            self.fast.execute("PRAGMA synchronous=NORMAL")
            self.fast.execute("PRAGMA wal_autocheckpoint=0")  # checkpoints run in a worker thread (below)
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
        return await trio.to_thread.run_sync(fn, self.conn, *args, limiter=self._limiter)

    def _checkpoint(self) -> None:
        """Copy the WAL into the database file (PASSIVE: writers are not held up)."""
        self.conn.execute("PRAGMA wal_checkpoint(PASSIVE)")

    async def aclose(self) -> None:
        if self.fast is not None:
            self.fast.close()
        await trio.to_thread.run_sync(self.conn.close, limiter=self._limiter)


_FAILED = "The conversation store failed; try again."


class _Save:
    """A record waiting in a batch, and what became of it."""

    __slots__ = ("data", "record", "done", "error")

    def __init__(self, data: bytes, record: StoredResponse) -> None:
        self.data = data
        self.record = record
        self.done = trio.Event()
        self.error: StoreUnavailable | None = None


class SQLiteStore:
    def __init__(self, path: str, *, ttl: float | None = None) -> None:
        self._ttl = ttl
        self._file = SQLiteFile(path, self._setup)
        self._saves: list[_Save] = []  # the batch being gathered (see `save`)

    def _setup(self, conn: sqlite3.Connection) -> None:
        _retry_locked(lambda: conn.executescript(_SCHEMA))
        _retry_locked(lambda: self._add_lease_column(conn))

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

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        try:
            return await self._file.run(fn, *args)
        except sqlite3.Error as exc:
            raise StoreUnavailable(_FAILED) from exc

    async def save(self, record: StoredResponse) -> None:
        """Records saved in the same pass of the event loop share one transaction.

        The first save of a pass yields once, so that the others ready to
        save join it, then writes them all: a commit costs tens of µs of
        page writes however many records it carries.  Each caller still
        returns only once its record is committed (or raises for all).
        """
        mine = _Save(encode_record(record), record)
        self._saves.append(mine)
        with trio.CancelScope(shield=True):  # a batch carries other callers' records
            if len(self._saves) > 1:
                await mine.done.wait()  # another save is gathering the batch
            else:
                await trio.lowlevel.cancel_shielded_checkpoint()
                batch, self._saves = self._saves, []
                try:
                    await self._run(self._save_batch, batch)
                except BaseException as exc:
                    failed = exc if isinstance(exc, StoreUnavailable) else StoreUnavailable(_FAILED)
                    for save in batch:
                        save.error = failed
                    raise  # this caller's own failure, as it happened
                finally:
                    for save in batch:
                        save.done.set()
        if mine.error is not None:
            raise mine.error

    def _save_batch(self, conn: sqlite3.Connection, batch: list[_Save]) -> None:
        with _transaction(conn):
            for save in batch:
                self._write(conn, save.data, save.record)

    @staticmethod
    def _write(conn: sqlite3.Connection, data: bytes, record: StoredResponse) -> None:
        response_id = record.id
        conn.execute(
            "INSERT OR REPLACE INTO responses (id, data, saved_at, lease_until) VALUES (?, ?, ?, ?)",
            (response_id, data, time.time(), record.lease_until),
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
        return await self._run(self._expired, now)

    @staticmethod
    def _expired(conn: sqlite3.Connection, now: float) -> list[str]:
        rows = conn.execute(
            "SELECT id FROM responses WHERE lease_until IS NOT NULL AND lease_until < ?", (now,)
        ).fetchall()
        return [str(row[0]) for row in rows]

    async def load(self, response_id: str) -> StoredResponse | None:
        data = await self._run(self._load, response_id)
        return decode_record(data) if data is not None else None

    def _load(self, conn: sqlite3.Connection, response_id: str, *, in_transaction: bool = False) -> bytes | None:
        row = conn.execute("SELECT data, saved_at FROM responses WHERE id = ?", (response_id,)).fetchone()
        if row is None:
            return None
        if self._ttl is not None and time.time() - row[1] > self._ttl:
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

    async def aclose(self) -> None:
        await self._file.aclose()


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
