"""MCP: the manager, the remote session and `gateway mcp list`, against real MCP servers.

Servers: `examples/mcp_server.py` as a stdio subprocess, and an in-test
MCPServer served by hypercorn on port 0 (streamable HTTP and SSE).  Every
wait is bounded by `fail_after`; ordering is proved with events (the
example's `slow` tool writes a line on stderr when it starts).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import pathlib
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterable
from typing import Any

import mcp_types
import pytest
import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

import gateway.mcp
from gateway.mcp import (
    MCPManager,
    MCPResult,
    RemoteMCPError,
    ServerConfig,
    check_url_allowed,
    check_url_allowed_async,
    load_mcp_config,
    open_remote_session,
    parse_mcp_config,
)
from gateway.mcp._connection import assign_tool_names, result_from_call, sanitize_tool_name

REPO = pathlib.Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "mcp_server.py"
EXAMPLE_TOOLS = ["add", "echo", "now", "slow", "fail", "word_count"]


# --- helpers -------------------------------------------------------------------------


def example(name: str = "example") -> ServerConfig:
    return ServerConfig(name=name, type="stdio", command=sys.executable, args=(str(EXAMPLE),))


def exits_at_start(name: str = "broken") -> ServerConfig:
    return ServerConfig(name=name, type="stdio", command=sys.executable, args=("-c", "import sys; sys.exit(1)"))


@contextlib.asynccontextmanager
async def open_manager(configs: Iterable[ServerConfig], **options: Any) -> AsyncIterator[MCPManager]:
    options.setdefault("refresh_interval", 3600)
    options.setdefault("backoff_base", 0.05)
    manager = MCPManager(list(configs), **options)
    async with trio.open_nursery() as nursery:
        await nursery.start(manager.run)
        yield manager
        nursery.cancel_scope.cancel()


def state(manager: MCPManager, name: str) -> str:
    return next(status.state for status in manager.status() if status.name == name)


def example_pids() -> set[int]:
    """Live children of this process running the example server (zombies have no cmdline)."""
    pids = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as file:
                ppid = int(file.read().rsplit(")", 1)[1].split()[1])
            if ppid != os.getpid():
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as file:
                if str(EXAMPLE).encode() in file.read():
                    pids.add(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    return pids


class StderrWatch:
    """A pipe for the servers' stderr, read line by line, with a wait for a line."""

    def __init__(self) -> None:
        read_fd, write_fd = os.pipe()
        self.errlog = os.fdopen(write_fd, "w")
        self._stream = trio.lowlevel.FdStream(read_fd)
        self.lines: list[str] = []
        self._changed = trio.Event()

    async def run(self) -> None:
        buffer = b""
        async with self._stream:
            while data := await self._stream.receive_some():
                *lines, buffer = (buffer + data).split(b"\n")
                self.lines += [line.decode("utf-8", "replace") for line in lines]
                self._changed.set()
                self._changed = trio.Event()

    async def wait_line(self, text: str, count: int = 1) -> int:
        """Wait until `count` lines contain `text`; the index of the last of them."""
        while True:
            found = [i for i, line in enumerate(self.lines) if text in line]
            if len(found) >= count:
                return found[count - 1]
            await self._changed.wait()


@contextlib.asynccontextmanager
async def open_stderr_watch() -> AsyncIterator[StderrWatch]:
    watch = StderrWatch()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch.run)
        try:
            yield watch
        finally:
            watch.errlog.close()
            nursery.cancel_scope.cancel()


def _constant() -> str:
    return "constant"


def make_test_server() -> MCPServer:
    """An MCP server for the HTTP tests; it can add tools at run time."""
    server = MCPServer("test-http", log_level="WARNING")

    @server.tool()
    def add(a: int, b: int) -> int:
        return a + b

    @server.tool()
    def boom(message: str) -> str:
        raise ToolError(message)

    @server.tool()
    def header(name: str, ctx: Context) -> str:
        return (ctx.headers or {}).get(name, "")

    @server.tool()
    async def grow(name: str, ctx: Context) -> str:
        server.add_tool(_constant, name=name, description="added at run time")
        await ctx.session.send_tool_list_changed()
        return "grown"

    @server.tool()
    def grow_quietly(name: str) -> str:
        server.add_tool(_constant, name=name, description="added without a notification")
        return "grown"

    return server


