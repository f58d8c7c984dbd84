"""Redis store: shared by every gateway process and machine, with a TTL.

redis-py's asyncio client does not run under trio, so the synchronous
client is used from worker threads (a limiter bounds how many at once; the
client's own connection pool is thread-safe).  A record and its item index
are written in one MULTI/EXEC transaction.
"""

from __future__ import annotations

from typing import Any

import trio

from .base import StoredResponse, decode_record, encode_record

__all__ = ["RedisStore"]


class RedisStore:
    def __init__(self, url: str, *, ttl: float | None = None, prefix: str = "gateway", threads: int = 16) -> None:
        import redis  # imported here: only deployments that choose Redis need the package

        self._redis = redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5, max_connections=threads)
        self._ttl = int(ttl) if ttl else None
        self._prefix = prefix
        self._limiter = trio.CapacityLimiter(threads)

    def _key(self, kind: str, key: str) -> str:
        return f"{self._prefix}:{kind}:{key}"

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await trio.to_thread.run_sync(fn, *args, limiter=self._limiter)

    async def save(self, record: StoredResponse) -> None:
        await self._run(self._save, record.id, encode_record(record), record.item_ids())

    def _save(self, response_id: str, data: bytes, item_ids: list[str]) -> None:
        pipe = self._redis.pipeline(transaction=True)
        pipe.set(self._key("response", response_id), data, ex=self._ttl)
        for item_id in item_ids:
            pipe.set(self._key("item", item_id), response_id, ex=self._ttl)
        pipe.execute()

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
        for item_id in decode_record(data if isinstance(data, bytes) else data.encode()).item_ids():
            pipe.delete(self._key("item", item_id))
        pipe.execute()
        return True

    async def find_item(self, item_id: str) -> dict[str, Any] | None:
        response_id = await self._run(self._redis.get, self._key("item", item_id))
        if response_id is None:
            return None
        record = await self.load(response_id.decode())
        return record.find_item(item_id) if record is not None else None

    async def aclose(self) -> None:
        await self._run(self._redis.close)
