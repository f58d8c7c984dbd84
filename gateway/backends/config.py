"""The backends file (`GATEWAY_CONFIG=gateway.toml`): named backends and model routes.

    [backends.local]
    type = "openai"                      # or "anthropic"
    base_url = "http://127.0.0.1:8000/v1"
    api_key_env = "LOCAL_API_KEY"        # or api_key = "..."
    [backends.spare]
    type = "openai"
    base_url = "http://gpu-box:8000/v1"
    [[routes]]
    model = "qwen*"                      # exact name or glob
    backends = ["local", "spare"]        # in order of preference

A route's backends may also be tables, `{ backend = "spare", model = "qwen2.5-7b" }`,
to send another model name to that backend.  An optional `[fallback]` table
tunes retries and the circuit breaker.

Reading is pure: text in, `GatewayConfig` out, or a `ConfigError` naming the
file, the line and the key.  Building adapters from it is `routing.py`'s.
"""

from __future__ import annotations

import fnmatch
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..config import ConfigError

__all__ = ["BackendConfig", "FallbackConfig", "GatewayConfig", "Route", "RouteTarget", "load_config", "parse_config"]

_BACKEND_TYPES = ("openai", "anthropic")


@dataclass(frozen=True)
class BackendConfig:
    name: str
    type: str
    base_url: str
    api_key: str | None = field(default=None, repr=False)
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    connect_timeout: float | None = None  # None: the gateway's CONNECT_TIMEOUT
    read_timeout: float | None = None  # None: the gateway's STREAM_TIMEOUT
    max_concurrent_streams: int | None = None  # None: no cap
    queue_timeout: float = 30.0  # how long a request waits for a capped backend


@dataclass(frozen=True)
class RouteTarget:
    backend: str
    model: str | None = None  # the name the backend knows the model by (None: as asked)


@dataclass(frozen=True)
class Route:
    model: str  # an exact name or a glob
    targets: tuple[RouteTarget, ...]
    line: int = 0
    context_window: int | None = None  # tokens, for clients that need model metadata (Codex)

    @property
    def is_glob(self) -> bool:
        return any(ch in self.model for ch in "*?[")

    def matches(self, model: str) -> bool:
        return fnmatch.fnmatchcase(model, self.model) if self.is_glob else model == self.model


@dataclass(frozen=True)
class FallbackConfig:
    max_attempts: int = 3  # backends tried for one request, the first included
    failures_to_open: int = 3  # consecutive failures that open a backend's circuit
    cooldown: float = 30.0  # seconds an open circuit skips the backend before a probe
    max_retry_after: float = 10.0  # a Retry-After up to this is waited out when no other backend is left


@dataclass(frozen=True)
class GatewayConfig:
    path: str
    backends: Mapping[str, BackendConfig]
    routes: tuple[Route, ...]
    fallback: FallbackConfig = FallbackConfig()

    def route_for(self, model: str) -> Route | None:
        """The route of `model`: an exact name first, else the first glob that matches, in file order."""
        exact = next((r for r in self.routes if not r.is_glob and r.model == model), None)
        return exact or next((r for r in self.routes if r.is_glob and r.matches(model)), None)

    def describe(self) -> str:
        """The resolved routes, for `gateway config check`."""
        lines = [f"{self.path}: {len(self.backends)} backends, {len(self.routes)} routes"]
        for backend in self.backends.values():
            cap = f", at most {backend.max_concurrent_streams} streams" if backend.max_concurrent_streams else ""
            key = "key set" if backend.api_key else "no key"
            lines.append(f"  backend {backend.name}: {backend.type} {backend.base_url} ({key}{cap})")
        for route in self.routes:
            targets = ", ".join(t.backend + (f" as {t.model}" if t.model else "") for t in route.targets)
            lines.append(f"  route {route.model} -> {targets}")
        return "\n".join(lines)


