"""In-process store: bounded by a count and/or a TTL, least recently used evicted first.

Fast and simple, and gone on restart; for one process only.  Records are
kept encoded, so what a caller does with a loaded record never changes the
stored one (the same behaviour as the other stores).  A record expires
`ttl` seconds after its last write (save or update), unless it holds a
lease (a running background response), and is dropped when next looked up;
the count bound evicts the others, so no sweep is needed.  Listing sorts
what is held (at most the count bound) and decodes only the page.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

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

__all__ = ["MemoryStore"]


class MemoryStore:
    def __init__(
        self, *, max_entries: int | None = 1000, ttl: float | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._max = max_entries
        self._ttl = ttl
        self._clock = clock
        # id -> (saved at, record, its item ids, its created_at)
        self._records: OrderedDict[str, tuple[float, bytes, tuple[str, ...], float]] = OrderedDict()
        self._items: dict[str, str] = {}  # item id -> response id
        self._leases: dict[str, float] = {}  # response id -> lease end
        self._conversations: dict[str, tuple[float, bytes, float]] = {}  # id -> (saved at, record, created_at)
        self._threads: OrderedDict[str, tuple[float, bytes]] = OrderedDict()  # id -> (saved at, record)

    async def save(self, record: StoredResponse) -> None:
        old = self._records.pop(record.id, None)
        if old is not None:
            self._unindex(record.id, old[2])
        item_ids = tuple(record.item_ids())
        self._records[record.id] = (self._clock(), encode_record(record), item_ids, response_created_at(record))
        for item_id in item_ids:
            self._items[item_id] = record.id
        if record.lease_until is not None:
            self._leases[record.id] = record.lease_until
        else:
            self._leases.pop(record.id, None)
        # Evict from the least recently used end, never the record just saved.
        while self._max is not None and len(self._records) > self._max:
            evicted_id, (_, _, evicted_items, _) = self._records.popitem(last=False)
            self._unindex(evicted_id, evicted_items)

    async def load(self, response_id: str) -> StoredResponse | None:
        entry = self._records.get(response_id)
        if entry is None:
            return None
        saved_at, data, item_ids, _ = entry
        if self._expired(response_id, saved_at):
            del self._records[response_id]
            self._unindex(response_id, item_ids)
            return None
        self._records.move_to_end(response_id)
        return decode_record(data)

    async def update(self, response_id: str, change: Change) -> StoredResponse | None:
        # Nothing between the read and the write yields to another task.
        current = await self.load(response_id)
        if current is None:
            return None
        new = change(current)
        if new is None:
            return current
        await self.save(new)
        return new

    async def expired_leases(self, now: float) -> list[str]:
        return [response_id for response_id, until in self._leases.items() if until < now]

    async def delete(self, response_id: str) -> bool:
        entry = self._records.pop(response_id, None)
        if entry is None:
            return False
        self._unindex(response_id, entry[2])
        return True

    async def holder_of(self, item_id: str) -> StoredResponse | None:
        response_id = self._items.get(item_id)
        return await self.load(response_id) if response_id is not None else None

    async def save_conversation(self, conversation: StoredConversation) -> None:
        self._conversations[conversation.id] = (
            self._clock(),
            encode_conversation(conversation),
            float(conversation.created_at),
        )

    async def load_conversation(self, conversation_id: str) -> StoredConversation | None:
        entry = self._conversations.get(conversation_id)
        if entry is None:
            return None
        if self._ttl is not None and self._clock() - entry[0] > self._ttl:
            del self._conversations[conversation_id]
            return None
        return decode_conversation(entry[1])

    async def update_conversation(
        self, conversation_id: str, change: ConversationChange
    ) -> StoredConversation | None:
        current = await self.load_conversation(conversation_id)  # nothing yields between read and write
        if current is None:
            return None
        new = change(current)
        if new is None:
            return current
        await self.save_conversation(new)
        return new

    async def delete_conversation(self, conversation_id: str) -> bool:
        return await self.load_conversation(conversation_id) is not None and bool(
            self._conversations.pop(conversation_id, None)
        )

    async def save_thread(self, thread: StoredThread) -> None:
        self._threads.pop(thread.id, None)
        self._threads[thread.id] = (self._clock(), encode_thread(thread))
        while self._max is not None and len(self._threads) > self._max:
            self._threads.popitem(last=False)  # the least recently written first

    async def load_thread(self, thread_id: str) -> StoredThread | None:
        entry = self._threads.get(thread_id)
        if entry is None:
            return None
        if self._ttl is not None and self._clock() - entry[0] > self._ttl:
            del self._threads[thread_id]
            return None
        return decode_thread(entry[1])

    async def update_thread(self, thread_id: str, change: ThreadChange) -> StoredThread | None:
        current = await self.load_thread(thread_id)  # nothing yields between read and write
        if current is None:
            return None
        new = change(current)
        if new is None:
            return current
        await self.save_thread(new)
        return new

    async def list_responses(self, *, limit: int = 50, before: str | None = None) -> list[StoredResponse]:
        # (without moving what is listed to the recently used end: the operator's look is not a use)
        keys = [(entry[3], rid) for rid, entry in self._records.items() if not self._expired(rid, entry[0])]
        page = _page(keys, self._records, limit, before)
        return [decode_record(self._records[rid][1]) for rid in page]

    async def list_conversations(self, *, limit: int = 50, before: str | None = None) -> list[StoredConversation]:
        now, ttl = self._clock(), self._ttl
        keys = [
            (entry[2], cid)
            for cid, entry in self._conversations.items()
            if ttl is None or now - entry[0] <= ttl
        ]
        page = _page(keys, self._conversations, limit, before)
        return [decode_conversation(self._conversations[cid][1]) for cid in page]

    def _expired(self, response_id: str, saved_at: float) -> bool:
        running = response_id in self._leases  # a running response's record never expires
        return self._ttl is not None and not running and self._clock() - saved_at > self._ttl

    async def aclose(self) -> None:
        self._threads.clear()
        self._conversations.clear()
        self._records.clear()
        self._items.clear()
        self._leases.clear()

    def _unindex(self, response_id: str, item_ids: tuple[str, ...]) -> None:
        self._leases.pop(response_id, None)
        for item_id in item_ids:
            if self._items.get(item_id) == response_id:
                del self._items[item_id]


def _page(keys: list[tuple[float, str]], held: Mapping[str, Any], limit: int, before: str | None) -> list[str]:
    """The ids of one page of `keys` ((created_at, id) of what is listable), newest first."""
    keys.sort(reverse=True)
    if before is not None:
        entry = held.get(before)
        if entry is None:
            return []
        cursor = (entry[-1], before)  # (every entry's last field is its created_at)
        keys = [key for key in keys if key < cursor]
    return [key[1] for key in keys[: list_limit(limit)]]