async def serve_asgi(app: Any, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.graceful_timeout = 0.1
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(functools.partial(serve, app, config, mode="asgi"))
        task_status.started(binds[0])


async def start_http_server(nursery: trio.Nursery, server: MCPServer, kind: str = "streamable-http") -> str:
    """Serve `server` in the test nursery; its MCP endpoint URL."""
    if kind == "sse":
        base = await nursery.start(serve_asgi, server.sse_app())
        return f"{base}/sse"
    base = await nursery.start(serve_asgi, server.streamable_http_app())
    return f"{base}/mcp"


# --- configuration ---------------------------------------------------------------------


def test_the_config_file_keeps_server_order_and_fills_defaults(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "servers.json"
    path.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "files": {"command": "npx", "args": ["-y", "server"], "env": {"KEY": "value"}},
                    "events": {"type": "sse", "url": "http://example.com/sse", "headers": {"Authorization": "x"}},
                    "api": {"type": "streamable-http", "url": "https://example.com/mcp"},
                }
            }
        )
    )
    configs = load_mcp_config(path)
    assert list(configs) == ["files", "events", "api"]
    assert configs["files"] == ServerConfig(
        name="files", type="stdio", command="npx", args=("-y", "server"), env={"KEY": "value"}
    )
    assert configs["events"].type == "sse" and configs["events"].headers == {"Authorization": "x"}
    assert configs["api"] == ServerConfig(name="api", type="streamable-http", url="https://example.com/mcp")


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        ({"type": "websocket", "url": "ws://x"}, "type"),
        ({"args": ["x"]}, "command"),
        ({"url": "http://example.com/mcp"}, "command"),
        ({"command": "x", "args": "not-a-list"}, "args"),
        ({"command": "x", "env": {"PORT": 8080}}, "env.PORT"),
        ({"type": "sse"}, "url"),
        ({"type": "streamable-http", "url": "ftp://example.com"}, "url"),
        ({"type": "sse", "url": "http://x", "headers": ["a"]}, "headers"),
    ],
)
def test_an_invalid_server_entry_is_refused_naming_the_server_and_the_field(entry: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError) as error:
        parse_mcp_config({"mcpServers": {"bad-one": entry}})
    assert "'bad-one'" in str(error.value) and f"'{field}'" in str(error.value)


def test_an_unreadable_or_malformed_config_file_is_a_value_error(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ValueError):
        load_mcp_config(tmp_path / "missing.json")
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(ValueError):
        load_mcp_config(tmp_path / "broken.json")
    (tmp_path / "empty.json").write_text("{}")
    with pytest.raises(ValueError):
        load_mcp_config(tmp_path / "empty.json")


def test_the_example_config_runs_the_example_server_over_stdio() -> None:
    configs = load_mcp_config(REPO / "examples" / "mcp_servers.json")
    assert configs == {
        "example": ServerConfig(name="example", type="stdio", command="python", args=("examples/mcp_server.py",))
    }


# --- pure helpers --------------------------------------------------------------------------


def _tool(name: str) -> mcp_types.Tool:
    return mcp_types.Tool(name=name, input_schema={"type": "object"})


def test_tool_names_are_sanitised_and_collisions_resolved_in_order() -> None:
    assert sanitize_tool_name("files.read/v2") == "files_read_v2"
    assert sanitize_tool_name("x" * 100) == "x" * 64
    tools = assign_tool_names(
        [
            ("first", [_tool("add"), _tool("a.b"), _tool("a_b")]),
            ("second", [_tool("add"), _tool("echo")]),
            ("second.copy", [_tool("add")]),
            ("first", [_tool("add")]),  # a name the prefixed form cannot free either
        ]
    )
    assert [(t.server, t.name, t.original_name) for t in tools] == [
        ("first", "add", "add"),
        ("first", "a_b", "a.b"),
        ("first", "first__a_b", "a_b"),
        ("second", "second__add", "add"),
        ("second", "echo", "echo"),
        ("second.copy", "second_copy__add", "add"),
        ("first", "first__add", "add"),
    ]
    long = assign_tool_names([("s", [_tool("y" * 70)]), ("s", [_tool("y" * 70)]), ("s", [_tool("y" * 70)])])
    assert [t.name for t in long] == ["y" * 64, ("s__" + "y" * 70)[:64], ("s__" + "y" * 70)[:62] + "_2"]


