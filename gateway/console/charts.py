"""A key's use over time as the shapes of a small inline SVG chart (pure).

One slot per minute of the span (the last hour by default), oldest on the
left: requests as bars, the errors among them as bars over those (one
scale), tokens (in and out) as a line on a scale of its own.  The template
draws the shapes with presentation attributes only (the console's CSP
allows no inline style), and the chart's title and the text beside it say
the totals, for a reader that does not see it.

Knows the usage ledger's buckets; no HTTP, no template.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..observe.usage import UsageBucket

__all__ = ["Bar", "UsageChart", "usage_chart"]


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float


@dataclass(frozen=True)
class UsageChart:
    width: int
    height: int
    minutes: int
    requests: list[Bar]
    errors: list[Bar]
    tokens: str  # the token line's points ("x,y x,y ..."), empty without tokens
    total_requests: int
    total_tokens: int
    total_errors: int

    @property
    def summary(self) -> str:
        """The chart in words (its title, and what a screen reader says)."""
        return (
            f"last {self.minutes} minutes: {self.total_requests} requests, {self.total_tokens} tokens, "
            f"{self.total_errors} errors"
        )


def usage_chart(
    buckets: Sequence[UsageBucket], *, now: float, minutes: int = 60, width: int = 240, height: int = 48
) -> UsageChart:
    """The chart of `buckets` (one key's, any order) over the `minutes` up to `now` (wall clock)."""
    current = int(now // 60)
    first = current - minutes + 1
    by_minute = {bucket.minute: bucket for bucket in buckets if first <= bucket.minute <= current}
    slot = width / minutes
    peak_requests = max((bucket.requests for bucket in by_minute.values()), default=0)
    peak_tokens = max((bucket.tokens_in + bucket.tokens_out for bucket in by_minute.values()), default=0)
    requests: list[Bar] = []
    errors: list[Bar] = []
    points: list[str] = []
    for index in range(minutes):
        bucket = by_minute.get(first + index)
        x = round(index * slot, 2)
        count = bucket.requests if bucket else 0
        failed = min(bucket.errors, count) if bucket else 0
        tokens = bucket.tokens_in + bucket.tokens_out if bucket else 0
        if count and peak_requests:
            tall = height * count / peak_requests
            requests.append(Bar(x, round(height - tall, 2), round(slot * 0.8, 2), round(tall, 2)))
        if failed and peak_requests:
            tall = height * failed / peak_requests
            errors.append(Bar(x, round(height - tall, 2), round(slot * 0.8, 2), round(tall, 2)))
        if peak_tokens:
            points.append(f"{round(x + slot * 0.4, 2)},{round(height - height * tokens / peak_tokens, 2)}")
    return UsageChart(
        width=width,
        height=height,
        minutes=minutes,
        requests=requests,
        errors=errors,
        tokens=" ".join(points),
        total_requests=sum(bucket.requests for bucket in by_minute.values()),
        total_tokens=sum(bucket.tokens_in + bucket.tokens_out for bucket in by_minute.values()),
        total_errors=sum(bucket.errors for bucket in by_minute.values()),
    )
