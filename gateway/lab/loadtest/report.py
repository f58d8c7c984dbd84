"""The results of a run: one request's measurements, their aggregate, and its JSON.

It owns `RequestResult` (and what each error kind means), the running `Counters`, `aggregate`
(results to a `LoadReport`: percentiles, failures by kind, the server's usage) and the
report's JSON, including what a report says about when, where and with which settings it was
made. Reports never carry header values or a password in the URL: they are often keys, and
reports get shared. It knows nothing of sockets or of how the figures were measured, nor of
the text and HTML that show them (`render.py`).

Error kinds (`RequestResult.error`): ``connect`` (TCP connect failed), ``http_status`` (status
not 2xx), ``no_terminal`` (the body ended without `response.completed`/`response.incomplete`,
for chat without `[DONE]`, for messages without `message_stop`), ``failed_event`` (a
`response.failed` or `error` event, or a chat `{"error": ...}` chunk), ``timeout``
(`LoadConfig.timeout`), ``read`` (the connection failed or closed mid-response), ``protocol``
(the server's bytes are not valid HTTP/1.1 framing).

The report counts failures by a finer kind (`RequestResult.failure_kind`, `LoadReport.failures`):
``http <status>`` and ``failed_event``, each followed by the error's `code` when the server gave
one, and ``reset`` for ``read``; the other kinds keep their names. The code is read only where a
failure was already seen: from the first 64 KiB of a non-2xx body, or of an error/failed frame.
"""

from __future__ import annotations

import math
import os
import platform
from array import array
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any
from urllib.parse import urlsplit

import orjson
import psutil

from .config import LoadConfig
from .sampler import ProcessSampler, ServerUsage

__all__ = ["Counters", "LoadReport", "Percentiles", "RequestResult", "aggregate", "cpu_model"]


@dataclass(slots=True)
class RequestResult:
    """One request's measurements. Times are seconds from the request's start (before connect
    when a new connection was needed); `started` and `ended` (when it finished, whatever the
    outcome) are seconds from the start of the run.
    `longest_silence` is the longest wait for body bytes, counted from the moment the request
    was written, so a slow first token without heartbeats counts; on a timeout it includes the
    final wait."""

    started: float = 0.0
    ended: float = 0.0
    status: int = 0
    error: str | None = None
    error_detail: str = ""
    time_to_first_byte: float | None = None
    time_to_first_event: float | None = None
    time_to_first_text: float | None = None
    total: float | None = None
    events: int = 0
    heartbeats: int = 0  # keep-alives: SSE comments, and Anthropic's `ping` events
    reads: int = 0  # body reads: events per read shows how much the kernel coalesced
    gaps: array[float] = field(default_factory=lambda: array("d"))
    longest_silence: float | None = None
    terminal: str | None = None
    saw_done: bool = False
    new_connection: bool = False
    # The error's `code` as the server said it: in a non-2xx JSON body, an `error` or
    # `response.failed` event, or a chat error chunk.
    code: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def failure_kind(self) -> str | None:
        """The row this request counts under in `LoadReport.failures`, None if it succeeded:
        ``http 503 server_shutting_down``, ``http 500``, ``failed_event server_error``,
        ``failed_event``, ``reset`` (for `error` ``read``), ``timeout``, ``connect``,
        ``protocol``, ``no_terminal``."""
        error = self.error
        if error is None:
            return None
        if error == "http_status":
            kind = f"http {self.status}"
        elif error == "read":
            return "reset"
        elif error == "failed_event":
            kind = error
        else:
            return error
        return f"{kind} {self.code}" if self.code else kind


@dataclass(frozen=True)
class Percentiles:
    """A distribution in milliseconds (nearest-rank percentiles); all None when empty."""

    count: int
    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None
    max: float | None

    @classmethod
    def of(cls, seconds: Sequence[float]) -> Percentiles:
        values = sorted(seconds)
        n = len(values)
        if not n:
            return cls(0, None, None, None, None, None)

        def rank(p: float) -> float:
            return _ms(values[max(0, math.ceil(p / 100 * n) - 1)])

        return cls(n, _ms(math.fsum(values) / n), rank(50), rank(90), rank(99), _ms(values[-1]))


