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

import trio

from .errors import InvalidRequest
from .streams.toolloop import ToolOutcome
from .streams.translator import RoundCall

__all__ = ["HostedListing", "HostedSpec", "RequestTools", "ToolSource", "hosted_specs", "listed_tool", "open_hosted", "gateway_tools_enabled", "request_tools", "resume_approvals"]


class ToolSource(Protocol):
    """What the toolbox needs from an MCP manager (or a hosted MCP session)."""

    def tools(self) -> Sequence[Any]: ...

    async def call(self, name: str, arguments: dict[str, Any]) -> Any: ...


@dataclass
class RequestTools:
    chat_tools: list[dict[str, Any]] = field(default_factory=list)
    routes: dict[str, str] = field(default_factory=dict)  # offered name -> server label
    approval: set[str] = field(default_factory=set)  # offered names that need the client's approval first
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


def gateway_tools_enabled(flag: Any, header: str = "") -> bool:
    """Whether a request accepts the gateway's tools: `"gateway_tools": false|"none"` or `x-gateway-tools: none` opt out."""
    return flag not in (False, "none") and header.lower() not in ("none", "off", "false")


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


# --- the hosted `mcp` tool ---------------------------------------------------------------


@dataclass(frozen=True)
class HostedSpec:
    """One `{"type": "mcp", ...}` entry of a request's tools."""

    index: int
    server_label: str
    server_url: str | None
    headers: dict[str, str]
    allowed: frozenset[str] | None
    approval: Any  # "always" | "never" | {"always": {...}, "never": {...}}

    def needs_approval(self, name: str) -> bool:
        rule = self.approval
        if rule == "never":
            return False
        if isinstance(rule, dict):
            never = (rule.get("never") or {}).get("tool_names") or []
            always = (rule.get("always") or {}).get("tool_names") or []
            if name in never:
                return False
            if always:
                return name in always
            return not never  # only "never" listed: everything else asks
        return True  # "always", and OpenAI's default


def hosted_specs(tools: list[dict[str, Any]] | None) -> list[HostedSpec]:
    """The request's hosted MCP tools.

    Raises:
        InvalidRequest: an entry is malformed (the error names it).
    """
    from .errors import InvalidRequest

    specs = []
    for index, tool in enumerate(tools or ()):
        if tool.get("type") != "mcp":
            continue
        label = tool.get("server_label")
        if not isinstance(label, str) or not label:
            raise InvalidRequest.missing(f"tools[{index}].server_label")
        url = tool.get("server_url")
        if url is not None and not isinstance(url, str):
            raise InvalidRequest("'server_url' must be a string.", param=f"tools[{index}].server_url", code="invalid_type")
        headers = tool.get("headers") or {}
        if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
            raise InvalidRequest("'headers' must map names to strings.", param=f"tools[{index}].headers", code="invalid_type")
        allowed = tool.get("allowed_tools")
        if isinstance(allowed, dict):
            allowed = allowed.get("tool_names")
        if allowed is not None and not (isinstance(allowed, list) and all(isinstance(n, str) for n in allowed)):
            raise InvalidRequest(
                "'allowed_tools' must list tool names.", param=f"tools[{index}].allowed_tools", code="invalid_type"
            )
        specs.append(
            HostedSpec(
                index=index,
                server_label=label,
                server_url=url,
                headers=dict(headers),
                allowed=frozenset(allowed) if allowed is not None else None,
                approval=tool.get("require_approval", "always"),
            )
        )
    return specs


@dataclass
class HostedListing:
    spec: HostedSpec
    tools: list[Any]
    error: str | None = None