def test_a_tool_result_becomes_text_for_the_model() -> None:
    result = mcp_types.CallToolResult(
        content=[
            mcp_types.TextContent(text="one"),
            mcp_types.ImageContent(data="aGk=", mime_type="image/png"),
            mcp_types.EmbeddedResource(resource=mcp_types.TextResourceContents(uri="file:///a", text="two")),
        ],
        is_error=False,
    )
    assert result_from_call(result) == MCPResult(text="one\n[image/png]\ntwo", is_error=False)
    structured = mcp_types.CallToolResult(content=[], structured_content={"result": 5}, is_error=True)
    assert result_from_call(structured) == MCPResult(text='{"result":5}', is_error=True)


# --- the manager with stdio servers ----------------------------------------------------------


async def wait_ready(manager: Any, names: list[str] | None = None) -> None:
    """Once the named servers (default: all) are ready."""

    def ready() -> bool:
        return all(s.state == "ready" for s in manager.status() if names is None or s.name in names)

    await manager.wait_for(ready)


async def test_a_stdio_server_is_connected_and_its_tools_listed_and_called() -> None:
    async with open_manager([example()]) as manager:
        with trio.fail_after(10):
            await wait_ready(manager)
        [status] = manager.status()
        assert (status.name, status.type, status.state, status.tools, status.last_error) == (
            "example",
            "stdio",
            "ready",
            EXAMPLE_TOOLS,
            None,
        )
        add = manager.find("add")
        assert add is not None and add.server == "example" and add.original_name == "add"
        assert add.input_schema["required"] == ["a", "b"]
        with trio.fail_after(5):
            assert await manager.call("add", {"a": 2, "b": 3}) == MCPResult("5", is_error=False)
            assert await manager.call("word_count", {"text": "one two three"}) == MCPResult("3", is_error=False)
            assert await manager.call("echo", {"text": "héllo"}) == MCPResult("héllo", is_error=False)


async def test_a_failing_tool_or_an_unknown_tool_is_an_error_result_not_an_exception() -> None:
    async with open_manager([example()]) as manager:
        with trio.fail_after(10):
            await wait_ready(manager)
            failed = await manager.call("fail", {"message": "the disk is on fire"})
            assert failed.is_error and "the disk is on fire" in failed.text
            bad_arguments = await manager.call("add", {"a": "x"})
            assert bad_arguments.is_error
            assert (await manager.call("no_such_tool", {})).is_error
            assert await manager.call("add", {"a": 1, "b": 1}) == MCPResult("2", is_error=False)


async def test_a_cancelled_call_returns_at_once_and_the_session_keeps_working() -> None:
    async with open_stderr_watch() as watch, open_manager([example()], errlog=watch.errlog) as manager:
        with trio.fail_after(10):
            await wait_ready(manager)
        pids = example_pids()
        async with trio.open_nursery() as nursery:
            cancelled = trio.Event()

            async def slow_call(task_status: trio.TaskStatus[trio.CancelScope]) -> None:
                with trio.CancelScope() as scope:
                    task_status.started(scope)
                    await manager.call("slow", {"seconds": 30})
                cancelled.set()

            scope = await nursery.start(slow_call)
            with trio.fail_after(5):
                await watch.wait_line("slow: sleeping 30")  # the server is running the tool
            with trio.fail_after(1):
                started = trio.current_time()
                scope.cancel()
                await cancelled.wait()
            assert trio.current_time() - started < 0.1
        with trio.fail_after(5):
            assert await manager.call("add", {"a": 20, "b": 22}) == MCPResult("42", is_error=False)
        assert state(manager, "example") == "ready" and example_pids() == pids  # the same session


async def test_a_server_that_exits_at_start_up_blocks_neither_start_up_nor_the_others() -> None:
    manager = MCPManager([exits_at_start("broken"), example("good")], refresh_interval=3600, backoff_base=0.05)
    async with trio.open_nursery() as nursery:
        with trio.fail_after(0.5):
            await nursery.start(manager.run)
        assert [s.state for s in manager.status()] == ["connecting", "connecting"]
        with trio.fail_after(10):
            await wait_ready(manager, ["good"])
            await manager.wait_settled()
        broken = manager.status()[0]
        assert broken.state in ("failed", "reconnecting") and broken.last_error and broken.tools == []
        assert [tool.server for tool in manager.tools()] == ["good"] * len(EXAMPLE_TOOLS)
        with trio.fail_after(5):
            assert await manager.call("add", {"a": 1, "b": 2}) == MCPResult("3", is_error=False)
        nursery.cancel_scope.cancel()


