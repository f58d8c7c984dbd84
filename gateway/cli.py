"""The `gateway` command line.

`serve` runs the gateway.  The lab commands (`simulate-backend`, `loadtest`,
`bench`) live in `gateway.lab` and parse their own arguments; they are
imported only when used, so serving never pays for them.

This is where a failure to start becomes what the operator reads: one line
on stderr and exit 2, never a traceback, before anything claims to serve.
An invalid option or setting names it (`gateway serve: argument --port: ...`,
`gateway: invalid configuration: API_ADAPTER_PORT: ...`); anything else that
stops start-up (an address that cannot be listened on, the log file, the
store, the MCP servers file) is `gateway: cannot start: <reason>`.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from typing import NoReturn

from .config import ConfigError, environment_warnings, load_settings

__all__ = ["main"]

_LAB_COMMANDS = {
    "simulate-backend": ("gateway.lab.simulator", "a deterministic Chat Completions server for load tests"),
    "loadtest": ("gateway.lab.loadtest", "concurrent streams against a Responses, Chat Completions or Messages endpoint"),
    "bench": ("gateway.lab.bench", "start simulator and gateway, run the standard scenarios, print one table"),
    "mcp": ("gateway.mcp.cli", "MCP servers: `gateway mcp list` connects to each and prints its tools"),
    "keys": ("gateway.keys.cli", "API keys: `gateway keys create NAME | list | revoke NAME`"),
    "config": ("gateway.backends.cli", "backends file: `gateway config check [FILE]` validates it, prints the routes"),
    "doctor": ("gateway.backends.doctor", "try each backend the way the clients will use it; a verdict and a fix per row"),
    "launch": ("gateway.launch.cli", "start Claude Code, Codex or opencode on your own model: `gateway launch claude`"),
}


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error in one line (the usage itself is one `--help` away)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see `{self.prog} --help`)\n")


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"must be 0-65535 (0: any free port), not {port}")
    return port


def _workers(text: str) -> int:
    try:
        workers = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if workers < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {workers}")
    return workers


def _parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = _Parser(
        prog="gateway",
        description="Serve the OpenAI Responses API on top of any Chat Completions backend.",
        epilog="Configuration comes from environment variables (and a .env file): docs/configuration.md; examples/.env.example lists them.",
    )
    parser.add_argument("--version", action="version", version=f"gateway {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = commands.add_parser("serve", help="run the gateway")
    serve.add_argument("--host", help="bind address (default: API_ADAPTER_HOST, or 127.0.0.1)")
    serve.add_argument("--port", type=_port, help="bind port, 0-65535 (default: API_ADAPTER_PORT)")
    serve.add_argument("--workers", type=_workers, default=1, help="worker processes, at least 1 (default: 1)")
    for name, (_module, summary) in _LAB_COMMANDS.items():
        commands.add_parser(name, help=summary, add_help=False)
    return parser


def _run_lab(name: str, argv: list[str]) -> int:
    module_name, summary = _LAB_COMMANDS[name]
    module = importlib.import_module(module_name)
    parser = _Parser(prog=f"gateway {name}", description=summary)
    module.add_arguments(parser)
    return int(module.main(parser.parse_args(argv)))


def _cannot_start(reason: object) -> int:
    # One line even if a library's message spans several (a pydantic error's does).
    print(f"gateway: cannot start: {' '.join(str(reason).split())}", file=sys.stderr)
    return 2


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
    from .ops.logs import configure_logging
    from .server import StartupError
    from .serving import run

    try:
        configure_logging(settings)
    except ConfigError as error:
        return _cannot_start(error)
    for warning in environment_warnings():
        logging.getLogger("gateway").warning("%s", warning)
    try:
        return run(settings, host=args.host, port=args.port, workers=args.workers)
    except StartupError as error:
        return _cannot_start(error)
