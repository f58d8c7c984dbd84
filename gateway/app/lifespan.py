"""The app's lifespan: the resources every request shares, opened before serving and closed after.

`Lifespan.open` builds them, and runs every long-running task (the
stream-slot renewals, the readiness checks, the heartbeat ticker, the
background runner, the MCP manager, the SQLite store's sweeps) in a nursery
of its own inside the app's, and hands the turn engine its `Resources`;
`Lifespan.close` stops background work first (each job records that it was
cancelled, while the store is still open), then those tasks (no check or
renewal runs on a closed client), then closes what the app made itself.  A backend,
store, MCP manager or key store given by an embedder is used as it is and
left for the embedder to close.  A resource that cannot be opened (a
SQLite file, an MCP config) raises `ConfigError`, which the server turns
into one line and exit 2.
"""

from __future__ import annotations

import importlib
import ipaddress
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from ..backends import Backend, OpenAICompatibleBackend
from ..config import Settings
from ..errors import GatewayError, StoreUnavailable
from ..keys import KeyRing, KeyStore, Limiter, parse_static_keys
from ..keys.stores import open_key_store
from ..observe import Telemetry
from ..observe.usage import UsageLedger, ledger_of
from ..ops.drain import Drain
from ..ops.logs import add_log_secrets
from ..ops.redact import Redactor
from ..store import ResponseStore, open_store, store_location
from ..store.observed import ObservedStore
from ..transport.background import BackgroundRunner
from ..transport.heartbeats import Heartbeats
from ..turn import Resources
from ..turn.sealing import Sealer
from ..turn.tools import ToolSource
from .readiness import Readiness

__all__ = ["Lifespan", "Shared"]

log = logging.getLogger("gateway")


@dataclass
class Shared:
    """What the edge and the routes use, once open: every field is set by `Lifespan.open`."""

    resources: Resources
    keyring: KeyRing
    limiter: Limiter
    readiness: Readiness
    heartbeats: Heartbeats
    runner: BackgroundRunner
    usage: UsageLedger  # each key's use by the minute, the backends' recent errors (this process's)

    async def authenticate(self, scope: Any) -> None:
        """Who the request comes from (`scope["gateway"]["caller"]`), and its requests per minute
        (a WebSocket counts each `response.create` instead).

        Raises:
            Unauthorized, RateLimited, StoreUnavailable: as `KeyRing.identify` and `Limiter.admit_request`.
        """
        caller = await self.keyring.identify(scope.get("headers", ()))
        notes = scope.setdefault("gateway", {})
        notes["caller"], notes["key_name"] = caller, caller.name
        if scope["type"] == "http":
            await self.limiter.admit_request(caller)

    async def serving(self, binds: list[str], *, stalls_bounded: bool = False) -> None:
        """Told where the gateway listens: say whether a key is required and where keys live, and
        warn when it is open to a network without keys.  `stalls_bounded`: the server resets a
        connection whose writes make no progress (gateway.serve does), so the heartbeat ticker
        need not time whole writes (which would cut a slow reader on one large write)."""
        if stalls_bounded:
            self.heartbeats.stall_timeout = None
        keyring = self.keyring
        where = keyring.store.location if keyring.store is not None else "no key store"
        try:
            keyed = await keyring.required()
        except GatewayError as error:
            keyed = True  # the key store is down: nobody is let in until it answers
            log.warning("authentication: the key store did not answer (%s); requests are refused until it does", error.cause or where)
        else:
            static = f", and {len(keyring.static_names)} from GATEWAY_API_KEYS" if keyring.static_names else ""
            log.info("authentication %s (keys in %s%s)", "on" if keyed else "off", where, static)
        exposed = [bind for bind in binds if not _loopback(bind)]
        if exposed and not keyed:
            log.warning(
                "no API keys are configured and the gateway listens on %s: anyone who can reach it spends the "
                "backend's key, runs the MCP tools and reads stored responses (set GATEWAY_API_KEYS, or "
                "API_ADAPTER_HOST=127.0.0.1; see docs/keys-and-limits.md)",
                ", ".join(exposed),
            )


