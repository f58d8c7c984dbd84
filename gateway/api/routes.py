"""What a route is: a row of the route table (`gateway.api.ROUTES`), and the call its handler takes.

Every endpoint is a `Route`: a method, a path (`{name}` for a segment,
`{name:path}` for the rest of the path), its handler and how it is served.
A handler takes a `Call` and answers in one way: it returns the body to
send (`transport.body.DeferredHeadBody`: JSON, a stream, a relayed
answer), or raises a `GatewayError`, which the dispatcher renders in the
request's dialect.  A WebSocket row's handler takes the socket instead
(`Socket`).  Nothing here knows the framework: the dispatcher
(`gateway.app.dispatch`) serves the rows.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from ..transport.render import Dialect
from ..turn.context import RequestContext
from ..wire import decode_json_object

if TYPE_CHECKING:
    from ..keys import KeyRing
    from ..observe.usage import UsageLedger
    from ..transport.background import BackgroundRunner
    from ..transport.body import DeferredHeadBody
    from ..transport.heartbeats import Heartbeats
    from ..turn import Resources

__all__ = ["Auth", "Call", "Handler", "Route", "RouteTable", "Served", "Services", "Socket", "SocketHandler"]


class Services(Protocol):
    """What the handlers use of the running gateway (the lifespan's `Shared` is one)."""

    @property
    def resources(self) -> Resources: ...

    @property
    def runner(self) -> BackgroundRunner: ...

    @property
    def heartbeats(self) -> Heartbeats: ...

    @property
    def readiness(self) -> Any: ...  # `report()`: whether the gateway is ready, and why

    @property
    def usage(self) -> UsageLedger: ...  # each key's use by the minute, the backends' recent errors

    @property
    def keyring(self) -> KeyRing: ...  # who a key is (the console's admin keys, and the keys it manages)

# How a row is served: by the framework's router (Quart, the design card's), or looked up by its
# exact method and path ahead of it, where the bench shows the router's cost (the row says how much).
Served = Literal["framework", "ahead"]
# Who may call a row: a caller with an API key (when keys are on), anyone (the probes), whoever
# has the route's own token when one is configured (/metrics: METRICS_TOKEN), else a key, or the
# operator, whom the row's handler itself checks (the console: CONSOLE_TOKEN or an admin key).
Auth = Literal["key", "anyone", "own token", "operator"]


@dataclass
class Call:
    shared: Services  # the running gateway's
    ctx: RequestContext  # who asks
    params: Mapping[str, str]  # the path's
    args: Mapping[str, str]  # the query's
    read: Callable[[], Awaitable[bytes]]  # the body, read and decoded by the dispatcher
    headers: Mapping[str, str] = field(default_factory=dict)  # the request's, names in lower case
    query: bytes = b""  # the raw query string, for a request relayed as it is
    method: str = ""  # the request's (a row may answer several)

    async def json(self) -> dict[str, Any]:
        """The body as a JSON object ({} when empty).

        Raises:
            InvalidRequest: not a JSON object.
        """
        raw = await self.read()
        return decode_json_object(raw) if raw.strip() else {}


@dataclass
class Socket:
    """A WebSocket that passed the edge, for a WebSocket row's handler."""

    shared: Services
    ctx: RequestContext
    scope: MutableMapping[str, Any]
    receive: Callable[[], Awaitable[MutableMapping[str, Any]]]
    send: Callable[[MutableMapping[str, Any]], Awaitable[None]]


Handler = Callable[[Call], Awaitable["DeferredHeadBody"]]
SocketHandler = Callable[[Socket], Awaitable[None]]

_PARAMETER = re.compile(r"\{(\w+)(?::(path))?\}")


@dataclass(frozen=True)
class Route:
    """One row of the route table.

    `method` is an HTTP method, `*` (any), or `WEBSOCKET`; `path` starts
    with `/v1` where the route is also served without it (`unversioned`,
    for clients configured without the `/v1`).  A row `served` "ahead" of
    the framework says in `cost` what the framework's router cost it, as
    `just bench` measured it.
    """

    method: str
    path: str
    handler: Handler | SocketHandler
    served: Served = "framework"
    unversioned: bool = True
    cost: str = ""
    dialect: Dialect = "openai"
    auth: Auth = "key"

    def __post_init__(self) -> None:
        if self.served == "ahead" and (not self.cost or _PARAMETER.search(self.path)):
            raise ValueError(f"{self.method} {self.path}: only an exact path is served ahead, with its measured cost")

    @property
    def paths(self) -> tuple[str, ...]:
        """Every path the row answers at."""
        if self.unversioned and self.path.startswith("/v1/"):
            return (self.path, self.path[3:])
        return (self.path,)

    @property
    def methods(self) -> tuple[str, ...]:
        return ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS") if self.method == "*" else (self.method,)

    def rule(self, path: str) -> str:
        """A path in the framework's (werkzeug's) rule syntax."""
        return _PARAMETER.sub(lambda m: f"<path:{m[1]}>" if m[2] else f"<{m[1]}>", path)

    @property
    def label(self) -> str:
        """The row's name in the metrics' `route` label: its path, the first `*_id` parameter
        spelled `{id}` (bounded: one value per row, whatever the ids)."""
        seen = False

        def name(match: re.Match[str]) -> str:
            nonlocal seen
            if match[1].endswith("_id") and not seen:
                seen = True
                return "{id}"
            return "{" + match[1] + "}"

        return _PARAMETER.sub(name, self.path)


class RouteTable:
    """What the table says of a path, asked of every request before any route runs (the edge's
    questions: the metrics' route label, the errors' dialect, whether a key is needed)."""

    def __init__(self, routes: Sequence[Route]) -> None:
        self.routes = tuple(routes)
        self._exact: dict[str, tuple[str, Route]] = {}
        general: list[tuple[int, str, str, Route]] = []
        for route in self.routes:
            for path in route.paths:
                label = route.label if path == route.path else route.label.removeprefix("/v1")
                if _PARAMETER.search(path):
                    literal = len(_PARAMETER.sub("", path))
                    general.append((literal, path, label, route))
                else:
                    self._exact.setdefault(path, (label, route))
        general.sort(key=lambda row: -row[0])  # the most literal first: the relay last
        self._general = [(label, route) for _, _, label, route in general]
        parts = [f"(?P<r{i}>{_pattern(path)})" for i, (_, path, _, _) in enumerate(general)]
        self._pattern = re.compile("|".join(parts)) if parts else None

    def find(self, path: str) -> tuple[str, Route] | None:
        """The row serving `path` (whatever the method) with its label, or None."""
        found = self._exact.get(path)
        if found is not None or self._pattern is None:
            return found
        match = self._pattern.fullmatch(path)
        if match is None or match.lastgroup is None:
            return None
        return self._general[int(match.lastgroup[1:])]

    def label(self, path: str) -> str:
        found = self.find(path)
        return found[0] if found is not None else "other"

    def dialect(self, path: str) -> Dialect:
        found = self.find(path)
        return found[1].dialect if found is not None else "openai"

    def paths(self, auth: Auth) -> frozenset[str]:
        """The exact paths whose rows `auth` admits."""
        return frozenset(path for route in self.routes if route.auth == auth for path in route.paths)


def _pattern(path: str) -> str:
    """A row's path as a regular expression (a `{name}` is one segment, `{name:path}` the rest)."""
    out, last = [], 0
    for match in _PARAMETER.finditer(path):
        out.append(re.escape(path[last : match.start()]))
        out.append(".+" if match[2] else "[^/]+")
        last = match.end()
    out.append(re.escape(path[last:]))
    return "".join(out)
