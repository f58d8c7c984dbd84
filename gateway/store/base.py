"""The store interface: what conversation state is kept, not where.

A `StoredResponse` is one response as the Responses API exposes it: the
final (or latest) `ResponseResource`, the input items it was given (after
`item_reference`s were resolved, each with an id), and the events it emitted.
Stores keep records whole: a record is written in one atomic step, so a
crash never leaves half of one behind, and `update` reads and writes one
atomically (a compare-and-set).  Items are also found by their own id, for
`item_reference` inputs.  A running background response holds a lease
(`lease_until`, wall-clock seconds) that its process renews; stores index
leases so that expired ones can be found after a crash.

With a TTL, a record expires that many seconds after its last write (a
save or an update) and then answers as an unknown one, by id and by item;
a record holding a lease does not expire while it holds it (a running
response must not vanish, and a lost one must still be found to be ended).

A `StoredConversation` (the Conversations API) is kept the same way: one
record, written whole (its metadata, its items in order, and the lock a
running response holds on it), changed only through `update_conversation`
(a compare-and-set), expiring `ttl` after its last write.  So is a
`StoredThread` (a message thread of the Messages API, under the id of the
answer it ends with): `save_thread`, `load_thread`, `update_thread`.

Responses and conversations can be listed, newest first (by `created_at`,
then id), a page at a time (`before`: the id the previous page ended with),
for the operator; what has expired or was deleted is not listed, and
threads are not listed at all.

Stores raise `StoreUnavailable` for their library's failures, and nothing
else.

Implementations (memory, SQLite, Redis) must not know about HTTP, the
translator or the backend; the contract tests in tests/test_store_contract.py
hold for all of them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson
import trio
import zstandard

from ..errors import StoreUnavailable

__all__ = [
    "LIST_LIMIT",
    "Change",
    "ConversationChange",
    "OwnerView",
    "ResponseStore",
    "StoredConversation",
    "StoredResponse",
    "StoredThread",
    "ThreadChange",
    "decode_conversation",
    "decode_record",
    "decode_thread",
    "encode_conversation",
    "encode_record",
    "encode_thread",
    "list_limit",
    "response_created_at",
    "save_retrying",
]

LIST_LIMIT = 100  # the most a page of `list_responses` / `list_conversations` holds


def list_limit(limit: int) -> int:
    """A page's size as asked for, within 0 and `LIST_LIMIT`."""
    return max(0, min(int(limit), LIST_LIMIT))


def response_created_at(record: StoredResponse) -> float:
    """What a stored response is listed by: its `created_at` (0 when it has none)."""
    value = record.response.get("created_at")
    return float(value) if isinstance(value, int | float) else 0.0


@dataclass
class StoredResponse:
    id: str
    response: dict[str, Any]
    input_items: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    previous_response_id: str | None = None
    lease_until: float | None = None  # a running background response's lease (wall-clock seconds)
    owner: str | None = None  # the API key (its id) that created it; None without keys

    def item_ids(self) -> list[str]:
        """Ids of every item this record can resolve: its inputs and its outputs."""
        ids = [item["id"] for item in self.input_items if isinstance(item.get("id"), str)]
        ids += [item["id"] for item in self.response.get("output") or () if isinstance(item.get("id"), str)]
        return ids

    def find_item(self, item_id: str) -> dict[str, Any] | None:
        for item in (*self.input_items, *(self.response.get("output") or ())):
            if item.get("id") == item_id:
                return item
        return None


def encode_record(record: StoredResponse) -> bytes:
    """The record as JSON, compressed with zstd at its fastest level (an event log repeats
    itself, so a long record shrinks to a small fraction, and stores write that instead)."""
    return _zstd().compress(orjson.dumps(
        {
            "id": record.id,
            "response": record.response,
            "input_items": record.input_items,
            "events": record.events,
            "previous_response_id": record.previous_response_id,
            "lease_until": record.lease_until,
            "owner": record.owner,
        }
    ))


_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_codecs = threading.local()  # zstd's (de)compressor objects must not be shared between threads


def _zstd() -> Any:
    compressor = getattr(_codecs, "compressor", None)
    if compressor is None:
        compressor = _codecs.compressor = zstandard.ZstdCompressor(level=1)
    return compressor