def _loopback(bind: str) -> bool:
    host = bind.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


@dataclass
class Lifespan:
    settings: Settings
    telemetry: Telemetry
    drain: Drain
    clock: Callable[[], float]
    ids: Callable[[str], str]
    backend: Backend | None = None  # an embedder's (else made here)
    store: ResponseStore | None = None
    mcp: ToolSource | None = None
    keys: KeyStore | None = None
    _owned: list[Any] = field(default_factory=list)  # what this lifespan made, and closes (in reverse)
    _runner: BackgroundRunner | None = None
    _shared: Shared | None = None
    _services_scope: trio.CancelScope | None = None

    async def _services(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """The nursery the long-running services run in (owned here: `close` cancels it)."""
        with trio.CancelScope() as self._services_scope:
            async with trio.open_nursery() as services:
                task_status.started(services)
                await trio.sleep_forever()

    async def authenticate(self, scope: Any) -> None:
        """The edge's authenticator: `Shared.authenticate`, once the lifespan has opened.

        Raises:
            StoreUnavailable: a request arrived before the lifespan opened (no server sends one).
        """
        if self._shared is None:
            raise StoreUnavailable("The gateway is starting.")
        await self._shared.authenticate(scope)

    async def open(self, app_nursery: trio.Nursery) -> Shared:
        """Open every resource, its long-running tasks in a nursery of the lifespan's own, itself
        run in `app_nursery` (the app's), which `close` ends before it closes what they use.

        Raises:
            ConfigError: a resource cannot be opened (the message names the setting).
        """
        settings, clock = self.settings, self.clock
        nursery: trio.Nursery = await app_nursery.start(self._services)
        # The MCP side (the mcp SDK builds hundreds of pydantic models as it loads) is
        # loaded now, in a worker thread: loaded by the first request that names a hosted server,
        # it held the event loop, and every stream with it, for that long.
        await trio.to_thread.run_sync(importlib.import_module, "gateway.mcp")
        redactor = Redactor.from_settings(settings)
        servers = None
        if self.mcp is None and settings.mcp_servers_config_path:
            from ..mcp import load_mcp_config

            servers = load_mcp_config(settings.mcp_servers_config_path)
            secrets = [secret for server in servers.values() for secret in server.secrets()]
            redactor = redactor.with_secrets(secrets)
            add_log_secrets(secrets)
        backend = self.backend if self.backend is not None else self._own(_make_backend(settings, redactor))
        if self.store is not None:
            store = ObservedStore(self.store, self.telemetry, location="the embedder's store")
        else:
            made = self._own(open_store(settings))
            await _warn_if_not_durable(made, store_location(settings))
            store = ObservedStore(made, self.telemetry, location=store_location(settings))
            if hasattr(made, "run_maintenance"):  # SQLite: sweeps expired responses (store/sqlite.py)
                await nursery.start(made.run_maintenance)
        key_store = self.keys if self.keys is not None else self._own(open_key_store(settings))
        keyring = KeyRing(key_store, parse_static_keys(settings.gateway_api_keys, now=clock()))
        try:
            await keyring.open()
        except GatewayError as error:
            log.warning("the key store could not be reached at start-up (%s)", error.cause or key_store.location)
        limiter = Limiter(key_store, clock=clock)
        await nursery.start(limiter.run_renewals)
        readiness = Readiness(store, backend, self.drain, interval=settings.readiness_interval, store_location=store.location)
        web_search = self._web_search(settings)
        readiness.search = web_search.provider if web_search is not None else None
        pages = self._pages(settings)
        await nursery.start(readiness.run)
        heartbeats = Heartbeats(settings.heartbeat_interval, stall_timeout=settings.client_stall_timeout)
        await nursery.start(heartbeats.run)
        runner = self._runner = BackgroundRunner(
            store, clock=clock, retry_seconds=settings.store_retry_seconds, lease_seconds=settings.background_lease_seconds
        )
        await nursery.start(runner.run)
        mcp = self.mcp
        if mcp is None and servers is not None:
            from ..mcp import MCPManager

            manager = MCPManager(
                servers, refresh_interval=settings.mcp_tool_refresh_interval, init_timeout=settings.mcp_connect_timeout
            )
            await nursery.start(manager.run)
            # Serve once every server has connected or failed once (bounded by
            # its connect timeout): a request must not race the first connection
            # and silently get no tools; a slow or broken server blocks nothing.
            with trio.move_on_after(settings.mcp_connect_timeout + 1):
                await manager.wait_settled()
            mcp = manager
        resources = Resources(
            settings=settings,
            backend=backend,
            store=store,
            mcp=mcp,
            sealer=Sealer(settings.gateway_secret_key or None),
            clock=clock,
            ids=self.ids,
            telemetry=self.telemetry,
            limiter=limiter,
            drain=self.drain,
            web_search=web_search,
            pages=pages,
            read_watch=heartbeats,
        )
        # The ledger `build_telemetry` installed; an app given another telemetry gets an empty one.
        usage = ledger_of(self.telemetry) or UsageLedger()
        self._shared = Shared(resources, keyring, limiter, readiness, heartbeats, runner, usage)
        return self._shared

    async def close(self) -> None:
        """Background jobs first (each records that it was cancelled), then what was made here."""
        if self._runner is not None:
            self._runner.shutdown()
            with trio.CancelScope(shield=True), trio.move_on_after(10):
                await self._runner.stopped.wait()
        if self._services_scope is not None:  # no check or renewal runs on what is closed next
            self._services_scope.cancel()
        with trio.CancelScope(shield=True), trio.move_on_after(5):
            for resource in reversed(self._owned):
                await resource.aclose()
        with trio.CancelScope(shield=True):
            await self.telemetry.aclose()  # the last spans, the request's own among them

    def _web_search(self, settings: Settings) -> Any:
        """The gateway's web search, when WEB_SEARCH_URL names an engine (its HTTP client owned here)."""
        if not settings.web_search_url:
            return None
        import httpx2

        from ..builtins import SearxngProvider, WebSearch

        client = self._own(httpx2.AsyncClient(timeout=settings.web_search_timeout, follow_redirects=False))
        return WebSearch(SearxngProvider(settings.web_search_url, client, timeout=settings.web_search_timeout))

    def _pages(self, settings: Settings) -> Any:
        """The fetcher of the pages models open (its HTTP client owned here: no redirects followed
        by the client, each is checked by the fetcher)."""
        import httpx2

        from ..builtins.fetch import PageFetcher, PageTools

        client = self._own(httpx2.AsyncClient(timeout=15.0, follow_redirects=False))
        allow = [entry.strip() for entry in settings.web_fetch_allowed_hosts.split(",") if entry.strip()]
        return PageTools(PageFetcher(client, allow=allow))

    def _own(self, resource: Any) -> Any:
        self._owned.append(resource)
        return resource


def _make_backend(settings: Settings, redactor: Redactor) -> Any:
    """The backend the settings name: a router over the GATEWAY_CONFIG file's, or the one backend."""
    if settings.gateway_config:
        from ..backends.config import load_config
        from ..backends.routing import build_router

        return build_router(load_config(settings.gateway_config), settings, redactor)
    return OpenAICompatibleBackend(settings, redactor=redactor)


async def _warn_if_not_durable(store: ResponseStore, location: str) -> None:
    check = getattr(store, "durability_warning", None)
    if check is None:
        return
    try:
        warning = await check()
    except GatewayError as error:
        original = error.__cause__
        detail = f" ({type(original).__name__}: {original})" if original is not None else ""
        warning = (
            f"the store ({location}) could not be reached at start-up{detail}; requests that need it get 503 "
            "until it answers, and /ready says so"
        )
    if warning:
        log.warning("%s", warning)
