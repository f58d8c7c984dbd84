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
    cli.py              `gateway keys create | list | update | rotate | revoke | auth`

Keys are random 256-bit secrets, so one SHA-256 digest is enough to store
them safely (a slow password hash buys nothing against a key nobody can
guess).

Authentication fails closed.  Whether the gateway requires a key is a
state kept in the key store (`AUTH_ON` / `AUTH_OFF`), so it survives
restarts and is the same on every instance: it turns on the moment an
operator configures a key (a stored one, or static ones in the environment)
and turns off only by the operator's explicit `gateway keys auth off`.
Revoking keys, even the last one, never turns it off: then nobody can call.
A gateway whose store never had a key serves everyone, as before.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import importlib
import math
import secrets
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio

from ..config import check_key_name, static_key_entries
from ..errors import GatewayError, NotFound, RateLimited, Unauthorized

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

_PREFIX = "sk-gw-"
AUTH_ON, AUTH_OFF = "on", "off"
# Seconds within which a change of the auth state reaches every instance.  A
# revoked or rotated key is refused at its very next request (keys are read
# from the store on every request); only the on/off state is cached.
REVOCATION_BOUND = 1.0
# Tokens reserved for the output of a request that sets no maximum, for a key
# with a token limit and no `reserve` of its own (and the backend's max_tokens
# for such a request, so that what it reserved bounds what it uses).
DEFAULT_OUTPUT_RESERVATION = 4096


def new_secret() -> str:
    """A new API key: `sk-gw-` and 256 random bits."""
    return _PREFIX + secrets.token_urlsafe(32)


def digest(secret: str) -> str:
    return _sha256(secret.encode()).hexdigest()


def _builtin_sha256() -> Any:
    """CPython's own SHA-256 (`_sha256`; `_sha2` from 3.12), else OpenSSL's through hashlib.

    Every request's key is hashed once, on a core that was idle a moment
    before: OpenSSL 3's digest set-up (its algorithm fetch and context
    layers) then cost ~23 us in place of ~0.4 us warm; the interpreter's
    built-in one, ~6 us.  The digests are the same.
    """
    for module in ("_sha2", "_sha256"):
        try:
            return importlib.import_module(module).sha256
        except (ImportError, AttributeError):
            continue
    return hashlib.sha256


_sha256 = _builtin_sha256()


