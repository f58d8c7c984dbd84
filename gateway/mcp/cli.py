"""`gateway mcp list`: connect to the configured MCP servers and print what they offer.

Starts an `MCPManager` as the gateway would, waits until every server is
ready or has failed (at most `--wait` seconds), prints one table (server,
type, state, tools, last error) and stops the servers.

Exit status: 0 when every server is ready; 1 when any is not (it failed to
connect or to list its tools, or was still connecting after `--wait`), the
table still showing every server; 2 when there is nothing to try (no
servers file, or one that cannot be read or is invalid).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
from collections.abc import Mapping, Sequence
from typing import TextIO

import trio

from ..config import ConfigError, load_settings
from .config import ServerConfig, load_mcp_config
from .manager import MCPManager, ServerStatus

__all__ = ["add_arguments", "format_status_table", "main"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    list_ = actions.add_parser("list", help="connect to every configured MCP server and print their tools")
    list_.add_argument("--config", metavar="PATH", help="MCP servers JSON file (default: MCP_SERVERS_CONFIG_PATH)")
    list_.add_argument(
        "--wait", type=float, default=15.0, metavar="SECONDS", help="longest wait for the servers (default: 15)"
    )
    list_.add_argument(
        "-v", "--verbose", action="store_true", help="show the servers' stderr and the connection log"
    )


def main(args: argparse.Namespace) -> int:
    path = args.config
    if path is None:
        try:
            path = load_settings().mcp_servers_config_path
        except ConfigError as error:
            print(f"gateway mcp: {error}", file=sys.stderr)
            return 2
        if not path:
            print("gateway mcp: no MCP servers file: pass --config or set MCP_SERVERS_CONFIG_PATH", file=sys.stderr)
            return 2
    try:
        configs = load_mcp_config(path)
    except ValueError as error:
        print(f"gateway mcp: {error}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.CRITICAL, format="%(levelname)s %(name)s: %(message)s"
    )
    if args.verbose:
        statuses = trio.run(_collect, configs, args.wait, sys.stderr)
    else:
        with open(os.devnull, "w") as devnull:
            statuses = trio.run(_collect, configs, args.wait, devnull)
    print(format_status_table(statuses))
    return 0 if all(status.state == "ready" for status in statuses) else 1


async def _collect(configs: Mapping[str, ServerConfig], wait: float, errlog: TextIO) -> list[ServerStatus]:
    manager = MCPManager(configs, refresh_interval=math.inf, init_timeout=max(wait, 0.1), errlog=errlog)
    async with trio.open_nursery() as nursery:
        await nursery.start(manager.run)
        with trio.move_on_after(wait):
            await manager.wait_settled()
        statuses = manager.status()
        nursery.cancel_scope.cancel()
    return statuses


def format_status_table(statuses: Sequence[ServerStatus]) -> str:
    """One row per server; a server's last error on an indented line below it."""
    if not statuses:
        return "no MCP servers configured"
    header = ("SERVER", "TYPE", "STATE", "TOOLS")
    rows = [(s.name, s.type, s.state, ", ".join(s.tools) if s.tools else "-") for s in statuses]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(3)]
    lines = []
    for (name, type_, state, tools), status in zip([header, *rows], [None, *statuses]):
        lines.append(f"{name:<{widths[0]}}  {type_:<{widths[1]}}  {state:<{widths[2]}}  {tools}".rstrip())
        if status is not None and status.last_error and status.state != "ready":
            lines.append(f"{'':<{widths[0]}}  error: {status.last_error}")
    return "\n".join(lines)
