"""`gateway launch CLIENT`: Claude Code, Codex or opencode on the gateway, in a session of its own.

    gateway launch claude|codex|opencode [--model M] [--url URL] [--key KEY] [--print] [-- ARGS]

The shell around `launch/clients.py`.  It finds the client's program on PATH; uses the gateway
at `--url`, or starts one in the background (`python -m gateway serve` on a free loopback port,
with the user's settings, in a process group of its own so that Ctrl-C reaches the client only)
and stops it when the client exits; when keys are on, makes a key for the session in the store
that gateway reads and revokes it at the end; asks the gateway for its models; writes the
client's files into its own directory; and runs the client in the foreground with the
terminal.  `--print` shows the environment and files instead, and makes no key.

Every reason the session cannot start is one line on stderr and exit status 2 (`LaunchError`,
mapped once in `main`); once the client runs, the exit status is the client's.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pathlib
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import trio

from ..config import ConfigError, Settings, load_settings
from ..errors import GatewayError
from ..keys import KeyRing, parse_static_keys
from ..keys.admin import create_key, revoke_key
from ..keys.stores import keys_path, open_key_store
from .clients import (
    CLIENTS,
    KEY_VARIABLE,
    Model,
    Plan,
    Session,
    choose_model,
    client_home,
    managed_files,
    plan,
    render,
    state_home,
)

__all__ = ["LaunchError", "add_arguments", "main"]

STARTUP_BOUND = 60.0  # seconds the background gateway may take to answer /health
STOP_BOUND = 10.0  # seconds it gets to stop after SIGTERM before it is killed
CONNECT_BOUND = 5.0  # seconds to reach a gateway at all
REQUEST_BOUND = 30.0  # seconds its models list may take


class LaunchError(Exception):
    """A reason the session cannot start: one line for stderr, exit status 2."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`gateway launch`'s options, before or after the client's name; the client's own after `--`."""
    parser.epilog = "The client's own arguments go after --: gateway launch codex -- exec 'make the test pass'. See docs/clients.md."
    _options(parser, None)
    clients = parser.add_subparsers(dest="client", metavar="CLIENT", required=True)
    for client in CLIENTS.values():
        # Each client's own parser: its options may come after its name too, its arguments after --.
        own = clients.add_parser(client.name, help=f"{client.title} (npm {client.package})")
        _options(own, argparse.SUPPRESS)
        own.add_argument("client_args", nargs="*", metavar="ARGS", help=f"{client.program}'s own arguments, after --")


def _options(parser: argparse.ArgumentParser, default: Any) -> None:
    parser.add_argument("--model", default=default, help="the gateway's model (route) to use (default: the first GET /v1/models lists)")
    parser.add_argument("--url", default=default, help="a gateway already running (default: one started in the background for the session)")
    parser.add_argument("--key", default=default, help=f"the key for --url's gateway (default: ${KEY_VARIABLE})")
    parser.add_argument(
        "--print",
        action="store_true",
        default=False if default is None else default,
        help="print the environment and the files instead of running the client (makes no key)",
    )


