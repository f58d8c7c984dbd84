"""A store that reports how long each of its calls takes (to the telemetry), and where its failures are.

A `StoreUnavailable` it passes on names the store (`cause`: where it is,
and the library's error), for the operator's log line; the client's
message stays the store's own, which names nothing.
"""

from __future__ import annotations

import time
from typing import Any

from ..errors import StoreUnavailable
from ..observe import Telemetry
from .base import Change, ConversationChange, ResponseStore, StoredConversation, StoredResponse, StoredThread, ThreadChange

__all__ = ["ObservedStore"]


class ObservedStore:
    """Wraps a `ResponseStore`; every call is timed and counted, its result unchanged."""

    def __init__(self, store: ResponseStore, telemetry: Telemetry, *, location: str = "the store") -> None:
        self.inner = store
        self._telemetry = telemetry
        self.location = location

    async def _timed(self, operation: str, call: Any) -> Any:
        started = time.perf_counter()
        ok = False
        try:
            result = await call
            ok = True
            return result
        except StoreUnavailable as error:
            if error.cause is None:
                original = error.__cause__
                detail = f": {type(original).__name__}: {original}" if original is not None else ""
                error.cause = f"store ({self.location}){detail}"
            raise
        finally:
            self._telemetry.store_operation(operation=operation, seconds=time.perf_counter() - started, ok=ok)

    async def save(self, record: StoredResponse) -> None:
        await self._timed("save", self.inner.save(record))

    async def load(self, response_id: str) -> StoredResponse | None:
        result: StoredResponse | None = await self._timed("load", self.inner.load(response_id))
        return result

    async def update(self, response_id: str, change: Change) -> StoredResponse | None:
        result: StoredResponse | None = await self._timed("update", self.inner.update(response_id, change))
        return result

    async def expired_leases(self, now: float) -> list[str]:
        result: list[str] = await self._timed("expired_leases", self.inner.expired_leases(now))
        return result

    async def delete(self, response_id: str) -> bool:
        return bool(await self._timed("delete", self.inner.delete(response_id)))

    async def holder_of(self, item_id: str) -> StoredResponse | None:
        result: StoredResponse | None = await self._timed("holder_of", self.inner.holder_of(item_id))
        return result

    async def save_conversation(self, conversation: StoredConversation) -> None:
        await self._timed("save_conversation", self.inner.save_conversation(conversation))

    async def load_conversation(self, conversation_id: str) -> StoredConversation | None:
        result: StoredConversation | None = await self._timed("load_conversation", self.inner.load_conversation(conversation_id))
        return result

    async def update_conversation(self, conversation_id: str, change: ConversationChange) -> StoredConversation | None:
        result: StoredConversation | None = await self._timed(
            "update_conversation", self.inner.update_conversation(conversation_id, change)
        )
        return result

    async def delete_conversation(self, conversation_id: str) -> bool:
        return bool(await self._timed("delete_conversation", self.inner.delete_conversation(conversation_id)))

    async def save_thread(self, thread: StoredThread) -> None:
        await self._timed("save_thread", self.inner.save_thread(thread))

    async def load_thread(self, thread_id: str) -> StoredThread | None:
        result: StoredThread | None = await self._timed("load_thread", self.inner.load_thread(thread_id))
        return result

    async def update_thread(self, thread_id: str, change: ThreadChange) -> StoredThread | None:
        result: StoredThread | None = await self._timed("update_thread", self.inner.update_thread(thread_id, change))
        return result

    async def list_responses(self, *, limit: int = 50, before: str | None = None) -> list[StoredResponse]:
        result: list[StoredResponse] = await self._timed(
            "list_responses", self.inner.list_responses(limit=limit, before=before)
        )
        return result

    async def list_conversations(self, *, limit: int = 50, before: str | None = None) -> list[StoredConversation]:
        result: list[StoredConversation] = await self._timed(
            "list_conversations", self.inner.list_conversations(limit=limit, before=before)
        )
        return result

    async def aclose(self) -> None:
        await self.inner.aclose()
