"""Redis store: shared by every gateway process and machine, with a TTL.

redis-py's asyncio client does not run under trio, so the synchronous
client is used from worker threads (a limiter bounds how many at once; the
client's own connection pool is thread-safe).  A record and its item index
are written in one MULTI/EXEC transaction; `update` is optimistic (WATCH,
retried on conflict).  Running background responses' leases live in one
sorted set, scored by their end.

Records and their item keys expire through Redis's own expiry, `ttl`
after their last write (every save and update sets it again, to the
millisecond); a record holding a lease (a running background response) is
written without one, so it cannot vanish while it runs, and gains it with
the write that clears its lease.

Nothing is lost only if Redis itself keeps what it acknowledged: with
snapshots alone (its default) a restart loses every write since the last
snapshot.  `durability_warning` tells at start-up when the append-only file
is off.

Listing reads one sorted set per kind (responses, conversations) of ids
scored by `created_at`, kept in the same transaction as each write and
delete.  A record Redis expired leaves its id behind: a listing skips (and
drops) ids whose record is gone, and with a TTL every write also drops the
ids whose record's expiry has passed (a second sorted set, scored by it), a
few at a time, so the index holds about what is stored.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

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
    decode_record,
    decode_thread,
    encode_conversation,
    encode_record,
    encode_thread,
    list_limit,
    response_created_at,
)

__all__ = ["RedisStore"]

T = TypeVar("T")

# Drop up to ARGV[2] ids whose expiry (KEYS[1]'s score) is before ARGV[1] from both sorted sets.
_PRUNE = """
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
if #gone > 0 then
  redis.call('ZREM', KEYS[1], unpack(gone))
  redis.call('ZREM', KEYS[2], unpack(gone))
end
return #gone
"""
_PRUNED_PER_WRITE = 20  # (more than one write's worth: the index shrinks as fast as records expire)

# One page of KEYS[1] (newest first): ARGV[2] ids after ARGV[1] ('' from the start); false when
# ARGV[1] is not there.  One script, so that a write between finding the cursor and reading on
# cannot shift the page.
_PAGE = """
local start = 0
if ARGV[1] ~= '' then
  local rank = redis.call('ZREVRANK', KEYS[1], ARGV[1])
  if not rank then
    return false
  end
  start = rank + 1