@dataclass(frozen=True)
class KeyLimits:
    """What one key may do.  None: no limit; 0: none at all."""

    rpm: int | None = None  # requests per minute
    tpm: int | None = None  # tokens per minute (counted from the usage responses report)
    concurrency: int | None = None  # streams (responses, chat completions) at once
    models: tuple[str, ...] | None = None  # names or globs (`qwen*`) the key may use
    mcp_servers: tuple[str, ...] | None = None  # configured MCP servers it may use (None: all)
    hosted_mcp: bool = True  # may name MCP servers by URL (OpenAI's hosted `mcp` tool)
    web_search: bool = True  # its requests' web search tools are run by the gateway (WEB_SEARCH_URL)
    reserve: int | None = None  # output tokens reserved when a request sets no maximum (tpm keys)

    @property
    def output_reservation(self) -> int:
        return DEFAULT_OUTPUT_RESERVATION if self.reserve is None else self.reserve

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
        if not self.web_search:
            parts.append("no-web-search")
        if self.reserve is not None:
            parts.append(f"reserve={self.reserve}")
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
            web_search=bool(raw.get("web_search", True)),
            reserve=raw.get("reserve"),
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
    """Who a request comes from: a key, or nobody (no keys are configured).

    `rate` is what the limiter learnt of the key's limits while admitting
    the request (`x-ratelimit-*` header names to values), for the edge to
    send with the response's head.
    """

    key: ApiKey | None = None
    rate: dict[str, str] = field(default_factory=dict, compare=False)

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

    async def auth_state(self) -> str | None:
        """`AUTH_ON`, `AUTH_OFF`, or None when it was never set (a store that never had a key,
        or one from before the state was kept)."""
        ...

    async def set_auth(self, state: str) -> None: ...

    @property
    def location(self) -> str:
        """Where the keys live, for the CLI and the start-up line (no password)."""
        ...

    async def add(self, counter: str, amount: int, ttl: float) -> int:
        """Add to a counter (created at 0, dropped after `ttl` seconds); its new value, atomically."""
        ...

    async def read(self, counter: str) -> int: ...

    async def reserve(self, counter: str, amount: int, limit: int, ttl: float) -> tuple[bool, int]:
        """Atomically: if the counter is below `limit`, add `amount`; (whether it did, the value now)."""
        ...

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
        ValueError: an entry is not `name=key` (see `config.static_key_entries`).
    """
    keys: dict[str, ApiKey] = {}
    for name, secret in static_key_entries(text):
        key_digest = digest(secret)
        keys[key_digest] = ApiKey(name=name, id=f"static:{name}", digest=key_digest, created_at=now)
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


@dataclass
class StreamSlot:
    """What an admitted request holds until it ends: a concurrent-stream slot (`pool`, `slot`),
    and the tokens reserved for it, by minute counter."""

    pool: str | None = None
    slot: str | None = None
    reserved: dict[str, int] = field(default_factory=dict)
    released: bool = False


class Limiter:
    """Per-key limits, counted in the key store (shared by every instance on Redis).

    Windows are whole minutes of wall-clock time: a refusal's Retry-After is
    the time left in the minute.  Tokens are reserved when a request is
    admitted (its input, estimated, plus the most it may generate) and
    settled from its usage when it ends; a request is admitted while the
    minute's count, reservations included, is below the limit, so parallel
    requests on any number of instances exceed it by at most one
    reservation.  Stream slots are leased, renewed by the process that
    holds them (`run_renewals`), so a dead process frees its slots after
    one lease.
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
        used = rpm + 1 if rpm <= 0 else await self.store.add(f"rpm:{caller.key.id}:{minute}", 1, ttl=120)
        _note_rate(caller, "requests", rpm, used, left)
        if used > rpm:
            raise RateLimited(
                f"Rate limit reached for requests: this key may make {rpm} requests per minute.", retry_after=left
            )

    def check_model(self, caller: Caller, model: str) -> None:
        """Raises NotFound (`model_not_found`, as OpenAI answers) when the key may not use `model`."""
        if caller.key is not None and not caller.limits.allows_model(model):
            raise NotFound(
                f"The model '{model}' does not exist or you do not have access to it.",
                param="model",
                code="model_not_found",
            )

    async def admit_stream(self, caller: Caller, model: str, slot: str, *, tokens: int = 0) -> StreamSlot | None:
        """Check the model, reserve `tokens` against the tokens per minute and take a stream slot,
        before any backend call.

        Returns what to give back when the request ends (`settle`), or None
        when the caller has no such limits.

        Raises:
            NotFound: the key may not use `model` (`model_not_found`, as OpenAI answers).
            RateLimited: tokens per minute used up, or too many streams at once.
        """
        limits = caller.limits
        if caller.key is None:
            return None
        self.check_model(caller, model)
        if self.store is None or (limits.tpm is None and limits.concurrency is None):
            return None
        held = StreamSlot()
        await self.reserve(held, caller, tokens)
        if limits.concurrency is not None:
            pool = f"streams:{caller.key.id}"
            now = self._clock()
            if limits.concurrency <= 0 or not await self.store.acquire(
                pool, slot, limits.concurrency, now + self._lease, now
            ):
                await self.release(held)  # the reservation goes back
                raise RateLimited(
                    f"Rate limit reached for concurrent streams: this key may hold {limits.concurrency} at once.",
                    retry_after=1.0,
                )
            self._held.setdefault(pool, set()).add(slot)
            held.pool, held.slot = pool, slot
        return held

    async def reserve(self, held: StreamSlot | None, caller: Caller, tokens: int) -> None:
        """Reserve `tokens` more for an admitted request (its first backend round, or a later one:
        a tool loop's every round is admitted like a request of its own).

        Raises:
            RateLimited: the key's tokens per minute are used up (`type: tokens`).
        """
        tpm = caller.limits.tpm
        if held is None or tpm is None or caller.key is None or self.store is None:
            return
        minute, left = self._minute()
        counter = f"tpm:{caller.key.id}:{minute}"
        amount = max(0, tokens)
        taken, used = (False, 0) if tpm <= 0 else await self.store.reserve(counter, amount, tpm, ttl=120)
        _note_rate(caller, "tokens", tpm, used, left)
        if not taken:
            raise RateLimited(
                f"Rate limit reached for tokens: this key may use {tpm} tokens per minute and has used or reserved {used}.",
                retry_after=left,
                kind="tokens",
            )
        held.reserved[counter] = held.reserved.get(counter, 0) + amount

    async def release(self, slot: StreamSlot | None) -> None:
        """Give back a stream slot and its reservations, counting nothing."""
        await self.settle(slot, ANONYMOUS, 0)

    async def settle(self, slot: StreamSlot | None, caller: Caller, tokens: int | None) -> None:
        """A request ended: give back its slot, and replace its reservations by the tokens it used
        (counted against this minute's limit and the key's total), in one store call, whatever
        happens to it.

        `tokens=None`: its usage is unknown (a relayed body whose usage never
        came), so what it reserved stays counted.
        """
        release = None
        counters: list[tuple[str, int, float]] = []
        if slot is not None and not slot.released:
            slot.released = True
            if slot.pool is not None and slot.slot is not None:
                held = self._held.get(slot.pool)
                if held is not None:
                    held.discard(slot.slot)
                    if not held:
                        del self._held[slot.pool]
                release = (slot.pool, slot.slot)
            if tokens is not None:
                counters += [(counter, -amount, 120.0) for counter, amount in slot.reserved.items() if amount]
        if caller.key is not None and tokens:
            if caller.limits.tpm is not None:  # (the minute's count matters only to a key with a limit)
                minute, _ = self._minute()
                counters.append((f"tpm:{caller.key.id}:{minute}", tokens, 120.0))
            counters.append((f"tokens:{caller.key.id}", tokens, 0.0))
        if self.store is None or (release is None and not counters):
            return
        with trio.CancelScope(shield=True, deadline=trio.current_time() + 5):  # whatever happens to the request
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


