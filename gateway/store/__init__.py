"""Conversation state: stored responses, behind one interface.

`open_store(settings)` builds the store the settings choose: `sqlite` (the
embedded default), `memory` or `redis`.
"""

from __future__ import annotations

from ..config import Settings
from .base import ResponseStore, StoredResponse
from .memory import MemoryStore
from .sqlite import SQLiteStore

__all__ = ["MemoryStore", "ResponseStore", "SQLiteStore", "StoredResponse", "open_store"]


def open_store(settings: Settings) -> ResponseStore:
    ttl = settings.store_ttl or None
    if settings.store_backend == "memory":
        return MemoryStore(max_entries=settings.max_conversation_history, ttl=ttl)
    if settings.store_backend == "redis":
        from .redis import RedisStore

        return RedisStore(settings.redis_url, ttl=ttl)
    return SQLiteStore(settings.sqlite_path, ttl=ttl)
