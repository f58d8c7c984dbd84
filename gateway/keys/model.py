"""A key as the gateway knows it: its secret's digest (never the secret), its limits, the caller
a request becomes, and the store it lives in.

Keys are random 256-bit secrets, so one SHA-256 digest is enough to store them safely (a slow
password hash buys nothing against a key nobody can guess).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import importlib
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..config import check_key_name, static_key_entries
from ..errors import GatewayError

__all__ = [
    "ANONYMOUS",
    "AUTH_OFF",
    "AUTH_ON",
    "DEFAULT_OUTPUT_RESERVATION",
    "REVOCATION_BOUND",
    "ApiKey",
    "Caller",
    "KeyLimits",
    "KeyStore",
    "PermissionDenied",
    "check_key_name",
    "digest",
    "new_secret",
    "parse_static_keys",
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
    layers) is then slow, many times the interpreter's built-in digest,
    whose set-up is small.  The digests are the same.
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
    # An operator's key: the console takes it as the operator's credential.
    admin: bool = False

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
            admin=bool(data.get("admin", False)),  # absent in keys stored before the flag: not admin
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

    @property
    def admin(self) -> bool:
        """Whether this caller is an operator (a stored key with the admin flag; never anonymous
        or a static `GATEWAY_API_KEYS` key)."""
        return self.key is not None and self.key.admin


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