async def test_a_server_killed_mid_call_gives_an_error_result_and_is_reconnected() -> None:
    async with open_stderr_watch() as watch, open_manager([example()], errlog=watch.errlog) as manager:
        with trio.fail_after(10):
            await wait_ready(manager)
        [pid] = example_pids()
        results: list[MCPResult] = []
        done = trio.Event()

        async def slow_call() -> None:
            results.append(await manager.call("slow", {"seconds": 30}))
            done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(slow_call)
            with trio.fail_after(5):
                await watch.wait_line("slow: sleeping 30")
                os.kill(pid, signal.SIGKILL)
                await done.wait()
        [result] = results
        assert result.is_error and "disconnected" in result.text
        with trio.fail_after(10):
            await manager.wait_for(lambda: state(manager, "example") == "ready" and example_pids() - {pid} != set())
            assert await manager.call("add", {"a": 2, "b": 2}) == MCPResult("4", is_error=False)
        assert pid not in example_pids()


async def test_calls_beyond_the_concurrency_limit_wait_for_a_slot() -> None:
    async with (
        open_stderr_watch() as watch,
        open_manager([example()], errlog=watch.errlog, call_concurrency=1) as manager,
    ):
        with trio.fail_after(10):
            await wait_ready(manager)
        order: list[str] = []

        async def first() -> None:
            await manager.call("slow", {"seconds": 0.3})
            order.append("first done")

        async def second() -> None:
            await manager.call("slow", {"seconds": 0.01})

        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(first)
                await watch.wait_line("slow: sleeping 0.3")
                nursery.start_soon(second)
                await watch.wait_line("slow: sleeping 0.01")
                order.append("second started")
        assert order == ["first done", "second started"]


async def test_stdio_servers_are_stopped_when_the_manager_is_cancelled() -> None:
    async with open_manager([example("one"), example("two")]) as manager:
        with trio.fail_after(10):
            await wait_ready(manager)
        pids = example_pids()
        assert len(pids) == 2
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # gone and reaped: no orphan, no zombie


async def test_tools_with_the_same_name_are_prefixed_with_the_later_servers_name() -> None:
    async with open_manager([example("first"), example("second")]) as manager:
        with trio.fail_after(10):
            await wait_ready(manager)
        names = [tool.name for tool in manager.tools()]
        assert names == EXAMPLE_TOOLS + [f"second__{name}" for name in EXAMPLE_TOOLS]
        prefixed = manager.find("second__add")
        assert prefixed is not None and (prefixed.server, prefixed.original_name) == ("second", "add")
        with trio.fail_after(5):
            assert await manager.call("second__add", {"a": 3, "b": 4}) == MCPResult("7", is_error=False)
        assert [s.tools for s in manager.status()][1][0] == "second__add"


# --- the manager with HTTP servers ------------------------------------------------------------


async def test_a_streamable_http_server_is_connected_with_its_headers(nursery: trio.Nursery) -> None:
    url = await start_http_server(nursery, make_test_server())
    config = ServerConfig(name="web", type="streamable-http", url=url, headers={"X-Team": "blue"})
    async with open_manager([config]) as manager:
        with trio.fail_after(10):
            await wait_ready(manager)
            assert manager.status()[0].tools == ["add", "boom", "header", "grow", "grow_quietly"]
            assert await manager.call("add", {"a": 1, "b": 2}) == MCPResult("3", is_error=False)
            assert await manager.call("header", {"name": "x-team"}) == MCPResult("blue", is_error=False)
            boom = await manager.call("boom", {"message": "nope"})
            assert boom.is_error and "nope" in boom.text


async def test_an_sse_server_is_connected(nursery: trio.Nursery) -> None:
    url = await start_http_server(nursery, make_test_server(), kind="sse")
    async with open_manager([ServerConfig(name="events", type="sse", url=url)]) as manager:
        with trio.fail_after(10):
            await wait_ready(manager)
            assert await manager.call("add", {"a": 5, "b": 5}) == MCPResult("10", is_error=False)


