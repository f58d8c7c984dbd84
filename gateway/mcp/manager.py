"""The configured MCP servers: their sessions, their tools, calls to them.

`MCPManager.run` is a long-running task (the app's lifespan starts it with
`await nursery.start(manager.run)`); it reports started at once and then
runs one supervisor per server.  A supervisor connects (stdio subprocess,
SSE or streamable HTTP), initializes, lists the tools and keeps the session;
when the connection fails or the server dies it retries with exponential
backoff.  A server that is slow, broken or exits at start-up holds up
neither start-up nor the other servers.  Cancelling `run` closes every
session and stops every subprocess.

Tool names.  The model sees the tools of the servers that are ready, in
config order, each server's tools in its own order.  Names are sanitised to
`^[a-zA-Z0-9_-]{1,64}$` (other characters become `_`).  When two tools
would get the same name, the one listed first (the earlier server in the
config file) keeps the plain name and the later one becomes
`{server}__{name}` (e.g. `add` and `second__add`), with `_2`, `_3`, ...
appended should that still collide.  Names are recomputed whenever a server
comes, goes or changes its tools, so a plain name can pass to a later server
while the earlier one is down.

Tool lists are refreshed every `refresh_interval` seconds, when a server
sends `notifications/tools/list_changed`, and after a call fails for a
reason other than the tool itself (which is also how a dead HTTP server is
noticed); a failed refresh counts as a lost connection.

`tools`, `find` and `status` read caches and never do I/O.  `call` never
raises for a tool's failure or an unavailable server: the model gets an
`is_error` result.  It takes no timeout; wrap it in `trio.fail_after`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TextIO

import mcp_types as types
import trio

from ._connection import (
    Connection,
    MCPResult,
    MCPTool,
    assign_tool_names,
    describe_error,
    open_transport,
)
from .config import ServerConfig, ServerType

__all__ = ["MCPManager", "MCPResult", "MCPTool", "ServerState", "ServerStatus"]

logger = logging.getLogger("gateway.mcp")

ServerState = Literal["connecting", "ready", "reconnecting", "failed"]


@dataclass(frozen=True)
class ServerStatus:
    """A server as `gateway mcp list` shows it.

    `state`: `connecting` (first attempt), `ready`, `failed` (the last attempt
    failed; waiting to retry) or `reconnecting` (retrying, or the session was
    lost).  `tools` are the names offered to the model.
    """

    name: str
    type: ServerType
    state: ServerState
    tools: list[str]
    last_error: str | None


class _Server:
    """One server's mutable state; only its supervisor writes it."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.state: ServerState = "connecting"
        self.last_error: str | None = None
        self.settled = False  # has been ready, or has failed at least once
        self.connection: Connection | None = None
        self.listing: list[types.Tool] = []
        self.refresh_wanted = trio.Event()


