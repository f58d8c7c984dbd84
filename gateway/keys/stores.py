"""Where API keys and their counters live: memory, SQLite (the default), Redis (shared).

The same backends as the conversation store, chosen by the same settings,
so that every instance and `gateway keys` see the same keys.  Counters are
atomic in each: an SQLite transaction, a Redis INCRBY, a Lua script for
stream slots.  Library errors become `StoreUnavailable`.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import orjson
import trio

from ..config import ConfigError, Settings
from ..errors import StoreUnavailable
from ..ops.redact import public_url
from .model import ApiKey, KeyStore

__all__ = ["MemoryKeys", "RedisKeys", "SQLiteKeys", "open_key_store"]

T = TypeVar("T")


def open_key_store(settings: Settings) -> KeyStore:
    """The key store next to the conversation store the settings choose.

    Raises:
        ConfigError: the SQLite file cannot be opened.
    """
    if settings.store_backend == "memory":
        return MemoryKeys()
    if settings.store_backend == "redis":
        return RedisKeys(settings.redis_url)
    path = os.path.abspath(keys_path(settings.sqlite_path)) if settings.sqlite_path != ":memory:" else ":memory:"
    try:
        return SQLiteKeys(path)
    except (OSError, sqlite3.Error) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"SQLITE_PATH: cannot open the key store at {path!r}: {reason}") from None


def keys_path(sqlite_path: str) -> str:
    """The key store's file beside the conversation store's (`responses.sqlite3` ->
    `responses.keys.sqlite3`): a file of its own, so that saving a response never holds
    the lock a request's key check and counters need."""
    if sqlite_path == ":memory:":
        return sqlite_path
    stem, dot, suffix = sqlite_path.rpartition(".")
    return f"{stem}.keys.{suffix}" if dot and "/" not in suffix else sqlite_path + ".keys"