async def test_tools_list_changed_from_the_server_refreshes_the_tools(nursery: trio.Nursery) -> None:
    url = await start_http_server(nursery, make_test_server())
    async with open_manager([ServerConfig(name="web", type="streamable-http", url=url)]) as manager:
        with trio.fail_after(10):
            await wait_ready(manager)
            assert manager.find("extra") is None
            assert await manager.call("grow", {"name": "extra"}) == MCPResult("grown", is_error=False)
            await manager.wait_for(lambda: manager.find("extra") is not None)  # no timer: refresh_interval is 1 h
            assert await manager.call("extra", {}) == MCPResult("constant", is_error=False)


async def test_tools_are_refreshed_periodically(nursery: trio.Nursery) -> None:
    url = await start_http_server(nursery, make_test_server())
    config = ServerConfig(name="web", type="streamable-http", url=url)
    async with open_manager([config], refresh_interval=0.1) as manager:
        with trio.fail_after(10):
            await wait_ready(manager)
            await manager.call("grow_quietly", {"name": "quiet"})
            await manager.wait_for(lambda: manager.find("quiet") is not None)


async def test_an_unreachable_http_server_fails_and_keeps_retrying() -> None:
    config = ServerConfig(name="down", type="streamable-http", url="http://127.0.0.1:9/mcp")
    async with open_manager([config]) as manager:
        with trio.fail_after(10):
            await manager.wait_settled()
            await manager.wait_for(lambda: state(manager, "down") == "reconnecting")
        [status] = manager.status()
        assert status.last_error and status.tools == []
        result = await manager.call("add", {"a": 1, "b": 1})
        assert result.is_error


# --- remote sessions (the hosted mcp tool) ------------------------------------------------------


async def test_a_remote_session_lists_and_calls_over_streamable_http(nursery: trio.Nursery) -> None:
    url = await start_http_server(nursery, make_test_server())
    with trio.fail_after(10):
        async with open_remote_session(url, {"X-Team": "red"}) as session:
            assert session.transport == "streamable-http"
            tools = await session.list_tools()
            assert [(tool.server, tool.name) for tool in tools][:2] == [("", "add"), ("", "boom")]
            assert session.tools() == tools
            assert await session.call("add", {"a": 2, "b": 40}) == MCPResult("42", is_error=False)
            assert await session.call("header", {"name": "x-team"}) == MCPResult("red", is_error=False)
            boom = await session.call("boom", {"message": "bad input"})
            assert boom.is_error and "bad input" in boom.text


async def test_a_remote_session_falls_back_to_sse(nursery: trio.Nursery) -> None:
    url = await start_http_server(nursery, make_test_server(), kind="sse")
    with trio.fail_after(10):
        async with open_remote_session(url, {}, server_label="events") as session:
            assert session.transport == "sse"
            assert (await session.list_tools())[0].server == "events"
            assert await session.call("add", {"a": 1, "b": 2}) == MCPResult("3", is_error=False)


async def test_an_unreachable_remote_server_is_a_424_gateway_error() -> None:
    with trio.fail_after(10), pytest.raises(RemoteMCPError) as error:
        async with open_remote_session("http://127.0.0.1:9/mcp", {}, server_label="gone"):
            pass
    assert (error.value.status, error.value.code) == (424, "mcp_server_unavailable")


async def test_an_error_raised_inside_a_remote_session_block_comes_out_unwrapped(nursery: trio.Nursery) -> None:
    url = await start_http_server(nursery, make_test_server())
    with trio.fail_after(10), pytest.raises(KeyError):
        async with open_remote_session(url, {}):
            raise KeyError("the caller's own error")


# --- which URLs a request may name ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "addresses"),
    [
        ("http://127.0.0.1:8000/mcp", []),
        ("http://[::1]/mcp", []),
        ("http://[::ffff:127.0.0.1]/mcp", []),
        ("http://0.0.0.0/mcp", []),
        ("http://169.254.169.254/latest/meta-data", []),
        ("http://localhost:8765/mcp", []),
        ("https://internal.example/mcp", ["10.1.2.3"]),
        ("https://internal.example/mcp", ["93.184.216.34", "192.168.1.1"]),
        ("https://multi.example/mcp", ["224.0.0.1"]),
        ("https://cgnat.example/mcp", ["100.64.0.1"]),
        ("ftp://example.com/mcp", []),
        ("file:///etc/passwd", []),
        ("http:///mcp", []),
    ],
)
def test_a_url_into_a_non_public_network_or_not_http_is_refused(url: str, addresses: list[str]) -> None:
    with pytest.raises(ValueError):
        check_url_allowed(url, [], addresses=addresses)


