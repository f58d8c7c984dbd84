"""`gateway keys`: API keys in the configured store, and whether the gateway requires one.

    gateway keys create NAME [limits] [--admin]       make a key, print it once
    gateway keys list                                 every key: state, created, tokens used, limits, admin
    gateway keys update NAME [limits] [--[no-]admin]  change a key's limits or admin flag (the others stay)
    gateway keys rotate NAME                          a new secret for the key (the old one stops at once)
    gateway keys revoke NAME                          refuse the key from its next request
    gateway keys auth [on|off]                        show or set whether every request needs a key

    --admin: an operator's key, which the operator console accepts

    limits: --rpm N  --tpm N  --concurrency N  --reserve N   (N, or 'none' to lift it in update)
            --models GLOB,...|all|none  --mcp-servers NAME,...|all|none  --[no-]hosted-mcp

Every command says which store it used (a key made against another
directory's SQLite file is unknown to a gateway serving elsewhere).  The
store keeps only a key's digest; a secret is printed once, when made.
Authentication turns on with the first key and off only by `auth off`
(see gateway.keys).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from typing import Any

import trio

from ..config import ConfigError, Settings, load_settings
from ..errors import GatewayError
from . import AUTH_OFF, AUTH_ON, KeyLimits, KeyStore, Limiter, admin, check_key_name

__all__ = ["add_arguments", "main"]

_UNSET = object()  # a limit option not given (update leaves it as it is)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    create = commands.add_parser("create", help="make a key and print it (once)")
    create.add_argument("name", type=_name, help="a name for the key (shown in logs and metrics)")
    create.add_argument("--admin", action="store_true", help="an operator's key: the console accepts it")
    _limit_options(create)
    commands.add_parser("list", help="every key: name, limits, tokens used, revoked or not")
    update = commands.add_parser("update", help="change a key's limits (options not given stay as they are)")
    update.add_argument("name", type=_name)
    update.add_argument(
        "--admin", action=argparse.BooleanOptionalAction, default=None, help="make it an operator's key, or not (the console)"
    )
    _limit_options(update)
    rotate = commands.add_parser("rotate", help="give a key a new secret (printed once); the old one stops at once")
    rotate.add_argument("name", type=_name)
    revoke = commands.add_parser("revoke", help="revoke a key (its next request is refused)")
    revoke.add_argument("name", type=_name)
    auth = commands.add_parser("auth", help="show, or turn on or off, whether every request needs a key")
    auth.add_argument("state", nargs="?", choices=(AUTH_ON, AUTH_OFF))


def _limit_options(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(rpm=_UNSET, tpm=_UNSET, concurrency=_UNSET, reserve=_UNSET, models=_UNSET, mcp_servers=_UNSET)
    parser.add_argument("--rpm", type=_count, help="requests per minute ('none': no limit)")
    parser.add_argument("--tpm", type=_count, help="tokens per minute ('none': no limit)")
    parser.add_argument("--concurrency", type=_count, help="streams at once ('none': no limit)")
    parser.add_argument(
        "--reserve", type=_count, help="output tokens a request without max_output_tokens reserves (tpm keys; default 4096)"
    )
    parser.add_argument("--models", type=_names, help="comma-separated model names or globs (qwen*) it may use ('all', 'none')")
    parser.add_argument(
        "--mcp-servers", type=_names, help="comma-separated configured MCP servers it may use ('all': default, 'none')"
    )
    parser.add_argument(
        "--hosted-mcp", action=argparse.BooleanOptionalAction, default=None, help="may name MCP servers by URL (default yes)"
    )
    parser.add_argument(
        "--web-search", action=argparse.BooleanOptionalAction, default=None,
        help="its requests' web search tools are run by the gateway (default yes; no: they are left out)",
    )


def _name(text: str) -> str:
    try:
        return check_key_name(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _count(text: str) -> int | None:
    if text.strip().lower() in ("none", "unlimited"):
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("must be a whole number, or 'none'") from None
    if value < 0:
        raise argparse.ArgumentTypeError("must be 0 or more (0: none allowed)")
    return value


def _names(text: str) -> tuple[str, ...] | None:
    word = text.strip().lower()
    if word == "none":
        return ()
    if word == "all":
        return None
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    if not names:
        raise argparse.ArgumentTypeError("give names separated by commas, 'all' or 'none'")
    return names


def _limits(args: argparse.Namespace, base: KeyLimits) -> KeyLimits:
    """`base` with the limit options that were given."""
    changes: dict[str, Any] = {
        name: getattr(args, name)
        for name in ("rpm", "tpm", "concurrency", "reserve", "models", "mcp_servers")
        if getattr(args, name) is not _UNSET
    }
    if args.hosted_mcp is not None:
        changes["hosted_mcp"] = args.hosted_mcp
    if args.web_search is not None:
        changes["web_search"] = args.web_search
    return dataclasses.replace(base, **changes)


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
    except ConfigError as error:
        print(f"gateway: {error}", file=sys.stderr)
        return 2
    except GatewayError as error:
        where = f" ({error.cause})" if error.cause else ""
        print(f"gateway: {error.message}{where}", file=sys.stderr)
        return 2


async def _run(args: argparse.Namespace, settings: Settings) -> int:
    from .stores import open_key_store

    store = open_key_store(settings)
    try:
        return await _ACTIONS[args.action](args, store)
    finally:
        await store.aclose()


def _say(store: KeyStore, text: str) -> None:
    print(f"{text} (keys in {store.location})", file=sys.stderr)


async def _create(args: argparse.Namespace, store: KeyStore) -> int:
    limits = _limits(args, KeyLimits())
    made = await admin.create_key(store, args.name, limits=limits, admin=args.admin, now=time.time())
    if made is None:
        print(f"gateway: a key named {args.name!r} exists in {store.location}; revoke it first", file=sys.stderr)
        return 2
    key, secret = made
    print(secret)
    _say(store, f"created {'admin ' if key.admin else ''}key {key.name!r} ({limits.describe()}); this is the only time it is shown")
    return 0


async def _list(args: argparse.Namespace, store: KeyStore) -> int:
    limiter = Limiter(store)
    keys = await store.all()
    state = await store.auth_state()
    required = state == AUTH_ON or (state is None and bool(keys))
    print(f"# keys in {store.location}; authentication {'on' if required else 'off'}")
    if not keys:
        print("no keys" + ("" if required else " (the gateway serves everyone)"))
    for key in keys:
        created = time.strftime("%Y-%m-%d %H:%M", time.gmtime(key.created_at))
        tokens = await limiter.tokens_used(key)
        status = "active" if key.active else "revoked"
        role = "\tadmin" if key.admin else ""
        print(f"{key.name}\t{status}\tcreated {created}Z\ttokens {tokens}\t{key.limits.describe()}{role}")
    return 0


def _no_key(store: KeyStore, name: str) -> int:
    print(f"gateway: no active key named {name!r} in {store.location}", file=sys.stderr)
    return 2


async def _update(args: argparse.Namespace, store: KeyStore) -> int:
    found = await store.by_name(args.name)
    if found is None or not found.active:
        return _no_key(store, args.name)
    changed = await admin.change_key(store, args.name, limits=_limits(args, found.limits), admin=args.admin)
    if changed is None:
        return _no_key(store, args.name)
    _say(store, f"updated {'admin ' if changed.admin else ''}key {changed.name!r}: {changed.limits.describe()}")
    return 0


async def _rotate(args: argparse.Namespace, store: KeyStore) -> int:
    rotated = await admin.rotate_key(store, args.name)
    if rotated is None:
        return _no_key(store, args.name)
    key, secret = rotated
    print(secret)
    _say(store, f"rotated key {key.name!r}: the old secret is refused from now on; this is the only time the new one is shown")
    return 0


async def _revoke(args: argparse.Namespace, store: KeyStore) -> int:
    revoked = await admin.revoke_key(store, args.name, now=time.time())
    if revoked is None:
        return _no_key(store, args.name)
    left = sum(key.active for key in await store.all())
    after = (
        f"{left} active key{'s' if left != 1 else ''} left"
        if left
        else "no active key left: nobody can call the gateway until a key is created "
        "(or authentication is turned off with `gateway keys auth off`)"
    )
    _say(store, f"revoked key {revoked.name!r}; {after}")
    return 0


async def _auth(args: argparse.Namespace, store: KeyStore) -> int:
    keys = await store.all()
    if args.state is None:
        state = await store.auth_state()
        required = state == AUTH_ON or (state is None and bool(keys))
        print(f"authentication {'on' if required else 'off'}")
        _say(store, f"{sum(k.active for k in keys)} active keys")
        return 0
    if args.state == AUTH_OFF:
        active = [key.name for key in keys if key.active]
        if active:
            print(
                f"gateway: authentication stays on while keys are active ({', '.join(active)}); revoke them first",
                file=sys.stderr,
            )
            return 2
    await store.set_auth(args.state)
    if args.state == AUTH_OFF:
        _say(store, "authentication off: every instance serves requests without a key within a second")
    else:
        _say(store, "authentication on: every request needs a key")
    return 0


_ACTIONS = {
    "create": _create,
    "list": _list,
    "update": _update,
    "rotate": _rotate,
    "revoke": _revoke,
    "auth": _auth,
}
