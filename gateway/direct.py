"""Table routes served straight on ASGI, beside the framework: those whose every request runs a turn.

`DirectRoutes` answers an exact method and path (with and without `/v1`)
with its table handler (`gateway.call`): the body read once by the intake
(bounded in size and time, decompressed), the handler's body written by the
ASGI transport (ended at once when the client leaves), a refusal answered
by the renderer in the request's dialect.  The framework serves the rest
(routes with path parameters, the operator's routes): it costs a chat
completion or a Messages request several hundred microseconds of CPU that
its turn does not need.  No framework request objects here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qsl

from . import intake, render
from .call import Call, Handler, Route
from .errors import GatewayError, RequestTooLarge
from .intake import RequestContext
from .lifespan import Shared
from .transport import asgi as asgi_transport

__all__ = ["DirectRoutes"]


class DirectRoutes:
    """Exact routes of the table, served on ASGI (see the module docstring)."""

    def __init__(self, shared: Shared, routes: Sequence[Route], body_timeout: float) -> None:
        self._shared = shared
        self._settings = shared.resources.settings
        self._body_timeout = body_timeout
        self._table: dict[tuple[str, str], Handler] = {
            (method, prefix + rule): handler for method, rule, handler in routes for prefix in ("/v1", "")
        }

    def handler(self, scope: Any) -> Handler | None:
        """The handler for this request, if it is one of these routes."""
        return self._table.get((scope.get("method"), scope.get("path")))

    async def serve(self, handler: Handler, scope: Any, receive: Any, send: Any) -> None:
        settings = self._settings
        ctx = RequestContext.of(scope)
        path, headers = scope.get("path", ""), scope.get("headers", ())
        where = f"{scope.get('method')} {path} {ctx.request_id or ''}".rstrip()
        try:
            raw = await intake.read_body(receive, settings.max_request_body_bytes, self._body_timeout, scope)
            if raw is None:
                return  # the client left
            encoding = intake.header(headers, b"content-encoding")
            limit, ratio = settings.max_request_body_bytes, settings.max_decompression_ratio

            async def read() -> bytes:
                return intake.decode_body(raw, encoding, limit, max_ratio=ratio)

            query = scope.get("query_string", b"")
            args: dict[str, str] = {}
            for name, value in parse_qsl(query.decode("latin-1"), keep_blank_values=True):
                args.setdefault(name, value)  # the first of a repeated name, as the framework gives it
            named = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in headers}
            answer = await handler(Call(self._shared, ctx, {}, args, read, named, query))
        except GatewayError as error:
            if isinstance(error, RequestTooLarge):
                await intake.discard_body(receive)
            dialect = render.dialect_of(path, headers)
            await render.send_error(send, error, where=where, dialect=dialect, request_id=ctx.request_id)
            return
        await asgi_transport.stream(answer, scope, receive, send)