def main(args: argparse.Namespace) -> int:
    """Run one session; the client's exit status, or 2 with one line on stderr when it cannot start."""
    try:
        settings = load_settings()
        return int(trio.run(_main, args, settings))
    except (LaunchError, ConfigError) as error:
        print(f"gateway launch: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
    except GatewayError as error:  # the key store failed
        where = f" ({error.cause})" if error.cause else ""
        print(f"gateway launch: {error.message}{where}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # before the client ran: everything it started is stopped
        return 130


async def _main(args: argparse.Namespace, settings: Settings) -> int:
    client = CLIENTS[args.client]
    if args.print:
        return await _print(args, settings)
    program = shutil.which(client.program)
    if program is None:
        raise LaunchError(f"{client.title} is not installed ({client.program} is not on PATH): npm install -g {client.package}")
    home = client_home(client.name, os.environ)
    log = state_home(os.environ) / "gateway.log"
    async with contextlib.AsyncExitStack() as session:
        key = args.key or os.environ.get(KEY_VARIABLE) or None
        said = "your key" if key else "no key needed"
        if args.url:
            url = _root(args.url)
            models = await _models(url, key)
        else:
            if key is None and await _keys_required(settings):
                key, name = await session.enter_async_context(open_session_key(settings, client.name))
                said = f"session key {name}, revoked when it ends"
            url = await session.enter_async_context(open_background_gateway(settings, log))
            models = await _models(url, key)
        model = _chosen(models, args.model)
        built = _plan(Session(client.name, url, key or "unused", model, models, home, os.environ))
        _write(built.directories, built.files)
        where = "gateway " + (url if args.url else f"{url} (started for this session; its log: {log})")
        print(f"gateway launch: {client.title} on {where}, model {model}, {said}; its configuration: {home}", file=sys.stderr)
        env = {name: value for name, value in os.environ.items() if name not in built.unset}
        env.update(built.env)
        env["PWD"] = _working_directory(env.get("PWD"))
        return await run_client([program, *args.client_args], env)


async def _print(args: argparse.Namespace, settings: Settings) -> int:
    client = CLIENTS[args.client]
    key = args.key or os.environ.get(KEY_VARIABLE) or None
    url = _root(args.url) if args.url else _local_url(settings)
    if args.model and not args.url:
        models: tuple[Model, ...] = (Model(args.model),)
        needed = await _keys_required(settings, create=False)
    else:
        try:
            models, needed = await _models(url, key), key is not None
        except _NeedsKey:
            if not args.model:
                raise
            models, needed = (Model(args.model),), True
    model = _chosen(models, args.model)
    home = client_home(client.name, os.environ)
    built = _plan(Session(client.name, url, None if needed else "unused", model, models, home, os.environ))
    print(f"# `gateway launch {client.name}` for the gateway at {url}, model {model}: its environment and files")
    if needed and not os.environ.get(KEY_VARIABLE):
        print(f"# keys are on: make one (`gateway keys create NAME` prints it) and `export {KEY_VARIABLE}=` it first")
    print(render(built, [client.program, *args.client_args]), end="")
    return 0


def _plan(session: Session) -> Plan:
    """`plan` for `session`, given what its managed files hold now."""
    existing = {}
    for path in managed_files(session.client, session.home):
        with contextlib.suppress(FileNotFoundError):
            existing[path] = path.read_text(encoding="utf-8")
    try:
        return plan(session, existing)
    except ValueError as error:
        raise LaunchError(str(error)) from None


def _chosen(models: Sequence[Model], wanted: str | None) -> str:
    try:
        return choose_model(models, wanted)
    except ValueError as error:
        raise LaunchError(str(error)) from None


def _root(url: str) -> str:
    """A gateway URL as the clients' configuration takes it: no trailing slash, no /v1."""
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise LaunchError(f"--url must be an http:// or https:// URL, not {url!r}")
    return url.removesuffix("/v1")


def _local_url(settings: Settings) -> str:
    host = settings.api_adapter_host
    host = "127.0.0.1" if host in ("0.0.0.0", "") else "[::1]" if host == "::" else host
    return f"http://{host}:{settings.api_adapter_port}"


# --- the gateway's models -----------------------------------------------------------------------


class _NeedsKey(LaunchError):
    """The gateway answered 401 to a request without a key."""


async def _models(url: str, key: str | None) -> tuple[Model, ...]:
    """What `GET /v1/models` lists.

    Raises:
        LaunchError: nothing answers at `url` (within CONNECT_BOUND), it wants a key it was not
            given (`_NeedsKey`) or refused the one it was, or it answered anything but a list.
    """
    import httpx2

    headers = {"authorization": f"Bearer {key}"} if key else {}
    timeout = httpx2.Timeout(REQUEST_BOUND, connect=CONNECT_BOUND)
    try:
        async with httpx2.AsyncClient(timeout=timeout) as http:
            response = await http.get(url + "/v1/models", headers=headers)
    except httpx2.HTTPError as error:
        raise LaunchError(f"no gateway answers at {url} ({type(error).__name__}: {error})") from None
    if response.status_code == 401:
        if key:
            raise LaunchError(f"the gateway at {url} refused the key (401): check --key or ${KEY_VARIABLE}")
        raise _NeedsKey(f"the gateway at {url} needs a key: pass --key KEY or set {KEY_VARIABLE}")
    try:
        data = response.json()["data"] if response.status_code == 200 else None
    except (ValueError, KeyError, TypeError):
        data = None
    if not isinstance(data, list):
        raise LaunchError(f"the gateway at {url} answered GET /v1/models with {response.status_code}, not a models list")
    models = []
    for entry in data:
        if isinstance(entry, dict) and isinstance(entry.get("id"), str):
            window = entry.get("context_window")
            models.append(Model(entry["id"], window if isinstance(window, int) and window > 0 else None))
    return tuple(models)


# --- keys ---------------------------------------------------------------------------------------


async def _keys_required(settings: Settings, *, create: bool = True) -> bool:
    """Whether the gateway these settings serve needs a key (static keys, or the store's state).

    `create=False` never makes the SQLite file: a store that is not there has no keys.

    Raises:
        LaunchError: keys are on, but the store is the process's memory (a key made here would
            not be the launched gateway's).
        ConfigError, GatewayError: the key store cannot be opened or read.
    """
    static = parse_static_keys(settings.gateway_api_keys)
    if settings.store_backend == "memory":
        if static:
            raise LaunchError(
                f"keys are on (GATEWAY_API_KEYS) and STORE_BACKEND=memory keeps no key the gateway would share: "
                f"pass --key or set {KEY_VARIABLE}"
            )
        return False
    if settings.store_backend == "sqlite" and not create and not os.path.exists(keys_path(settings.sqlite_path)):
        return bool(static)
    store = open_key_store(settings)
    try:
        return await KeyRing(store, static).required()
    finally:
        with trio.CancelScope(shield=True):
            await store.aclose()


@contextlib.asynccontextmanager
async def open_session_key(settings: Settings, client: str) -> AsyncIterator[tuple[str, str]]:
    """A key (secret, name) for one session, in the store the settings name; revoked on exit.

    Raises:
        ConfigError, GatewayError: the key store cannot be opened or written.
    """
    store = open_key_store(settings)
    try:
        made = await create_key(store, f"launch-{client}-{secrets.token_hex(4)}", now=time.time())
        if made is None:  # 32 random bits met an active key's name
            raise LaunchError("a key for this session could not be named; try again")
        key, secret = made
        try:
            yield secret, key.name
        finally:
            with trio.move_on_after(STOP_BOUND, shield=True):
                await revoke_key(store, key.name, now=time.time())
    finally:
        with trio.move_on_after(STOP_BOUND, shield=True):
            await store.aclose()


# --- the background gateway ---------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.asynccontextmanager
async def open_background_gateway(settings: Settings, log: pathlib.Path) -> AsyncIterator[str]:
    """`python -m gateway serve` on a free loopback port with the user's settings, its output
    appended to `log`; its URL once it answers `/health`.  Stopped on exit: SIGTERM, then
    killed after STOP_BOUND.

    Raises:
        LaunchError: it exited before it answered (its own reason), or did not answer within
            STARTUP_BOUND.
    """
    port = _free_port()
    env = dict(os.environ)
    if "log_file_path" not in settings.model_fields_set:
        env["LOG_FILE_PATH"] = ""  # not ./log of the directory the client runs in: its output goes to `log`
    log.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    output = open(log, "ab")  # noqa: SIM115 (closed below, after the process)
    start = output.tell()
    command = [sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", str(port)]
    try:
        process = await trio.lowlevel.open_process(
            command, stdin=subprocess.DEVNULL, stdout=output, stderr=output, env=env, start_new_session=True
        )
    except BaseException:
        output.close()
        raise
    url = f"http://127.0.0.1:{port}"
    try:
        with trio.move_on_after(STARTUP_BOUND) as waited:
            await _wait_ready(url, process, log, start)
        if waited.cancelled_caught:
            raise LaunchError(f"the gateway did not answer within {STARTUP_BOUND:.0f} s (its log: {log})")
        yield url
    finally:
        await _stop(process)
        output.close()


async def _wait_ready(url: str, process: trio.Process, log: pathlib.Path, start: int) -> None:
    import httpx2

    async with httpx2.AsyncClient(timeout=2.0, trust_env=False) as http:
        while True:
            if process.poll() is not None:
                raise LaunchError(f"the gateway did not start: {_last_words(log, start) or f'it exited with status {process.returncode}'}")
            try:
                if (await http.get(url + "/health")).status_code == 200:
                    return
            except httpx2.HTTPError:
                pass  # not listening yet
            await trio.sleep(0.1)  # the gateway's own start-up pace; the loop is bounded by the caller


def _last_words(log: pathlib.Path, start: int) -> str:
    """What the gateway said when it stopped: its `gateway: …` line, else its last line."""
    try:
        with open(log, "rb") as file:
            file.seek(start)
            lines = [line.strip() for line in file.read().decode("utf-8", "replace").splitlines() if line.strip()]
    except OSError:
        return ""
    said = [line for line in lines if line.startswith("gateway: ")] or lines[-1:]
    return said[-1].removeprefix("gateway: ") if said else ""


async def _stop(process: trio.Process) -> None:
    with trio.CancelScope(shield=True):
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
            with trio.move_on_after(STOP_BOUND):
                await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()


# --- the client ---------------------------------------------------------------------------------


def _write(directories: Sequence[pathlib.Path], files: Mapping[pathlib.Path, str]) -> None:
    """Each file written whole or not at all (a temporary file renamed), for its owner only."""
    try:
        for directory in directories:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        for path, text in files.items():
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            descriptor = os.open(partial, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
            with os.fdopen(descriptor, "w", encoding="utf-8") as file:
                file.write(text)
            os.replace(partial, path)
    except OSError as error:
        raise LaunchError(f"cannot write the client's configuration: {error}") from None


def _working_directory(pwd: str | None) -> str:
    """`pwd` if it names this process's working directory (a shell's, perhaps through a symlink),
    else the directory itself: opencode works in `$PWD`, which whatever started this process may
    have left pointing elsewhere."""
    try:
        if pwd and os.path.samefile(pwd, "."):
            return pwd
    except OSError:
        pass
    return os.getcwd()


async def run_client(command: Sequence[str], env: Mapping[str, str]) -> int:
    """Run the client in the foreground with the terminal; its exit status (128 + N for signal N).

    Ctrl-C reaches the client from the terminal (it decides whether to stop), not this process;
    SIGTERM and SIGHUP sent to this process are passed on to it.

    Raises:
        LaunchError: the program cannot be started.
    """
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
        try:
            process = await trio.lowlevel.open_process(list(command), env=dict(env))
        except OSError as error:
            raise LaunchError(f"cannot run {shlex.join(command[:1])}: {error}") from None
        try:
            async with trio.open_nursery() as nursery:  # owner: this session; ends with the client
                nursery.start_soon(_pass_on, signals, process)
                await process.wait()
                nursery.cancel_scope.cancel()
        finally:
            if process.returncode is None:  # this process was cancelled: the client does not outlive it
                with trio.CancelScope(shield=True):
                    process.kill()
                    await process.wait()
    code = process.returncode
    assert code is not None
    return code if code >= 0 else 128 - code


async def _pass_on(signals: Any, process: trio.Process) -> None:
    async for number in signals:
        if number != signal.SIGINT:  # the terminal sent Ctrl-C to the client itself
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(number)