@pytest.mark.parametrize(
    ("url", "addresses", "allow"),
    [
        ("https://example.com/mcp", ["93.184.216.34"], []),
        ("http://8.8.8.8/mcp", [], []),
        ("http://[2606:4700::1111]/mcp", [], []),
        ("https://unresolved.example/mcp", [], []),
        ("http://localhost:8765/mcp", [], ["localhost:8765"]),
        ("http://LOCALHOST:8765/mcp", [], ["localhost"]),
        ("http://127.0.0.1:8000/mcp", [], ["127.0.0.1"]),
        ("https://internal.example/mcp", ["10.1.2.3"], ["10.0.0.0/8"]),
        ("https://internal.example/mcp", ["10.1.2.3"], ["internal.example"]),
        ("http://[::1]:9000/mcp", [], ["[::1]:9000"]),
    ],
)
def test_a_public_or_allow_listed_url_is_allowed(url: str, addresses: list[str], allow: list[str]) -> None:
    check_url_allowed(url, allow, addresses=addresses)


def test_an_allow_list_entry_covers_only_its_own_port_and_network() -> None:
    with pytest.raises(ValueError):
        check_url_allowed("http://localhost:9999/mcp", ["localhost:8765"])
    with pytest.raises(ValueError):
        check_url_allowed("https://internal.example/mcp", ["10.0.0.0/8"], addresses=["192.168.0.2"])


async def test_the_async_check_resolves_the_host() -> None:
    with trio.fail_after(5):
        with pytest.raises(ValueError):
            await check_url_allowed_async("http://localhost:8765/mcp", [])
        await check_url_allowed_async("http://localhost:8765/mcp", ["127.0.0.0/8", "::1"])
        await check_url_allowed_async("http://8.8.8.8/mcp", [])  # a literal: no DNS
        with pytest.raises(ValueError):
            await check_url_allowed_async("http://does-not-exist.invalid/mcp", [])


# --- gateway mcp list ---------------------------------------------------------------------------


async def test_gateway_mcp_list_prints_each_servers_state_and_tools(tmp_path: pathlib.Path) -> None:
    document = json.loads((REPO / "examples" / "mcp_servers.json").read_text())
    document["mcpServers"]["broken"] = {"command": "python", "args": ["-c", "import sys; sys.exit(1)"]}
    path = tmp_path / "servers.json"
    path.write_text(json.dumps(document))
    # `python` in the example config is the interpreter on PATH: make it ours.
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    with trio.fail_after(30):
        process = await trio.run_process(
            [sys.executable, "-m", "gateway", "mcp", "list", "--config", str(path), "--wait", "15"],
            cwd=REPO,
            env=env,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert process.returncode == 1, process.stderr.decode()  # one server failed: not every server is ready
    lines = process.stdout.decode().splitlines()
    assert lines[0].split() == ["SERVER", "TYPE", "STATE", "TOOLS"]
    assert lines[1].split()[:3] == ["example", "stdio", "ready"]
    assert lines[1].split(None, 3)[3] == ", ".join(EXAMPLE_TOOLS)
    assert lines[2].split()[:3] in (["broken", "stdio", "failed"], ["broken", "stdio", "reconnecting"])
    assert lines[3].strip().startswith("error: ")


def test_gateway_mcp_without_a_config_says_how_to_give_one() -> None:
    env = {key: value for key, value in os.environ.items() if key != "MCP_SERVERS_CONFIG_PATH"}
    process = subprocess.run(
        [sys.executable, "-m", "gateway", "mcp", "list"], cwd="/", env=env, capture_output=True, timeout=30
    )
    assert process.returncode == 2
    assert b"MCP_SERVERS_CONFIG_PATH" in process.stderr


# --- public surface --------------------------------------------------------------------------------


def test_the_mcp_package_exports_exactly_its_documented_api() -> None:
    assert sorted(gateway.mcp.__all__) == [
        "MCPManager",
        "MCPResult",
        "MCPTool",
        "RemoteMCPError",
        "RemoteSession",
        "ServerConfig",
        "ServerState",
        "ServerStatus",
        "check_url_allowed",
        "check_url_allowed_async",
        "load_mcp_config",
        "open_remote_session",
        "parse_mcp_config",
    ]