def load_config(path: str, environ: Mapping[str, str] | None = None) -> GatewayConfig:
    """Read and check the file at `path`.

    Raises:
        ConfigError: the file cannot be read, is not TOML, or says something
            the gateway cannot use (the message names file, line and key).
    """
    try:
        with open(path, encoding="utf-8") as file:
            text = file.read()
    except OSError as exc:
        raise ConfigError(f"GATEWAY_CONFIG: cannot read {path}: {exc.strerror or exc}") from None
    return parse_config(text, path=path, environ=os.environ if environ is None else environ)


def parse_config(text: str, *, path: str = "gateway.toml", environ: Mapping[str, str] | None = None) -> GatewayConfig:
    """The configuration `text` describes (see the module docstring).

    Raises:
        ConfigError: naming the file, the line and the key.
    """
    environ = environ or {}
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    where = _Locator(text, path)
    where.unknown(data, {"backends", "routes", "fallback"}, ())

    raw_backends = data.get("backends")
    if not isinstance(raw_backends, dict) or not raw_backends:
        raise ConfigError(where.at(("backends",), "backends", "at least one [backends.NAME] table is needed"))
    backends = {name: _backend(name, raw, where, environ) for name, raw in raw_backends.items()}

    raw_routes = data.get("routes", [])
    if not isinstance(raw_routes, list) or not all(isinstance(r, dict) for r in raw_routes):
        raise ConfigError(where.at((), "routes", "routes are [[routes]] tables"))
    routes = tuple(_route(index, raw, where, backends) for index, raw in enumerate(raw_routes))

    raw_fallback = data.get("fallback", {})
    if not isinstance(raw_fallback, dict):
        raise ConfigError(where.at((), "fallback", "must be a [fallback] table"))
    where.unknown(raw_fallback, set(FallbackConfig.__dataclass_fields__), ("fallback",))
    fallback = FallbackConfig(
        max_attempts=_number(raw_fallback, "max_attempts", where, ("fallback",), int, 3, minimum=1),
        failures_to_open=_number(raw_fallback, "failures_to_open", where, ("fallback",), int, 3, minimum=1),
        cooldown=_number(raw_fallback, "cooldown", where, ("fallback",), float, 30.0, minimum=0),
        max_retry_after=_number(raw_fallback, "max_retry_after", where, ("fallback",), float, 10.0, minimum=0),
    )
    return GatewayConfig(path=path, backends=backends, routes=routes, fallback=fallback)


def _backend(name: str, raw: Any, where: _Locator, environ: Mapping[str, str]) -> BackendConfig:
    table = ("backends", name)
    if not isinstance(raw, dict):
        raise ConfigError(where.at(("backends",), name, "must be a [backends.NAME] table"))
    allowed = {
        "type", "base_url", "api_key", "api_key_env", "headers", "connect_timeout", "read_timeout",
        "max_concurrent_streams", "queue_timeout",
    }
    where.unknown(raw, allowed, table)
    kind = raw.get("type", "openai")
    if kind not in _BACKEND_TYPES:
        raise ConfigError(where.at(table, "type", f"must be one of {', '.join(_BACKEND_TYPES)} (not {kind!r})"))
    base_url = raw.get("base_url")
    if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
        raise ConfigError(where.at(table, "base_url", "must be an http:// or https:// URL"))
    if "api_key" in raw and "api_key_env" in raw:
        raise ConfigError(where.at(table, "api_key_env", "give api_key or api_key_env, not both"))
    api_key = raw.get("api_key")
    if "api_key_env" in raw:
        variable = raw["api_key_env"]
        if not isinstance(variable, str) or not variable:
            raise ConfigError(where.at(table, "api_key_env", "must name an environment variable"))
        if variable not in environ:
            raise ConfigError(where.at(table, "api_key_env", f"the environment variable {variable} is not set"))
        api_key = environ[variable]
    if api_key is not None and not isinstance(api_key, str):
        raise ConfigError(where.at(table, "api_key", "must be a string"))
    headers = raw.get("headers", {})
    if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
        raise ConfigError(where.at(table, "headers", "must be a table of strings"))
    return BackendConfig(
        name=name,
        type=kind,
        base_url=base_url.rstrip("/"),
        api_key=api_key or None,
        headers=dict(headers),
        connect_timeout=_number(raw, "connect_timeout", where, table, float, None, minimum=0),
        read_timeout=_number(raw, "read_timeout", where, table, float, None, minimum=0),
        max_concurrent_streams=_number(raw, "max_concurrent_streams", where, table, int, None, minimum=1),
        queue_timeout=_number(raw, "queue_timeout", where, table, float, 30.0, minimum=0),
    )


