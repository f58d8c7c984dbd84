"""The `gateway` command line."""

from __future__ import annotations

import argparse
import sys

from .config import ConfigError, load_settings

__all__ = ["main"]


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
    return parser


def main(argv: list[str] | None = None) -> int:
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
    if args.command == "serve":
        from .logs import configure_logging
        from .server import run

        configure_logging(settings)
        run(settings, host=args.host, port=args.port, workers=args.workers)
        return 0
    parser.error(f"unknown command {args.command}")
    return 2
