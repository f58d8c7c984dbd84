"""What the edge learnt of a request (who asks, its id, when it arrived), for the turn it starts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from ..keys import ANONYMOUS, Caller

__all__ = ["RequestContext", "gateway_tools_wanted", "where_of"]


@dataclass(frozen=True)
class RequestContext:
    """What the edge learnt of a request, for the turn it starts."""

    caller: Caller = ANONYMOUS
    request_id: str | None = None
    tools_header: str = ""  # x-gateway-tools
    arrived: float | None = None  # trio time the edge saw the request (None: a WebSocket's frames)
    where: str = ""  # what a log line about the request names: method, path, request id
    dialect: Literal["openai", "anthropic"] = "openai"  # the shape of its errors (the edge's note)

    @classmethod
    def of(cls, scope: Any) -> RequestContext:
        """The context of an ASGI scope the edge has seen (its notes in `scope["gateway"]`)."""
        notes = scope.get("gateway") or {}
        caller = notes.get("caller", ANONYMOUS)
        header = next((v for n, v in scope.get("headers", ()) if n == b"x-gateway-tools"), b"")
        arrived = notes.get("arrived") if scope.get("type") == "http" else None
        return cls(
            caller if isinstance(caller, Caller) else ANONYMOUS,
            notes.get("request_id"),
            header.decode("latin-1"),
            arrived,
            where_of(scope),
            "anthropic" if notes.get("dialect") == "anthropic" else "openai",
        )

    def gateway_tools(self, flag: Any = None) -> bool:
        """Whether the gateway's tools are wanted, given the body's `gateway_tools` field."""
        return gateway_tools_wanted(flag, self.tools_header)


def where_of(scope: Any) -> str:
    """The request a log line is about: method (`WEBSOCKET` for a socket), path and request id."""
    request_id = (scope.get("gateway") or {}).get("request_id") or ""
    return f"{scope.get('method', 'WEBSOCKET')} {scope.get('path', '')} {request_id}".rstrip()


def gateway_tools_wanted(flag: Any, header: str = "") -> bool:
    """`"gateway_tools": false|"none"` in a body, or `x-gateway-tools: none`, opt out of the gateway's tools."""
    return flag not in (False, "none") and header.lower() not in ("none", "off", "false")