class MemoryKeys:
    """One process's keys (for tests and embedding: `gateway keys` cannot reach it)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._keys: dict[str, ApiKey] = {}
        self._counters: dict[str, tuple[int, float]] = {}
        self._slots: dict[str, dict[str, float]] = {}
        self._auth: str | None = None
        self._clock = clock

    @property
    def location(self) -> str:
        return "memory (this process only)"

    async def put(self, key: ApiKey) -> None:
        self._keys[key.name] = key

    async def auth_state(self) -> str | None:
        return self._auth

    async def set_auth(self, state: str) -> None:
        self._auth = state

    async def by_digest(self, key_digest: str) -> ApiKey | None:
        return next((k for k in self._keys.values() if k.digest == key_digest), None)

    async def by_name(self, name: str) -> ApiKey | None:
        return self._keys.get(name)

    async def all(self) -> list[ApiKey]:
        return sorted(self._keys.values(), key=lambda k: (k.created_at, k.name))

    async def add(self, counter: str, amount: int, ttl: float) -> int:
        now = self._clock()
        value, expires = self._counters.get(counter, (0, 0.0))
        if ttl and expires and expires < now:
            value = 0
        value += amount
        self._counters[counter] = (value, now + ttl if ttl else 0.0)
        return value

    async def read(self, counter: str) -> int:
        value, expires = self._counters.get(counter, (0, 0.0))
        return 0 if expires and expires < self._clock() else value

    async def reserve(self, counter: str, amount: int, limit: int, ttl: float) -> tuple[bool, int]:
        used = await self.read(counter)
        if used >= limit:
            return False, used
        return True, await self.add(counter, amount, ttl)

    async def acquire(self, pool: str, slot: str, limit: int, until: float, now: float) -> bool:
        slots = self._slots.setdefault(pool, {})
        for name in [n for n, end in slots.items() if end < now]:
            del slots[name]
        if slot not in slots and len(slots) >= limit:
            return False
        slots[slot] = until
        return True

    async def renew(self, pool: str, slots: list[str], until: float) -> None:
        held = self._slots.get(pool, {})
        for slot in slots:
            if slot in held:
                held[slot] = until

    async def release(self, pool: str, slot: str) -> None:
        self._slots.get(pool, {}).pop(slot, None)

    async def settle(self, release: tuple[str, str] | None, counters: Sequence[tuple[str, int, float]]) -> None:
        if release is not None:
            await self.release(*release)
        for counter, amount, ttl in counters:
            await self.add(counter, amount, ttl)

    async def aclose(self) -> None:
        pass


_SCHEMA = """
CREATE TABLE IF NOT EXISTS api_keys (name TEXT PRIMARY KEY, digest TEXT NOT NULL, data BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS api_keys_by_digest ON api_keys(digest);
CREATE TABLE IF NOT EXISTS key_counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL, expires REAL NOT NULL);
CREATE TABLE IF NOT EXISTS key_slots (pool TEXT NOT NULL, slot TEXT NOT NULL, until REAL NOT NULL, PRIMARY KEY (pool, slot));
CREATE TABLE IF NOT EXISTS key_settings (name TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


_KNOWN_KEYS = 1024  # digests remembered by SQLiteKeys.by_digest
# A request's end: the stream slot to give back, and (counter, amount, ttl) to add.
_Settlement = tuple[tuple[str, str] | None, Sequence[tuple[str, int, float]]]


class SQLiteKeys:
    """Keys and counters in the gateway's SQLite file (shared by the worker processes of one machine).

    Every request reads a key and counts against its limits, so each call
    is first tried on the event loop's own thread, on a connection that
    never waits for a lock: these are microsecond statements on a local
    file, and a thread hop would cost several times as much.  Only when
    another process holds the write lock does the call wait for it, in a
    worker thread, on a second connection.
    """

    def __init__(self, path: str, *, clock: Callable[[], float] = time.time) -> None:
        from ..store.sqlite import PassBatches, SQLiteFile, _retry_locked

        self._file = SQLiteFile(path, lambda conn: _retry_locked(lambda: conn.executescript(_SCHEMA)))
        self._settles = PassBatches[_Settlement](self._settle_batch, self._settle_failure)
        self._path = path
        self._clock = clock
        # Keys as last read, by digest: (the connection, its data_version then, the key or None).
        self._known: dict[str, tuple[sqlite3.Connection, int, ApiKey | None]] = {}

    @property
    def location(self) -> str:
        return f"SQLite file {self._path}"

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        try:
            return await self._file.run(fn, *args)
        except sqlite3.Error as exc:
            raise StoreUnavailable(
                "The key store failed; try again.", cause=f"key store ({self.location}): {type(exc).__name__}: {exc}"
            ) from exc

    @staticmethod
    def _write(conn: sqlite3.Connection, sql: str, *args: Any) -> None:
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(sql, args)

    async def put(self, key: ApiKey) -> None:
        self._known.clear()
        await self._run(
            self._write,
            "INSERT OR REPLACE INTO api_keys (name, digest, data) VALUES (?, ?, ?)",
            key.name,
            key.digest,
            orjson.dumps(key.to_json()),
        )

    @staticmethod
    def _one(conn: sqlite3.Connection, sql: str, *args: Any) -> ApiKey | None:
        row = conn.execute(sql, args).fetchone()
        return ApiKey.from_json(orjson.loads(row[0])) if row is not None else None

    def _by_digest(self, conn: sqlite3.Connection, key_digest: str) -> ApiKey | None:
        """The key read on every request, from memory while the file is unchanged.

        `PRAGMA data_version` changes when any other connection commits to the
        file (`gateway keys` revoking a key, another worker, this process's
        other connection); this store's own key writes (`put`) forget what was
        read.  So a revoked key is still refused at its very next request, for
        the price of one statement instead of a read and a decode.
        """
        version = conn.execute("PRAGMA data_version").fetchone()[0]
        known = self._known.get(key_digest)
        if known is not None and known[0] is conn and known[1] == version:
            return known[2]
        key = self._one(conn, "SELECT data FROM api_keys WHERE digest = ?", key_digest)
        if len(self._known) >= _KNOWN_KEYS:
            self._known.clear()  # (wrong keys are remembered too: a flood of them cannot grow this)
        self._known[key_digest] = (conn, version, key)
        return key

    async def by_digest(self, key_digest: str) -> ApiKey | None:
        return await self._run(self._by_digest, key_digest)

    async def by_name(self, name: str) -> ApiKey | None:
        return await self._run(self._one, "SELECT data FROM api_keys WHERE name = ?", name)

    @staticmethod
    def _all(conn: sqlite3.Connection) -> list[ApiKey]:
        rows = conn.execute("SELECT data FROM api_keys").fetchall()
        return sorted((ApiKey.from_json(orjson.loads(row[0])) for row in rows), key=lambda k: (k.created_at, k.name))

    async def all(self) -> list[ApiKey]:
        return await self._run(self._all)

    @staticmethod
    def _auth_state(conn: sqlite3.Connection) -> str | None:
        row = conn.execute("SELECT value FROM key_settings WHERE name = 'auth'").fetchone()
        return str(row[0]) if row is not None else None

    async def auth_state(self) -> str | None:
        return await self._run(self._auth_state)

    async def set_auth(self, state: str) -> None:
        await self._run(self._write, "INSERT OR REPLACE INTO key_settings (name, value) VALUES ('auth', ?)", state)

    def _add(self, conn: sqlite3.Connection, counter: str, amount: int, ttl: float) -> int:
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            return self._count(conn, counter, amount, ttl)

    def _count(self, conn: sqlite3.Connection, counter: str, amount: int, ttl: float) -> int:
        """Add to a counter inside the caller's transaction; its new value."""
        now = self._clock()
        row = conn.execute("SELECT value, expires FROM key_counters WHERE name = ?", (counter,)).fetchone()
        value = 0 if row is None or (row[1] and row[1] < now) else int(row[0])
        value += amount
        conn.execute(
            "INSERT OR REPLACE INTO key_counters (name, value, expires) VALUES (?, ?, ?)",
            (counter, value, now + ttl if ttl else 0.0),
        )
        if ttl and value == amount:  # a new window: sweep the expired ones now and then
            conn.execute("DELETE FROM key_counters WHERE expires > 0 AND expires < ?", (now,))
        return value

    async def add(self, counter: str, amount: int, ttl: float) -> int:
        return await self._run(self._add, counter, amount, ttl)

    def _read(self, conn: sqlite3.Connection, counter: str) -> int:
        row = conn.execute("SELECT value, expires FROM key_counters WHERE name = ?", (counter,)).fetchone()
        return 0 if row is None or (row[1] and row[1] < self._clock()) else int(row[0])

    async def read(self, counter: str) -> int:
        return await self._run(self._read, counter)

    def _reserve(self, conn: sqlite3.Connection, counter: str, amount: int, limit: int, ttl: float) -> tuple[bool, int]:
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            used = self._read(conn, counter)
            if used >= limit:
                return False, used
            return True, self._count(conn, counter, amount, ttl)

    async def reserve(self, counter: str, amount: int, limit: int, ttl: float) -> tuple[bool, int]:
        return await self._run(self._reserve, counter, amount, limit, ttl)

    @staticmethod
    def _acquire(conn: sqlite3.Connection, pool: str, slot: str, limit: int, until: float, now: float) -> bool:
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("DELETE FROM key_slots WHERE pool = ? AND until < ?", (pool, now))
            taken = conn.execute(
                "SELECT COUNT(*) FROM key_slots WHERE pool = ? AND slot != ?", (pool, slot)
            ).fetchone()[0]
            if taken >= limit:
                return False
            conn.execute("INSERT OR REPLACE INTO key_slots (pool, slot, until) VALUES (?, ?, ?)", (pool, slot, until))
            return True

    async def acquire(self, pool: str, slot: str, limit: int, until: float, now: float) -> bool:
        return await self._run(self._acquire, pool, slot, limit, until, now)

    @staticmethod
    def _renew(conn: sqlite3.Connection, pool: str, slots: list[str], until: float) -> None:
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(
                "UPDATE key_slots SET until = ? WHERE pool = ? AND slot = ?", [(until, pool, s) for s in slots]
            )

    async def renew(self, pool: str, slots: list[str], until: float) -> None:
        await self._run(self._renew, pool, slots, until)

    async def release(self, pool: str, slot: str) -> None:
        await self._run(self._write, "DELETE FROM key_slots WHERE pool = ? AND slot = ?", pool, slot)

    async def settle(self, release: tuple[str, str] | None, counters: Sequence[tuple[str, int, float]]) -> None:
        """Requests that end in the same pass of the event loop settle in one transaction
        (`PassBatches`, as the conversation store's saves do)."""
        await self._settles((release, counters))

    async def _settle_batch(self, batch: list[_Settlement]) -> None:
        await self._run(self._settle, batch)

    def _settle(self, conn: sqlite3.Connection, batch: list[_Settlement]) -> None:
        releases = [release for release, _ in batch if release is not None]
        totals: dict[str, tuple[int, float]] = {}  # each counter once, with the batch's sum
        for _, counters in batch:
            for counter, amount, ttl in counters:
                total, _ttl = totals.get(counter, (0, ttl))
                totals[counter] = (total + amount, ttl)
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            if releases:
                conn.executemany("DELETE FROM key_slots WHERE pool = ? AND slot = ?", releases)
            for counter, (amount, ttl) in totals.items():
                self._count(conn, counter, amount, ttl)

    def _settle_failure(self, error: BaseException) -> BaseException:
        if isinstance(error, StoreUnavailable):
            return error
        return StoreUnavailable("The key store failed; try again.", cause=f"key store ({self.location}): {type(error).__name__}")

    async def aclose(self) -> None:
        await self._file.aclose()


# Take a slot if fewer than ARGV[1] unexpired ones are held: atomic in Redis.
_ACQUIRE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[3])
if redis.call('ZSCORE', KEYS[1], ARGV[4]) == false and redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then
  return 0
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[4])
redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[2]) - tonumber(ARGV[3])) + 60)
return 1
"""


# Reserve ARGV[1] on a counter below ARGV[2]: atomic in Redis.  {taken, value}.
_RESERVE = """
local used = tonumber(redis.call('GET', KEYS[1]) or '0')
if used >= tonumber(ARGV[2]) then
  return {0, used}