@dataclass
class Counters:
    """Running totals of one run, kept as it goes: the clients count connections and retries,
    the run counts outcomes, the progress line reads them."""

    connections_opened: int = 0
    stale_retries: int = 0
    completed: int = 0
    failed: int = 0


@dataclass
class LoadReport:
    """The aggregate of one run. Latency distributions cover successful requests; longest
    silences cover every request that got response headers (a stall that ended in a timeout is
    exactly what they are for).

    `errors` counts failed requests by `RequestResult.error`; `failures` by the finer
    `RequestResult.failure_kind` (most frequent first), with one sample message of each in
    `failure_examples`."""

    config: dict[str, Any]
    started_at: float
    wall_seconds: float
    requests_completed: int
    requests_failed: int
    throughput_rps: float
    status_codes: dict[str, int]
    errors: dict[str, int]
    error_examples: dict[str, str]
    terminals: dict[str, int]
    time_to_first_byte_ms: Percentiles
    time_to_first_event_ms: Percentiles
    time_to_first_text_ms: Percentiles
    total_latency_ms: Percentiles
    inter_event_gap_ms: Percentiles
    longest_silence_max_ms: float | None
    longest_silence_p99_ms: float | None
    events_total: int
    events_per_response: float | None
    reads_per_response: float | None
    heartbeats_total: int
    connections_opened: int
    stale_connection_retries: int
    loader_cpu_seconds: float
    loader_cpu_per_response_ms: float | None
    server: ServerUsage | None
    machine: str = ""  # where the run was made: CPU, cores, OS, Python
    failures: dict[str, int] = field(default_factory=dict)
    failure_examples: dict[str, str] = field(default_factory=dict)
    requests: list[RequestResult] = field(default_factory=list, repr=False)

    @property
    def error_rate(self) -> float:
        """Failed requests as a fraction of the counted ones (warm-up excluded); 0 when none."""
        counted = self.requests_completed + self.requests_failed
        return self.requests_failed / counted if counted else 0.0

    def to_json(self, *, include_requests: bool = False) -> str:
        """The report as indented JSON; per-request records only when asked (they are large)."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "requests"}
        if include_requests:
            data["requests"] = self.requests
        return orjson.dumps(data, default=_json_default, option=orjson.OPT_INDENT_2).decode()


def cpu_model() -> str:
    """The CPU's model name, as well as the system tells it."""
    model = platform.processor() or platform.machine()
    try:  # Linux names the CPU model only here; elsewhere `platform.processor()` does
        with open("/proc/cpuinfo", encoding="utf-8") as file:
            model = next((line.split(":", 1)[1].strip() for line in file if line.startswith("model name")), model)
    except OSError:
        pass
    return model


def _describe_machine() -> str:
    """This machine in a line: CPU model, CPUs, memory, OS and Python (not the host name)."""
    model = cpu_model()
    logical = psutil.cpu_count(logical=True) or os.cpu_count() or 1
    physical = psutil.cpu_count(logical=False)
    cores = f"{logical} CPUs" if physical in (None, logical) else f"{physical} cores / {logical} threads"
    memory = psutil.virtual_memory().total / 2**30
    return (
        f"{model}, {cores}, {memory:.1f} GiB RAM, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}"
    )


