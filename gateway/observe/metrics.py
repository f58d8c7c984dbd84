"""Prometheus metrics: the telemetry hooks as counters, histograms and gauges, served at `/metrics`.

Each `PrometheusTelemetry` keeps its metrics in a registry of its own, so
several apps in one process (tests, an embedding program) never share or
clash.  Label values stay bounded whatever clients send: routes are
templates, methods outside the usual few are `other`, and names that come
from requests (models, keys, MCP servers and tools, error codes) are kept
up to a cap, after which newcomers count as `other`.

With `--workers N` the worker processes keep their values in files under
`PROMETHEUS_MULTIPROC_DIR` (prometheus-client's multiprocess mode, which the
library switches on from that variable when it is first imported): the
parent sets it up with `shared_across_workers` before it starts them, and
`/metrics` on any worker shows the sum over all of them.  In one process
nothing is written to disk.

Hooks run on the path of every request: each keeps its labelled children
in a dict, and none raises.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Generic, ParamSpec, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess, values
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics import MetricWrapperBase

from . import Telemetry
from .outcome import ANONYMOUS_KEY

if TYPE_CHECKING:
    from ..config import Settings
    from .outcome import TurnOutcome

__all__ = ["OTHER", "PrometheusTelemetry", "shared_across_workers"]

log = logging.getLogger("gateway.observe")

OTHER = "other"  # the label value of whatever is past a cap

# Seconds, from a cached first token to a long generation with tool rounds.
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)
# A store call takes milliseconds; a slow one tens of them.
STORE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
# What the gateway adds to a response: under a millisecond when all is well, more under load.
OVERHEAD_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
# Distinct values a label may take in one process before newcomers become `other`.
_MAX_MODELS = 100
_MAX_KEYS = 1000
_MAX_MCP_SERVERS = 100
_MAX_MCP_TOOLS = 500
_MAX_ERROR_KINDS = 100

_MULTIPROC_DIR = "PROMETHEUS_MULTIPROC_DIR"

P = ParamSpec("P")
M = TypeVar("M", bound=MetricWrapperBase)


def _never_raises(hook: Callable[P, None]) -> Callable[P, None]:
    """A hook that fails (a full disk under the multiprocess files) costs a metric, not a request."""

    @functools.wraps(hook)
    def guarded(*args: P.args, **kwargs: P.kwargs) -> None:
        try:
            hook(*args, **kwargs)
        except Exception:
            log.debug("metrics hook %s failed", hook.__name__, exc_info=True)

    return guarded


class _Children(Generic[M]):
    """A metric's labelled children by label values: `labels()` validates and locks on every call."""

    def __init__(self, metric: M) -> None:
        self._metric = metric
        self._children: dict[tuple[str, ...], M] = {}

    def __call__(self, *label_values: str) -> M:
        child = self._children.get(label_values)
        if child is None:
            child = self._children[label_values] = self._metric.labels(*label_values)
        return child


