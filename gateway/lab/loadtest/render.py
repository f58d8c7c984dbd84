"""What a load test shows: the text summary and the self-contained HTML page of a `LoadReport`.

It owns the wording and layout of both: the summary's table of percentiles and failures by kind,
the page's settings, results, cumulative latency curves, timeline and longest silences (inline
SVG, nothing fetched). Every value from the configuration or from the server is escaped on
the page. It knows nothing of how the figures were measured: it reads a finished report.
"""

from __future__ import annotations

import html
import math
import time
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

from .config import DEFAULT_MAX_TOKENS, DEFAULT_REQUESTS
from .report import LoadReport, RequestResult

__all__ = ["format_summary", "percent", "render_html"]


def format_summary(report: LoadReport) -> str:
    """A compact, human summary."""
    c = report.config
    lines = [
        f"gateway loadtest: {_endpoint(c)}  model={c['model']}  "
        f"concurrency={c['concurrency']}",
        f"  {report.requests_completed} ok, {report.requests_failed} failed in "
        f"{report.wall_seconds:.2f} s: {report.throughput_rps:.1f} responses/s; "
        f"{report.connections_opened} new connections"
        + (f", {report.stale_connection_retries} found closed" if report.stale_connection_retries else ""),
    ]
    if report.failures:
        counted = report.requests_completed + report.requests_failed
        lines.append(f"  failed by kind ({report.requests_failed} of {counted}, {percent(report.error_rate)}):")
        for kind, n in report.failures.items():
            example = report.failure_examples.get(kind, "")
            lines.append(f"    {kind}: {n}" + (f"    e.g. {example[:120]}" if example else ""))
    lines.append(f"  {'(ms)':<18}{'p50':>9}{'p90':>9}{'p99':>9}{'max':>9}")
    for label, dist in (
        ("first byte", report.time_to_first_byte_ms),
        ("first event", report.time_to_first_event_ms),
        ("first text", report.time_to_first_text_ms),
        ("total", report.total_latency_ms),
        ("event gap", report.inter_event_gap_ms),
    ):
        cells = "".join(f"{_num(v):>9}" for v in (dist.p50, dist.p90, dist.p99, dist.max))
        lines.append(f"  {label:<18}{cells}")
    lines.append(
        f"  longest silence: max {_num(report.longest_silence_max_ms)} ms, "
        f"p99 {_num(report.longest_silence_p99_ms)} ms; heartbeats {report.heartbeats_total}; "
        f"events/response {_num(report.events_per_response)} in {_num(report.reads_per_response)} reads"
    )
    if report.server is not None:
        s = report.server
        lines.append(
            f"  server: cpu {s.cpu_seconds:.2f} s ({_num(s.cpu_per_response_ms)} ms/response) "
            f"over {s.processes_seen} processes; rss {_mib(s.rss_start_bytes)} -> peak "
            f"{_mib(s.rss_peak_bytes)} MiB"
        )
    lines.append(
        f"  loader: cpu {report.loader_cpu_seconds:.2f} s ({_num(report.loader_cpu_per_response_ms)} ms/response)"
    )
    return "\n".join(lines)


def percent(rate: float) -> str:
    """A fraction as a percentage with one decimal, as the summary and the verdict say it."""
    # One failure in thousands of requests must not read as 0.0%.
    text = f"{rate:.1%}"
    return "<0.1%" if rate and text == "0.0%" else text


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def _mib(value: int) -> str:
    return f"{value / 1048576:.1f}"


def _endpoint(config: dict[str, Any]) -> str:
    """`api` and the URL requested (the reported `path` already holds the base URL's path)."""
    parts = urlsplit(str(config["url"]))
    return f"{config['api']} {parts.scheme}://{parts.netloc}{config['path']}"


def _seconds(value: float) -> str:
    return f"{value:g} s"


def _duration_label(ms: float) -> str:
    """An axis tick: `250 ms`, `1.5 s`."""
    return f"{ms:g} ms" if ms < 1000 else f"{ms / 1000:g} s"


def _settings_rows(config: dict[str, Any]) -> list[tuple[str, str]]:
    """Every setting of the run, readable. A `LoadConfig` field without a label here is still
    shown, under its own name, so a new setting cannot silently go missing from the page."""
    rows: list[tuple[str, str]] = []
    for key, value in config.items():
        if key in ("url", "path", "api", "progress"):
            continue  # the endpoint row shows these; a progress bar does not change a result
        if key == "requests":
            if value is None:
                value = "as many as the duration allows" if config.get("duration") else f"{DEFAULT_REQUESTS} (default)"
        elif key == "duration":
            value = "until the requests are sent" if value is None else _seconds(value)
        elif key in ("timeout", "ramp_up"):
            value = "none" if not value else _seconds(value)
        elif key == "max_output_tokens" and value is None:
            # The Messages API requires max_tokens: the client sends its default.
            value = f"{DEFAULT_MAX_TOKENS} (the default)" if config.get("api") == "messages" else "the server's default"
        elif key == "headers":
            # Names only, even if a caller built the report from a raw config: values may be keys.
            names = [item[0] if isinstance(item, (list, tuple)) else item for item in value]
            value = ", ".join(map(str, names)) or "none"
        elif key == "input":
            text = str(value)
            value = f"{text[:160]}{'…' if len(text) > 160 else ''} ({len(text)} characters)"
        rows.append((_SETTING_LABELS.get(key, key), "-" if value is None else str(value)))
    return rows


