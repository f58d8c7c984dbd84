"""API keys: who is calling, and what that key may do.

    ApiKey, KeyLimits   a key as stored: its name, id, digest (never the key
                        itself) and limits
    KeyRing             the edge's question "who is this?": a request's key
                        (`Authorization: Bearer`, `api-key`, `x-api-key`) to a
                        `Caller`, or 401
    Limiter             what a caller may do now: requests and tokens per
                        minute, concurrent streams, models, MCP servers; a
                        refusal is a 429 with Retry-After (or 404 for a model
                        the key may not use, as OpenAI answers)
    stores.py           where keys and counters live: memory, SQLite, Redis
                        (shared by every instance, so limits hold across them)
    cli.py              `gateway keys create | list | revoke`

Keys are random 256-bit secrets, so one SHA-256 digest is enough to store
them safely (a slow password hash buys nothing against a key nobody can
guess).  Without any key configured the gateway serves everyone as before.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import math
import secrets
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio

from ..errors import GatewayError, NotFound, RateLimited, Unauthorized

__all__ = [
    "ANONYMOUS",
    "ApiKey",
    "Caller",
    "KeyLimits",
    "KeyRing",
    "KeyStore",
    "Limiter",
    "PermissionDenied",
    "StreamSlot",
    "digest",
    "new_secret",
    "parse_static_keys",
]

_PREFIX = "sk-gw-"


def new_secret() -> str:
    """A new API key: `sk-gw-` and 256 random bits."""
    return _PREFIX + secrets.token_urlsafe(32)


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True)
class KeyLimits:
    """What one key may do.  None: no limit; 0: none at all."""

    rpm: int | None = None  # requests per minute
    tpm: int | None = None  # tokens per minute (counted from the usage responses report)
    concurrency: int | None = None  # streams (responses, chat completions) at once
    models: tuple[str, ...] | None = None  # names or globs (`qwen*`) the key may use
    mcp_servers: tuple[str, ...] | None = None  # configured MCP servers it may use (None: all)
    hosted_mcp: bool = True  # may name MCP servers by URL (OpenAI's hosted `mcp` tool)

    def allows_model(self, model: str) -> bool:
        return self.models is None or any(fnmatch.fnmatchcase(model, pattern) for pattern in self.models)

    def allows_server(self, server: str) -> bool:
        return self.mcp_servers is None or server in self.mcp_servers

    def describe(self) -> str:
        parts = [
            f"{name}={value}"
            for name, value in (("rpm", self.rpm), ("tpm", self.tpm), ("concurrency", self.concurrency))
            if value is not None
        ]
        if self.models is not None:
            parts.append("models=" + (",".join(self.models) or "(none)"))
        if self.mcp_servers is not None:
            parts.append("mcp=" + (",".join(self.mcp_servers) or "(none)"))
        if not self.hosted_mcp:
            parts.append("no-hosted-mcp")
        return " ".join(parts) or "unlimited"


@dataclass(frozen=True)
class ApiKey:
    name: str
    id: str
    digest: str
    created_at: float
    limits: KeyLimits = field(default_factory=KeyLimits)
    revoked_at: float | None = None

    @property
    def active(self) -> bool:
        return self.revoked_at is None

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["limits"] = {k: list(v) if isinstance(v, tuple) else v for k, v in data["limits"].items()}
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ApiKey:
        raw = dict(data.get("limits") or {})
        limits = KeyLimits(
            rpm=raw.get("rpm"),
            tpm=raw.get("tpm"),
            concurrency=raw.get("concurrency"),
            models=tuple(raw["models"]) if raw.get("models") is not None else None,
            mcp_servers=tuple(raw["mcp_servers"]) if raw.get("mcp_servers") is not None else None,
            hosted_mcp=bool(raw.get("hosted_mcp", True)),
        )
        return cls(
            name=str(data["name"]),
            id=str(data["id"]),
            digest=str(data["digest"]),
            created_at=float(data["created_at"]),
            limits=limits,
            revoked_at=data.get("revoked_at"),
        )


@dataclass(frozen=True)
class Caller:
    """Who a request comes from: a key, or nobody (no keys are configured)."""

    key: ApiKey | None = None

    @property
    def owner(self) -> str | None:
        """Whose stored responses these are (the key's id)."""
        return self.key.id if self.key is not None else None

    @property
    def name(self) -> str | None:
        return self.key.name if self.key is not None else None

    @property
    def limits(self) -> KeyLimits:
        return self.key.limits if self.key is not None else _NO_LIMITS


ANONYMOUS = Caller()
_NO_LIMITS = KeyLimits()


class PermissionDenied(GatewayError):
    status = 403
    type = "invalid_request_error"
    code = "permission_denied"


class KeyStore(Protocol):
    """Where keys and their counters live (see stores.py).  Raises `StoreUnavailable`."""

    async def put(self, key: ApiKey) -> None: ...

    async def by_digest(self, key_digest: str) -> ApiKey | None: ...

    async def by_name(self, name: str) -> ApiKey | None: ...

    async def all(self) -> list[ApiKey]: ...

    async def any_active(self) -> bool: ...

    async def add(self, counter: str, amount: int, ttl: float) -> int:
        """Add to a counter (created at 0, dropped after `ttl` seconds); its new value, atomically."""
        ...

    async def read(self, counter: str) -> int: ...

    async def acquire(self, pool: str, slot: str, limit: int, until: float, now: float) -> bool:
        """Take a slot in `pool` until `until` if fewer than `limit` unexpired ones are taken."""
        ...

    async def renew(self, pool: str, slots: list[str], until: float) -> None: ...

    async def release(self, pool: str, slot: str) -> None: ...

    async def settle(self, release: tuple[str, str] | None, counters: Sequence[tuple[str, int, float]]) -> None:
        """At the end of a stream, in one go: give back a slot (pool, slot) and add to counters
        (name, amount, ttl) -- one round trip where each would cost one."""
        ...

    async def aclose(self) -> None: ...


def parse_static_keys(text: str, *, now: float = 0.0) -> dict[str, ApiKey]:
    """`GATEWAY_API_KEYS` (`name=key,name2=key2`) as keys by digest (no limits).

    Raises:
        ValueError: an entry is not `name=key`.
    """
    keys: dict[str, ApiKey] = {}
    for entry in filter(None, (part.strip() for part in text.split(","))):
        name, sep, secret = entry.partition("=")
        if not sep or not name.strip() or len(secret.strip()) < 8:
            raise ValueError("entries must be name=key, the key at least 8 characters")
        key_digest = digest(secret.strip())
        keys[key_digest] = ApiKey(name=name.strip(), id=f"static:{name.strip()}", digest=key_digest, created_at=now)
    return keys


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
    """Identifies callers: static keys (the environment) and stored ones (the key store)."""

    def __init__(
        self, store: KeyStore | None, static: Mapping[str, ApiKey] | None = None, *, recheck_every: float = 2.0
    ) -> None:
        self.store = store
        self._static = dict(static or {})
        self._recheck_every = recheck_every
        self._required = bool(self._static)
        self._checked_at = -math.inf

    async def required(self) -> bool:
        """Whether any key is configured (then every request needs one); rechecked every few seconds.

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
                self._required = await self.store.any_active()
            except GatewayError:
                if self._checked_at == -math.inf:
                    raise
                return self._required
            self._checked_at = now
        return self._required

    async def identify(self, headers: Iterable[tuple[bytes, bytes]]) -> Caller:
        """The caller a request's headers name.

        Raises:
            Unauthorized: keys are configured and the request has no valid one.
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


@dataclass
class StreamSlot:
    """A concurrent-stream slot a caller holds; released when its stream ends."""

    pool: str
    slot: str
    released: bool = False


class Limiter:
    """Per-key limits, counted in the key store (shared by every instance on Redis).

    Windows are whole minutes of wall-clock time: a refusal's Retry-After is
    the time left in the minute.  Stream slots are leased, renewed by the
    process that holds them (`run_renewals`), so a dead process frees its
    slots after one lease.
    """

    def __init__(self, store: KeyStore | None, *, clock: Callable[[], float] = time.time, lease: float = 60.0) -> None:
        self.store = store
        self._clock = clock
        self._lease = lease
        self._held: dict[str, set[str]] = {}  # pool -> slots this process holds

    def _minute(self) -> tuple[int, float]:
        now = self._clock()
        return int(now // 60), 60.0 - now % 60

    async def admit_request(self, caller: Caller) -> None:
        """Count one request against the caller's requests per minute.

        Raises:
            RateLimited: over the limit.
        """
        rpm = caller.limits.rpm
        if rpm is None or caller.key is None or self.store is None:
            return
        minute, left = self._minute()
        if rpm <= 0 or await self.store.add(f"rpm:{caller.key.id}:{minute}", 1, ttl=120) > rpm:
            raise RateLimited(
                f"Rate limit reached for requests: this key may make {rpm} requests per minute.", retry_after=left
            )

    async def admit_stream(self, caller: Caller, model: str, slot: str) -> StreamSlot | None:
        """Check the model, the tokens per minute and the concurrent streams before any backend call.

        Returns the stream slot to release when the stream ends (None without a concurrency limit).

        Raises:
            NotFound: the key may not use `model` (`model_not_found`, as OpenAI answers).
            RateLimited: tokens per minute used up, or too many streams at once.
        """
        limits = caller.limits
        if caller.key is None:
            return None
        if not limits.allows_model(model):
            raise NotFound(
                f"The model '{model}' does not exist or you do not have access to it.",
                param="model",
                code="model_not_found",
            )
        if self.store is None:
            return None
        if limits.tpm is not None:
            minute, left = self._minute()
            used = await self.store.read(f"tpm:{caller.key.id}:{minute}")
            if limits.tpm <= 0 or used >= limits.tpm:
                raise RateLimited(
                    f"Rate limit reached for tokens: this key may use {limits.tpm} tokens per minute "
                    f"and has used {used}.",
                    retry_after=left,
                    kind="tokens",
                )
        if limits.concurrency is None:
            return None
        pool = f"streams:{caller.key.id}"
        now = self._clock()
        if limits.concurrency <= 0 or not await self.store.acquire(pool, slot, limits.concurrency, now + self._lease, now):
            raise RateLimited(
                f"Rate limit reached for concurrent streams: this key may hold {limits.concurrency} at once.",
                retry_after=1.0,
            )
        self._held.setdefault(pool, set()).add(slot)
        return StreamSlot(pool, slot)

    async def release(self, slot: StreamSlot | None) -> None:
        """Give back a stream slot (a relayed stream that counts no tokens)."""
        await self.settle(slot, ANONYMOUS, 0)

    async def settle(self, slot: StreamSlot | None, caller: Caller, tokens: int) -> None:
        """A stream ended: give back its slot and count the tokens it used (against the
        minute's limit and the key's total), in one store call, whatever happens to it."""
        release = None
        if slot is not None and not slot.released:
            slot.released = True
            held = self._held.get(slot.pool)
            if held is not None:
                held.discard(slot.slot)
                if not held:
                    del self._held[slot.pool]
            release = (slot.pool, slot.slot)
        counters: list[tuple[str, int, float]] = []
        if caller.key is not None and tokens > 0:
            minute, _ = self._minute()
            counters = [(f"tpm:{caller.key.id}:{minute}", tokens, 120.0), (f"tokens:{caller.key.id}", tokens, 0.0)]
        if self.store is None or (release is None and not counters):
            return
        with trio.CancelScope(shield=True), trio.move_on_after(5):
            await self.store.settle(release, counters)

    async def tokens_used(self, key: ApiKey) -> int:
        return await self.store.read(f"tokens:{key.id}") if self.store is not None else 0

    async def run_renewals(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Renew the slots this process holds, a third of a lease apart, until cancelled."""
        task_status.started()
        while True:
            await trio.sleep(self._lease / 3)
            if self.store is None:
                continue
            until = self._clock() + self._lease
            for pool, slots in list(self._held.items()):
                try:
                    await self.store.renew(pool, sorted(slots), until)
                except GatewayError:
                    pass  # retried at the next renewal; a lease outlives two missed ones
