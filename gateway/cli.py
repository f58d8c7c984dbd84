"""The `gateway` command line.

`serve` runs the gateway.  The lab commands (`simulate-backend`, `loadtest`,
`bench`) live in `gateway.lab` and parse their own arguments; they are
imported only when used, so serving never pays for them.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from .config import ConfigError, environment_warnings, load_settings

__all__ = ["main"]

_LAB_COMMANDS = {
    "simulate-backend": ("gateway.lab.simulator", "a deterministic Chat Completions server for load tests"),
    "loadtest": ("gateway.lab.loadtest", "concurrent streams against a Responses or Chat Completions endpoint"),
    "bench": ("gateway.lab.bench", "start simulator and gateway, run the standard scenarios, print one table"),
    "mcp": ("gateway.mcp.cli", "MCP servers: `gateway mcp list` connects to each and prints its tools"),
    "keys": ("gateway.keys.cli", "API keys: `gateway keys create NAME | list | revoke NAME`"),
    "config": ("gateway.backends.cli", "backends file: `gateway config check [FILE]` validates it, prints the routes"),
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gateway",
        description="Serve the OpenAI Responses API on top of any Chat Completions backend.",
        epilog="Configuration comes from environment variables (and a .env file); see README.md.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = commands.add_parser("serve", help="run the gateway (hypercorn, trio worker)")
    serve.add_argument("--host", help="bind address (default: API_ADAPTER_HOST)")
    serve.add_argument("--port", type=int, help="bind port (default: API_ADAPTER_PORT)")
    serve.add_argument("--workers", type=int, default=1, help="worker processes (default: 1)")
    for name, (_module, summary) in _LAB_COMMANDS.items():
        commands.add_parser(name, help=summary, add_help=False)
    return parser


def _run_lab(name: str, argv: list[str]) -> int:
    module_name, summary = _LAB_COMMANDS[name]
    module = importlib.import_module(module_name)
    parser = argparse.ArgumentParser(prog=f"gateway {name}", description=summary)
    module.add_arguments(parser)
    return int(module.main(parser.parse_args(argv)))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in _LAB_COMMANDS:
        return _run_lab(argv[0], argv[1:])
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        settings = load_settings()
    except ConfigError as error:
        print(f"gateway: {error}", file=sys.stderr)
        return 2
    from .logs import configure_logging
    from .server import StartupError, run

    configure_logging(settings)
    for warning in environment_warnings():
        logging.getLogger("gateway").warning("%s", warning)
    try:
        return run(settings, host=args.host, port=args.port, workers=args.workers)
    except StartupError as error:
        print(f"gateway: {error}", file=sys.stderr)
        return 2
