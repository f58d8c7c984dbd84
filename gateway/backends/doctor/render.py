"""The doctor's output: a table for the operator, a JSON document for a script, and the exit status.

Pure: reports in, text and a number out.  It knows the rows' shape (`checks.Row`), nothing of
how they were found.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import orjson

from .checks import CLIENTS, Row

__all__ = ["Report", "exit_status", "redacted", "render_json", "render_table"]


@dataclass(frozen=True)
class Report:
    """The rows of one backend of one route."""

    route: str
    backend: str
    model: str
    url: str  # without credentials
    server: str | None  # the server's flavour, when recognised
    rows: tuple[Row, ...]


def exit_status(reports: Sequence[Report]) -> int:
    """1 when a row some client needs failed, else 0 (a nice-to-have row is at worst `warn`)."""
    return 1 if any(row.verdict == "fail" for report in reports for row in report.rows) else 0


def redacted(report: Report, redact: Callable[[str], str]) -> Report:
    """The report with every detail and fix passed through `redact` (the backends' keys out)."""
    rows = tuple(replace(row, detail=redact(row.detail), fix=redact(row.fix)) for row in report.rows)
    return replace(report, rows=rows)


def _needed(row: Row) -> str:
    if not row.needed_by:
        return "nice to have"
    return "all three" if row.needed_by == CLIENTS else ", ".join(row.needed_by)


_WIDTH = 100


def render_table(reports: Sequence[Report]) -> str:
    """One block per route and backend, a line per check, its fix under it when not ok."""
    lines: list[str] = []
    for report in reports:
        server = f", {report.server}" if report.server else ""
        lines.append(f"route {report.route} -> backend {report.backend} ({report.url}{server}), model {report.model}")
        lines.append(f"  {'check':<20} {'verdict':<7} {'needed by':<12}  detail")
        for row in report.rows:
            head = f"  {row.check:<20} {row.verdict.upper() if row.verdict == 'fail' else row.verdict:<7} {_needed(row):<12}  "
            wrapped = textwrap.wrap(row.detail, _WIDTH - len(head)) or [""]
            lines.append(head + wrapped[0])
            lines += [" " * len(head) + more for more in wrapped[1:]]
            if row.fix:
                label = "hint: " if row.verdict == "n/a" else "fix: "  # (n/a is no fault: a hint for who wants it)
                indent = " " * len(head)
                lines += textwrap.wrap(row.fix, _WIDTH, initial_indent=indent + label, subsequent_indent=indent + " " * len(label))
        lines.append("")
    failed = [f"{r.route} ({r.backend}): {row.check}" for r in reports for row in r.rows if row.verdict == "fail"]
    warned = sum(row.verdict == "warn" for r in reports for row in r.rows)
    if failed:
        lines.append(f"{len(failed)} check{'s' if len(failed) != 1 else ''} a client needs failed: {'; '.join(failed)}")
    else:
        lines.append(f"every check a client needs passed ({warned} warning{'s' if warned != 1 else ''})")
    return "\n".join(lines)


def render_json(reports: Sequence[Report]) -> str:
    """The same, for a script: routes, each with its rows (name, verdict, detail, fix, needed_by)."""
    document = {
        "routes": [
            {
                "route": report.route,
                "backend": report.backend,
                "model": report.model,
                "url": report.url,
                "server": report.server,
                "rows": [
                    {"name": row.check, "verdict": row.verdict, "detail": row.detail, "fix": row.fix or None, "needed_by": list(row.needed_by)}
                    for row in report.rows
                ],
            }
            for report in reports
        ],
        "exit_status": exit_status(reports),
    }
    return orjson.dumps(document, option=orjson.OPT_INDENT_2).decode()
