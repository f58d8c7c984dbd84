"""OpenTelemetry traces, received by a real OTLP/HTTP receiver in the test.

The receiver is an HTTP server that decodes what the gateway's exporter
POSTs to /v1/traces (protobuf, the OTLP wire format).  One request through
a tool loop with a remote MCP server must give a server span, a turn under
it, a span per backend round and per MCP call, `traceparent` at the
backend and at the MCP server, and no prompt text or tool arguments in any
attribute.
"""

from __future__ import annotations

import functools
from typing import Any

import trio
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

import gateway
from asgi_helpers import answer_lifespan, read_body
from conftest import SequentialIds, make_settings, parse_sse
from gateway.observe import Telemetries
from gateway.observe.tracing import OpenTelemetryTracing, traces_url
from test_mcp_manager import make_test_server, serve_asgi

CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
MARKER = "PROMPT-MARKER-7f3a"


class OTLPReceiver:
    """A real OTLP/HTTP traces endpoint: every span it is sent, decoded."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.paths: list[str] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        body = await read_body(receive)
        self.paths.append(scope["path"])
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        for resource_spans in request.resource_spans:
            service = {a.key: a.value.string_value for a in resource_spans.resource.attributes}.get("service.name")
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    self.spans.append(
                        {
                            "name": span.name,
                            "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "parent": span.parent_span_id.hex(),
                            "kind": span.kind,
                            "service": service,
                            "attributes": {a.key: _value(a.value) for a in span.attributes},
                            "error": span.status.code == 2,
                        }
                    )
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/x-protobuf")]})
        await send({"type": "http.response.body", "body": b""})

    def named(self, name: str) -> list[dict[str, Any]]:
        return [span for span in self.spans if span["name"] == name]


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


def recording(app: Any, seen: list[dict[str, str]]) -> Any:
    """An ASGI app that notes each HTTP request's headers, then serves it with `app`."""

    async def wrapped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            seen.append({k.decode(): v.decode() for k, v in scope["headers"]})
        await app(scope, receive, send)

    return wrapped


def tracing_of(app: Any) -> OpenTelemetryTracing:
    parts = app.telemetry.parts if isinstance(app.telemetry, Telemetries) else [app.telemetry]
    (tracing,) = [part for part in parts if isinstance(part, OpenTelemetryTracing)]
    return tracing


async def start_traced_gateway(
    nursery: trio.Nursery, backend: Any, receiver_url: str, *, shutdown_trigger: Any = None, **overrides: Any
) -> tuple[str, Any]:
    settings = make_settings(
        backend.url, otel_exporter_otlp_endpoint=receiver_url, otel_service_name="gw-under-test", **overrides
    )
    app = gateway.create_app(settings, ids=SequentialIds(), clock=lambda: 1_700_000_000.0)
    url = await nursery.start(functools.partial(gateway.serve, settings, app=app, shutdown_trigger=shutdown_trigger))
    return url, app


async def test_a_request_through_a_tool_loop_is_one_trace_carried_to_the_backend_and_the_mcp_server(nursery, backend, client):
    receiver = OTLPReceiver()
    receiver_url = await nursery.start(serve_asgi, receiver)
    mcp_headers: list[dict[str, str]] = []
    mcp_base = await nursery.start(serve_asgi, recording(make_test_server().streamable_http_app(), mcp_headers))
    url, app = await start_traced_gateway(nursery, backend, receiver_url, mcp_allowed_urls="127.0.0.1")

    tools = [{"type": "mcp", "server_label": "calc", "server_url": mcp_base + "/mcp", "require_approval": "never"}]
    r = await client.post(
        url + "/v1/responses",
        json={"model": "mcp-add", "input": f"{MARKER}: what is 2+3?", "tools": tools, "stream": True},
        headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01", "x-request-id": "req-traced-1"},
    )
    final = parse_sse(r.content)[-2]
    assert final["type"] == "response.completed"
    assert next(i for i in final["response"]["output"] if i["type"] == "mcp_call")["output"] == "5"
    await tracing_of(app).flush()

    assert set(receiver.paths) == {"/v1/traces"}
    (server,) = receiver.named("POST /v1/responses")
    assert (server["trace_id"], server["parent"]) == (CLIENT_TRACE, CLIENT_SPAN)  # the caller's trace goes on
    assert server["kind"] == 2 and server["service"] == "gw-under-test"  # SERVER
    assert server["attributes"]["http.route"] == "/v1/responses"
    assert server["attributes"]["gateway.request_id"] == "req-traced-1"
    assert server["attributes"]["http.response.status_code"] == 200
    (turn,) = receiver.named("turn")
    assert turn["parent"] == server["span_id"] and turn["attributes"]["gateway.model"] == "mcp-add"
    rounds = receiver.named("backend round")
    assert len(rounds) == 2 and all(span["parent"] == turn["span_id"] for span in rounds)
    (call,) = receiver.named("mcp call")
    assert call["parent"] == turn["span_id"]
    assert call["attributes"]["gateway.tool"] == "add" and call["attributes"]["gateway.mcp.outcome"] == "ok"
    assert {span["trace_id"] for span in receiver.spans} == {CLIENT_TRACE}

    # Each backend call carried the span of its own round.
    sent = [request.headers["traceparent"] for request in backend.requests if request.path == "/v1/chat/completions"]
    assert [header.split("-")[1] for header in sent] == [CLIENT_TRACE, CLIENT_TRACE]
    assert sorted(header.split("-")[2] for header in sent) == sorted(span["span_id"] for span in rounds)
    # The remote MCP server got the trace too.
    assert mcp_headers and all(headers["traceparent"].split("-")[1] == CLIENT_TRACE for headers in mcp_headers)

    # Nothing of the prompt or the tool's arguments is in any attribute.
    everything = repr([span["attributes"] for span in receiver.spans])
    assert MARKER not in everything and '"a": 2' not in everything and "2+3" not in everything
    await tracing_of(app).aclose()  # its exporter stops with the test's receiver


