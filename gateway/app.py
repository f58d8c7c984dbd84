"""The quart-trio application: routes, error mapping, app-wide resources.

Owns the HTTP surface (`/v1/responses`, `/responses`, `/health`, `/`, the
`/v1/{path}` passthrough), the one place where errors become HTTP responses,
and the app lifespan resources (the backend's HTTP client).  Protocol
decisions live in `translate` and `streams`; this module wires them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, cast

import orjson
import trio
from quart import Response, request
from quart.utils import encode_headers
from quart_trio import QuartTrio
from quart_trio.asgi import TrioASGIHTTPConnection
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from .backend import ChatBackend, OpenAICompatibleBackend, passthrough_response_headers
from .config import Settings
from .errors import GatewayError, InternalError, InvalidRequest, NotFound, RequestTooLarge, error_json
from .streams.relay import DeferredHeadBody, ResponseEventStream, StreamOutcome, collect_response
from .streams.translator import ResponseTranslator, random_id
from .translate import plan_chat_request
from .wire import parse_create_request

__all__ = ["GatewayApp", "create_app"]

log = logging.getLogger("gateway")


class _GatewayHTTPConnection(TrioASGIHTTPConnection):
    async def _send_response(self, send: Any, response: Any) -> None:
        body = getattr(response, "response", None)
        if not isinstance(body, DeferredHeadBody):
            await super()._send_response(send, response)
            return
        async with body:
            status, headers = await body.head()
            response.status_code = status
            for name, value in headers.items():
                response.headers[name] = value
            await send({"type": "http.response.start", "status": status, "headers": encode_headers(response.headers)})
            async for data in body:
                await send({"type": "http.response.body", "body": data, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class GatewayApp(QuartTrio):
    asgi_http_class = _GatewayHTTPConnection
    settings: Settings
    backend: ChatBackend


def _json(data: bytes, status: int = 200) -> Response:
    return Response(data, status=status, content_type="application/json")


def error_response(error: GatewayError) -> Response:
    """The one function that turns an error into an HTTP response."""
    return _json(error_json(error), error.status)


def create_app(
    settings: Settings,
    *,
    backend: ChatBackend | None = None,
    clock: Callable[[], float] = time.time,
    ids: Callable[[str], str] = random_id,
) -> GatewayApp:
    """Build the gateway app from a settings object.

    `backend` replaces the default OpenAI-compatible adapter (its HTTP
    client is then the caller's to manage); `clock` and `ids` are injected
    into the translator (tests pin them).
    """
    app = GatewayApp(__name__)
    app.settings = settings
    app.config["MAX_CONTENT_LENGTH"] = settings.max_request_body_bytes
    app.config["RESPONSE_TIMEOUT"] = None  # long streams must never be cut by the framework
    app.config["BODY_TIMEOUT"] = max(60.0, settings.stream_timeout)
    owned: OpenAICompatibleBackend | None = None
    if backend is not None:
        app.backend = backend

    @app.before_serving
    async def _open_backend() -> None:
        nonlocal owned
        if backend is None:
            owned = OpenAICompatibleBackend(settings)
            app.backend = owned

    @app.after_serving
    async def _close_backend() -> None:
        if owned is not None:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await owned.aclose()

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

    @app.post("/v1/responses")
    @app.post("/responses")
    async def _create_response() -> Response:
        started = trio.current_time()
        req = parse_create_request(await _body_bytes())
        # Until responses are stored, no earlier response can be continued and
        # none can run in the background: say so rather than ignore the field.
        if req.previous_response_id:
            raise NotFound(
                f"Previous response with id '{req.previous_response_id}' not found.",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        if req.background:
            raise InvalidRequest(
                "Background mode is not available on this gateway yet.", param="background", code="unsupported_parameter"
            )
        response_id = ids("resp")
        plan = plan_chat_request(req, response_id=response_id, created_at=int(clock()))
        translator = ResponseTranslator(
            plan.response,
            ids=ids,
            clock=clock,
            reasoning_events=settings.reasoning_events,
            allowed_tools=plan.allowed_tools,
        )
        model = plan.body["model"]
        if req.stream:

            def _log_stream(outcome: StreamOutcome) -> None:
                _log_request(response_id, model, outcome.status, outcome.http_status, started, outcome.first_byte_at,
                             client_left=outcome.client_left)

            body = ResponseEventStream(
                backend=app.backend,
                body=plan.body,
                translator=translator,
                heartbeat_interval=settings.heartbeat_interval,
                on_close=_log_stream,
            )
            response = Response(body, status=200, content_type="text/event-stream")
            response.timeout = None
            return response
        try:
            final = await collect_response(app.backend, plan.body, translator)
        except GatewayError as error:
            _log_request(response_id, model, "failed", error.status, started, None)
            raise
        _log_request(response_id, model, final["status"], 200, started, None)
        return _json(orjson.dumps(final))

    @app.route("/v1/<path:path>", methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"])
    async def _passthrough(path: str) -> Response:
        body = _PassthroughBody(
            app.backend,
            request.method,
            path,
            request.query_string,
            dict(request.headers),
            await _body_bytes(),
        )
        response = Response(body)
        response.timeout = None
        return response

    return app


async def _body_bytes() -> bytes:
    data = await request.get_data(as_text=False)
    return data if isinstance(data, bytes) else data.encode()


def _log_request(
    response_id: str,
    model: str,
    status: str,
    http_status: int,
    started: float,
    first_byte_at: float | None,
    *,
    client_left: bool = False,
) -> None:
    now = trio.current_time()
    ttfe = f"{(first_byte_at - started) * 1000:.1f}ms" if first_byte_at is not None else "-"
    log.info(
        "%s model=%s status=%s http=%d duration=%.1fms first_event=%s%s",
        response_id,
        model,
        status,
        http_status,
        (now - started) * 1000,
        ttfe,
        " client_left" if client_left else "",
    )


class _PassthroughBody(DeferredHeadBody):
    """Relays one `/v1/{path}` request to the backend, streaming the answer."""

    def __init__(
        self, backend: ChatBackend, method: str, path: str, query: bytes, headers: dict[str, str], body: bytes
    ) -> None:
        self._backend = backend
        self._args = (method, path, query, headers, body)
        self._cm: Any = None
        self._upstream: Any = None
        self._error: bytes | None = None
        self._status = 502
        self._chunks: Any = None

    async def __aenter__(self) -> _PassthroughBody:
        cm = self._backend.open_passthrough(*self._args)
        try:
            self._upstream = await cm.__aenter__()
        except GatewayError as error:
            self._error, self._status = error_json(error), error.status
        else:
            self._cm = cm
            self._chunks = self._upstream.aiter_bytes()
        return self

    async def head(self) -> tuple[int, dict[str, str]]:
        if self._upstream is None:
            return self._status, {"content-type": "application/json"}
        return self._upstream.status_code, passthrough_response_headers(self._upstream)

    def __aiter__(self) -> _PassthroughBody:
        return self

    async def __anext__(self) -> bytes:
        if self._error is not None:
            data, self._error = self._error, None
            return data
        if self._chunks is None:
            raise StopAsyncIteration
        try:
            return cast(bytes, await self._chunks.__anext__())
        except StopAsyncIteration:
            raise
        except Exception as error:  # the backend dropped mid-body; nothing more can be said
            log.warning("passthrough body from the backend was cut (%s)", type(error).__name__)
            raise StopAsyncIteration from None

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._cm is not None:
            await self._cm.__aexit__(exc_type, exc, tb)
