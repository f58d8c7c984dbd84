"""The gateway's tools for one turn: which MCP tools are offered, and how their calls run.

Configured MCP servers' tools are offered on every request unless the
request opts out (`"gateway_tools": false` in the body, or the header
`x-gateway-tools: none`).  A request's own function of the same name wins:
the MCP tool is not offered, and calls to that name go back to the client.
A request's hosted `mcp` tools (`{"type": "mcp", "server_label", ...}`)
name servers the gateway connects to for the duration of the turn.  The
model sees every tool as a function; `RequestTools.routes` tells the
translator which names are the gateway's (they become `mcp_call` items).

A tool failure is data for the model (its text goes back as the tool's
result), never an exception.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio

from ..errors import GatewayError, InvalidRequest
from ..keys import KeyLimits, PermissionDenied
from ..observe import Telemetry
from ..streams.translator import RoundCall

__all__ = [
    "Builtin",
    "HostedListing",
    "HostedSpec",
    "RequestTools",
    "ToolOutcome",
    "ToolSource",
    "check_hosted",
    "hosted_specs",
    "listed_tool",
    "offer_configured",
    "offers_gateway_tools",
    "open_hosted",
    "run_calls",
]

log = logging.getLogger("gateway.tools")


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    output: str | None = None
    error: str | None = None
    # What the client's item shows beyond the text (a built-in tool's `action` and `status`).
    detail: dict[str, Any] | None = None


# A built-in tool's runner (`gateway.builtins`): the call's arguments in, its outcome out; never raises.
Builtin = Callable[[dict[str, Any]], Awaitable[ToolOutcome]]


class ToolSource(Protocol):
    """What the tools need from an MCP manager (or a hosted MCP session)."""

    def tools(self) -> Sequence[Any]: ...

    async def call(self, name: str, arguments: dict[str, Any]) -> Any: ...


@dataclass
class RequestTools:
    """The gateway tools one turn offers, and where each call goes."""

    chat_tools: list[dict[str, Any]] = field(default_factory=list)
    routes: dict[str, str] = field(default_factory=dict)  # offered name -> server label
    approval: set[str] = field(default_factory=set)  # offered names that need the client's approval first
    builtins: dict[str, str] = field(default_factory=dict)  # offered name -> the item type its calls show as
    _sources: dict[str, tuple[ToolSource, str]] = field(default_factory=dict)  # offered name -> (source, its name)
    _runners: dict[str, Builtin] = field(default_factory=dict)

    def add_builtin(self, function: dict[str, Any], item_type: str, runner: Builtin) -> None:
        """A built-in tool (`gateway.builtins`): offered as `function`, its calls shown as
        `item_type` items and run by `runner`."""
        name = function["name"]
        self.routes[name] = name  # (its "server", in metrics and spans)
        self.builtins[name] = item_type
        self._runners[name] = runner
        self.chat_tools.append({"type": "function", "function": function})

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
        """Run one call; every failure comes back as `ToolOutcome(error=...)`."""
        runner = self._runners.get(call.name)
        source_and_name = self._sources.get(call.name)
        if source_and_name is None and runner is None:
            return ToolOutcome(error=f"unknown tool {call.name!r}")
        try:
            arguments = json.loads(call.arguments) if call.arguments.strip() else {}
        except ValueError:
            return ToolOutcome(error="the tool arguments are not valid JSON")
        if not isinstance(arguments, dict):
            return ToolOutcome(error="the tool arguments must be a JSON object")
        if runner is not None:
            return await runner(arguments)
        assert source_and_name is not None
        source, name = source_and_name
        result = await source.call(name, arguments)
        if result.is_error:
            return ToolOutcome(error=result.text or "the tool failed")
        return ToolOutcome(output=result.text)


async def run_calls(
    tools: RequestTools,
    calls: Sequence[RoundCall],
    on_result: Callable[[RoundCall, ToolOutcome], Awaitable[None]],
    *,
    call_timeout: float,
    concurrency: int,
    telemetry: Telemetry | None = None,
    begun: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Run the gateway's calls concurrently (at most `concurrency` at once, each within `call_timeout`).

    `on_result` is awaited once per call as soon as it finishes, one at a
    time and in the order they finish (so the caller can emit in order).
    `begun` is awaited once every call has begun (or waits for a free slot),
    before any result: what tells the client the calls are in progress goes
    out once they are.  The nursery is this function's; cancelling the
    caller cancels the calls.
    """
    limiter = trio.CapacityLimiter(concurrency)
    send, receive = trio.open_memory_channel[tuple[RoundCall, ToolOutcome]](len(calls) or 1)
    observe = telemetry or Telemetry()

    async def one(
        call: RoundCall,
        send: trio.MemorySendChannel[tuple[RoundCall, ToolOutcome]],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        async with send:
            try:
                limiter.acquire_nowait()
            except trio.WouldBlock:
                task_status.started()  # (it waits for a slot: the next call begins meanwhile)
                await limiter.acquire()
            else:
                # The caller resumes once this task yields: inside the call, begun.
                task_status.started()
            try:
                await _one_call(call, send)
            finally:
                limiter.release()

    async def _one_call(call: RoundCall, send: trio.MemorySendChannel[tuple[RoundCall, ToolOutcome]]) -> None:
        started = trio.current_time()
        kind = "ok"
        with observe.span("mcp call", server=call.server or "", tool=call.name):
            try:
                with trio.fail_after(call_timeout):
                    outcome = await tools.run(call)
                kind = "ok" if outcome.error is None else "error"
            except trio.TooSlowError:
                outcome = ToolOutcome(error=f"the tool call timed out after {call_timeout:g} s")
                kind = "timeout"
            except Exception as exc:  # a runner bug must not end the response
                log.warning("tool %s failed unexpectedly (%s)", call.name, type(exc).__name__)
                outcome = ToolOutcome(error="the tool failed")
                kind = "error"
            observe.mcp_call(
                server=tools.routes.get(call.name, call.server or ""),
                tool=call.name,
                outcome=kind,
                seconds=trio.current_time() - started,
            )
        await send.send((call, outcome))

    async with trio.open_nursery() as nursery:
        async with send:
            for call in calls:
                await nursery.start(one, call, send.clone())
        if begun is not None:
            await begun()
        async with receive:
            async for call, outcome in receive:
                await on_result(call, outcome)


def offers_gateway_tools(tool_choice: Any) -> bool:
    """The one rule, for Responses and chat completions alike: whether a request's `tool_choice`
    leaves the model free to call the gateway's tools.  Not when it says `none`, forces one of
    the client's own functions, or restricts the choice to a list (`allowed_tools`, in either
    API's shape); `auto`, `required`, or no choice at all: yes."""
    return tool_choice is None or tool_choice in ("auto", "required")


def offer_configured(tools: RequestTools, source: ToolSource | None, *, taken: set[str], limits: KeyLimits) -> None:
    """Add the configured MCP servers' tools the key may use to `tools`, except names the
    request's own functions take (its own function wins: calls to that name go back to it)."""
    if source is None:
        return
    for tool in source.tools():
        if tool.name not in taken and tool.name not in tools.routes and limits.allows_server(tool.server):
            tools.add(source, tool)


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


async def check_hosted(
    specs: list[HostedSpec], configured: ToolSource | None, allow: Sequence[str], limits: KeyLimits | None = None
) -> None:
    """Refuse, before anything is sent, hosted servers the gateway or the caller's key may not use.

    Raises:
        InvalidRequest: a URL the gateway may not contact (`mcp_server_not_allowed`), or a
            `server_label` without `server_url` that names no configured server.
        PermissionDenied: the key may not use that server (`mcp_server_not_allowed`).
    """
    if not specs:
        return
    from ..mcp import check_url_allowed_async  # (loaded at start-up: see lifespan)

    for spec in specs:
        where = f"tools[{spec.index}]"
        if limits is not None and spec.server_url and not limits.hosted_mcp:
            raise PermissionDenied(
                "This API key may not name MCP servers by URL.", param=f"{where}.server_url", code="mcp_server_not_allowed"
            )
        if limits is not None and not spec.server_url and not limits.allows_server(spec.server_label):
            raise PermissionDenied(
                f"This API key may not use the MCP server '{spec.server_label}'.",
                param=f"{where}.server_label",
                code="mcp_server_not_allowed",
            )
        if spec.server_url:
            try:
                await check_url_allowed_async(spec.server_url, allow)
            except ValueError as exc:
                raise InvalidRequest(
                    str(exc), param=f"tools[{spec.index}].server_url", code="mcp_server_not_allowed"
                ) from None
        elif configured is None or not any(t.server == spec.server_label for t in configured.tools()):
            raise InvalidRequest(
                f"No configured MCP server is labelled '{spec.server_label}'; give a server_url.",
                param=f"tools[{spec.index}].server_url",
                code="missing_required_parameter",
            )


@dataclass
class HostedListing:
    spec: HostedSpec
    tools: list[Any]
    error: str | None = None


async def open_hosted(
    stack: Any,
    specs: list[HostedSpec],
    configured: ToolSource | None,
    tools: RequestTools,
    *,
    connect_timeout: float,
    trace_headers: Mapping[str, str] | None = None,
) -> list[HostedListing]:
    """Connect the turn's hosted MCP servers (their sessions live in `stack`) and offer their tools.

    Checked beforehand by `check_hosted`.  A `server_label` without
    `server_url` names a configured server.  Each server gets
    `connect_timeout` seconds to connect and initialise, and as long again
    to list its tools; one that does not is reported in its listing, as any
    other failure to reach it.
    """
    from ..mcp import open_remote_session

    listings = []
    for spec in specs:
        source: ToolSource
        if spec.server_url:
            try:
                session = await stack.enter_async_context(
                    open_remote_session(
                        spec.server_url,
                        {**(trace_headers or {}), **spec.headers},
                        server_label=spec.server_label,
                        connect_timeout=connect_timeout,
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
            source = configured  # type: ignore[assignment]  # check_hosted made sure it is there
            offered = [t for t in source.tools() if t.server == spec.server_label]
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