async def test_a_streamed_request_on_a_kept_alive_connection_carries_its_rounds_span_too(nursery, backend, client):
    # Untraced, such a request is sent before its stream sets up (`Turn.begin`); traced, it
    # waits for its round, whose span it carries.
    receiver = OTLPReceiver()
    receiver_url = await nursery.start(serve_asgi, receiver)
    url, app = await start_traced_gateway(nursery, backend, receiver_url)
    for _ in range(2):  # (the start-up's probe left a kept-alive connection for the first already)
        r = await client.post(url + "/v1/responses", json={"model": "text", "input": "hi", "stream": True})
        assert parse_sse(r.content)[-2]["type"] == "response.completed"
    await tracing_of(app).flush()
    rounds = receiver.named("backend round")
    sent = [request.headers["traceparent"] for request in backend.requests if request.path == "/v1/chat/completions"]
    assert len(sent) == len(rounds) == 2
    assert sorted(header.split("-")[2] for header in sent) == sorted(span["span_id"] for span in rounds)
    await tracing_of(app).aclose()


async def test_each_request_without_a_traceparent_starts_its_own_trace_and_failures_are_marked(nursery, backend, client):
    receiver = OTLPReceiver()
    receiver_url = await nursery.start(serve_asgi, receiver)
    url, app = await start_traced_gateway(nursery, backend, receiver_url)
    assert (await client.post(url + "/v1/responses", json={"model": "text", "input": "hi"})).status_code == 200
    assert (await client.post(url + "/v1/responses", json={"model": "http-500", "input": "hi"})).status_code == 502
    await tracing_of(app).flush()
    servers = receiver.named("POST /v1/responses")
    assert len(servers) == 2 and len({span["trace_id"] for span in servers}) == 2
    assert all(span["parent"] == "" for span in servers)
    failed = next(span for span in servers if span["attributes"]["http.response.status_code"] == 502)
    assert failed["error"]
    (failed_round,) = [span for span in receiver.named("backend round") if span["trace_id"] == failed["trace_id"]]
    assert failed_round["error"] and failed_round["attributes"]["error.type"] == "backend_error"
    await tracing_of(app).aclose()


async def test_spans_still_buffered_at_shutdown_are_sent(nursery, backend, client):
    receiver = OTLPReceiver()
    receiver_url = await nursery.start(serve_asgi, receiver)
    stop = trio.Event()
    async with trio.open_nursery() as gateway_nursery:
        url, _app = await start_traced_gateway(gateway_nursery, backend, receiver_url, shutdown_trigger=stop.wait)
        assert (await client.get(url + "/v1/responses/resp_none")).status_code == 404
        stop.set()  # an orderly stop, as at SIGTERM: the app closes and its last spans are sent
    assert [span["attributes"]["http.response.status_code"] for span in receiver.named("GET /v1/responses/{id}")] == [404]


async def test_no_tracing_unless_an_endpoint_is_configured(start_gateway):
    from gateway.observe import build_telemetry

    telemetry = build_telemetry(make_settings("http://127.0.0.1:1"))
    parts = telemetry.parts if isinstance(telemetry, Telemetries) else (telemetry,)
    assert not any(isinstance(part, OpenTelemetryTracing) for part in parts)
    assert traces_url("http://collector:4318") == "http://collector:4318/v1/traces"
    assert traces_url("http://collector:4318/v1/traces/") == "http://collector:4318/v1/traces"
