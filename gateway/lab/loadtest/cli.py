"""The `gateway loadtest` command: options, the run, the outputs and the exit status.

It owns the options (`add_arguments`, which `gateway loadtest` and `python -m
gateway.lab.loadtest` share), their reading into a `LoadConfig`, the decision to show progress
(by default when stderr is a terminal), where the summary, JSON and HTML go, and the verdict:
exit 1 when more than `--max-error-rate` of the counted requests failed or none succeeded. It
knows nothing of how requests are made or measured.
"""

from __future__ import annotations

import argparse
import sys

import trio

from ..fdlimit import raise_fd_limit
from .config import APIS, DEFAULT_INPUT, DEFAULT_MAX_TOKENS, DEFAULT_REQUESTS, LoadConfig
from .render import format_summary, percent, render_html
from .report import LoadReport
from .run import run_load

__all__ = ["add_arguments", "build_parser", "main"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the loadtest options to `parser` (the `gateway loadtest` subcommand uses this)."""
    parser.add_argument("--url", default="http://127.0.0.1:8080", help="server base URL (default: %(default)s)")
    parser.add_argument("--api", choices=APIS, default="responses",
                        help="POST /v1/responses, /v1/chat/completions (a backend directly, for a baseline), "
                        "or Anthropic's /v1/messages")
    parser.add_argument("--no-stream", dest="stream", action="store_false",
                        help="ask for JSON answers (\"stream\": false) instead of event streams")
    parser.add_argument("--websocket", action="store_true",
                        help="the Responses API's WebSocket mode: a connection per worker, its turns in sequence")
    parser.add_argument("--model", default="sim", help="model name (default: %(default)s)")
    parser.add_argument("--input", default=DEFAULT_INPUT, help="the user message")
    parser.add_argument("--max-output-tokens", type=int,
                        help=f"max_output_tokens (max_tokens for chat and messages; messages default {DEFAULT_MAX_TOKENS})")
    parser.add_argument("--concurrency", "-c", type=int, default=1, help="concurrent streams (default: 1)")
    parser.add_argument("--requests", "-n", type=int,
                        help=f"total requests (default: unlimited with --duration, else {DEFAULT_REQUESTS})")
    parser.add_argument("--duration", "-d", type=float, help="stop starting requests after SECONDS")
    parser.add_argument("--timeout", type=float, help="per-request timeout in seconds, connect included")
    parser.add_argument("--ramp-up", type=float, default=0.0, help="seconds over which the workers start (default 0)")
    parser.add_argument("--warmup", type=int, default=0, help="requests sent first and not counted")
    parser.add_argument("--header", "-H", action="append", default=[], metavar="K:V",
                        help="extra request header (repeatable)")
    parser.add_argument("--server-pid", action="append", type=int, default=[], metavar="PID",
                        help="server pid to sample for CPU time and RSS, children included (repeatable)")
    parser.add_argument("--json", dest="json_path", metavar="PATH", help="write the report as JSON")
    parser.add_argument("--json-requests", action="store_true", help="include per-request records in --json")
    parser.add_argument("--html", dest="html_path", metavar="PATH", help="write an HTML report with charts")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="show a live progress line on stderr (default: when stderr is a terminal)")
    parser.add_argument("--max-error-rate", type=float, default=0.0, metavar="R",
                        help="exit 1 when more than this fraction (0..1) of the counted requests failed "
                        "(default 0: any failure)")


def _config_from(args: argparse.Namespace) -> LoadConfig:
    headers = []
    for item in args.header:
        name, sep, value = item.partition(":")
        if not sep:
            raise ValueError(f"--header needs K:V, got {item!r}")
        headers.append((name.strip(), value.strip()))
    # The line is rewritten in place, which only a terminal shows as one line; asked for
    # explicitly, it is written wherever stderr goes.
    progress = args.progress if args.progress is not None else sys.stderr.isatty()
    return LoadConfig(
        url=args.url,
        api=args.api,
        model=args.model,
        input=args.input,
        max_output_tokens=args.max_output_tokens,
        concurrency=args.concurrency,
        requests=args.requests,
        duration=args.duration,
        timeout=args.timeout,
        warmup=args.warmup,
        headers=tuple(headers),
        progress=progress,
        ramp_up=args.ramp_up,
        stream=args.stream,
        websocket=args.websocket,
    )


def _max_error_rate(args: argparse.Namespace) -> float:
    rate = float(getattr(args, "max_error_rate", 0.0))
    if not 0 <= rate <= 1:  # NaN fails this too
        raise ValueError(f"--max-error-rate must be a fraction from 0 to 1, got {rate:g}")
    return rate


def _verdict(report: LoadReport, max_error_rate: float) -> str | None:
    """Why the run fails, in one line, or None when it passes: more than `max_error_rate` of
    the counted requests failed, or none succeeded."""
    counted = report.requests_completed + report.requests_failed
    if report.requests_failed and report.error_rate > max_error_rate:
        return (
            f"{report.requests_failed} of {counted} requests failed ({percent(report.error_rate)}), "
            f"above --max-error-rate {max_error_rate:g}"
        )
    if not report.requests_completed:
        return f"none of {counted} requests succeeded" if counted else "no request was made"
    return None


def main(args: argparse.Namespace) -> int:
    """Run the load test described by parsed `args`, print a summary and write the outputs.

    Returns 0 when the run passed, 1 (with one line on stderr saying why) when more than
    `--max-error-rate` of the counted requests failed or none succeeded, 2 for invalid options.
    """
    try:
        config = _config_from(args)
        max_error_rate = _max_error_rate(args)
    except ValueError as error:
        print(f"gateway loadtest: {error}", file=sys.stderr)
        return 2
    raise_fd_limit()
    try:
        report = trio.run(lambda: run_load(config, server_pids=args.server_pid))
    except KeyboardInterrupt:
        print("gateway loadtest: interrupted", file=sys.stderr)
        return 130
    print(format_summary(report))
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as file:
            file.write(report.to_json(include_requests=getattr(args, "json_requests", False)))
    if args.html_path:
        with open(args.html_path, "w", encoding="utf-8") as file:
            file.write(render_html(report))
    problem = _verdict(report, max_error_rate)
    if problem is not None:
        print(f"gateway loadtest: {problem}", file=sys.stderr)
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The standalone parser, for `python -m gateway.lab.loadtest`."""
    parser = argparse.ArgumentParser(
        prog="gateway loadtest",
        description="Run concurrent streams against a Responses, Chat Completions or Messages endpoint and measure them.",
    )
    add_arguments(parser)
    return parser
