"""Telemetry: what the gateway tells its operator (metrics and traces), behind one interface.

Code on the path of a request calls a `Telemetry`; the base class does
nothing, so an unobserved gateway pays one method call per hook.
Implementations override what they need:

    metrics.py   Prometheus counters, histograms and gauges (`/metrics`)
    tracing.py   OpenTelemetry spans, exported over OTLP
    usage.py     each key's use by the minute and the backends' recent errors (the console's)

`Telemetries` fans out to several.  A hook never raises into the request
path and never receives prompt text.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..config import Settings
    from .outcome import TurnOutcome

__all__ = ["Telemetries", "Telemetry", "build_telemetry", "metrics_page"]

log = logging.getLogger("gateway.observe")


class Telemetry:
    """Every hook, as a no-op."""

    # --- the HTTP edge ---------------------------------------------------------------

    def http_request(self, *, route: str, method: str, status: int, seconds: float, key: str | None) -> None:
        """One HTTP request answered, with its route template (WebSockets: `websocket_opened`/`_closed`)."""

    def websocket_opened(self) -> None: ...

    def websocket_closed(self) -> None: ...

    def server_span(
        self, name: str, headers: Iterable[tuple[bytes, bytes]], **attributes: Any
    ) -> contextlib.AbstractContextManager[None]:
        """Around a whole request; `headers` (the request's, raw) may carry the caller's `traceparent`."""
        return _NO_SPAN

    # --- turns ---------------------------------------------------------------------------

    def turn_started(self, outcome: TurnOutcome) -> None:
        """A response began producing (an active stream)."""

    def turn_finished(self, outcome: TurnOutcome) -> None:
        """A response ended (its outcome is complete: status, usage, timings, key)."""

    def heartbeat(self) -> None:
        """A keep-alive comment was written to a client."""

    def backend_error(self, kind: str, *, route: str | None = None) -> None:
        """A backend call failed (`kind`: the error code, such as `backend_timeout`; `route`: the
        model the request asked for, when known)."""

    def mcp_call(self, *, server: str, tool: str, outcome: str, seconds: float) -> None:
        """A gateway tool call ended (`outcome`: `ok`, `error` or `timeout`)."""

    def web_tool(self, *, tool: str, outcome: str, seconds: float) -> None:
        """A web search or page fetch ended (`outcome`: `ok`, or why not: `unreachable`, `no_engine`,
        `url_not_allowed`, ...; `seconds`: the engine's or the page's time)."""

    def store_operation(self, *, operation: str, seconds: float, ok: bool) -> None:
        """A conversation-store call ended."""

    def span(self, name: str, **attributes: Any) -> contextlib.AbstractContextManager[None]:
        """A child span of the current one (a turn, a backend round, an MCP call)."""
        return _NO_SPAN

    def trace_headers(self) -> dict[str, str]:
        """Headers that carry the current span to a server the gateway calls (`traceparent`)."""
        return {}

    # --- exposition ------------------------------------------------------------------------

    def exposition(self) -> tuple[bytes, str] | None:
        """The metrics page (body, content type), or None when there are no metrics."""
        return None

    async def aclose(self) -> None:
        """At shutdown: send what is buffered (spans) and stop."""


# What a hook without a span gives: one context manager that does nothing, shared (no generator
# per request on the hot path).
_NO_SPAN: contextlib.AbstractContextManager[None] = contextlib.nullcontext()


class Telemetries(Telemetry):
    """Several telemetries as one; a hook that fails is logged and skipped.

    Each hook calls only the parts that override it (found once, here): the usage ledger is
    always one of the parts, and the request path should not pay for the others' no-ops.
    """

    def __init__(self, parts: Sequence[Telemetry]) -> None:
        self.parts = tuple(parts)
        self._hooks: dict[str, tuple[Callable[..., Any], ...]] = {
            name: tuple(getattr(part, name) for part in self.parts if _overrides(part, name)) for name in _HOOKS
        }
        self._spans = tuple(part for part in self.parts if _overrides(part, "span"))
        self._server_spans = tuple(part for part in self.parts if _overrides(part, "server_span"))

    def _each(self, name: str, *args: Any, **kwargs: Any) -> None:
        for hook in self._hooks[name]:
            try:
                hook(*args, **kwargs)
            except Exception:
                log.debug("telemetry hook %s failed", name, exc_info=True)

    def http_request(self, **kwargs: Any) -> None:
        self._each("http_request", **kwargs)

    def websocket_opened(self) -> None:
        self._each("websocket_opened")

    def websocket_closed(self) -> None:
        self._each("websocket_closed")

    def turn_started(self, outcome: TurnOutcome) -> None:
        self._each("turn_started", outcome)

    def turn_finished(self, outcome: TurnOutcome) -> None:
        self._each("turn_finished", outcome)

    def heartbeat(self) -> None:
        self._each("heartbeat")

    def backend_error(self, kind: str, *, route: str | None = None) -> None:
        self._each("backend_error", kind, route=route)

    def mcp_call(self, **kwargs: Any) -> None:
        self._each("mcp_call", **kwargs)

    def web_tool(self, **kwargs: Any) -> None:
        self._each("web_tool", **kwargs)

    def store_operation(self, **kwargs: Any) -> None:
        self._each("store_operation", **kwargs)

    def server_span(
        self, name: str, headers: Iterable[tuple[bytes, bytes]], **attributes: Any
    ) -> contextlib.AbstractContextManager[None]:
        if not self._server_spans:
            return _NO_SPAN
        if len(self._server_spans) == 1:
            return self._server_spans[0].server_span(name, headers, **attributes)
        return _nested(part.server_span(name, headers, **attributes) for part in self._server_spans)

    def span(self, name: str, **attributes: Any) -> contextlib.AbstractContextManager[None]:
        if not self._spans:
            return _NO_SPAN
        if len(self._spans) == 1:
            return self._spans[0].span(name, **attributes)
        return _nested(part.span(name, **attributes) for part in self._spans)

    def trace_headers(self) -> dict[str, str]:
        headers: dict[str, str] = {}
        for part in self.parts:
            headers.update(part.trace_headers())
        return headers

    def exposition(self) -> tuple[bytes, str] | None:
        for part in self.parts:
            page = part.exposition()
            if page is not None:
                return page
        return None

    async def aclose(self) -> None:
        for part in self.parts:
            await part.aclose()


_HOOKS = (
    "http_request",
    "websocket_opened",
    "websocket_closed",
    "turn_started",
    "turn_finished",
    "heartbeat",
    "backend_error",
    "mcp_call",
    "web_tool",
    "store_operation",
)


def _overrides(part: Telemetry, name: str) -> bool:
    return getattr(type(part), name) is not getattr(Telemetry, name)


@contextlib.contextmanager
def _nested(spans: Iterable[contextlib.AbstractContextManager[None]]) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for span in spans:
            stack.enter_context(span)
        yield


def build_telemetry(settings: Settings) -> Telemetry:
    """The telemetry the settings ask for: the usage ledger always (the console's figures,
    see usage.py), Prometheus metrics unless turned off, OpenTelemetry traces when an OTLP
    endpoint is configured."""
    from .usage import UsageLedger

    parts: list[Telemetry] = [UsageLedger()]
    if settings.metrics_enabled:
        from .metrics import PrometheusTelemetry

        parts.append(PrometheusTelemetry(settings))
    if settings.otel_exporter_otlp_endpoint:
        from .tracing import OpenTelemetryTracing

        parts.append(OpenTelemetryTracing(settings))
    return parts[0] if len(parts) == 1 else Telemetries(parts)


def metrics_page(telemetry: Telemetry, token: str, authorization: str) -> tuple[bytes, str]:
    """The `/metrics` page (body, content type) for a scraper that sent `authorization`.

    Raises:
        Unauthorized: `METRICS_TOKEN` is set and the scraper did not send it.
        NotFound: no metrics are kept (`METRICS_ENABLED=false`).
    """
    import hmac

    from ..errors import NotFound, Unauthorized

    if token and not hmac.compare_digest(authorization, f"Bearer {token}"):
        raise Unauthorized("/metrics needs its token: Authorization: Bearer <METRICS_TOKEN>.")
    page = telemetry.exposition()
    if page is None:
        raise NotFound("No metrics are kept.", code="unknown_url")
    return page