class _Capped:
    """Label values as given, up to `limit` distinct ones; later newcomers are `other`."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._seen: set[str] = set()

    def __contains__(self, value: str) -> bool:
        return value in self._seen

    def __call__(self, value: str) -> str:
        if value in self._seen:
            return value
        if len(self._seen) >= self._limit:
            return OTHER
        self._seen.add(value)
        return value


class PrometheusTelemetry(Telemetry):
    """The gateway's metrics (see the module docstring); `exposition()` is the `/metrics` page."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        registry = CollectorRegistry()
        self._page = registry
        # prometheus-client chose file-backed values when it was imported (the
        # variable was set): every worker writes its own, the page is their sum.
        if getattr(values.ValueClass, "_multiprocess", False):
            self._page = CollectorRegistry()
            multiprocess.MultiProcessCollector(self._page)

        self._http_requests = _Children(
            Counter(
                "gateway_http_requests",
                "HTTP requests answered, by route template, method, status and API key name.",
                ["route", "method", "status", "key"],
                registry=registry,
            )
        )
        self._http_duration = _Children(
            Histogram(
                "gateway_http_request_duration_seconds",
                "Time from a request's arrival to the end of its response (a stream's whole length).",
                ["route"],
                buckets=LATENCY_BUCKETS,
                registry=registry,
            )
        )
        self._responses = _Children(
            Counter(
                "gateway_responses",
                "Responses ended, by model, final status (or client_left), API key name and transport.",
                ["model", "status", "key", "transport"],
                registry=registry,
            )
        )
        self._first_event = _Children(
            Histogram(
                "gateway_time_to_first_event_seconds",
                "Time from a response's start to its first event sent.",
                ["model", "transport"],
                buckets=LATENCY_BUCKETS,
                registry=registry,
            )
        )
        self._first_token = _Children(
            Histogram(
                "gateway_time_to_first_token_seconds",
                "Time from a response's start to its first generated delta.",
                ["model"],
                buckets=LATENCY_BUCKETS,
                registry=registry,
            )
        )
        self._duration = _Children(
            Histogram(
                "gateway_response_duration_seconds",
                "Time from a response's start to its end.",
                ["model", "transport"],
                buckets=LATENCY_BUCKETS,
                registry=registry,
            )
        )
        self._added = _Children(
            Histogram(
                "gateway_overhead_seconds",
                "Time the gateway added to a response: from the request's arrival to the response's end, "
                "less the time spent waiting on the backend (connecting, sending, reading its answer) and "
                "on the gateway's tool calls.",
                ["transport"],
                buckets=OVERHEAD_BUCKETS,
                registry=registry,
            )
        )
        self._tokens = _Children(
            Counter(
                "gateway_tokens",
                "Tokens of ended responses, by model, API key name and direction (in, out).",
                ["model", "key", "direction"],
                registry=registry,
            )
        )
        self._active_streams = Gauge(
            "gateway_active_streams",
            "Responses being produced now, whatever their transport.",
            registry=registry,
            multiprocess_mode="livesum",
        )
        self._websockets = Gauge(
            "gateway_websocket_connections",
            "WebSocket connections open now.",
            registry=registry,
            multiprocess_mode="livesum",
        )
        self._heartbeats = Counter(
            "gateway_heartbeats", "SSE keep-alive comments sent to clients.", registry=registry
        )
        self._backend_errors = _Children(
            Counter(
                "gateway_backend_errors",
                "Backend calls that failed, by error code (backend_timeout, backend_unavailable, ...).",
                ["kind"],
                registry=registry,
            )
        )
        self._mcp_calls = _Children(
            Counter(
                "gateway_mcp_calls",
                "Gateway tool calls ended, by MCP server, tool and outcome (ok, error, timeout).",
                ["server", "tool", "outcome"],
                registry=registry,
            )
        )
        self._mcp_duration = _Children(
            Histogram(
                "gateway_mcp_call_duration_seconds",
                "Time a gateway tool call took.",
                ["server", "tool"],
                buckets=LATENCY_BUCKETS,
                registry=registry,
            )
        )
        self._web_tools = _Children(
            Counter(
                "gateway_web_tool_calls",
                "Web searches and page fetches the gateway ran, by tool and outcome (ok, or why not).",
                ["tool", "outcome"],
                registry=registry,
            )
        )
        self._web_duration = _Children(
            Histogram(
                "gateway_web_tool_duration_seconds",
                "Time a web search (the engine's answer) or a page fetch took.",
                ["tool"],
                buckets=LATENCY_BUCKETS,
                registry=registry,
            )
        )
        self._store = _Children(
            Histogram(
                "gateway_store_operation_duration_seconds",
                "Time a conversation-store call took, by operation and whether it succeeded.",
                ["operation", "ok"],
                buckets=STORE_BUCKETS,
                registry=registry,
            )
        )
        self._models = _Capped(_MAX_MODELS)
        self._keys = _Capped(_MAX_KEYS)
        self._mcp_servers = _Capped(_MAX_MCP_SERVERS)
        self._mcp_tools = _Capped(_MAX_MCP_TOOLS)
        self._error_kinds = _Capped(_MAX_ERROR_KINDS)
        self._running: set[str] = set()  # response ids counted in gateway_active_streams

    # --- the HTTP edge ---------------------------------------------------------------

    @_never_raises
    def http_request(self, *, route: str, method: str, status: int, seconds: float, key: str | None) -> None:
        method = method if method in _METHODS else OTHER  # any token is a valid method to h11
        self._http_requests(route, method, str(status), self._key(key)).inc()
        self._http_duration(route).observe(seconds)

    @_never_raises
    def websocket_opened(self) -> None:
        self._websockets.inc()

    @_never_raises
    def websocket_closed(self) -> None:
        self._websockets.dec()

    # --- turns ---------------------------------------------------------------------------

    @_never_raises
    def turn_started(self, outcome: TurnOutcome) -> None:
        if outcome.response_id not in self._running:
            self._running.add(outcome.response_id)
            self._active_streams.inc()

    @_never_raises
    def turn_finished(self, outcome: TurnOutcome) -> None:
        # Only a turn counted as started is counted as ended: the gauge never drifts below 0.
        if outcome.response_id in self._running:
            self._running.discard(outcome.response_id)
            self._active_streams.dec()
        model = self._model(outcome)
        key = self._key(outcome.key)
        transport = outcome.transport
        # A turn cut short by its client never reached a status of its own.
        status = outcome.final_status
        self._responses(model, status, key, transport).inc()
        started = outcome.started
        if outcome.first_event_at is not None:
            self._first_event(model, transport).observe(outcome.first_event_at - started)
        if outcome.first_token_at is not None:
            self._first_token(model).observe(outcome.first_token_at - started)
        if outcome.finished_at is not None:
            self._duration(model, transport).observe(outcome.finished_at - started)
            added = outcome.added
            if added is not None:
                self._added(transport).observe(added)
        usage = outcome.usage or {}
        tokens_in = int(usage.get("input_tokens") or 0)
        tokens_out = int(usage.get("output_tokens") or 0)
        if tokens_in > 0:
            self._tokens(model, key, "in").inc(tokens_in)
        if tokens_out > 0:
            self._tokens(model, key, "out").inc(tokens_out)

    @_never_raises
    def heartbeat(self) -> None:
        self._heartbeats.inc()

    @_never_raises
    def backend_error(self, kind: str, *, route: str | None = None) -> None:
        self._backend_errors(self._error_kinds(kind)).inc()

    @_never_raises
    def mcp_call(self, *, server: str, tool: str, outcome: str, seconds: float) -> None:
        server, tool = self._mcp_servers(server), self._mcp_tools(tool)
        self._mcp_calls(server, tool, outcome).inc()
        self._mcp_duration(server, tool).observe(seconds)

    @_never_raises
    def web_tool(self, *, tool: str, outcome: str, seconds: float) -> None:
        outcome = self._error_kinds(outcome)
        self._web_tools(tool, outcome).inc()
        self._web_duration(tool).observe(seconds)

    @_never_raises
    def store_operation(self, *, operation: str, seconds: float, ok: bool) -> None:
        self._store(operation, "true" if ok else "false").observe(seconds)

    # --- exposition ------------------------------------------------------------------------

    def exposition(self) -> tuple[bytes, str] | None:
        # The classic text format: what every Prometheus (and the parser) reads.
        return generate_latest(self._page), CONTENT_TYPE_PLAIN_0_0_4

    # --- bounded labels ------------------------------------------------------------------

    def _key(self, name: str | None) -> str:
        return ANONYMOUS_KEY if name is None else self._keys(name)

    def _model(self, outcome: TurnOutcome) -> str:
        """The model's label: a name becomes one once a response of it produced a token.

        The name is the client's: one the backend refuses (or that never
        worked) must not take a place under the cap.
        """
        if outcome.model in self._models:
            return outcome.model
        return self._models(outcome.model) if outcome.first_token_at is not None else OTHER