def _json_default(value: object) -> object:
    if isinstance(value, array):
        return value.tolist()
    raise TypeError(f"cannot serialize {type(value).__name__}")


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def aggregate(
    config: LoadConfig,
    results: list[RequestResult],
    counters: Counters,
    started_at: float,
    wall: float,
    loader_cpu: float,
    sampler: ProcessSampler | None,
) -> LoadReport:
    """The report of a run: `results` of the counted requests, the `counters` without the
    warm-up's, `started_at` (wall clock), `wall` and `loader_cpu` (seconds), and the server's
    usage from `sampler` when one ran."""
    ok = [r for r in results if r.error is None]
    completed = len(ok)
    gaps: array[float] = array("d")
    for r in ok:
        gaps.extend(r.gaps)
    silences = sorted(r.longest_silence for r in results if r.status and r.longest_silence is not None)
    silence_p99 = Percentiles.of(silences).p99
    events_total = sum(r.events for r in ok)
    server = None
    if sampler is not None:
        cpu = sampler.cpu_seconds
        server = ServerUsage(
            pids=list(sampler.pids),
            processes_seen=sampler.processes_seen,
            cpu_seconds=round(cpu, 3),
            cpu_per_response_ms=_ms(cpu / completed) if completed else None,
            rss_start_bytes=sampler.rss_start_bytes,
            rss_peak_bytes=sampler.rss_peak_bytes,
            rss_growth_per_stream_bytes=round(
                max(0, sampler.rss_peak_bytes - sampler.rss_start_bytes) / config.concurrency, 1
            ),
            samples=sampler.samples,
        )
    errors = Counter(r.error for r in results if r.error is not None)
    examples: dict[str, str] = {}
    kinds: Counter[str] = Counter()
    kind_examples: dict[str, str] = {}
    for r in results:
        if r.error is not None and r.error not in examples:
            examples[r.error] = r.error_detail
        kind = r.failure_kind
        if kind is not None:
            kinds[kind] += 1
            kind_examples.setdefault(kind, r.error_detail)
    failures = dict(sorted(kinds.items(), key=lambda item: (-item[1], item[0])))
    return LoadReport(
        machine=_describe_machine(),
        config=_reported_config(config),
        started_at=started_at,
        wall_seconds=round(wall, 6),
        requests_completed=completed,
        requests_failed=len(results) - completed,
        throughput_rps=round(completed / wall, 3) if wall > 0 else 0.0,
        status_codes=dict(sorted(Counter(str(r.status) for r in results if r.status).items())),
        errors=dict(sorted(errors.items())),
        error_examples=examples,
        failures=failures,
        failure_examples={kind: kind_examples[kind] for kind in failures},
        terminals=dict(sorted(Counter(r.terminal for r in ok if r.terminal).items())),
        time_to_first_byte_ms=Percentiles.of([r.time_to_first_byte for r in ok if r.time_to_first_byte is not None]),
        time_to_first_event_ms=Percentiles.of(
            [r.time_to_first_event for r in ok if r.time_to_first_event is not None]
        ),
        time_to_first_text_ms=Percentiles.of([r.time_to_first_text for r in ok if r.time_to_first_text is not None]),
        total_latency_ms=Percentiles.of([r.total for r in ok if r.total is not None]),
        inter_event_gap_ms=Percentiles.of(gaps),
        longest_silence_max_ms=_ms(silences[-1]) if silences else None,
        longest_silence_p99_ms=silence_p99,
        events_total=events_total,
        events_per_response=round(events_total / completed, 2) if completed else None,
        reads_per_response=round(sum(r.reads for r in ok) / completed, 2) if completed else None,
        heartbeats_total=sum(r.heartbeats for r in results),
        connections_opened=counters.connections_opened,
        stale_connection_retries=counters.stale_retries,
        loader_cpu_seconds=round(loader_cpu, 4),
        loader_cpu_per_response_ms=_ms(loader_cpu / completed) if completed else None,
        server=server,
        requests=results,
    )


def _reported_config(config: LoadConfig) -> dict[str, Any]:
    """The settings as the JSON and HTML reports show them. Header values and a password in the
    URL are left out: they are often keys, and reports get shared."""
    data = asdict(config)
    data["headers"] = [name for name, _ in config.headers]
    parts = urlsplit(config.url)
    if "@" in parts.netloc:
        data["url"] = parts._replace(netloc=parts.netloc.rsplit("@", 1)[-1]).geturl()
    data["path"] = config.endpoint().path
    return data