# The fields of a generation request that are its input (Chat Completions,
# completions, embeddings, Anthropic Messages): their JSON, a quarter token a byte.
_INPUT_FIELDS = ("messages", "prompt", "input", "system", "tools", "functions")
_OUTPUT_FIELDS = ("max_completion_tokens", "max_tokens", "max_output_tokens")


def token_reservation(body: Mapping[str, Any], limits: KeyLimits, *, generates: bool = True) -> tuple[int, int | None]:
    """What a request reserves against its key's tokens per minute: (tokens, max_tokens to set).

    Its input, estimated at four bytes of JSON a token, plus the most it may
    generate: its own maximum, else the key's output reservation -- which is
    then also the maximum the backend is given (the second value), so that
    what it reserved bounds what it can use.  (0, None) for a key without a
    token limit.
    """
    if limits.tpm is None:
        return 0, None
    import orjson  # the keys package is imported by the CLI too; orjson is only needed here

    given = {name: body[name] for name in _INPUT_FIELDS if body.get(name) is not None}
    tokens = len(orjson.dumps(given)) // 4 if given else 0
    if not generates:
        return tokens, None
    for name in _OUTPUT_FIELDS:
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return tokens + value, None
    return tokens + limits.output_reservation, limits.output_reservation


def _note_rate(caller: Caller, kind: str, limit: int, used: int, reset: float) -> None:
    """What OpenAI's `x-ratelimit-*` headers say of one limit, noted on the caller for the edge."""
    caller.rate[f"x-ratelimit-limit-{kind}"] = str(limit)
    caller.rate[f"x-ratelimit-remaining-{kind}"] = str(max(0, limit - used))
    caller.rate[f"x-ratelimit-reset-{kind}"] = reset_text(reset)


def reset_text(seconds: float) -> str:
    """A duration as OpenAI writes it in `x-ratelimit-reset-*`: `20ms`, `1.5s`, `6m0s`."""
    if seconds < 1:
        return f"{max(0, round(seconds * 1000))}ms"
    minutes, rest = divmod(seconds, 60)
    text = f"{round(rest, 3):g}s"
    return f"{int(minutes)}m{text}" if minutes else text