end
return redis.call('ZREVRANGE', KEYS[1], start, start + tonumber(ARGV[2]) - 1)
"""

class RedisStore:
    def __init__(
        self,
        url: str,
        *,
        ttl: float | None = None,
        prefix: str = "gateway",
        threads: int = 16,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`clock` (wall-clock seconds) dates the listing index's expiries; Redis expires the
        records themselves by its own clock."""
        import redis  # imported here: only deployments that choose Redis need the package

        self._redis = redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5, max_connections=threads)
        self._errors = redis.exceptions.RedisError
        self._conflict = redis.exceptions.WatchError
        self._ttl_ms = max(1, round(ttl * 1000)) if ttl else None
        self._prefix = prefix
        self._leases = f"{prefix}:leases"
        self._limiter = trio.CapacityLimiter(threads)
        self._prune = self._redis.register_script(_PRUNE)
        self._page_script = self._redis.register_script(_PAGE)
        self._clock = clock

    def _key(self, kind: str, key: str) -> str:
        return f"{self._prefix}:{kind}:{key}"

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return await trio.to_thread.run_sync(fn, *args, limiter=self._limiter)
        except self._errors as exc:
            raise StoreUnavailable("The conversation store failed; try again.") from exc

    async def durability_warning(self) -> str | None:
        """Why acknowledged writes could be lost on a Redis restart, or None.

        Raises:
            StoreUnavailable: Redis could not be asked.
        """
        info = await self._run(self._redis.info, "persistence")
        if int(info.get("aof_enabled", 0)):
            return None
        return (
            "Redis does not keep an append-only file (appendonly no): a Redis restart loses the responses "
            "stored since its last snapshot. Run redis-server with --appendonly yes (see docs/conversation-state.md)."
        )

    async def save(self, record: StoredResponse) -> None:
        await self._run(self._save, record)

    def _save(self, record: StoredResponse) -> None:
        pipe = self._redis.pipeline(transaction=True)
        self._queue_write(pipe, record)
        pipe.execute()

    def _queue_write(self, pipe: Any, record: StoredResponse) -> None:
        expiry = self._ttl_ms if record.lease_until is None else None  # SET without PX also drops an old expiry
        pipe.set(self._key("response", record.id), encode_record(record), px=expiry)
        for item_id in record.item_ids():
            pipe.set(self._key("item", item_id), record.id, px=expiry)
        if record.lease_until is not None:
            pipe.zadd(self._leases, {record.id: record.lease_until})
        else:
            pipe.zrem(self._leases, record.id)
        self._queue_index(pipe, "responses", record.id, response_created_at(record), expires=expiry is not None)

    def _queue_index(self, pipe: Any, kind: str, record_id: str, created: float, *, expires: bool) -> None:
        """List the record (`kind`'s sorted set), note when it expires, drop a few that have."""
        listed = self._key("index", kind)
        pipe.zadd(listed, {record_id: created})
        if self._ttl_ms is None:
            return
        expiry = self._key("expiry", kind)
        now = self._clock()
        if expires:
            pipe.zadd(expiry, {record_id: now + self._ttl_ms / 1000})
        else:  # a running response: it does not expire while it runs
            pipe.zrem(expiry, record_id)
        self._prune(keys=[expiry, listed], args=[now, _PRUNED_PER_WRITE], client=pipe)

    def _queue_unindex(self, pipe: Any, kind: str, record_id: str) -> None:
        pipe.zrem(self._key("index", kind), record_id)
        pipe.zrem(self._key("expiry", kind), record_id)

    async def update(self, response_id: str, change: Change) -> StoredResponse | None:
        return await self._run(self._update, response_id, change)

    def _update(self, response_id: str, change: Change) -> StoredResponse | None:
        return self._compare_and_set(self._key("response", response_id), decode_record, change, self._queue_write)

    def _compare_and_set(
        self, key: str, decode: Callable[[bytes], T], change: Callable[[T], T | None], write: Callable[[Any, T], None]
    ) -> T | None:
        """`change` applied to what `key` holds, written back (queued by `write` on the pipeline)
        unless someone wrote it since it was read: then it is read and changed again. None when
        there is nothing; what it holds when `change` leaves it."""
        with self._redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(key)
                    data = pipe.get(key)
                    if data is None:
                        return None
                    current = decode(data if isinstance(data, bytes) else data.encode())
                    new = change(current)
                    if new is None:
                        return current
                    pipe.multi()
                    write(pipe, new)
                    pipe.execute()
                    return new
                except self._conflict:
                    continue  # written by someone else since WATCH: read again

    async def expired_leases(self, now: float) -> list[str]:
        ids = await self._run(self._redis.zrangebyscore, self._leases, "-inf", f"({now}")
        return [i.decode() if isinstance(i, bytes) else str(i) for i in ids]

    async def load(self, response_id: str) -> StoredResponse | None:
        data = await self._run(self._redis.get, self._key("response", response_id))
        return decode_record(data) if data is not None else None

    async def delete(self, response_id: str) -> bool:
        return bool(await self._run(self._delete, response_id))

    def _delete(self, response_id: str) -> bool:
        key = self._key("response", response_id)
        data = self._redis.get(key)
        if data is None:
            return False
        pipe = self._redis.pipeline(transaction=True)
        pipe.delete(key)
        pipe.zrem(self._leases, response_id)
        self._queue_unindex(pipe, "responses", response_id)
        for item_id in decode_record(data if isinstance(data, bytes) else data.encode()).item_ids():
            pipe.delete(self._key("item", item_id))
        pipe.execute()
        return True

    async def holder_of(self, item_id: str) -> StoredResponse | None:
        response_id = await self._run(self._redis.get, self._key("item", item_id))
        return await self.load(response_id.decode()) if response_id is not None else None

    async def save_conversation(self, conversation: StoredConversation) -> None:
        await self._run(self._save_conversation, conversation)

    def _save_conversation(self, conversation: StoredConversation) -> None:
        pipe = self._redis.pipeline(transaction=True)
        self._queue_conversation(pipe, conversation)
        pipe.execute()

    def _queue_conversation(self, pipe: Any, conversation: StoredConversation) -> None:
        pipe.set(self._key("conversation", conversation.id), encode_conversation(conversation), px=self._ttl_ms)
        self._queue_index(pipe, "conversations", conversation.id, float(conversation.created_at), expires=True)

    async def load_conversation(self, conversation_id: str) -> StoredConversation | None:
        data = await self._run(self._redis.get, self._key("conversation", conversation_id))
        return decode_conversation(data) if data is not None else None

    async def update_conversation(
        self, conversation_id: str, change: ConversationChange
    ) -> StoredConversation | None:
        return await self._run(self._update_conversation, conversation_id, change)

    def _update_conversation(self, conversation_id: str, change: ConversationChange) -> StoredConversation | None:
        key = self._key("conversation", conversation_id)
        return self._compare_and_set(key, decode_conversation, change, self._queue_conversation)

    async def delete_conversation(self, conversation_id: str) -> bool:
        return bool(await self._run(self._delete_conversation, conversation_id))

    def _delete_conversation(self, conversation_id: str) -> bool:
        pipe = self._redis.pipeline(transaction=True)
        pipe.delete(self._key("conversation", conversation_id))
        self._queue_unindex(pipe, "conversations", conversation_id)
        return bool(pipe.execute()[0])

    async def list_responses(self, *, limit: int = 50, before: str | None = None) -> list[StoredResponse]:
        found = await self._run(self._list, "responses", "response", limit, before)
        return [decode_record(data) for data in found]

    async def list_conversations(self, *, limit: int = 50, before: str | None = None) -> list[StoredConversation]:
        found = await self._run(self._list, "conversations", "conversation", limit, before)
        return [decode_conversation(data) for data in found]

    def _list(self, kind: str, record_kind: str, limit: int, before: str | None) -> list[bytes]:
        """Up to `limit` records of the index's ids after `before`, skipping ids whose record
        Redis expired (dropped from the index once the page is read)."""
        listed = self._key("index", kind)
        wanted = list_limit(limit)
        found: list[bytes] = []
        gone: list[bytes] = []
        cursor = before
        while len(found) < wanted:
            ids = self._page_script(keys=[listed], args=[cursor or "", wanted - len(found)])
            if not ids:  # the end, or a cursor that is not listed (false: None)
                break
            values: list[Any] = self._redis.mget([self._key(record_kind, _text(i)) for i in ids])
            found += [value for value in values if value is not None]
            gone += [i for i, value in zip(ids, values) if value is None]
            cursor = _text(ids[-1])
        if gone:
            pipe = self._redis.pipeline(transaction=True)
            pipe.zrem(listed, *gone)
            pipe.zrem(self._key("expiry", kind), *gone)
            pipe.execute()
        return found

    async def save_thread(self, thread: StoredThread) -> None:
        key = self._key("thread", thread.id)
        await self._run(lambda: self._redis.set(key, encode_thread(thread), px=self._ttl_ms))

    async def load_thread(self, thread_id: str) -> StoredThread | None:
        data = await self._run(self._redis.get, self._key("thread", thread_id))
        return decode_thread(data) if data is not None else None

    async def update_thread(self, thread_id: str, change: ThreadChange) -> StoredThread | None:
        """As `update_conversation`: WATCH makes a claim on a thread hold across every process
        that shares the Redis (one continue at a time)."""
        key = self._key("thread", thread_id)

        def write(pipe: Any, new: StoredThread) -> None:
            pipe.set(key, encode_thread(new), px=self._ttl_ms)

        return await self._run(self._compare_and_set, key, decode_thread, change, write)

    async def aclose(self) -> None:
        await self._run(self._redis.close)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
