"""A small MCP server for trying the gateway's MCP support (and for its tests).

Run it over stdio, as an MCP client such as the gateway starts it:

    python examples/mcp_server.py

or as a streamable-HTTP server (endpoint `http://HOST:PORT/mcp`):

    python examples/mcp_server.py --http --port 8765

Tools: add, echo, now, slow, fail, word_count.  `examples/mcp_servers.json`
configures it for the gateway over stdio.
"""

from __future__ import annotations

import argparse
import datetime
import sys

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

mcp = MCPServer("gateway-example", instructions="Arithmetic, text and timing tools for testing MCP clients.")


@mcp.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@mcp.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


@mcp.tool()
def now() -> str:
    """The current UTC time, ISO 8601."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


@mcp.tool()
async def slow(seconds: float) -> str:
    """Sleep for the given number of seconds, then say so."""
    # A line on stderr marks the start, so a test can act while the tool runs.
    print(f"slow: sleeping {seconds} s", file=sys.stderr, flush=True)
    await anyio.sleep(seconds)
    return f"slept {seconds} s"


@mcp.tool()
def fail(message: str) -> str:
    """Always fail with the given message (the result has is_error set)."""
    raise ToolError(message)


@mcp.tool()
def word_count(text: str) -> int:
    """Count the whitespace-separated words in the text."""
    return len(text.split())


async def _serve_http(host: str, port: int) -> None:
    # hypercorn on trio: the same stack as the gateway (the SDK's own runner uses uvicorn).
    from hypercorn.config import Config
    from hypercorn.trio import serve

    config = Config()
    config.bind = [f"{host}:{port}"]
    config.accesslog = None
    await serve(mcp.streamable_http_app(host=host), config, mode="asgi")  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http", action="store_true", help="serve streamable HTTP instead of stdio")
    parser.add_argument("--host", default="127.0.0.1", help="bind address with --http (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8765, help="bind port with --http (default: 8765)")
    args = parser.parse_args(argv)
    if args.http:
        import trio

        print(f"MCP endpoint: http://{args.host}:{args.port}/mcp", file=sys.stderr, flush=True)
        trio.run(_serve_http, args.host, args.port)
    else:
        mcp.run()


if __name__ == "__main__":
    main()