_SETTING_LABELS = {
    "model": "model",
    "input": "input",
    "max_output_tokens": "max output tokens",
    "concurrency": "concurrent streams",
    "requests": "requests",
    "duration": "duration",
    "timeout": "per-request timeout",
    "warmup": "warm-up requests (not counted)",
    "headers": "extra headers (names)",
    "ramp_up": "ramp-up",
}

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1000px}
h1{font-size:20px;margin-bottom:4px}h2{font-size:16px;margin-top:28px}
.meta{color:#555;margin-top:0}
table{border-collapse:collapse}td,th{padding:3px 10px;border-bottom:1px solid #ddd;text-align:right}
td:first-child,th:first-child{text-align:left}
table.run td{text-align:left}
.example{font-family:ui-monospace,monospace;font-size:12px;text-align:left;max-width:640px;overflow-wrap:anywhere}
svg{background:#fafafa;border:1px solid #ddd}
.axis{stroke:#888;stroke-width:1}.grid{stroke:#e4e4e4;stroke-width:1}
text{font:11px system-ui,sans-serif;fill:#444}
"""

_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728")
_FAILED_COLOR = "#d62728"


def render_html(report: LoadReport) -> str:
    """A self-contained page: when, where and with which settings the run was made; the
    results; time to first event and total latency in panels of their own; completed and failed
    requests per second over the run; the longest silences. Inline SVG, nothing fetched; every
    value from the configuration or the server is escaped."""
    ok = [r for r in report.requests if r.error is None]
    esc = html.escape
    c = report.config
    endpoint = _endpoint(c)
    when = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(report.started_at))
    run_rows = [("started", when), ("machine", report.machine or "-"), ("endpoint", endpoint)]
    run_rows += _settings_rows(c)
    rows = [
        ("completed / failed", f"{report.requests_completed} / {report.requests_failed}"),
        ("wall time", f"{report.wall_seconds:.2f} s"),
        ("throughput", f"{report.throughput_rps:.2f} responses/s"),
        ("failed by kind", ", ".join(f"{k}: {v}" for k, v in report.failures.items()) or "none"),
        ("connections opened", str(report.connections_opened)),
        ("heartbeats", str(report.heartbeats_total)),
        ("longest silence max / p99", f"{_num(report.longest_silence_max_ms)} / {_num(report.longest_silence_p99_ms)} ms"),
        ("loader cpu", f"{report.loader_cpu_seconds:.2f} s ({_num(report.loader_cpu_per_response_ms)} ms/response)"),
    ]
    if report.server is not None:
        s = report.server
        rows.append(("server cpu", f"{s.cpu_seconds:.2f} s ({_num(s.cpu_per_response_ms)} ms/response)"))
        rows.append(("server rss start / peak", f"{_mib(s.rss_start_bytes)} / {_mib(s.rss_peak_bytes)} MiB"))
    run_table = "".join(f"<tr><td>{esc(k)}</td><td>{esc(v)}</td></tr>" for k, v in run_rows)
    summary = "".join(f"<tr><td>{esc(k)}</td><td>{esc(v)}</td></tr>" for k, v in rows)
    errors = ""
    if report.failures:
        errors = (
            "<h2>Errors by kind</h2><table><tr><th>kind</th><th>n</th><th>first example</th></tr>"
            + "".join(
                f"<tr><td>{esc(kind)}</td><td>{n}</td>"
                f"<td class='example'>{esc(report.failure_examples.get(kind, '')[:400])}</td></tr>"
                for kind, n in report.failures.items()
            )
            + "</table>"
        )
    dist_rows = "".join(
        f"<tr><td>{esc(label)}</td><td>{d.count}</td>"
        + "".join(f"<td>{_num(v)}</td>" for v in (d.p50, d.p90, d.p99, d.max))
        + "</tr>"
        for label, d in (
            ("time to first byte", report.time_to_first_byte_ms),
            ("time to first event", report.time_to_first_event_ms),
            ("time to first text", report.time_to_first_text_ms),
            ("total latency", report.total_latency_ms),
            ("inter-event gap", report.inter_event_gap_ms),
        )
    )
    # One panel each: a first event in milliseconds and a total in seconds do not share a scale.
    first_cdf = _svg_cdf(
        [("time to first event", [r.time_to_first_event * 1000 for r in ok if r.time_to_first_event is not None])]
    )
    total_cdf = _svg_cdf([("total latency", [r.total * 1000 for r in ok if r.total is not None])])
    timeline = _svg_timeline(report.requests, report.wall_seconds)
    silences = [
        (r.longest_silence * 1000, r.error is not None)
        for r in report.requests
        if r.status and r.longest_silence is not None
    ]
    bars = _svg_bars(silences)
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>gateway loadtest {esc(when)}</title><style>{_CSS}</style></head><body>"
        f"<h1>gateway loadtest: {esc(endpoint)}</h1>"
        f"<p class='meta'>{esc(when)} &middot; {report.requests_completed} completed, "
        f"{report.requests_failed} failed in {report.wall_seconds:.2f} s</p>"
        f"<h2>Run</h2><table class='run'>{run_table}</table>"
        f"<h2>Results</h2><table>{summary}</table>{errors}"
        "<h2>Latency (ms, successful requests)</h2><table><tr><th></th><th>n</th><th>p50</th>"
        f"<th>p90</th><th>p99</th><th>max</th></tr>{dist_rows}</table>"
        f"<h2>Time to first event (cumulative)</h2>{first_cdf}"
        f"<h2>Total latency (cumulative)</h2>{total_cdf}"
        "<h2>Throughput and errors over time (requests ended per second; failed in red)</h2>"
        f"{timeline}"
        "<h2>Longest silence per request (ms, in start order; failed requests in red)</h2>"
        f"{bars}</body></html>"
    )


def _nice_step(span: float, ticks: int) -> float:
    """A round tick step (1, 2 or 5 times a power of ten) giving about `ticks` ticks."""
    if span <= 0:
        return 1.0
    raw = span / ticks
    magnitude = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 5):
        if raw <= factor * magnitude:
            return factor * magnitude
    return 10 * magnitude


def _nice_scale(top: float, ticks: int) -> tuple[float, float]:
    """(axis maximum, tick step): the maximum rounded up to a whole number of steps."""
    step = _nice_step(top or 1.0, ticks)
    return step * max(1, math.ceil(top / step - 1e-9)), step


def _general(value: float) -> str:
    return f"{value:g}"


class _Plot:
    """Pixel geometry of one chart: a plot area with a left and a bottom margin for labels."""

    def __init__(self, width: int, height: int, x_max: float, y_max: float, *, top: int = 16) -> None:
        self.width, self.height = width, height
        self.left, self.top = 56, top
        self.plot_w = width - self.left - 20
        self.plot_h = height - self.top - 40
        self.x_max, self.y_max = x_max, y_max

    def x(self, value: float) -> float:
        return self.left + self.plot_w * value / self.x_max

    def y(self, value: float) -> float:
        return self.top + self.plot_h - self.plot_h * value / self.y_max

    def axes(
        self,
        x_step: float,
        y_step: float,
        y_fmt: Callable[[float], str],
        x_label: str,
        x_fmt: Callable[[float], str] = _general,
    ) -> list[str]:
        parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{self.width}' height='{self.height}'>"]
        bottom = self.top + self.plot_h
        for i in range(round(self.x_max / x_step) + 1):
            x = self.x(i * x_step)
            parts.append(f"<line class='grid' x1='{x:.1f}' y1='{self.top}' x2='{x:.1f}' y2='{bottom}'/>")
            parts.append(f"<text x='{x:.1f}' y='{bottom + 15}' text-anchor='middle'>{x_fmt(i * x_step)}</text>")
        for i in range(round(self.y_max / y_step) + 1):
            y = self.y(i * y_step)
            parts.append(f"<line class='grid' x1='{self.left}' y1='{y:.1f}' x2='{self.left + self.plot_w}' y2='{y:.1f}'/>")
            parts.append(f"<text x='{self.left - 6}' y='{y + 4:.1f}' text-anchor='end'>{y_fmt(i * y_step)}</text>")
        parts.append(f"<line class='axis' x1='{self.left}' y1='{bottom}' x2='{self.left + self.plot_w}' y2='{bottom}'/>")
        parts.append(f"<line class='axis' x1='{self.left}' y1='{self.top}' x2='{self.left}' y2='{bottom}'/>")
        parts.append(
            f"<text x='{self.left + self.plot_w / 2:.0f}' y='{self.height - 6}' text-anchor='middle'>"
            f"{html.escape(x_label)}</text>"
        )
        return parts

    def legend(self, index: int, color: str, label: str) -> str:
        x = self.left + 260 * index
        return (
            f"<rect x='{x}' y='8' width='12' height='10' fill='{color}'/>"
            f"<text x='{x + 18}' y='17'>{html.escape(label)}</text>"
        )


def _svg_cdf(series: list[tuple[str, list[float]]], width: int = 900, height: int = 320) -> str:
    top = max((max(values) for _, values in series if values), default=0.0)
    x_max, x_step = _nice_scale(top, 8)
    plot = _Plot(width, height, x_max, 1.0, top=34)  # room for the legend above the plot
    parts = plot.axes(x_step, 0.25, lambda v: f"{v:.0%}", "time since the request started", _duration_label)
    for index, (label, values) in enumerate(series):
        color = _COLORS[index % len(_COLORS)]
        ordered = sorted(values)
        n = len(ordered)
        if n:
            stride = max(1, n // 600)  # a few hundred points draw the same curve as thousands
            points = [f"{plot.x(ordered[0]):.1f},{plot.y(0):.1f}"]
            for i in list(range(0, n, stride)) + [n - 1]:
                points.append(f"{plot.x(ordered[i]):.1f},{plot.y((i + 1) / n):.1f}")
            parts.append(f"<polyline fill='none' stroke='{color}' stroke-width='2' points='{' '.join(points)}'/>")
        parts.append(plot.legend(index, color, f"{label} (n={n})"))
    parts.append("</svg>")
    return "".join(parts)


def _svg_timeline(requests: Sequence[RequestResult], wall: float, width: int = 900, height: int = 280) -> str:
    """Requests per second that ended in each slice of the run, the completed stacked under the
    failed. Slices are about a hundredth of the run (0.1 s at least): seconds for a minute's
    run, tenths for a few seconds', so a stall or a burst of errors shows where it happened."""
    bucket = max(0.1, _nice_step(wall, 100))
    count = max(1, math.ceil(wall / bucket - 1e-9))
    done, failed = [0] * count, [0] * count
    for r in requests:
        index = min(count - 1, max(0, int(r.ended / bucket)))
        (done if r.error is None else failed)[index] += 1
    y_max, y_step = _nice_scale(max((a + b for a, b in zip(done, failed)), default=0) / bucket, 5)
    x_max, x_step = _nice_scale(count * bucket, 8)
    plot = _Plot(width, height, x_max, y_max, top=34)
    parts = plot.axes(x_step, y_step, _general, "seconds into the run")
    parts.append(plot.legend(0, _COLORS[0], f"completed ({sum(done)})"))
    parts.append(plot.legend(1, _FAILED_COLOR, f"failed ({sum(failed)})"))
    bar_w = max(plot.plot_w * bucket / x_max * 0.85, 0.5)
    for index, (ok_count, failed_count) in enumerate(zip(done, failed)):
        if not ok_count + failed_count:
            continue
        x = plot.x(index * bucket)
        title = (
            f"<title>{index * bucket:g}–{(index + 1) * bucket:g} s: "
            f"{ok_count} completed, {failed_count} failed</title>"
        )
        for low, high, kind, color in (
            (0, ok_count, "completed", _COLORS[0]),
            (ok_count, ok_count + failed_count, "failed", _FAILED_COLOR),
        ):
            if high > low:
                top_y, low_y = plot.y(high / bucket), plot.y(low / bucket)
                parts.append(
                    f"<rect class='{kind}' x='{x:.2f}' y='{top_y:.2f}' width='{bar_w:.2f}' "
                    f"height='{low_y - top_y:.2f}' fill='{color}'>{title}</rect>"
                )
    parts.append("</svg>")
    return "".join(parts)


def _svg_bars(values: list[tuple[float, bool]], width: int = 900, height: int = 260) -> str:
    # Many requests: one bar per bucket of consecutive requests, showing the bucket's worst.
    size = max(1, math.ceil(len(values) / 600))
    bars = [
        (max(v for v, _ in values[i : i + size]), any(failed for _, failed in values[i : i + size]))
        for i in range(0, len(values), size)
    ]
    y_max, y_step = _nice_scale(max((v for v, _ in bars), default=0.0), 5)
    x_max, x_step = _nice_scale(float(max(1, len(values))), 8)
    plot = _Plot(width, height, x_max, y_max)
    parts = plot.axes(x_step, y_step, _general, "request (in start order)")
    bar_w = plot.plot_w * size / x_max
    for i, (value, failed) in enumerate(bars):
        color = _FAILED_COLOR if failed else _COLORS[0]
        y = plot.y(value)
        parts.append(
            f"<rect x='{plot.x(i * size):.2f}' y='{y:.2f}' width='{max(bar_w * 0.85, 0.5):.2f}' "
            f"height='{plot.top + plot.plot_h - y:.2f}' fill='{color}'/>"
        )
    parts.append("</svg>")
    return "".join(parts)