def _decompressed(data: bytes) -> bytes:
    """What `_zstd` compressed, or `data` itself when it is plain JSON (what earlier versions stored)."""
    if data[:4] != _ZSTD_MAGIC:
        return data
    decompressor = getattr(_codecs, "decompressor", None)
    if decompressor is None:
        decompressor = _codecs.decompressor = zstandard.ZstdDecompressor()
    return bytes(decompressor.decompress(data))


def decode_record(data: bytes) -> StoredResponse:
    """A record `encode_record` made; plain JSON (what earlier versions stored) is read too."""
    raw = orjson.loads(_decompressed(data))
    return StoredResponse(
        id=raw["id"],
        response=raw["response"],
        input_items=raw.get("input_items") or [],
        events=raw.get("events") or [],
        previous_response_id=raw.get("previous_response_id"),
        lease_until=raw.get("lease_until"),
        owner=raw.get("owner"),
    )


# Given the stored record, the record to write instead, or None to leave it.
# It may run more than once (optimistic stores retry after a conflict).
Change = Callable[[StoredResponse], "StoredResponse | None"]


@dataclass
class StoredConversation:
    """A conversation (the Conversations API): its metadata and its items, oldest first."""

    id: str
    created_at: int
    metadata: dict[str, str] = field(default_factory=dict)
    items: list[dict[str, Any]] = field(default_factory=list)  # Responses items, each with an id
    owner: str | None = None  # the API key (its id) that created it
    lock: str | None = None  # the response running on it now (its id), if any
    lock_until: float | None = None  # wall-clock seconds; a holder that died lets it lapse

    def find_item(self, item_id: str) -> dict[str, Any] | None:
        return next((item for item in self.items if item.get("id") == item_id), None)


def encode_conversation(conversation: StoredConversation) -> bytes:
    return _zstd().compress(orjson.dumps(conversation.__dict__))


def decode_conversation(data: bytes) -> StoredConversation:
    raw = orjson.loads(_decompressed(data))
    return StoredConversation(
        id=raw["id"],
        created_at=raw["created_at"],
        metadata=raw.get("metadata") or {},
        items=raw.get("items") or [],
        owner=raw.get("owner"),
        lock=raw.get("lock"),
        lock_until=raw.get("lock_until"),
    )


# Given the stored conversation, the one to write instead, or None to leave it (as `Change`).
ConversationChange = Callable[[StoredConversation], "StoredConversation | None"]


@dataclass
class StoredThread:
    """A message thread (the Messages API's `thread`) as of one answer, kept under that answer's id.

    `messages` is the whole conversation the answer ended, itself last (as
    an assistant message); `system` and `tools` are what the thread was
    created with (the fields a continue may not change).  `next` names the
    answer that continued it: while that answer is still being made,
    `next_until` says when the claim lapses (wall-clock seconds, so a
    process that died lets go); once it is made, `next_until` is None and
    the thread cannot be continued from here again.
    """

    id: str
    created_at: int
    messages: list[dict[str, Any]] = field(default_factory=list)
    system: Any = None
    tools: list[Any] | None = None
    owner: str | None = None  # the API key (its id) that created it; None without keys
    next: str | None = None
    next_until: float | None = None


def encode_thread(thread: StoredThread) -> bytes:
    return _zstd().compress(orjson.dumps(thread.__dict__))


def decode_thread(data: bytes) -> StoredThread:
    """Raises:
        ValueError: `data` is not a thread `encode_thread` made (a damaged record).
    """
    try:
        raw = orjson.loads(_decompressed(data))
        if not isinstance(raw, dict) or not isinstance(raw.get("id"), str):
            raise ValueError("not a thread")
    except Exception as exc:  # zstd's and orjson's errors alike: the record cannot be read
        raise ValueError("a stored thread that cannot be read") from exc
    return StoredThread(
        id=raw["id"],
        created_at=raw["created_at"],
        messages=raw.get("messages") or [],
        system=raw.get("system"),
        tools=raw.get("tools"),
        owner=raw.get("owner"),
        next=raw.get("next"),
        next_until=raw.get("next_until"),
    )


