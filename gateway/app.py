"""The quart-trio application: routes, error mapping, app-wide resources.

Owns the HTTP surface (`/v1/responses`, `/responses`, `/health`, `/`, the
`/v1/{path}` passthrough), the one place where errors become HTTP responses,
and the app lifespan resources (the backend's HTTP client).  Protocol
decisions live in `translate` and `streams`; this module wires them.
"""

from __future__ import annotations

import functools
import hmac
import ipaddress
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import trio
from quart import Response, has_websocket_context, request, websocket
from quart_trio import QuartTrio
from quart_trio.asgi import TrioASGIHTTPConnection
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from . import web
from .backends import Backend, OpenAICompatibleBackend
from .config import Settings
from .drain import Drain
from .edge import Edge, respond_error
from .errors import (
    BackendStreamError,
    GatewayError,
    InternalError,
    InvalidRequest,
    NotFound,
    RateLimited,
    ShuttingDown,
    RequestTooLarge,
    Unauthorized,
    error_json,
    report,
)
from .keys import ANONYMOUS, Caller, KeyRing, KeyStore, Limiter, parse_static_keys, token_reservation
from .keys.stores import open_key_store
from .logs import add_log_secrets
from .observe import Telemetry, build_telemetry
from .redact import Redactor
from .sealing import Sealer
from .readiness import Readiness
from .store import ResponseStore, open_store, store_location
from .store.base import OwnerView
from .store.observed import ObservedStore
from .streams.chat_session import ChatSession, collect_chat_completion
from .streams.sse import encode_done, encode_event, event_json
from .streams.translator import random_id
from .transport import asgi as asgi_transport
from .transport.background import BackgroundRunner
from .transport.heartbeats import Heartbeats
from .transport.sse import ChatCompletionStream, DeferredHeadBody, EventChannelBody, TurnEventStream
from .turn import Resources, Turn, TurnOutcome, note_chat_chunks, prepare_turn, report_outcome, run_rounds
from .turn.tools import RequestTools, ToolSource, gateway_tools_enabled
from .wire import CreateResponseRequest, decode_json_object, parse_create_request, read_relayed_body, validate_create_request

__all__ = ["GatewayApp", "create_app"]

log = logging.getLogger("gateway")


class _GatewayHTTPConnection(TrioASGIHTTPConnection):
    async def _send_response(self, send: Any, response: Any) -> None:
        body = getattr(response, "response", None)
        if not isinstance(body, DeferredHeadBody):
            await super()._send_response(send, response)
            return
        await asgi_transport.send_body(body, send)


class GatewayApp(QuartTrio):
    asgi_http_class = _GatewayHTTPConnection
    settings: Settings
    backend: Backend
    store: ObservedStore
    runner: BackgroundRunner
    resources: Resources
    telemetry: Telemetry
    keyring: KeyRing
    limiter: Limiter
    drain: Drain
    readiness: Readiness
    heartbeats: Heartbeats
    mcp: ToolSource | None = None
    # The hot route (see gateway.transport.asgi), set by create_app.
    streamed_response: Callable[[Any, Any, Any], Awaitable[None]] | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        # Every connection passes the edge (gateway.edge), however the app is
        # served: gateway.serve, `hypercorn gateway.asgi:app`, an embedder's server.
        edge = self.extensions.get("gateway.edge")
        if edge is None:  # made on first use: `settings` is set after construction
            edge = self.extensions["gateway.edge"] = Edge(
                self._route,
                max_websockets=self.settings.websocket_max_connections,
                telemetry=self.telemetry,
                authenticate=self.authenticate,
                cors_origins=self.settings.cors_allow_origins,
                draining=self.drain.draining.is_set,
                metrics_token=bool(self.settings.metrics_token),
            )
        await edge(scope, receive, send)

    async def _route(self, scope: Any, receive: Any, send: Any) -> None:
        """Streamed responses take the hot route; everything else is Quart's."""
        hot = self.streamed_response
        if hot is not None and scope["type"] == "http" and scope.get("method") == "POST" and scope.get("path") in _HOT_PATHS:
            await hot(scope, receive, send)
        else:
            await self.asgi_app(scope, receive, send)

    async def serving(self, binds: list[str], *, stalls_bounded: bool = False) -> None:
        """Told by the serve loop where it listens: say whether a key is required and where keys
        live, and warn when the gateway is open to a network without keys.

        `stalls_bounded`: the server resets a connection whose writes make no
        progress for CLIENT_STALL_TIMEOUT (gateway.serve does), so the heartbeat
        ticker need not time whole writes (which would cut a slow reader that
        still reads, on one large write)."""
        if stalls_bounded:
            self.heartbeats.stall_timeout = None
        exposed = [bind for bind in binds if not _loopback(bind)]
        where = self.keyring.store.location if self.keyring.store is not None else "no key store"
        try:
            keyed = await self.keyring.required()
        except GatewayError as error:
            keyed = True  # the key store is down: nobody is let in until it answers
            log.warning("authentication: the key store did not answer (%s); requests are refused until it does", error.cause or where)
        else:
            static = f", and {len(self.keyring.static_names)} from GATEWAY_API_KEYS" if self.keyring.static_names else ""
            log.info("authentication %s (keys in %s%s)", "on" if keyed else "off", where, static)
        if exposed and not keyed:
            log.warning(
                "no API keys are configured and the gateway listens on %s: anyone who reaches it can use the "
                "backend and the MCP tools, and read stored responses (see README, Run it for a team)",
                ", ".join(exposed),
            )

    async def authenticate(self, scope: Any) -> None:
        """Who the request comes from (`scope["gateway"]["caller"]`), and its requests per minute.

        Raises:
            Unauthorized: keys are configured and the request has no valid one.
            RateLimited: the key's requests per minute are used up.
            StoreUnavailable: the key store failed.
        """
        caller = await self.keyring.identify(scope.get("headers", ()))
        state = scope.setdefault("gateway", {})
        state["caller"], state["key_name"] = caller, caller.name
        if scope["type"] == "http":  # a WebSocket counts each response.create instead
            await self.limiter.admit_request(caller)


