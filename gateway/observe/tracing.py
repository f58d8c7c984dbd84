"""OpenTelemetry traces, exported over OTLP/HTTP (off unless OTEL_EXPORTER_OTLP_ENDPOINT is set).

One server span per request (a caller's `traceparent` is its parent), a
`turn` span under it, and under that a span per backend round and per MCP
call.  The current span travels to the backend and to remote MCP servers as
`traceparent`.  Attributes name routes, models, keys, tools, statuses and
token counts, never prompt text, tool arguments or outputs.

Spans live in contextvars, which trio copies into every task a task starts:
a span made current around a request is the parent of what the request's
tasks do.  The exporter runs in the SDK's own thread; flushing waits for it
in a worker thread, never on the event loop (whose server may be the very
receiver the exporter is sending to).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import trio
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from . import Telemetry

if TYPE_CHECKING:
    from ..config import Settings
    from .outcome import TurnOutcome

__all__ = ["OpenTelemetryTracing", "traces_url"]

log = logging.getLogger("gateway.observe")

_PROPAGATOR = TraceContextTextMapPropagator()
_FLUSH_SECONDS = 5.0


def traces_url(endpoint: str) -> str:
    """The traces URL of an OTLP/HTTP endpoint: `/v1/traces` is appended to a base URL, as the
    OpenTelemetry convention for OTEL_EXPORTER_OTLP_ENDPOINT says."""
    endpoint = endpoint.strip().rstrip("/")
    return endpoint if endpoint.endswith("/v1/traces") else endpoint + "/v1/traces"


class OpenTelemetryTracing(Telemetry):
    """Spans for requests, turns, backend rounds and MCP calls, with its own tracer provider
    (the process-global one is left alone, so that several gateways can share a process)."""

    def __init__(self, settings: Settings) -> None:
        self.provider = TracerProvider(resource=Resource.create({"service.name": settings.otel_service_name}))
        exporter = OTLPSpanExporter(endpoint=traces_url(settings.otel_exporter_otlp_endpoint), timeout=_FLUSH_SECONDS)
        self.provider.add_span_processor(BatchSpanProcessor(exporter))
        self._tracer = self.provider.get_tracer("gateway")

    @contextlib.contextmanager
    def server_span(self, name: str, headers: Iterable[tuple[bytes, bytes]], **attributes: Any) -> Iterator[None]:
        parent = _PROPAGATOR.extract({name.decode("latin-1"): value.decode("latin-1") for name, value in headers})
        attrs = {"http.route": attributes.get("route", ""), "gateway.request_id": attributes.get("request_id", "")}
        with self._span(name, kind=SpanKind.SERVER, context=parent, attributes=attrs):
            yield

    @contextlib.contextmanager
    def span(self, name: str, **attributes: Any) -> Iterator[None]:
        with self._span(name, attributes={f"gateway.{k}": v for k, v in attributes.items() if _plain(v)}):
            yield

    @contextlib.contextmanager
    def _span(self, name: str, **options: Any) -> Iterator[None]:
        # Exceptions are not recorded as events: their messages may quote a request.
        with self._tracer.start_as_current_span(
            name, record_exception=False, set_status_on_exception=False, **options
        ) as span:
            try:
                yield
            except trio.Cancelled:
                span.set_attribute("gateway.cancelled", True)
                raise
            except BaseException as exc:
                span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
                raise

    def trace_headers(self) -> dict[str, str]:
        headers: dict[str, str] = {}
        _PROPAGATOR.inject(headers)
        return headers

    def http_request(self, *, route: str, method: str, status: int, seconds: float, key: str | None) -> None:
        span = trace.get_current_span()
        span.set_attribute("http.request.method", method)
        span.set_attribute("http.response.status_code", status)
        if key is not None:
            span.set_attribute("gateway.key", key)
        if status >= 500:
            span.set_status(Status(StatusCode.ERROR))

    def turn_finished(self, outcome: TurnOutcome) -> None:
        span = trace.get_current_span()
        usage = outcome.usage or {}
        for name, value in (
            ("gateway.response_id", outcome.response_id),
            ("gateway.response.status", outcome.final_status),
            ("gen_ai.request.model", outcome.model),
            ("gen_ai.usage.input_tokens", usage.get("input_tokens")),
            ("gen_ai.usage.output_tokens", usage.get("output_tokens")),
            ("error.type", (outcome.error or {}).get("code")),
        ):
            if value is not None:
                span.set_attribute(name, value)

    def backend_error(self, kind: str, *, route: str | None = None) -> None:
        span = trace.get_current_span()
        span.set_attribute("error.type", kind)
        span.set_status(Status(StatusCode.ERROR, kind))

    def mcp_call(self, *, server: str, tool: str, outcome: str, seconds: float) -> None:
        trace.get_current_span().set_attribute("gateway.mcp.outcome", outcome)

    async def aclose(self) -> None:
        """Send what is buffered and stop the exporter (in a thread: it may be sending to
        a receiver this very event loop serves)."""
        with trio.move_on_after(_FLUSH_SECONDS + 1):
            await trio.to_thread.run_sync(self.provider.shutdown, abandon_on_cancel=True)

    async def flush(self) -> None:
        """Send what is buffered now (tests, and operators who want it before a restart)."""
        await trio.to_thread.run_sync(self.provider.force_flush, int(_FLUSH_SECONDS * 1000), abandon_on_cancel=True)


def _plain(value: Any) -> bool:
    return isinstance(value, (str, bool, int, float))