def _route(index: int, raw: dict[str, Any], where: _Locator, backends: Mapping[str, BackendConfig]) -> Route:
    table = ("routes", str(index))
    where.unknown(raw, {"model", "backends", "context_window"}, table)
    model = raw.get("model")
    if not isinstance(model, str) or not model:
        raise ConfigError(where.at(table, "model", "must be a model name or glob"))
    targets = raw.get("backends")
    if not isinstance(targets, list) or not targets:
        raise ConfigError(where.at(table, "backends", "must list at least one backend"))
    resolved: list[RouteTarget] = []
    for entry in targets:
        if isinstance(entry, str):
            target = RouteTarget(entry)
        elif isinstance(entry, dict) and isinstance(entry.get("backend"), str) and set(entry) <= {"backend", "model"}:
            rewrite = entry.get("model")
            if rewrite is not None and not isinstance(rewrite, str):
                raise ConfigError(where.at(table, "backends", "a target's model must be a string"))
            target = RouteTarget(entry["backend"], rewrite)
        else:
            raise ConfigError(where.at(table, "backends", 'entries are names or { backend = "...", model = "..." }'))
        if target.backend not in backends:
            raise ConfigError(where.at(table, "backends", f"no backend named {target.backend!r}"))
        resolved.append(target)
    return Route(
        model=model,
        targets=tuple(resolved),
        line=where.line_of(table, "model"),
        context_window=_number(raw, "context_window", where, table, int, None, minimum=1),
    )


def _number(raw: Mapping[str, Any], key: str, where: _Locator, table: tuple[str, ...], kind: type, default: Any, *, minimum: float) -> Any:
    if key not in raw:
        return default
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        raise ConfigError(where.at(table, key, f"must be {'an integer' if kind is int else 'a number'}"))
    if value < minimum:
        raise ConfigError(where.at(table, key, f"must be at least {minimum:g}"))
    return kind(value)


class _Locator:
    """Finds the line a key is on, for messages (tomllib keeps no positions)."""

    def __init__(self, text: str, path: str) -> None:
        self.path = path
        self.lines = text.splitlines()

    def line_of(self, table: tuple[str, ...], key: str) -> int:
        start = self._table_start(table)
        pattern = re.compile(rf"^\s*[\"']?{re.escape(key)}[\"']?\s*=")
        for number in range(start, len(self.lines)):
            line = self.lines[number]
            if number > start and line.lstrip().startswith("["):
                break
            if pattern.match(line) or (not key and number == start):
                return number + 1
        return start + 1 if table else 0

    def _table_start(self, table: tuple[str, ...]) -> int:
        if not table:
            return 0
        if table[0] == "routes":  # the index-th [[routes]]
            seen = -1
            for number, line in enumerate(self.lines):
                if line.strip() == "[[routes]]":
                    seen += 1
                    if seen == int(table[1]):
                        return number
            return 0
        header = re.compile(r"^\s*\[\s*" + r"\s*\.\s*".join(re.escape(part) for part in table) + r"\s*\]\s*(#.*)?$")
        return next((number for number, line in enumerate(self.lines) if header.match(line)), 0)

    def at(self, table: tuple[str, ...], key: str, message: str) -> str:
        line = self.line_of(table, key)
        parts = [f"routes[{table[1]}]"] if table[:1] == ("routes",) else list(table)
        dotted = ".".join([*parts, key])
        return f"{self.path}:{line}: {dotted}: {message}" if line else f"{self.path}: {dotted}: {message}"

    def unknown(self, raw: Mapping[str, Any], allowed: set[str], table: tuple[str, ...]) -> None:
        for key in raw:
            if key not in allowed:
                raise ConfigError(self.at(table, key, f"unknown key (expected one of {', '.join(sorted(allowed))})"))
