"""Each key's use over time, and the backends' recent errors: what the operator console shows.

`UsageLedger` is a `Telemetry` that keeps, in this process's memory, one
bucket per key per minute (requests, tokens in and out, errors) for the last
day, and the last backend errors.  It is fed by the hooks the gateway
already calls (`http_request`, `turn_finished`, `backend_error`), is bounded
(minutes kept, keys tracked, errors kept) and is always installed, metrics
or not.  Each worker process has its own.  Knows no HTTP library, route or
store; never sees prompt text.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import Telemetries, Telemetry
from .outcome import ANONYMOUS_KEY

if TYPE_CHECKING:
    from .outcome import TurnOutcome

__all__ = ["BackendError", "UsageBucket", "UsageLedger", "ledger_of"]

KEEP_MINUTES = 24 * 60  # one bucket a minute for a day, per key
MAX_KEYS = 1000  # keys tracked; later newcomers are counted together as `other` (as the metrics' key label)
MAX_BACKEND_ERRORS = 200
OTHER = "other"


@dataclass(frozen=True)
class UsageBucket:
    """One key's use in one minute."""

    minute: int  # epoch minute (wall-clock seconds // 60)
    requests: int
    tokens_in: int
    tokens_out: int
    errors: int  # HTTP answers of 400 and above, and turns that failed after a 2xx head


@dataclass(frozen=True)
class BackendError:
    """A backend call that failed."""

    at: float  # wall clock
    kind: str  # its error code, such as `backend_timeout`
    route: str | None  # the model route the request asked for, when known


class _Minute:
    __slots__ = ("errors", "requests", "tokens_in", "tokens_out")

    def __init__(self) -> None:
        self.requests = self.tokens_in = self.tokens_out = self.errors = 0


class UsageLedger(Telemetry):
    """Per-key use by the minute and the last backend errors, in memory, bounded."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.time,
        keep_minutes: int = KEEP_MINUTES,
        max_keys: int = MAX_KEYS,
        max_backend_errors: int = MAX_BACKEND_ERRORS,
    ) -> None:
        self._clock = clock
        self._keep = keep_minutes
        self._max_keys = max_keys
        # key name -> epoch minute -> counts, each inner dict in the order its minutes began
        self._keys: dict[str, dict[int, _Minute]] = {}
        self._current: dict[str, tuple[int, _Minute]] = {}  # each key's latest minute and its bucket
        self._errors: collections.deque[BackendError] = collections.deque(maxlen=max_backend_errors)

    def _bucket(self, key: str | None) -> _Minute:
        name = key or ANONYMOUS_KEY
        minute = int(self._clock() // 60)
        current = self._current.get(name)
        if current is not None and current[0] == minute:  # (most calls: the key's minute so far)
            return current[1]
        return self._new_bucket(name, minute)

    def _new_bucket(self, name: str, minute: int) -> _Minute:
        """The key's bucket for `minute`, made (and the day's oldest dropped) when it is new."""
        key = name
        minutes = self._keys.get(name)
        if minutes is None:
            if len(self._keys) >= self._max_keys:
                name = OTHER  # (a flood of names cannot grow this past one more)
                minutes = self._keys.get(name)
            if minutes is None:
                minutes = self._keys[name] = {}
        bucket = minutes.get(minute)
        if bucket is None:
            bucket = minutes[minute] = _Minute()
            oldest = minute - self._keep
            while True:  # a new minute: drop the ones past the day (oldest first, in insertion order)
                first = next(iter(minutes))
                if first > oldest:
                    break
                del minutes[first]
        if name == key:  # (a key past the cap is not remembered: the cache stays as bounded as the keys)
            self._current[name] = (minute, bucket)
        return bucket

    # --- the hooks -------------------------------------------------------------------------

    def http_request(self, *, route: str, method: str, status: int, seconds: float, key: str | None) -> None:
        bucket = self._bucket(key)
        bucket.requests += 1
        if status >= 400:
            bucket.errors += 1

    def turn_finished(self, outcome: TurnOutcome) -> None:
        usage = outcome.usage or {}
        tokens_in = int(usage.get("input_tokens", usage.get("prompt_tokens")) or 0)
        tokens_out = int(usage.get("output_tokens", usage.get("completion_tokens")) or 0)
        http_status = outcome.http_status
        on_socket = http_status is None  # a WebSocket turn: no HTTP request of its own is counted
        # A failure its HTTP status already showed is counted once, by `http_request`.
        failed = outcome.final_status == "failed" and (http_status is None or http_status < 400)
        if not (tokens_in or tokens_out or failed or on_socket):
            return
        bucket = self._bucket(outcome.key)
        bucket.tokens_in += max(tokens_in, 0)
        bucket.tokens_out += max(tokens_out, 0)
        bucket.requests += on_socket
        bucket.errors += failed

    def backend_error(self, kind: str, *, route: str | None = None) -> None:
        self._errors.append(BackendError(at=self._clock(), kind=kind, route=route))

    # --- what the console reads ------------------------------------------------------------

    def per_key(self, *, minutes: int = 60, now: float | None = None) -> dict[str, list[UsageBucket]]:
        """Each key's buckets of the last `minutes` (up to `now`, wall clock), oldest first;
        minutes without use have no bucket, keys without use in the span are left out.  Requests
        without a key are under `anonymous`; keys past the cap, under `other`."""
        current = int((self._clock() if now is None else now) // 60)
        since = current - max(0, min(minutes, self._keep)) + 1
        spans: dict[str, list[UsageBucket]] = {}
        for name, counts in self._keys.items():
            buckets = [
                UsageBucket(minute, bucket.requests, bucket.tokens_in, bucket.tokens_out, bucket.errors)
                for minute, bucket in sorted(counts.items())
                if since <= minute <= current
            ]
            if buckets:
                spans[name] = buckets
        return spans

    def recent_backend_errors(self, *, limit: int = 20) -> list[BackendError]:
        """The last `limit` backend errors, newest first."""
        if limit <= 0:
            return []
        errors = list(self._errors)[-limit:]
        errors.reverse()
        return errors


def ledger_of(telemetry: Telemetry) -> UsageLedger | None:
    """The ledger among `telemetry`'s parts (`build_telemetry` always puts one there), if any."""
    if isinstance(telemetry, UsageLedger):
        return telemetry
    if isinstance(telemetry, Telemetries):
        return next((part for part in telemetry.parts if isinstance(part, UsageLedger)), None)
    return None