async def open_hosted(
    stack: Any,
    specs: list[HostedSpec],
    configured: ToolSource | None,
    allow: Sequence[str],
    tools: RequestTools,
    *,
    connect_timeout: float,
) -> list[HostedListing]:
    """Connect the request's hosted MCP servers (their sessions live in `stack`) and offer their tools.

    A `server_label` without `server_url` names a configured server.  Each
    server gets `connect_timeout` seconds to connect and initialise, and as
    long again to list its tools; one that does not is reported in its
    `mcp_list_tools` item, as any other failure to reach it.

    Raises:
        InvalidRequest: a URL the gateway may not contact, or an unknown configured label.
    """
    from .errors import GatewayError, InvalidRequest
    from .mcp import check_url_allowed_async, open_remote_session

    listings = []
    for spec in specs:
        source: ToolSource
        if spec.server_url:
            try:
                await check_url_allowed_async(spec.server_url, allow)
            except ValueError as exc:
                raise InvalidRequest(str(exc), param=f"tools[{spec.index}].server_url", code="mcp_server_not_allowed") from None
            try:
                session = await stack.enter_async_context(
                    open_remote_session(
                        spec.server_url, spec.headers, server_label=spec.server_label, connect_timeout=connect_timeout
                    )
                )
                with trio.fail_after(connect_timeout):
                    offered = await session.list_tools()
            except GatewayError as error:
                listings.append(HostedListing(spec, [], error.message))
                continue
            except trio.TooSlowError:
                message = f"the MCP server {spec.server_label!r} did not list its tools within {connect_timeout:g} s"
                listings.append(HostedListing(spec, [], message))
                continue
            source = session
        else:
            offered = [t for t in (configured.tools() if configured is not None else ()) if t.server == spec.server_label]
            if configured is None or not offered:
                raise InvalidRequest(
                    f"No configured MCP server is labelled '{spec.server_label}'; give a server_url.",
                    param=f"tools[{spec.index}].server_url",
                    code="missing_required_parameter",
                )
            source = configured
        if spec.allowed is not None:
            offered = [t for t in offered if t.name in spec.allowed or getattr(t, "original_name", None) in spec.allowed]
        for tool in offered:
            if tool.name not in tools.routes:
                tools.add(source, _labelled(tool, spec.server_label))
                if spec.needs_approval(tool.name):
                    tools.approval.add(tool.name)
        listings.append(HostedListing(spec, offered))
    return listings


def _labelled(tool: Any, label: str) -> Any:
    """The tool as offered under a hosted server's label."""
    import dataclasses

    if dataclasses.is_dataclass(tool) and not isinstance(tool, type):
        return dataclasses.replace(tool, server=label)
    return tool


def listed_tool(tool: Any) -> dict[str, Any]:
    return {
        "name": tool.name,
        "description": tool.description,
        "input_schema": tool.input_schema or {"type": "object", "properties": {}},
        "annotations": None,
    }


async def resume_approvals(
    prepared: Any, tools: RequestTools, translator: Any, body: dict[str, Any], timeout: float
) -> list[dict[str, Any]]:
    """Run (or decline) the tool calls the client answered with `mcp_approval_response` items.

    Raises:
        InvalidRequest: a response names no approval request in the conversation.
    """
    answers = [item for item in prepared.input if getattr(item, "type", None) == "mcp_approval_response"]
    if not answers:
        return []
    asked = {
        data.get("id"): data
        for data in (item.model_dump() for item in [*prepared.history, *prepared.input])
        if data.get("type") == "mcp_approval_request"
    }
    events: list[dict[str, Any]] = []
    for answer in answers:
        data = answer.model_dump()
        request_id = data.get("approval_request_id")
        ask = asked.get(request_id)
        if ask is None:
            raise InvalidRequest(
                f"No mcp_approval_request with id '{request_id}' in this conversation.",
                param="input",
                code="approval_request_not_found",
            )
        name, arguments, label = ask.get("name", ""), ask.get("arguments") or "{}", ask.get("server_label", "")
        if data.get("approve") is True:
            with trio.move_on_after(timeout) as waited:
                outcome = await tools.run(RoundCall(request_id, request_id, name, arguments, label))
            if waited.cancelled_caught:
                outcome = ToolOutcome(error=f"the tool call timed out after {timeout:g} s")
            events += translator.record_mcp_call(
                label, name, arguments, output=outcome.output, error=outcome.error, approval_request_id=request_id
            )
            result = outcome.text_for_model
        else:
            result = "The user did not approve this tool call." + (f" Reason: {data['reason']}" if data.get("reason") else "")
        body["messages"].append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": request_id, "type": "function", "function": {"name": name, "arguments": arguments}}],
            }
        )
        body["messages"].append({"role": "tool", "tool_call_id": request_id, "content": result})
    return events
