"""The edge's question "who is this?": a request's key (`Authorization: Bearer`, `api-key`,
`x-api-key`) to a `Caller`, or 401.

Authentication fails closed.  Whether the gateway requires a key is a state kept in the key
store (`AUTH_ON` / `AUTH_OFF`), so it survives restarts and is the same on every instance: it
turns on the moment an operator configures a key (a stored one, or static ones in the
environment) and turns off only by the operator's explicit `gateway keys auth off`.  Revoking
keys, even the last one, never turns it off: then nobody can call.  A gateway whose store never
had a key serves everyone.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import trio

from ..errors import GatewayError, Unauthorized
from .model import ANONYMOUS, AUTH_ON, REVOCATION_BOUND, ApiKey, Caller, KeyStore, digest

__all__ = ["KeyRing", "presented_key"]


def presented_key(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The key a request presents (`Authorization: Bearer`, `api-key`, `x-api-key`), if well-formed."""
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            if scheme.lower() == b"bearer":
                return _token(token)
        elif name in (b"api-key", b"x-api-key"):
            return _token(value)
    return None


def _token(raw: bytes) -> str | None:
    token = raw.strip()
    if not token or len(token) > 512 or not token.isascii() or b" " in token:
        return None
    return token.decode("ascii")


class KeyRing:
    """Identifies callers: static keys (the environment) and stored ones (the key store).

    Keys are looked up in the store on every request, so a revoked or
    rotated key is refused at once on every instance.  Whether a key is
    required at all is the store's auth state (see the module docstring),
    read again at most `REVOCATION_BOUND` seconds apart.
    """

    def __init__(
        self,
        store: KeyStore | None,
        static: Mapping[str, ApiKey] | None = None,
        *,
        recheck_every: float = REVOCATION_BOUND,
    ) -> None:
        self.store = store
        self._static = dict(static or {})
        self._recheck_every = recheck_every
        self._required = bool(self._static)
        self._checked_at = -math.inf

    @property
    def static_names(self) -> list[str]:
        """The names of the keys given in the environment (GATEWAY_API_KEYS)."""
        return sorted(key.name for key in self._static.values())

    async def open(self) -> None:
        """At start-up: static keys configure authentication, so the store records it as on.

        Raises:
            StoreUnavailable: the key store failed.
        """
        if self._static and self.store is not None and await self.store.auth_state() != AUTH_ON:
            await self.store.set_auth(AUTH_ON)

    async def required(self) -> bool:
        """Whether every request needs a key.

        While the key store is down, the last answer stands; before there
        was any, the store's failure is raised (nobody is let in unchecked).

        Raises:
            StoreUnavailable: the key store failed and there is no earlier answer.
        """
        if self._static or self.store is None:
            return bool(self._static)
        now = trio.current_time()
        if now - self._checked_at >= self._recheck_every:
            try:
                self._required = await _auth_required(self.store)
            except GatewayError:
                if self._checked_at == -math.inf:
                    raise
                return self._required
            self._checked_at = now
        return self._required

    async def identify(self, headers: Iterable[tuple[bytes, bytes]]) -> Caller:
        """The caller a request's headers name.

        Raises:
            Unauthorized: a key is required and the request has no valid one.
            StoreUnavailable: the key store failed.
        """
        secret = presented_key(headers)
        if secret is not None:
            key_digest = digest(secret)
            key = self._static.get(key_digest)
            if key is None and self.store is not None:
                key = await self.store.by_digest(key_digest)
            if key is not None and key.active:
                return Caller(key)
        if not await self.required():
            return ANONYMOUS
        if secret is None:
            raise Unauthorized(
                "You didn't provide an API key. Send it as 'Authorization: Bearer <key>'.", code="invalid_api_key"
            )
        raise Unauthorized("Incorrect API key provided.", code="invalid_api_key")


async def _auth_required(store: KeyStore) -> bool:
    """The store's auth state; a store from before the state was kept is on once it has any key.

    Raises:
        StoreUnavailable: the key store failed.
    """
    state = await store.auth_state()
    if state is not None:
        return state == AUTH_ON
    if await store.all():  # keys were configured before the state existed: it is on
        await store.set_auth(AUTH_ON)
        return True
    return False