end
used = redis.call('INCRBY', KEYS[1], ARGV[1])
if redis.call('TTL', KEYS[1]) < 0 then
  redis.call('EXPIRE', KEYS[1], ARGV[3])
end
return {1, used}
"""


class RedisKeys:
    """Keys and counters in Redis: every instance sees the same keys and counts the same limits."""

    def __init__(self, url: str, *, prefix: str = "gateway", threads: int = 16) -> None:
        import redis

        self._redis = redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5, max_connections=threads)
        self._errors = redis.exceptions.RedisError
        self._url = public_url(url)
        self._prefix = prefix
        self._limiter = trio.CapacityLimiter(threads)
        self._acquire_script = self._redis.register_script(_ACQUIRE)
        self._reserve_script = self._redis.register_script(_RESERVE)

    @property
    def location(self) -> str:
        return f"Redis at {self._url}"

    def _k(self, *parts: str) -> str:
        return ":".join((self._prefix, *parts))

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return await trio.to_thread.run_sync(fn, *args, limiter=self._limiter)
        except self._errors as exc:
            raise StoreUnavailable(
                "The key store failed; try again.", cause=f"key store ({self.location}): {type(exc).__name__}: {exc}"
            ) from exc

    def _put(self, key: ApiKey) -> None:
        old = self._redis.hget(self._k("keys"), key.name)
        pipe = self._redis.pipeline(transaction=True)
        if old is not None:
            pipe.delete(self._k("keydigest", ApiKey.from_json(orjson.loads(old)).digest))
        data = orjson.dumps(key.to_json())
        pipe.hset(self._k("keys"), key.name, data)
        pipe.set(self._k("keydigest", key.digest), data)  # the whole key: one round trip per request
        pipe.execute()

    async def put(self, key: ApiKey) -> None:
        await self._run(self._put, key)

    async def by_name(self, name: str) -> ApiKey | None:
        data = await self._run(self._redis.hget, self._k("keys"), name)
        return ApiKey.from_json(orjson.loads(data)) if data is not None else None

    async def by_digest(self, key_digest: str) -> ApiKey | None:
        data = await self._run(self._redis.get, self._k("keydigest", key_digest))
        return ApiKey.from_json(orjson.loads(data)) if data is not None else None

    async def all(self) -> list[ApiKey]:
        values = await self._run(self._redis.hvals, self._k("keys"))
        return sorted((ApiKey.from_json(orjson.loads(v)) for v in values), key=lambda k: (k.created_at, k.name))

    async def auth_state(self) -> str | None:
        value = await self._run(self._redis.get, self._k("auth"))
        return value.decode() if isinstance(value, bytes) else value

    async def set_auth(self, state: str) -> None:
        await self._run(self._redis.set, self._k("auth"), state)

    def _add(self, counter: str, amount: int, ttl: float) -> int:
        pipe = self._redis.pipeline(transaction=True)
        pipe.incrby(self._k("counter", counter), amount)
        if ttl:
            pipe.expire(self._k("counter", counter), int(ttl), nx=True)
        return int(pipe.execute()[0])

    async def add(self, counter: str, amount: int, ttl: float) -> int:
        return int(await self._run(self._add, counter, amount, ttl))

    async def read(self, counter: str) -> int:
        value = await self._run(self._redis.get, self._k("counter", counter))
        return int(value) if value is not None else 0

    async def reserve(self, counter: str, amount: int, limit: int, ttl: float) -> tuple[bool, int]:
        taken, used = await self._run(
            lambda: self._reserve_script(keys=[self._k("counter", counter)], args=[amount, limit, int(ttl)])
        )
        return bool(taken), int(used)

    async def acquire(self, pool: str, slot: str, limit: int, until: float, now: float) -> bool:
        taken = await self._run(
            lambda: self._acquire_script(keys=[self._k("slots", pool)], args=[limit, until, now, slot])
        )
        return bool(taken)

    def _renew(self, pool: str, slots: list[str], until: float) -> None:
        if slots:
            self._redis.zadd(self._k("slots", pool), {slot: until for slot in slots}, xx=True)

    async def renew(self, pool: str, slots: list[str], until: float) -> None:
        await self._run(self._renew, pool, slots, until)

    async def release(self, pool: str, slot: str) -> None:
        await self._run(self._redis.zrem, self._k("slots", pool), slot)

    def _settle(self, release: tuple[str, str] | None, counters: Sequence[tuple[str, int, float]]) -> None:
        pipe = self._redis.pipeline(transaction=True)
        if release is not None:
            pipe.zrem(self._k("slots", release[0]), release[1])
        for counter, amount, ttl in counters:
            pipe.incrby(self._k("counter", counter), amount)
            if ttl:
                pipe.expire(self._k("counter", counter), int(ttl), nx=True)
        pipe.execute()

    async def settle(self, release: tuple[str, str] | None, counters: Sequence[tuple[str, int, float]]) -> None:
        await self._run(self._settle, release, counters)

    async def aclose(self) -> None:
        await self._run(self._redis.close)
