"""MCP servers named by a request: the hosted `mcp` tool of the Responses API.

A request may carry `{"type": "mcp", "server_label": ..., "server_url": ...}`;
the gateway then connects to that URL for the duration of the request.
`open_remote_session` connects (streamable HTTP, falling back to SSE) and
yields a `RemoteSession`; `check_url_allowed_async` decides beforehand
whether the URL may be contacted at all, since a client-supplied URL could
otherwise reach the gateway's own network (SSRF).

The session runs in a task of its own: a transport failure marks it closed
and turns later calls into `is_error` results; it never cancels the
caller's code.  Connecting takes no timeout: wrap it in `trio.fail_after`.

This module knows nothing of configuration files or the HTTP API.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import trio
from mcp.client._transport import TransportStreams

from ..errors import GatewayError
from ..ops import addresses as addresses_module
from ._connection import (
    Connection,
    MCPResult,
    MCPTool,
    assign_tool_names,
    describe_error,
    open_transport,
)
from .config import ServerConfig, ServerType

__all__ = [
    "RemoteMCPError",
    "RemoteSession",
    "check_url_allowed",
    "check_url_allowed_async",
    "open_remote_session",
]

logger = logging.getLogger("gateway.mcp")



class RemoteMCPError(GatewayError):
    """A request's MCP server could not be reached or listed (OpenAI answers 424)."""

    status = 424
    type = "external_connector_error"
    code = "mcp_server_unavailable"

    def __init__(self, message: str, *, detail: str | None = None) -> None:
        super().__init__(message, param="tools")
        self.detail = detail  # what went wrong, for logs only


class RemoteSession:
    """A connected MCP server: list its tools, call them.

    `tools()` returns the last listing without I/O, so a session can serve
    where a manager would (`gateway.turn.tools.ToolSource`).
    """

    def __init__(self, connection: Connection, server_label: str, transport: ServerType) -> None:
        self._connection = connection
        self._label = server_label
        self.transport = transport  # which transport connected: "streamable-http" or "sse"
        self._tools: list[MCPTool] = []
        self._original: dict[str, str] = {}

    async def list_tools(self) -> list[MCPTool]:
        """The server's tools, named for the model (`server` is the label given, default "").

        Raises:
            RemoteMCPError: the listing failed or the connection is gone.
        """
        try:
            listing = await self._connection.list_tools()
        except Exception as exc:
            detail = describe_error(exc)
            logger.warning("listing the tools of remote MCP server %r failed: %s", self._label, detail)
            raise RemoteMCPError(f"could not list the tools of the MCP server {self._label!r}", detail=detail) from None
        self._tools = assign_tool_names([(self._label, listing)])
        self._original = {tool.name: tool.original_name for tool in self._tools}
        return list(self._tools)

    def tools(self) -> list[MCPTool]:
        """The tools of the last `list_tools` (no I/O)."""
        return list(self._tools)

    async def call(self, name: str, arguments: dict[str, Any]) -> MCPResult:
        """Call a tool by the name `list_tools` gave it (or by the server's own name).

        Never raises for a failure of the tool or the server: those come back
        as `MCPResult(is_error=True)`.  Cancellation returns at once.
        """
        return await self._connection.call(self._original.get(name, name), arguments)


@asynccontextmanager
async def open_remote_session(
    url: str, headers: Mapping[str, str], *, server_label: str = "", connect_timeout: float = math.inf
) -> AsyncIterator[RemoteSession]:
    """Connect to the MCP server at `url` (streamable HTTP, then SSE) and initialize.

    Check the URL with `check_url_allowed_async` first.  Leaving the block
    closes the session.  `connect_timeout` bounds connecting and the
    handshake, both transports together: the session's task outlives any
    cancel scope a caller could put around entering this block, so the bound
    is taken here.

    Raises:
        RemoteMCPError: neither transport could connect and initialize in time.
    """
    failure: RemoteMCPError | None = None
    body_error: Exception | None = None
    async with trio.open_nursery() as nursery:
        failures: list[str] = []
        transports: tuple[ServerType, ...] = ("streamable-http", "sse")
        deadline = trio.current_time() + connect_timeout
        connected = False
        for transport in transports:
            config = ServerConfig(name=server_label, type=transport, url=url, headers=dict(headers))
            connection = Connection(server_label)
            try:
                with trio.move_on_at(deadline):
                    await nursery.start(_run_contained, connection, open_transport(config))
                    connected = True
            except Exception as exc:
                failures.append(f"{transport}: {describe_error(exc)}")
                continue
            if not connected:  # out of time: a server that accepts and never answers
                failures.append(f"{transport}: no answer within {connect_timeout:g} s")
            break
        if not connected:
            detail = "; ".join(failures)
            logger.warning("connecting to remote MCP server %r at %s failed: %s", server_label, url, detail)
            failure = RemoteMCPError(f"could not connect to the MCP server {server_label or url!r}", detail=detail)
        if failure is None:
            try:
                yield RemoteSession(connection, server_label, transport)
            except Exception as exc:
                # The caller's own error: raised below, outside our nursery, so
                # that it is not wrapped in an ExceptionGroup.
                body_error = exc
            finally:
                nursery.cancel_scope.cancel()
    if failure is not None:
        raise failure
    if body_error is not None:
        raise body_error


async def _run_contained(
    connection: Connection,
    transport: AbstractAsyncContextManager[TransportStreams],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    # Failures before started() go to the caller of nursery.start; after it,
    # they only close the connection (the caller's code must not be cancelled).
    try:
        await connection.run(transport, task_status=task_status)
    except* Exception as group:
        if not connection.started:
            raise
        logger.info("remote MCP server %r closed: %s", connection.label, describe_error(group))


# --- which URLs may be contacted ----------------------------------------------------


def check_url_allowed(url: str, allow: Sequence[str], *, addresses: Iterable[str] = ()) -> None:
    """`gateway.ops.addresses.check_url_allowed` for an MCP server's URL.

    Raises:
        ValueError: saying why the URL is refused.
    """
    addresses_module.check_url_allowed(url, allow, addresses=addresses, what="MCP server URL")


async def check_url_allowed_async(url: str, allow: Sequence[str]) -> None:
    """`gateway.ops.addresses.check_url_allowed_async` for an MCP server's URL.

    Raises:
        ValueError: the URL is refused, or its host does not resolve.
    """
    try:
        await addresses_module.check_url_allowed_async(url, allow, what="MCP server URL")
    except ValueError as refused:
        raise ValueError(str(refused).replace("the MCP server URL host", "the MCP server host")) from None

