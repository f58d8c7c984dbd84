"""API keys: who is calling, and what that key may do.

    model.py    a key as stored (`ApiKey`, `KeyLimits`: its name, id, digest, never
                the key itself, and limits), the `Caller` a request becomes, the
                `KeyStore` it lives in
    ring.py     `KeyRing`: the edge's question "who is this?", failing closed
    limits.py   `Limiter`: what a caller may do now (requests and tokens per
                minute, concurrent streams, models, MCP servers)
    stores.py   where keys and counters live: memory, SQLite, Redis (shared by
                every instance, so limits hold across them)
    admin.py    the one place keys change (created, changed, rotated, revoked):
                `gateway keys`, the console and `gateway launch` use it
    cli.py      `gateway keys create | list | update | rotate | revoke | auth`
"""

from __future__ import annotations

from .limits import Limiter, StreamSlot, token_reservation
from .model import (
    ANONYMOUS,
    AUTH_OFF,
    AUTH_ON,
    DEFAULT_OUTPUT_RESERVATION,
    REVOCATION_BOUND,
    ApiKey,
    Caller,
    KeyLimits,
    KeyStore,
    PermissionDenied,
    check_key_name,
    digest,
    new_secret,
    parse_static_keys,
)
from .ring import KeyRing

__all__ = [
    "ANONYMOUS",
    "AUTH_OFF",
    "AUTH_ON",
    "DEFAULT_OUTPUT_RESERVATION",
    "REVOCATION_BOUND",
    "ApiKey",
    "Caller",
    "KeyLimits",
    "KeyRing",
    "KeyStore",
    "Limiter",
    "PermissionDenied",
    "StreamSlot",
    "check_key_name",
    "digest",
    "new_secret",
    "parse_static_keys",
    "token_reservation",
]