class MCPManager:
    """Sessions with the configured MCP servers (see the module docstring).

    Args:
        configs: the servers, in config order (as `load_mcp_config` returns them).
        refresh_interval: seconds between tool-list refreshes.
        call_concurrency: calls in flight at once, across all servers.
        backoff_base, backoff_max: reconnection delays double from the first
            to the second (seconds).
        init_timeout: seconds allowed to connect, initialize and list tools,
            and for each later refresh.
        errlog: where stdio servers' stderr goes (default: ours).
    """

    def __init__(
        self,
        configs: Mapping[str, ServerConfig] | Iterable[ServerConfig],
        *,
        refresh_interval: float,
        call_concurrency: int = 8,
        backoff_base: float = 0.5,
        backoff_max: float = 30.0,
        init_timeout: float = 30.0,
        errlog: TextIO | None = None,
    ) -> None:
        values = configs.values() if isinstance(configs, Mapping) else configs
        self._servers: dict[str, _Server] = {}
        for config in values:
            if config.name in self._servers:
                raise ValueError(f"MCP server {config.name!r} is configured twice")
            self._servers[config.name] = _Server(config)
        if refresh_interval <= 0:
            raise ValueError("refresh_interval must be positive")
        self._refresh_interval = refresh_interval
        self._limiter = trio.CapacityLimiter(call_concurrency)
        self._backoff_base = backoff_base
        self._backoff_max = backoff_max
        self._init_timeout = init_timeout
        self._errlog = errlog
        self._tools: list[MCPTool] = []
        self._by_name: dict[str, MCPTool] = {}
        self._changed = trio.Event()
        self._running = False

    # --- the task -------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Supervise every server until cancelled; reports started before any connects.

        Raises:
            RuntimeError: the manager is already running.
        """
        if self._running:
            raise RuntimeError("this MCPManager is already running")
        self._running = True
        try:
            async with trio.open_nursery() as nursery:
                for server in self._servers.values():
                    nursery.start_soon(self._supervise, server, name=f"mcp:{server.config.name}")
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._running = False

    async def _supervise(self, server: _Server) -> None:
        streak = 0  # consecutive failed attempts
        while True:
            error = "the connection ended"
            try:
                await self._serve_once(server)
            except* Exception as group:  # trio.Cancelled is not an Exception: it propagates
                error = describe_error(group)
            was_ready = server.state == "ready"
            server.connection = None
            server.listing = []
            if was_ready:
                streak = 0
                logger.warning("MCP server %r was lost: %s; reconnecting", server.config.name, error)
            elif error != server.last_error:
                logger.warning("MCP server %r failed: %s", server.config.name, error)
            else:  # the same failure again: once is enough at warning level
                logger.debug("MCP server %r failed again: %s", server.config.name, error)
            delay = min(self._backoff_base * 2 ** min(streak, 32), self._backoff_max)
            streak += 1
            server.settled = True
            self._set_state(server, "reconnecting" if was_ready else "failed", error)
            await trio.sleep(delay)
            if server.state == "failed":
                self._set_state(server, "reconnecting", server.last_error)

    async def _serve_once(self, server: _Server) -> None:
        name = server.config.name

        def wake_refresh() -> None:
            server.refresh_wanted.set()

        connection = Connection(name, on_tools_changed=wake_refresh, on_trouble=wake_refresh)
        transport = open_transport(server.config, errlog=self._errlog)
        async with trio.open_nursery() as nursery:
            with trio.fail_after(self._init_timeout):
                await nursery.start(connection.run, transport)
                listing = await connection.list_tools()
            server.connection = connection
            server.listing = listing
            server.settled = True
            server.refresh_wanted = trio.Event()
            self._set_state(server, "ready", None)
            logger.info("MCP server %r is ready with %d tools", name, len(listing))
            # Returns only by raising: when `connection.run` ends, or a refresh fails.
            await self._run_refresh(server, connection)

    async def _run_refresh(self, server: _Server, connection: Connection) -> None:
        while True:
            with trio.move_on_after(self._refresh_interval):
                await server.refresh_wanted.wait()
            server.refresh_wanted = trio.Event()
            with trio.fail_after(self._init_timeout):
                listing = await connection.list_tools()
            if _tool_key(listing) != _tool_key(server.listing):
                server.listing = listing
                logger.info("MCP server %r now has %d tools", server.config.name, len(listing))
                self._publish()

    def _set_state(self, server: _Server, state: ServerState, error: str | None) -> None:
        server.state = state
        server.last_error = error
        self._publish()

    def _publish(self) -> None:
        """Rename the tools and wake the waiters, after any change of state or tools."""
        self._tools = assign_tool_names(
            (s.config.name, s.listing) for s in self._servers.values() if s.state == "ready"
        )
        self._by_name = {tool.name: tool for tool in self._tools}
        self._changed.set()
        self._changed = trio.Event()

    # --- reading the caches -------------------------------------------------------

    def tools(self) -> list[MCPTool]:
        """The tools of the ready servers, named for the model (no I/O)."""
        return list(self._tools)

    def find(self, name: str) -> MCPTool | None:
        """The tool the model knows as `name`, if any server offers it now."""
        return self._by_name.get(name)

    def status(self) -> list[ServerStatus]:
        """Every configured server, in config order."""
        return [
            ServerStatus(
                name=server.config.name,
                type=server.config.type,
                state=server.state,
                tools=[tool.name for tool in self._tools if tool.server == server.config.name],
                last_error=server.last_error,
            )
            for server in self._servers.values()
        ]

    # --- waiting ------------------------------------------------------------------

    async def wait_for(self, predicate: Callable[[], bool]) -> None:
        """Return once `predicate()` holds; it is re-checked after every change of state or tools."""
        while not predicate():
            await self._changed.wait()

    async def wait_settled(self) -> None:
        """Return once every server has either become ready or failed at least once."""
        await self.wait_for(lambda: all(server.settled for server in self._servers.values()))

    # --- calling --------------------------------------------------------------

    async def call(self, name: str, arguments: dict[str, Any]) -> MCPResult:
        """Call the tool the model knows as `name`.

        Never raises for a failure of the tool or the server: those come back
        as `MCPResult(is_error=True)`.  Calls wait for a slot when
        `call_concurrency` are already in flight.  Cancellation returns at once
        and leaves the session usable.
        """
        tool = self._by_name.get(name)
        if tool is None:
            return MCPResult(f"no MCP tool is named {name!r}", is_error=True)
        async with self._limiter:
            server = self._servers[tool.server]
            connection = server.connection
            if connection is None:
                return MCPResult(f"the MCP server {tool.server!r} is not available ({server.state})", is_error=True)
            return await connection.call(tool.original_name, arguments)


def _tool_key(listing: list[types.Tool]) -> list[dict[str, Any]]:
    return [tool.model_dump(mode="json", by_alias=True, exclude_none=True) for tool in listing]