_HOT_PATHS = frozenset({"/v1/responses", "/responses"})
# Relayed paths that generate (or embed) tokens: admitted against a key's token
# limit and concurrent streams, and their usage counted.
_GENERATION_PATHS = frozenset({"completions", "chat/completions", "embeddings", "messages"})


def _model_in_path(target: str) -> str | None:
    """The model a relayed path names (`models/{model}`), decoded."""
    from urllib.parse import unquote

    head, _, rest = target.partition("/")
    return unquote(rest) if head == "models" and rest and "/" not in rest else None


def _loopback(bind: str) -> bool:
    host = bind.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _json(data: bytes, status: int = 200) -> Response:
    return Response(data, status=status, content_type="application/json")


def error_response(error: GatewayError) -> Response:
    """The one function that turns an error into an HTTP response (a 5xx is logged with its cause)."""
    report(error, f"{request.method} {request.path} {_request_id() or ''}".rstrip())
    response = _json(error_json(error), error.status)
    if isinstance(error, RateLimited):
        response.headers["retry-after"] = str(max(1, math.ceil(error.retry_after)))
    return response


def _caller() -> Caller:
    """The caller the edge identified for the current request (or WebSocket)."""
    caller = _edge_notes().get("caller", ANONYMOUS)
    return caller if isinstance(caller, Caller) else ANONYMOUS


def _request_id() -> str | None:
    """The id the edge gave the current request (or WebSocket), as returned in `x-request-id`."""
    return _edge_notes().get("request_id")


def _edge_notes() -> dict[str, Any]:
    scope: Any = websocket.scope if has_websocket_context() else request.scope
    return scope.get("gateway") or {}


