"""`gateway config check [FILE]`: validate a backends file and print the resolved routes, with
each route's context window (the file's `context_window`, else what its backend says, asked
once with a short timeout; `--offline` asks nothing).
`gateway config codex-catalog [FILE] [--model NAME ...]`: print a model catalog for Codex CLI.

FILE defaults to GATEWAY_CONFIG.  Exit status 0 when the file is usable, 2
(with the file, line and key named) when it is not.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import trio

from ..config import ConfigError
from .config import GatewayConfig, load_config

__all__ = ["add_arguments", "context_windows", "main"]


async def search_engine() -> str | None:
    """A line on the web search engine WEB_SEARCH_URL names, tried with one search; None without one."""
    import httpx2

    from ..builtins.search import SearchError, SearxngProvider
    from ..config import load_settings
    from ..ops.redact import public_url

    settings = load_settings()
    if not settings.web_search_url:
        return None
    where = public_url(settings.web_search_url)
    async with httpx2.AsyncClient(timeout=5) as client:
        try:
            found = await SearxngProvider(settings.web_search_url, client, timeout=5).search("gateway", language=None, count=10)
        except SearchError as error:
            return f"  web search: {where} does not answer a search ({error.message}); searches will be tool errors"
    return f"  web search: {where} answers ({len(found)} results for a test search)"


async def context_windows(config: GatewayConfig) -> list[str]:
    """One line per route: its context window and where it comes from (the file, the backend's
    answer) or that it is unknown (the backend does not say, or was not reached in 3 s)."""
    from ..config import load_settings
    from ..ops.redact import Redactor
    from .routing import build_router, context_window_of

    settings = load_settings(connect_timeout=3.0, stream_timeout=3.0)
    router = build_router(config, settings, Redactor.from_settings(settings))
    lines = []
    try:
        for route in config.routes:
            if route.context_window:
                lines.append(f"  route {route.model}: context window {route.context_window} tokens (the file)")
                continue
            target = route.targets[0]
            model = target.model or route.model
            with trio.move_on_after(5):
                window = None if route.is_glob and not target.model else await context_window_of(router.backends[target.backend].adapter, model)
            said = f"{window} tokens ({target.backend} says)" if window else "unknown (no context_window, and the backend does not say)"
            lines.append(f"  route {route.model}: context window {said}")
    finally:
        await router.aclose()
    return lines


def add_arguments(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    check = commands.add_parser("check", help="validate a backends file and print its routes")
    check.add_argument("file", nargs="?", help="the TOML file (default: GATEWAY_CONFIG)")
    check.add_argument("--offline", action="store_true", help="do not ask the backends for their context windows")
    catalog = commands.add_parser(
        "codex-catalog", help="print a model catalog for Codex CLI (model_catalog_json) of the routed models"
    )
    catalog.add_argument("file", nargs="?", help="the TOML file (default: GATEWAY_CONFIG; none: only --model)")
    catalog.add_argument("--model", action="append", default=[], help="a model name to list too (repeatable)")
    catalog.add_argument("--context-window", type=int, default=32768, help="for models without their own (tokens)")
    catalog.add_argument("--instructions", help="a file with the base instructions Codex sends for these models")


def main(args: argparse.Namespace) -> int:
    path = args.file or os.environ.get("GATEWAY_CONFIG", "")
    if not path and not (args.action == "codex-catalog" and args.model):
        print("gateway: name a file, or set GATEWAY_CONFIG", file=sys.stderr)
        return 2
    try:
        config = load_config(path) if path else None
    except ConfigError as error:
        print(f"gateway: {error}", file=sys.stderr)
        return 2
    if args.action == "check":
        assert config is not None
        print(config.describe())
        if not args.offline:
            for line in trio.run(context_windows, config):
                print(line)
            engine = trio.run(search_engine)
            if engine:
                print(engine)
        return 0
    from .codex import BASE_INSTRUCTIONS, codex_catalog

    models: dict[str, int] = {}
    for route in config.routes if config is not None else ():
        if not route.is_glob:
            models[route.model] = route.context_window or args.context_window
    for name in args.model:
        models.setdefault(name, args.context_window)
    instructions = BASE_INSTRUCTIONS
    if args.instructions:
        with open(args.instructions, encoding="utf-8") as file:
            instructions = file.read()
    print(json.dumps(codex_catalog(models.items(), instructions=instructions), indent=2))
    return 0
