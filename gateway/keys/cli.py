"""`gateway keys`: create, list and revoke API keys in the configured store.

    gateway keys create NAME [--rpm N] [--tpm N] [--concurrency N]
                             [--models GLOB,...] [--mcp-servers NAME,...|none] [--no-hosted-mcp]
    gateway keys list
    gateway keys revoke NAME

The key is printed once, at creation; the store keeps only its digest.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import uuid

import trio

from ..config import ConfigError, load_settings
from ..errors import GatewayError
from . import ApiKey, KeyLimits, Limiter, digest, new_secret

__all__ = ["add_arguments", "main"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    create = commands.add_parser("create", help="make a key and print it (once)")
    create.add_argument("name", help="a name for the key (shown in logs and metrics)")
    create.add_argument("--rpm", type=_count, help="requests per minute")
    create.add_argument("--tpm", type=_count, help="tokens per minute")
    create.add_argument("--concurrency", type=_count, help="streams at once")
    create.add_argument("--models", type=_names, help="comma-separated model names or globs (qwen*) it may use")
    create.add_argument(
        "--mcp-servers", type=_names, help="comma-separated configured MCP servers it may use ('none': none; default all)"
    )
    create.add_argument("--no-hosted-mcp", action="store_true", help="may not name MCP servers by URL")
    commands.add_parser("list", help="every key: name, limits, tokens used, revoked or not")
    revoke = commands.add_parser("revoke", help="revoke a key (its next request is refused)")
    revoke.add_argument("name")


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be 0 or more (0: none allowed)")
    return value


def _names(text: str) -> tuple[str, ...]:
    if text.strip().lower() == "none":
        return ()
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    if not names:
        raise argparse.ArgumentTypeError("give names separated by commas, or 'none'")
    return names


def main(args: argparse.Namespace) -> int:
    try:
        settings = load_settings()
    except ConfigError as error:
        print(f"gateway: {error}", file=sys.stderr)
        return 2
    if settings.store_backend == "memory":
        print(
            "gateway: keys need a store every instance shares (STORE_BACKEND=sqlite or redis); "
            "for a fixed list use GATEWAY_API_KEYS",
            file=sys.stderr,
        )
        return 2
    try:
        return int(trio.run(_run, args, settings))
    except (GatewayError, ConfigError) as error:
        print(f"gateway: {getattr(error, 'message', error)}", file=sys.stderr)
        return 2


async def _run(args: argparse.Namespace, settings: object) -> int:
    from .stores import open_key_store

    store = open_key_store(settings)  # type: ignore[arg-type]
    try:
        if args.action == "create":
            existing = await store.by_name(args.name)
            if existing is not None and existing.active:
                print(f"gateway: a key named {args.name!r} exists; revoke it first", file=sys.stderr)
                return 2
            secret = new_secret()
            limits = KeyLimits(
                rpm=args.rpm,
                tpm=args.tpm,
                concurrency=args.concurrency,
                models=args.models,
                mcp_servers=args.mcp_servers,
                hosted_mcp=not args.no_hosted_mcp,
            )
            key = ApiKey(name=args.name, id=f"key_{uuid.uuid4().hex}", digest=digest(secret), created_at=time.time(), limits=limits)
            await store.put(key)
            print(secret)
            print(f"created key {key.name!r} ({limits.describe()}); this is the only time it is shown", file=sys.stderr)
            return 0
        if args.action == "list":
            limiter = Limiter(store)
            keys = await store.all()
            if not keys:
                print("no keys (the gateway serves everyone)")
            for key in keys:
                state = "revoked" if not key.active else "active"
                created = time.strftime("%Y-%m-%d %H:%M", time.gmtime(key.created_at))
                tokens = await limiter.tokens_used(key)
                print(f"{key.name}\t{state}\tcreated {created}Z\ttokens {tokens}\t{key.limits.describe()}")
            return 0
        found = await store.by_name(args.name)
        if found is None or not found.active:
            print(f"gateway: no active key named {args.name!r}", file=sys.stderr)
            return 2
        await store.put(dataclasses.replace(found, revoked_at=time.time()))
        print(f"revoked key {found.name!r}")
        return 0
    finally:
        await store.aclose()