def create_app(
    settings: Settings,
    *,
    backend: Backend | None = None,
    store: ResponseStore | None = None,
    mcp: ToolSource | None = None,
    keys: KeyStore | None = None,
    clock: Callable[[], float] = time.time,
    ids: Callable[[str], str] = random_id,
) -> GatewayApp:
    """Build the gateway app from a settings object.

    `backend`, `store`, `mcp` (a running MCP manager) and `keys` (a key
    store) replace the ones the settings would build (they are then the
    caller's to run and close);
    `clock` and `ids` are injected into the translator (tests pin them).
    """
    app = GatewayApp(__name__)
    app.settings = settings
    app.telemetry = build_telemetry(settings)
    app.drain = Drain()
    sealer = Sealer(settings.gateway_secret_key or None)
    app.config["MAX_CONTENT_LENGTH"] = settings.max_request_body_bytes
    app.config["RESPONSE_TIMEOUT"] = None  # long streams must never be cut by the framework
    app.config["BODY_TIMEOUT"] = max(60.0, settings.stream_timeout)
    owned: Any = None  # the backend (or router) this app made, and closes
    owned_store: ResponseStore | None = None
    owned_keys: KeyStore | None = None
    if backend is not None:
        app.backend = backend
    if store is not None:
        app.store = ObservedStore(store, app.telemetry, location="the embedder's store")

    @app.before_serving
    async def _open_resources() -> None:
        nonlocal owned, owned_store
        servers = None
        redactor = Redactor.from_settings(settings)
        if mcp is None and settings.mcp_servers_config_path:
            from .mcp import load_mcp_config

            servers = load_mcp_config(settings.mcp_servers_config_path)
            secrets = [secret for server in servers.values() for secret in server.secrets()]
            redactor = redactor.with_secrets(secrets)
            add_log_secrets(secrets)
        if backend is None and settings.gateway_config:
            from .backends.config import load_config
            from .backends.routing import build_router

            owned = build_router(load_config(settings.gateway_config), settings, redactor)
            app.backend = owned
        elif backend is None:
            owned = OpenAICompatibleBackend(settings, redactor=redactor)
            app.backend = owned
        if store is None:
            owned_store = open_store(settings)
            await _warn_if_not_durable(owned_store, store_location(settings))
            app.store = ObservedStore(owned_store, app.telemetry, location=store_location(settings))
            if hasattr(owned_store, "run_maintenance"):  # SQLite: sweeps expired responses (store/sqlite.py)
                await app.nursery.start(owned_store.run_maintenance)
        if keys is not None:
            key_store: KeyStore = keys
        else:
            key_store = owned_keys = open_key_store(settings)
        app.keyring = KeyRing(key_store, parse_static_keys(settings.gateway_api_keys, now=clock()))
        try:
            await app.keyring.open()
        except GatewayError as error:
            log.warning("the key store could not be reached at start-up (%s)", error.cause or key_store.location)
        app.limiter = Limiter(key_store, clock=clock)
        await app.nursery.start(app.limiter.run_renewals)
        app.readiness = Readiness(
            app.store,
            app.backend,
            app.drain,
            interval=settings.readiness_interval,
            store_location=app.store.location,
        )
        await app.nursery.start(app.readiness.run)
        app.heartbeats = Heartbeats(settings.heartbeat_interval, stall_timeout=settings.client_stall_timeout)
        await app.nursery.start(app.heartbeats.run)
        app.runner = BackgroundRunner(
            app.store,
            clock=clock,
            retry_seconds=settings.store_retry_seconds,
            lease_seconds=settings.background_lease_seconds,
        )
        await app.nursery.start(app.runner.run)
        if mcp is not None:
            app.mcp = mcp
        elif servers is not None:
            from .mcp import MCPManager

            manager = MCPManager(
                servers,
                refresh_interval=settings.mcp_tool_refresh_interval,
                init_timeout=settings.mcp_connect_timeout,
            )
            await app.nursery.start(manager.run)
            # Serve once every server has connected or failed once (bounded by
            # its connect timeout): a request must not race the first connection
            # and silently get no tools; a slow or broken server blocks nothing.
            with trio.move_on_after(settings.mcp_connect_timeout + 1):
                await manager.wait_settled()
            app.mcp = manager
        app.resources = Resources(
            settings=settings,
            backend=app.backend,
            store=app.store,
            mcp=app.mcp,
            sealer=sealer,
            clock=clock,
            ids=ids,
            observers=[_log_outcome],
            telemetry=app.telemetry,
            limiter=app.limiter,
            drain=app.drain,
        )

    @app.after_serving
    async def _close_resources() -> None:
        # Background jobs first: each records that it was cancelled, and the
        # store must still be open for that.
        app.runner.shutdown()
        with trio.CancelScope(shield=True), trio.move_on_after(10):
            await app.runner.stopped.wait()
        with trio.CancelScope(shield=True), trio.move_on_after(5):
            if owned is not None:
                await owned.aclose()
            if owned_store is not None:
                await owned_store.aclose()
            if owned_keys is not None:
                await owned_keys.aclose()
        with trio.CancelScope(shield=True):
            await app.telemetry.aclose()  # the last spans, the request's own among them

    # --- errors ----------------------------------------------------------------

    @app.errorhandler(GatewayError)
    async def _gateway_error(error: GatewayError) -> Response:
        return error_response(error)

    @app.errorhandler(HTTPException)
    async def _http_error(error: HTTPException) -> Response:
        if isinstance(error, RequestEntityTooLarge):
            mapped: GatewayError = RequestTooLarge(
                f"The request body exceeds the limit of {settings.max_request_body_bytes} bytes."
            )
        elif error.code == 404:
            mapped = NotFound(f"Unknown path: {request.method} {request.path}", code="unknown_url")
        elif error.code == 405:
            mapped = InvalidRequest(f"Method {request.method} is not allowed on {request.path}", code="method_not_allowed")
            mapped.status = 405
        else:
            mapped = InvalidRequest(error.description or "bad request")
            mapped.status = error.code or 400
        return error_response(mapped)

    @app.errorhandler(Exception)
    async def _unexpected(error: Exception) -> Response:
        log.error("internal error on %s %s (%s)", request.method, request.path, type(error).__name__)
        log.debug("internal error detail", exc_info=error)
        return error_response(InternalError("The gateway failed to process the request."))

    # --- routes -----------------------------------------------------------------

    @app.get("/")
    async def _root() -> Response:
        return _json(b'{"message":"Responses gateway is running.","docs":"/v1/responses"}')

    @app.get("/health")
    async def _health() -> Response:
        return _json(b'{"status":"ok","adapter":"running"}')

    @app.get("/ready")
    async def _ready() -> Response:
        """What the last background check found (never a check per request)."""
        ready, body = app.readiness.report()
        return _json(orjson.dumps(body), 200 if ready else 503)

    @app.get("/metrics")
    async def _metrics() -> Response:
        if settings.metrics_token and not hmac.compare_digest(
            request.headers.get("authorization", ""), f"Bearer {settings.metrics_token}"
        ):
            raise Unauthorized("/metrics needs its token: Authorization: Bearer <METRICS_TOKEN>.")
        page = app.telemetry.exposition()
        if page is None:
            raise NotFound("No metrics are kept.", code="unknown_url")
        body, content_type = page
        return Response(body, content_type=content_type)

    @app.post("/v1/responses")
    @app.post("/responses")
    async def _create_response() -> Response:
        return await _respond(parse_create_request(await web.body_bytes()))

    @app.post("/v1/responses/<response_id>/submit_tool_outputs")
    @app.post("/responses/<response_id>/submit_tool_outputs")
    async def _submit_tool_outputs(response_id: str) -> Response:
        """The required_action protocol: the client's tool outputs continue the response as its next turn,
        with the same model, instructions and tools."""
        if settings.tool_call_protocol != "required_action":
            raise NotFound("Unknown endpoint: set TOOL_CALL_PROTOCOL=required_action to use it.", code="unknown_url")
        body = decode_json_object(await web.body_bytes())
        outputs = body.get("tool_outputs")
        if not isinstance(outputs, list) or not outputs:
            raise InvalidRequest.missing("tool_outputs")
        items = []
        for index, entry in enumerate(outputs):
            if not isinstance(entry, dict) or not isinstance(entry.get("tool_call_id"), str):
                raise InvalidRequest.missing(f"tool_outputs[{index}].tool_call_id")
            output = entry.get("output", "")
            if not isinstance(output, str):
                raise InvalidRequest("'output' must be a string.", param=f"tool_outputs[{index}].output", code="invalid_type")
            items.append({"type": "function_call_output", "call_id": entry["tool_call_id"], "output": output})
        previous = (await _stored(response_id)).response
        carried = {key: previous[key] for key in _CARRIED_SETTINGS if previous.get(key) is not None}
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise InvalidRequest("'stream' must be a boolean.", param="stream", code="invalid_type")
        return await _respond(
            validate_create_request({**carried, "previous_response_id": response_id, "input": items, "stream": stream})
        )

    async def _streamed_response(scope: Any, receive: Any, send: Any) -> None:
        """`POST /v1/responses` with `"stream": true`, beside Quart (see gateway.transport.asgi);
        any other request to the path is handed to Quart whole."""
        messages, raw = await asgi_transport.read_body(
            receive, settings.max_request_body_bytes, app.config["BODY_TIMEOUT"]
        )
        req = None
        if raw is not None:
            headers = dict(scope.get("headers", ()))
            try:
                encoding = headers.get(b"content-encoding", b"").decode("latin-1").strip().lower()
                body = (
                    raw
                    if encoding in ("", "identity")
                    else web.decompress(
                        raw, encoding, settings.max_request_body_bytes, max_ratio=settings.max_decompression_ratio
                    )
                )
                req = parse_create_request(body)
            except GatewayError:
                req = None  # Quart answers it, as for any request
        if req is None or not req.stream or req.background:
            replayed: Any = asgi_transport.replay(messages, receive)
            await app.asgi_app(scope, replayed, send)
            return
        notes = scope.get("gateway") or {}
        caller = notes.get("caller", ANONYMOUS)
        try:
            turn = await prepare_turn(
                app.resources,
                req,
                transport="sse",
                caller=caller if isinstance(caller, Caller) else ANONYMOUS,
                gateway_tools=_gateway_tools_enabled(req, headers.get(b"x-gateway-tools", b"").decode("latin-1")),
                request_id=notes.get("request_id"),
            )
        except GatewayError as error:
            await respond_error(send, error, where=f"POST {scope.get('path')} {notes.get('request_id', '')}".rstrip())
            return
        await asgi_transport.stream(TurnEventStream(turn, heartbeats=app.heartbeats), receive, send)

    app.streamed_response = _streamed_response

    async def _respond(req: CreateResponseRequest) -> Response:
        transport = "background" if req.background else "sse" if req.stream else "json"
        turn = await prepare_turn(
            app.resources,
            req,
            transport=transport,
            caller=_caller(),
            gateway_tools=_gateway_tools_enabled(req, request.headers.get("x-gateway-tools", "")),
            request_id=_request_id(),
        )
        if req.background:
            job = await app.runner.start(turn)
            if req.stream:
                return web.event_stream(web.follow_job(job, -1))
            return _json(orjson.dumps(job.record.response))
        if req.stream:
            response = Response(
                TurnEventStream(turn, heartbeats=app.heartbeats),
                status=200,
                content_type="text/event-stream",
            )
            response.timeout = None
            return response
        return _json(orjson.dumps(await _run_to_end(turn)))

    @app.websocket("/v1/responses")
    @app.websocket("/responses")
    async def _responses_socket() -> None:
        """WebSocket mode: `response.create` messages answered in order with the same events as SSE."""
        opened = trio.current_time()
        latest: dict[str, Any] = {}  # the connection's latest response: id -> the items it continues from
        waiting = trio.CancelScope()  # around each wait for a message: a drain ends it
        with trio.move_on_after(settings.websocket_max_age) as limit, app.drain.on_drain(lambda: waiting.cancel()):
            while not app.drain.draining.is_set():
                with waiting:
                    raw = await websocket.receive()
                if waiting.cancelled_caught:
                    break
                waiting = trio.CancelScope()
                if not await _ws_turn(raw if isinstance(raw, bytes) else raw.encode(), latest):
                    break
        if app.drain.draining.is_set():
            await websocket.close(1001)  # going away: the turn in progress has ended first
        elif limit.cancelled_caught or trio.current_time() - opened >= settings.websocket_max_age:
            await _ws_send([web.ws_error(400, "websocket_connection_limit_reached",
                "This connection reached its time limit; open a new one.")])
            await websocket.close(1000)

    async def _ws_turn(raw: bytes, latest: dict[str, Any]) -> bool:
        """One `response.create`; False when the connection should end."""
        try:
            message = decode_json_object(raw)
        except GatewayError as error:
            await _ws_send([web.ws_error(error.status, error.code or "invalid_json", error.message, param=error.param)])
            return True
        if message.get("type") != "response.create":
            await _ws_send([web.ws_error(400, "invalid_event_type", "Send response.create events.", param="type")])
            return True
        for field_name in ("stream", "stream_options", "background"):
            if field_name in message:
                await _ws_send([web.ws_error(400, "invalid_request", f"'{field_name}' is not allowed in WebSocket mode.", param=field_name)])
                return True
        body = {k: v for k, v in message.items() if k != "type"}
        previous = body.get("previous_response_id")
        cached = latest.get(previous) if isinstance(previous, str) else None
        try:
            await app.limiter.admit_request(_caller())  # each response.create is a request
            req = validate_create_request(body)
            turn = await prepare_turn(
                app.resources,
                req,
                transport="websocket",
                caller=_caller(),
                gateway_tools=gateway_tools_enabled((req.model_extra or {}).get("gateway_tools")),
                cached=(str(previous), cached) if cached is not None else None,
                request_id=_request_id(),
            )
        except GatewayError as error:
            if previous:
                latest.pop(previous, None)  # a failed continuation forgets the id
            await _ws_send(
                [web.ws_error(error.status, error.code or "invalid_request", error.message, param=error.param, type=error.type)]
            )
            return True
        try:
            await turn.run(_ws_send)
        except trio.Cancelled:  # the client went away mid-turn
            turn.outcome.client_left = True
            raise
        finally:
            turn.observe()
        final = turn.response
        if final.get("status") == "failed" and previous:
            latest.pop(previous, None)
        latest.clear()  # only the latest response is kept on the connection
        latest[final["id"]] = turn.conversation_so_far()
        return True

    async def _ws_send(events: list[dict[str, Any]]) -> None:
        for event in events:
            await websocket.send(event_json(event).decode())

    @app.post("/v1/responses/compact")
    @app.post("/responses/compact")
    async def _compact() -> Response:
        """Summarise a conversation through the backend: retained user messages plus a sealed compaction item."""
        req = parse_create_request(await web.body_bytes())
        summarise = req.model_copy(
            update={"tools": None, "tool_choice": None, "text": None, "reasoning": None, "store": False, "background": False}
        )
        turn = await prepare_turn(
            app.resources, summarise, transport="compact", caller=_caller(), gateway_tools=False, request_id=_request_id()
        )
        turn.plan.body["messages"].append({"role": "user", "content": _COMPACT_PROMPT})
        final = await _run_to_end(turn)
        summary = "".join(
            part.get("text", "")
            for item in final["output"]
            if item.get("type") == "message"
            for part in item.get("content") or ()
        )
        retained = [
            record
            for record in [*(i.model_dump(exclude_none=True) for i in turn.prepared.history), *turn.prepared.input_records]
            if record.get("type", "message") == "message" and record.get("role") == "user"
        ]
        compaction = {
            "type": "compaction",
            "id": ids("cmp"),
            "encrypted_content": sealer.seal("compaction", {"summary": summary, "owner": _caller().owner}),
        }
        return _json(
            orjson.dumps(
                {
                    "id": final["id"],
                    "object": "response.compaction",
                    "output": [*retained, compaction],
                    "created_at": int(clock()),
                    "usage": final["usage"],
                }
            )
        )

    # --- stored responses -----------------------------------------------------

    async def _stored(response_id: str) -> Any:
        record = await app.runner.load(response_id, _caller().owner)
        if record is None:
            raise NotFound(f"Response with id '{response_id}' not found.", param="response_id", code="response_not_found")
        return record

    @app.get("/v1/responses/<response_id>")
    @app.get("/responses/<response_id>")
    async def _get_response(response_id: str) -> Response:
        streaming = request.args.get("stream", "").lower() in ("true", "1")
        after = web.int_arg("starting_after", -1)
        owner = _caller().owner
        job = app.runner.job(response_id, owner)
        if job is not None:
            return web.event_stream(web.follow_job(job, after)) if streaming else _json(orjson.dumps(job.snapshot()))
        record = await _stored(response_id)
        if not streaming:
            return _json(orjson.dumps(record.response))
        if record.response.get("status") in ("queued", "in_progress"):
            load = functools.partial(app.runner.load, owner=owner)
            return web.event_stream(web.follow_store(load, response_id, after))  # running on another instance
        body = b"".join(encode_event(e) for e in record.events if e.get("sequence_number", 0) > after)
        return web.event_stream(web.once(body + encode_done()))

    @app.post("/v1/responses/<response_id>/cancel")
    @app.post("/responses/<response_id>/cancel")
    async def _cancel_response(response_id: str) -> Response:
        job = app.runner.job(response_id, _caller().owner)
        if job is not None:
            app.runner.cancel(response_id)
            with trio.move_on_after(5):
                await job.finished.wait()
            return _json(orjson.dumps(job.record.response))
        record = await _stored(response_id)
        if not record.response.get("background"):
            raise InvalidRequest(
                "Only responses created with background=true can be cancelled.", param="response_id", code="invalid_value"
            )
        if record.response.get("status") in ("queued", "in_progress"):
            # Running on another instance: it sees this within a second and stops.
            record = await app.runner.cancel_stored(response_id) or record
        return _json(orjson.dumps(record.response))

    @app.delete("/v1/responses/<response_id>")
    @app.delete("/responses/<response_id>")
    async def _delete_response(response_id: str) -> Response:
        if not await OwnerView(app.store, _caller().owner).delete(response_id):
            raise NotFound(f"Response with id '{response_id}' not found.", param="response_id", code="response_not_found")
        return _json(orjson.dumps({"id": response_id, "object": "response.deleted", "deleted": True}))

    @app.get("/v1/responses/<response_id>/input_items")
    @app.get("/responses/<response_id>/input_items")
    async def _input_items(response_id: str) -> Response:
        record = await _stored(response_id)
        return _json(orjson.dumps(web.page(record.input_items)))

    @app.post("/v1/chat/completions")
    @app.post("/chat/completions")
    async def _chat_completions() -> Response:
        body = decode_json_object(await web.body_bytes())
        if not isinstance(body.get("messages"), list):
            raise InvalidRequest.missing("messages")
        enabled = gateway_tools_enabled(body.pop("gateway_tools", True), request.headers.get("x-gateway-tools", ""))
        caller = _caller()
        model = str(body.get("model") or "")
        chat_id = ids("chatcmpl")
        tokens, max_tokens = token_reservation(body, caller.limits)
        if max_tokens is not None:
            body["max_tokens"] = max_tokens  # what it reserved bounds what it may use
        slot = await app.limiter.admit_stream(caller, model, chat_id, tokens=tokens)
        tools = RequestTools()
        if enabled and app.mcp is not None and body.get("tool_choice") != "none":
            own = {t.get("function", {}).get("name") for t in body.get("tools") or () if isinstance(t, dict)}
            for tool in app.mcp.tools():
                if tool.name not in own and caller.limits.allows_server(tool.server):
                    tools.add(app.mcp, tool)
        if not tools.routes and caller.limits.tpm is None:
            # Relayed as the backend sends it.  (A key with a token limit goes
            # through the session below, which reads the usage to count.)
            passthrough = web.PassthroughBody(
                app.backend,
                "POST",
                "chat/completions",
                request.query_string,
                dict(request.headers),
                orjson.dumps(body),
                on_close=functools.partial(app.limiter.settle, slot, caller),
                drain=app.drain,
            )
            response = Response(passthrough)
            response.timeout = None
            return response
        if tools.chat_tools:
            body["tools"] = [*(body.get("tools") or []), *tools.chat_tools]
        session = ChatSession(body, set(tools.routes), max_rounds=settings.max_tool_call_iterations)
        call_timeout, concurrency = settings.mcp_call_timeout, settings.mcp_call_concurrency
        streamed = bool(body.get("stream"))
        outcome = TurnOutcome(
            chat_id, model, "chat-sse" if streamed else "chat-json", trio.current_time(), key=caller.name, request_id=_request_id()
        )
        app.telemetry.turn_started(outcome)

        async def settle() -> None:
            """Give back the stream slot, count the tokens, report the outcome."""
            usage = session.usage or {}
            outcome.status = "failed" if session.failure else "completed" if session.done else "incomplete"
            outcome.error = {"code": session.failure} if session.failure else None
            outcome.usage = {
                "input_tokens": usage.get("prompt_tokens"),
                "output_tokens": usage.get("completion_tokens"),
                "total_tokens": usage.get("total_tokens"),
            }
            outcome.rounds = session.rounds + 1
            outcome.finished_at = trio.current_time()
            report_outcome(app.resources, outcome)
            await app.limiter.settle(slot, caller, int(usage.get("total_tokens") or 0))

        async def admit_round(next_request: dict[str, Any]) -> None:
            """A tool loop's next backend round reserves its tokens like a request of its own."""
            await app.limiter.reserve(slot, caller, token_reservation(next_request, caller.limits)[0])

        if streamed:
            stream = ChatCompletionStream(
                session,
                backend=app.backend,
                tools=tools,
                heartbeats=app.heartbeats,
                call_timeout=call_timeout,
                concurrency=concurrency,
                telemetry=app.telemetry,
                on_close=settle,
                drain=app.drain,
                outcome=outcome,
                admit_round=admit_round,
            )
            response = Response(stream, content_type="text/event-stream")
            response.timeout = None
            return response
        chunks: list[dict[str, Any]] = []

        async def collect(batch: list[dict[str, Any]]) -> None:
            note_chat_chunks(outcome, batch)
            chunks.extend(batch)

        try:
            with app.drain.stoppable() as stop:
                failure = await run_rounds(
                    session,
                    app.backend,
                    collect,
                    tools,
                    call_timeout=call_timeout,
                    concurrency=concurrency,
                    telemetry=app.telemetry,
                    admit_round=admit_round,
                )
        except trio.Cancelled:
            outcome.client_left = True
            raise
        finally:
            with trio.CancelScope(shield=True):
                await settle()
        if stop.cancelled_caught:
            raise ShuttingDown("The gateway shut down before the answer finished; send the request again.")
        errors = [chunk["error"] for chunk in chunks if "error" in chunk]
        if errors:
            raise failure or BackendStreamError(errors[0]["message"], code=errors[0]["code"])
        return _json(orjson.dumps(collect_chat_completion(chunks)))

    @app.get("/v1/models")
    @app.get("/models")
    async def _models() -> Response:
        """The models a key may use: with several backends, the configured names and each
        backend's own list; with one, the backend's list."""
        from .backends.routing import backend_models

        limits = _caller().limits
        lister = getattr(app.backend, "list_models", None)
        if lister is None and limits.models is None:
            return await _passthrough("models")  # the backend's answer, as it gives it
        listed = await lister() if lister is not None else await backend_models(app.backend)
        models = [m for m in listed if limits.allows_model(str(m["id"]))]
        return _json(orjson.dumps({"object": "list", "data": models}))

    @app.route("/v1/<path:path>", methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"])
    async def _passthrough(path: str) -> Response:
        """Any other `/v1/{path}`, relayed to the backend; a key's models and limits hold here too."""
        caller = _caller()
        limits = caller.limits
        target = web.passthrough_path(path)
        headers = dict(request.headers)
        relayed = read_relayed_body(
            await web.body_bytes(),
            request.headers.get("content-type", ""),
            strict=caller.key is not None and limits.models is not None,
        )
        if relayed.content_type is not None:
            headers = {k: v for k, v in headers.items() if k.lower() != "content-type"}
            headers["content-type"] = relayed.content_type
        for model in (relayed.model, *request.args.getlist("model"), _model_in_path(target)):
            if model is not None:
                app.limiter.check_model(caller, model)
        slot = None
        if request.method == "POST" and target in _GENERATION_PATHS:
            fields = relayed.fields or ({"input": relayed.data.decode("utf-8", "replace")} if relayed.data else {})
            tokens, _ = token_reservation(fields, limits, generates=target != "embeddings")
            slot = await app.limiter.admit_stream(caller, relayed.model or "", ids("relay"), tokens=tokens)
        body = web.PassthroughBody(
            app.backend,
            request.method,
            target,
            request.query_string,
            headers,
            relayed.data,
            drain=app.drain,
            on_close=functools.partial(app.limiter.settle, slot, caller),
        )
        response = Response(body)
        response.timeout = None
        return response

    return app


async def _run_to_end(turn: Turn) -> dict[str, Any]:
    """A turn without streaming: the final response, or the error the JSON answer carries.

    Raises:
        GatewayError: the backend refused, failed or timed out, or the
            response could not be stored.
    """
    async def ignore(events: list[dict[str, Any]]) -> None:
        pass

    try:
        await turn.run(ignore)
    except trio.Cancelled:
        turn.outcome.client_left = True
        turn.observe()
        raise
    error = turn.rejection or turn.error_for_json()
    if error is not None:
        turn.outcome.http_status = error.status
    turn.observe()
    if error is not None:
        raise error
    return turn.response


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


def _gateway_tools_enabled(req: Any, header: str) -> bool:
    """A create request's `gateway_tools` field, with its `x-gateway-tools` header."""
    return gateway_tools_enabled((req.model_extra or {}).get("gateway_tools"), header)


# What a submit_tool_outputs continuation takes over from the response it continues.
_CARRIED_SETTINGS = (
    "model", "instructions", "tools", "tool_choice", "text", "reasoning", "temperature", "top_p",
    "max_output_tokens", "parallel_tool_calls", "store", "metadata",
)

_COMPACT_PROMPT = (
    "Summarise the conversation above so that it can be continued from your summary alone: the user's goals, "
    "decisions made, important facts and names (files, functions, commands), work done, and what is still open. "
    "Be concise and complete; do not address the user."
)


def _log_outcome(outcome: TurnOutcome) -> None:
    """The one line per response at INFO (no prompt text); its fields are the JSON log's keys."""
    now = trio.current_time() if outcome.finished_at is None else outcome.finished_at

    def ms(at: float | None) -> float | None:
        return round((at - outcome.started) * 1000, 1) if at is not None else None

    usage = outcome.usage or {}
    fields: dict[str, Any] = {
        "response_id": outcome.response_id,
        "request_id": outcome.request_id,
        "key": outcome.key,
        "model": outcome.model,
        "transport": outcome.transport,
        "status": outcome.status,
        "http_status": outcome.http_status,
        "duration_ms": ms(now),
        "first_event_ms": ms(outcome.first_event_at),
        "first_token_ms": ms(outcome.first_token_at),
        "input_tokens": usage.get("input_tokens"),
        "output_tokens": usage.get("output_tokens"),
        "rounds": outcome.rounds,
        "error": (outcome.error or {}).get("code"),
        "client_left": outcome.client_left,
    }
    text = " ".join(
        f"{name}={'-' if value is None else value}"
        for name, value in fields.items()
        if name not in ("response_id", "client_left") and (value is not None or name in ("first_event_ms", "key"))
    )
    log.info("%s %s%s", outcome.response_id, text, " client_left" if outcome.client_left else "", extra={"fields": fields})