# Given the stored thread, the one to write instead, or None to leave it (as `Change`).
ThreadChange = Callable[[StoredThread], "StoredThread | None"]


class ResponseStore(Protocol):
    """Conversation state.  Every method may be called from many tasks at once."""

    async def save(self, record: StoredResponse) -> None:
        """Insert or replace the record (atomically) and index its items."""
        ...

    async def load(self, response_id: str) -> StoredResponse | None:
        """The record, or None when unknown, expired, evicted or deleted."""
        ...

    async def update(self, response_id: str, change: Change) -> StoredResponse | None:
        """Apply `change` to the stored record atomically; the record as stored afterwards.

        None when there is no such record (`change` is not called).
        """
        ...

    async def expired_leases(self, now: float) -> list[str]:
        """Ids of records whose lease ended before `now`."""
        ...

    async def delete(self, response_id: str) -> bool:
        """Remove the record and its item index; False when it was not there."""
        ...

    async def holder_of(self, item_id: str) -> StoredResponse | None:
        """The stored response that has the item `item_id` among its inputs or outputs."""
        ...

    async def save_conversation(self, conversation: StoredConversation) -> None:
        """Insert or replace a conversation (atomically)."""
        ...

    async def load_conversation(self, conversation_id: str) -> StoredConversation | None:
        """The conversation, or None when unknown, expired or deleted."""
        ...

    async def update_conversation(
        self, conversation_id: str, change: ConversationChange
    ) -> StoredConversation | None:
        """Apply `change` to the stored conversation atomically; the conversation as stored afterwards
        (None when there is none: `change` is not called)."""
        ...

    async def delete_conversation(self, conversation_id: str) -> bool:
        """Remove the conversation and its items; False when it was not there."""
        ...

    async def save_thread(self, thread: StoredThread) -> None:
        """Insert or replace a thread (atomically)."""
        ...

    async def load_thread(self, thread_id: str) -> StoredThread | None:
        """The thread, or None when unknown or expired."""
        ...

    async def update_thread(self, thread_id: str, change: ThreadChange) -> StoredThread | None:
        """Apply `change` to the stored thread atomically; the thread as stored afterwards (None
        when there is none: `change` is not called)."""
        ...

    async def list_responses(self, *, limit: int = 50, before: str | None = None) -> list[StoredResponse]:
        """Stored responses, newest first (`response["created_at"]`, then id), at most `limit`
        (within 0 and `LIST_LIMIT`); with `before`, those after that response in this order (none
        when it is not stored).  Expired and deleted ones are not listed."""
        ...

    async def list_conversations(self, *, limit: int = 50, before: str | None = None) -> list[StoredConversation]:
        """Conversations, newest first (`created_at`, then id), paged as `list_responses`."""
        ...

    async def aclose(self) -> None: ...


async def save_retrying(store: ResponseStore, record: StoredResponse, *, within: float) -> None:
    """Save, retrying a failing store (a Redis restart, a locked file) for up to `within` seconds.

    Raises:
        StoreUnavailable: the store still failed when the time was up.
    """
    deadline = trio.current_time() + within
    delay = 0.05
    while True:
        try:
            await store.save(record)
            return
        except StoreUnavailable:
            if trio.current_time() + delay > deadline:
                raise
        await trio.sleep(delay)
        delay = min(delay * 2, 0.5)


class OwnerView:
    """A store as one caller sees it: records another key created do not exist.

    Lookups by id, by item and deletion all answer as for an unknown id, so
    that ids cannot be probed.  Saves pass through (the record carries its
    owner already).
    """

    def __init__(self, store: ResponseStore, owner: str | None) -> None:
        self.store = store
        self.owner = owner

    def _mine(self, record: StoredResponse | None) -> StoredResponse | None:
        return record if record is not None and record.owner == self.owner else None

    async def load(self, response_id: str) -> StoredResponse | None:
        return self._mine(await self.store.load(response_id))

    async def holder_of(self, item_id: str) -> StoredResponse | None:
        return self._mine(await self.store.holder_of(item_id))

    async def delete(self, response_id: str) -> bool:
        if await self.load(response_id) is None:
            return False
        return await self.store.delete(response_id)
