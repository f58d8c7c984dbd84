"""One MCP client session, run by its own task and used by others.

Owns what the configured servers (`manager.py`) and the hosted `mcp` tool
(`remote.py`) share: opening a transport, the session's life, calling a tool
so that the caller's cancellation never waits on the server, turning a tool
result into text, and naming tools for the model.

Why calls run as tasks of the connection: the SDK's transports run their
own task groups around the session, and on cancellation its dispatcher
writes a courtesy `notifications/cancelled` under a shield (for up to 5 s
when the transport is busy).  A caller awaiting `call_tool` directly would
wait out that write, and a transport failure would cancel the caller's own
code.  Here the request runs in the connection's nursery; the caller waits
for its outcome and, when cancelled, abandons it at once.

This module knows nothing of configuration files, reconnection or the HTTP
API.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from types import TracebackType
from typing import Any, TextIO, TypeVar

import anyio
import httpx2
import mcp_types as types
import outcome
import trio
from mcp import ClientSession, MCPError, StdioServerParameters, stdio_client
from mcp.client.session import IncomingMessage
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.client._transport import TransportStreams
from mcp.shared.message import SessionMessage
from mcp_types import CONNECTION_CLOSED

from ..wire import nested_deeper_than
from .config import ServerConfig

__all__ = [
    "CLIENT_INFO",
    "Connection",
    "ConnectionLost",
    "MCPResult",
    "MCPTool",
    "assign_tool_names",
    "describe_error",
    "open_transport",
    "result_from_call",
    "sanitize_tool_name",
]

logger = logging.getLogger("gateway.mcp")

T = TypeVar("T")

CLIENT_INFO = types.Implementation(name="trio-responses-gateway", version="0.1.0")

# 30 s to connect, write or wait for a pool slot; 5 min of silence on a stream
# (a long tool call); the MCP SDK's own defaults.
_HTTP_TIMEOUT = httpx2.Timeout(30.0, read=300.0)

_MAX_SCHEMA_DEPTH = 32  # a tool's input schema; real ones stay within a dozen levels
_MAX_TOOL_PAGES = 100  # a server that paginates forever cannot hang a refresh
_NAME_RE = re.compile(r"[^a-zA-Z0-9_-]")
_MAX_NAME = 64


@dataclass(frozen=True)
class MCPTool:
    """A tool offered to the model.

    `name` is what the model sees (sanitised, unique across servers);
    `original_name` is what the server calls it.
    """

    server: str
    name: str
    original_name: str
    description: str | None
    input_schema: dict[str, Any] = field(hash=False)


@dataclass(frozen=True)
class MCPResult:
    """The outcome of a tool call, as text for the model.

    `is_error` is set for a tool's own failure and for a call that could not
    be made (server down, connection lost); the text says which.
    """

    text: str
    is_error: bool


class ConnectionLost(Exception):
    """The server closed the connection (a stdio server exited, a stream ended)."""


def sanitize_tool_name(name: str) -> str:
    """`name` made to match `^[a-zA-Z0-9_-]{1,64}$`: other characters become `_`."""
    return (_NAME_RE.sub("_", name) or "_")[:_MAX_NAME]


def assign_tool_names(listings: Iterable[tuple[str, Sequence[types.Tool]]]) -> list[MCPTool]:
    """Name every tool for the model, in the order given.

    The first tool to claim a sanitised name keeps it; a later one becomes
    `{server}__{name}`, and should that be taken as well (or truncation makes
    two names equal) a `_2`, `_3`, ... suffix makes it unique.  The result
    depends only on the listings and their order.
    """
    taken: set[str] = set()
    tools: list[MCPTool] = []
    for server, listing in listings:
        for tool in listing:
            name = sanitize_tool_name(tool.name)
            if name in taken:
                name = _unique(sanitize_tool_name(f"{server}__{tool.name}"), taken)
            taken.add(name)
            schema = dict(tool.input_schema)
            if nested_deeper_than(schema, _MAX_SCHEMA_DEPTH):
                # It would be echoed in events and records, and sent to the
                # backend: a server must not be able to break those.
                logger.warning("MCP server %r: the schema of tool %r nests too deeply; it is offered without one", server, tool.name)
                schema = {"type": "object", "properties": {}}
            tools.append(
                MCPTool(
                    server=server,
                    name=name,
                    original_name=tool.name,
                    description=tool.description,
                    input_schema=schema,
                )
            )
    return tools


def _unique(name: str, taken: set[str]) -> str:
    if name not in taken:
        return name
    counter = 2
    while True:
        suffix = f"_{counter}"
        candidate = name[: _MAX_NAME - len(suffix)] + suffix
        if candidate not in taken:
            return candidate
        counter += 1


def result_from_call(result: types.CallToolResult) -> MCPResult:
    """The text of a tool result.

    Text blocks (and text resources) are joined by newlines; other content is
    named, e.g. `[image/png]`; structured content is given as JSON when the
    result has no text.
    """
    parts: list[str] = []
    has_text = False
    for block in result.content:
        if isinstance(block, types.TextContent):
            parts.append(block.text)
            has_text = True
        elif isinstance(block, (types.ImageContent, types.AudioContent)):
            parts.append(f"[{block.mime_type}]")
        elif isinstance(block, types.ResourceLink):
            parts.append(f"[resource: {block.uri}]")
        elif isinstance(block, types.EmbeddedResource):
            resource = block.resource
            if isinstance(resource, types.TextResourceContents):
                parts.append(resource.text)
                has_text = True
            else:
                parts.append(f"[{resource.mime_type or 'application/octet-stream'}: {resource.uri}]")
    if not has_text and result.structured_content is not None:
        parts.insert(0, json.dumps(result.structured_content, ensure_ascii=False, separators=(",", ":")))
    return MCPResult(text="\n".join(parts), is_error=bool(result.is_error))


def describe_error(exc: BaseException) -> str:
    """A one-line account of a connection failure, for status and logs (not for clients)."""
    texts: list[str] = []
    for leaf in _leaves(exc):
        text = _describe_one(leaf)
        if text not in texts:
            texts.append(text)
    return "; ".join(texts)[:500] or type(exc).__name__


def _leaves(exc: BaseException) -> Iterable[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaves(inner)
    else:
        yield exc


def _describe_one(exc: BaseException) -> str:
    if isinstance(exc, ConnectionLost):
        return str(exc)
    if isinstance(exc, MCPError):
        if exc.code == CONNECTION_CLOSED:
            return "the server closed the connection"
        return f"MCP error {exc.code}: {exc.message}"
    if isinstance(exc, trio.TooSlowError):
        return "timed out"
    if isinstance(exc, httpx2.HTTPStatusError):
        return f"HTTP {exc.response.status_code} from {exc.request.url}"
    if isinstance(exc, FileNotFoundError) and exc.filename:
        return f"command not found: {exc.filename}"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def open_transport(
    config: ServerConfig, *, errlog: TextIO | None = None
) -> AbstractAsyncContextManager[TransportStreams]:
    """The SDK transport for `config`: a stdio subprocess, SSE or streamable HTTP.

    A stdio server runs in its own process group; leaving the context closes
    its stdin, then terminates and kills the group if it does not exit.
    `errlog` receives the server's stderr (default: ours).
    """
    if config.type == "stdio":
        assert config.command is not None  # guaranteed by config parsing
        params = StdioServerParameters(command=config.command, args=list(config.args), env=dict(config.env) or None)
        return stdio_client(params, errlog=errlog if errlog is not None else sys.stderr)
    assert config.url is not None
    if config.type == "sse":
        return sse_client(config.url, headers=dict(config.headers) or None)
    return _streamable_http(config.url, dict(config.headers))


@asynccontextmanager
async def _streamable_http(url: str, headers: dict[str, str]) -> AsyncIterator[TransportStreams]:
    async with httpx2.AsyncClient(headers=headers, timeout=_HTTP_TIMEOUT) as http:
        async with streamable_http_client(url, http_client=http) as streams:
            yield streams


class _WatchedReadStream:
    """The transport's read stream, setting `lost` when it ends.

    The SDK's session does not say when its transport closed; a stdio
    server's exit shows up only as the end of this stream.
    """

    def __init__(self, inner: Any, lost: trio.Event) -> None:
        self._inner = inner
        self._lost = lost

    @property
    def last_context(self) -> Any:
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> SessionMessage | Exception:
        try:
            item: SessionMessage | Exception = await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._lost.set()
            raise
        return item

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> _WatchedReadStream:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> _WatchedReadStream:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> bool | None:
        await self.aclose()
        return None


class Connection:
    """A live MCP session: `run` owns it; `list_tools` and `call` use it from other tasks.

    `label` names the server in result texts.  `on_tools_changed` runs when
    the server sends `notifications/tools/list_changed`; `on_trouble` when a
    call failed for a reason other than the tool itself (a hint to check the
    connection).  Both must not block.
    """

    def __init__(
        self,
        label: str,
        *,
        on_tools_changed: Callable[[], None] | None = None,
        on_trouble: Callable[[], None] | None = None,
    ) -> None:
        self.label = label
        self.open = False
        self.started = False  # `run` reported started (the handshake succeeded)
        self._on_tools_changed = on_tools_changed
        self._on_trouble = on_trouble
        self._session: ClientSession | None = None
        self._nursery: trio.Nursery | None = None

    @property
    def _who(self) -> str:
        return f"the MCP server {self.label!r}" if self.label else "the MCP server"

    async def run(
        self,
        transport: AbstractAsyncContextManager[TransportStreams],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Open `transport`, initialize, report started, then serve until the connection ends.

        Start it with `nursery.start` (under `fail_after` to bound the
        connection and handshake); calls made meanwhile run in its nursery and
        end with it.

        Raises:
            ConnectionLost: the server closed the connection.
            Exception: the transport or the handshake failed (often inside an
                `ExceptionGroup`, as the SDK's task groups raise them).
        """
        lost = trio.Event()
        async with transport as (read_stream, write_stream):
            async with ClientSession(
                _WatchedReadStream(read_stream, lost),
                write_stream,
                message_handler=self._on_message,
                client_info=CLIENT_INFO,
            ) as session:
                # The initialize handshake (2025-11-25 and earlier): what every
                # deployed server speaks, and the era in which a server may send
                # tools/list_changed without a subscription.
                await session.initialize()
                async with trio.open_nursery() as nursery:
                    self._session, self._nursery, self.open = session, nursery, True
                    try:
                        self.started = True
                        task_status.started()
                        await lost.wait()
                    finally:
                        self.open = False
                    raise ConnectionLost(f"{self._who} closed the connection")

    async def list_tools(self) -> list[types.Tool]:
        """Every tool the server lists, following pagination.

        Raises:
            ConnectionLost: the connection is not open, or ended meanwhile.
            MCPError: the server refused the request.
            Exception: the transport failed.
        """
        return await self._in_connection(self._list_now, "the tool listing")

    async def call(self, name: str, arguments: dict[str, Any]) -> MCPResult:
        """Call the server's tool `name`; every failure becomes an `is_error` result.

        Cancellation returns at once: the request is abandoned (the server is
        told in the background) and the session stays usable.
        """
        try:
            return await self._in_connection(partial(self._call_now, name, arguments), f"the call to {name!r}")
        except ConnectionLost as exc:
            return MCPResult(str(exc), is_error=True)

    async def _in_connection(self, request: Callable[[], Awaitable[T]], what: str) -> T:
        """Run `request` as a task of the connection and wait for its outcome.

        Raises what `request` raises, or `ConnectionLost`.  When the caller is
        cancelled, the task is cancelled and the caller returns without
        waiting for it.
        """
        nursery = self._nursery
        if nursery is None or not self.open:
            raise ConnectionLost(f"{self._who} is not connected")
        box: list[outcome.Outcome[T]] = []
        done = trio.Event()
        scope = trio.CancelScope()

        async def run() -> None:
            try:
                with scope:
                    try:
                        value = await request()
                    except Exception as exc:
                        box.append(outcome.Error(exc))
                    else:
                        box.append(outcome.Value(value))
            finally:
                done.set()

        try:
            nursery.start_soon(run)
        except RuntimeError:  # the nursery is closed: the connection just ended
            raise ConnectionLost(f"{self._who} is not connected") from None
        try:
            await done.wait()
        finally:
            scope.cancel()  # a no-op once done; abandons the request when our caller is cancelled
        if not box:
            raise ConnectionLost(f"{self._who} disconnected during {what}")
        return box[0].unwrap()

    async def _list_now(self) -> list[types.Tool]:
        assert self._session is not None
        tools: list[types.Tool] = []
        cursor: str | None = None
        for _ in range(_MAX_TOOL_PAGES):
            params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
            result = await self._session.list_tools(params=params)
            tools.extend(result.tools)
            cursor = result.next_cursor
            if not cursor:
                break
        return tools

    async def _call_now(self, name: str, arguments: dict[str, Any]) -> MCPResult:
        assert self._session is not None
        try:
            result = await self._session.call_tool(name, arguments)
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                return MCPResult(f"{self._who} disconnected during the call to {name!r}", is_error=True)
            self._trouble()
            return MCPResult(exc.message or f"{self._who} refused the call (error {exc.code})", is_error=True)
        except Exception as exc:
            logger.warning("MCP call %r on %s failed: %s", name, self._who, describe_error(exc))
            self._trouble()
            return MCPResult(f"{self._who} could not complete the call to {name!r}", is_error=True)
        return result_from_call(result)

    def _trouble(self) -> None:
        if self._on_trouble is not None:
            self._on_trouble()

    async def _on_message(self, message: IncomingMessage) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            if self._on_tools_changed is not None:
                self._on_tools_changed()
        elif isinstance(message, Exception):
            logger.debug("transport error from %s: %s", self._who, describe_error(message))
        await trio.lowlevel.checkpoint()
