"""The gateway's tools for one request: which MCP tools are offered, and how a call runs.

Configured MCP servers' tools are offered on every request unless the
request opts out (`"gateway_tools": false` in the body, or the header
`x-gateway-tools: none`).  A request's own function of the same name wins:
the MCP tool is not offered, and calls to that name go back to the client.
The model sees tools as functions; `routes` tells the translator which
names are the gateway's (they become `mcp_call` items).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .streams.toolloop import ToolOutcome
from .streams.translator import RoundCall

__all__ = ["RequestTools", "ToolSource", "request_tools"]


class ToolSource(Protocol):
    """What the toolbox needs from an MCP manager (or a hosted MCP session)."""

    def tools(self) -> Sequence[Any]: ...

    async def call(self, name: str, arguments: dict[str, Any]) -> Any: ...


@dataclass
class RequestTools:
    chat_tools: list[dict[str, Any]] = field(default_factory=list)
    routes: dict[str, str] = field(default_factory=dict)  # offered name -> server label
    _sources: dict[str, tuple[ToolSource, str]] = field(default_factory=dict)  # offered name -> (source, its name)

    def add(self, source: ToolSource, tool: Any, *, offered: str | None = None) -> None:
        name = offered or tool.name
        self.routes[name] = tool.server
        self._sources[name] = (source, tool.name)
        function: dict[str, Any] = {
            "name": name,
            "parameters": tool.input_schema or {"type": "object", "properties": {}},
        }
        if tool.description:
            function["description"] = tool.description
        self.chat_tools.append({"type": "function", "function": function})

    async def run(self, call: RoundCall) -> ToolOutcome:
        source_and_name = self._sources.get(call.name)
        if source_and_name is None:
            return ToolOutcome(error=f"unknown tool {call.name!r}")
        try:
            arguments = json.loads(call.arguments) if call.arguments.strip() else {}
        except ValueError:
            return ToolOutcome(error="the tool arguments are not valid JSON")
        if not isinstance(arguments, dict):
            return ToolOutcome(error="the tool arguments must be a JSON object")
        source, name = source_and_name
        result = await source.call(name, arguments)
        if result.is_error:
            return ToolOutcome(error=result.text or "the tool failed")
        return ToolOutcome(output=result.text)


def request_tools(source: ToolSource | None, *, client_names: Iterable[str], enabled: bool) -> RequestTools:
    """The configured MCP tools this request offers (none when disabled or no servers)."""
    tools = RequestTools()
    if source is None or not enabled:
        return tools
    taken = set(client_names)
    for tool in source.tools():
        if tool.name not in taken:
            tools.add(source, tool)
    return tools
