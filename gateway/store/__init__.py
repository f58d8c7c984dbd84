"""Conversation state: stored responses, behind one interface.

`open_store(settings)` builds the store the settings choose: `sqlite` (the
embedded default), `memory` or `redis`.
"""

from __future__ import annotations

import sqlite3

from ..config import ConfigError, Settings
from .base import ResponseStore, StoredResponse
from .memory import MemoryStore
from .sqlite import SQLiteStore

__all__ = ["MemoryStore", "ResponseStore", "SQLiteStore", "StoredResponse", "open_store", "store_location"]


def open_store(settings: Settings) -> ResponseStore:
    """The store the settings choose.

    Raises:
        ConfigError: the SQLite file cannot be opened (a directory, no permission).
    """
    ttl = settings.store_ttl or None
    if settings.store_backend == "memory":
        return MemoryStore(max_entries=settings.max_conversation_history, ttl=ttl)
    if settings.store_backend == "redis":
        from .redis import RedisStore

        return RedisStore(settings.redis_url, ttl=ttl)
    try:
        return SQLiteStore(settings.sqlite_path, ttl=ttl)
    except (OSError, sqlite3.Error) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"SQLITE_PATH: cannot open the SQLite store at {settings.sqlite_path!r}: {reason}") from None


def store_location(settings: Settings) -> str:
    """Where the settings keep stored responses, for log lines (no password)."""
    import os

    from ..ops.redact import public_url

    if settings.store_backend == "memory":
        return "memory (this process only)"
    if settings.store_backend == "redis":
        return f"Redis at {public_url(settings.redis_url)}"
    return f"SQLite file {os.path.abspath(settings.sqlite_path)}"
