"""Changes to API keys, the one place they are made: created, changed, rotated, revoked.

`gateway keys`, the operator console and `gateway launch` (a key per session)
all change keys through these steps, so what each step means stays the same
everywhere: a new secret is made here and returned once, only its digest is
stored; making a key turns authentication on (see `gateway.keys`); a revoked
key is refused from its next request, on every instance; a rotated key keeps
its id (its stored responses, counters and stream slots stay its own).

Knows the key store; nothing of argument parsing, forms or HTTP.
"""

from __future__ import annotations

import dataclasses
import uuid

from .model import AUTH_ON, ApiKey, KeyLimits, KeyStore, digest, new_secret

__all__ = ["change_key", "create_key", "revoke_key", "rotate_key"]


async def create_key(
    store: KeyStore, name: str, *, limits: KeyLimits | None = None, admin: bool = False, now: float
) -> tuple[ApiKey, str] | None:
    """The key made and its secret (shown once), or None when an active key has that name.

    Raises:
        StoreUnavailable: the key store failed.
    """
    existing = await store.by_name(name)
    if existing is not None and existing.active:
        return None
    secret = new_secret()
    key = ApiKey(
        name=name, id=f"key_{uuid.uuid4().hex}", digest=digest(secret), created_at=now, limits=limits or KeyLimits(), admin=admin
    )
    await store.put(key)
    await store.set_auth(AUTH_ON)  # configuring a key turns authentication on (see gateway.keys)
    return key, secret


async def change_key(
    store: KeyStore, name: str, *, limits: KeyLimits | None = None, admin: bool | None = None
) -> ApiKey | None:
    """The active key `name` with new limits and admin flag (None: as it was); None when there is none.

    Raises:
        StoreUnavailable: the key store failed.
    """
    found = await store.by_name(name)
    if found is None or not found.active:
        return None
    changed = dataclasses.replace(
        found, limits=found.limits if limits is None else limits, admin=found.admin if admin is None else admin
    )
    await store.put(changed)
    return changed


async def rotate_key(store: KeyStore, name: str) -> tuple[ApiKey, str] | None:
    """The active key `name` with a new secret (the old one refused from now), and that secret.

    Raises:
        StoreUnavailable: the key store failed.
    """
    found = await store.by_name(name)
    if found is None or not found.active:
        return None
    secret = new_secret()
    rotated = dataclasses.replace(found, digest=digest(secret))
    await store.put(rotated)
    return rotated, secret


async def revoke_key(store: KeyStore, name: str, *, now: float) -> ApiKey | None:
    """The active key `name`, revoked; None when there is none.

    Raises:
        StoreUnavailable: the key store failed.
    """
    found = await store.by_name(name)
    if found is None or not found.active:
        return None
    revoked = dataclasses.replace(found, revoked_at=now)
    await store.put(revoked)
    return revoked