@contextlib.contextmanager
def shared_across_workers(settings: Settings) -> Iterator[Callable[[int], None]]:
    """Around the worker processes of `--workers N`: their metrics go to one directory.

    prometheus-client decides between in-memory and file-backed values from
    `PROMETHEUS_MULTIPROC_DIR` when a process first imports it, so the
    variable is set here, in the parent, before any worker starts (workers
    are spawned: they inherit the environment, never the parent's modules).
    A fresh directory is made and removed at exit, unless the operator named
    one (it is theirs: used as it is, never removed).

    Yields what to call with a worker's pid once it has exited: its share of
    the live gauges (open streams, WebSockets) goes with it.
    """
    if not settings.metrics_enabled:
        yield lambda pid: None
        return
    given = os.environ.get(_MULTIPROC_DIR) or None
    if given:
        os.makedirs(given, exist_ok=True)
    path = given or tempfile.mkdtemp(prefix="gateway-metrics-")
    os.environ[_MULTIPROC_DIR] = path

    def worker_exited(pid: int) -> None:
        try:
            multiprocess.mark_process_dead(pid, path)
        except OSError:
            log.debug("could not drop the metrics of worker %s", pid, exc_info=True)

    try:
        yield worker_exited
    finally:
        if given is None:
            os.environ.pop(_MULTIPROC_DIR, None)
            shutil.rmtree(path, ignore_errors=True)
