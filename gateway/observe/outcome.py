"""How one response went: the outcome every transport fills in, and the one log line it becomes.

Every response -- Responses (SSE, JSON, WebSocket, background), chat
completions (with the gateway's tools or relayed as bytes), compaction --
ends as one `TurnOutcome`: its final status (`completed`, `incomplete`,
`failed`, `cancelled`, or `client_left` when the client went away before
the end), the HTTP status actually sent, the backend that answered, usage,
timings and the error code.  `Telemetry.turn_finished` counts it and
`log_outcome` writes its line.  Knows no turn, transport or HTTP library.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

__all__ = ["ANONYMOUS_KEY", "TERMINAL_STATUSES", "TurnOutcome", "log_outcome"]

ANONYMOUS_KEY = "anonymous"  # who a request without an API key is, in the log line and the metrics

log = logging.getLogger("gateway")

TERMINAL_STATUSES = frozenset({"completed", "incomplete", "failed", "cancelled"})


@dataclass
class TurnOutcome:
    """How one response went, for the log line, the limits and the metrics."""

    response_id: str
    model: str
    transport: str  # sse, json, websocket, background, compact, chat-sse, chat-json, chat-relay
    started: float  # trio time
    key: str | None = None  # the API key's name, when keys are configured
    request_id: str | None = None
    status: str = "in_progress"
    http_status: int | None = 200  # the status the client was sent (None: none, a WebSocket turn)
    backend: str | None = None  # which backend answered (its name and URL, no secrets)
    first_event_at: float | None = None
    first_token_at: float | None = None  # the first generated delta
    finished_at: float | None = None
    usage: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    rounds: int = 0
    client_left: bool = False
    waited: float = 0.0  # seconds spent waiting on backends and on the gateway's tool calls

    @property
    def added(self) -> float | None:
        """What the gateway added to the response: its duration less the time it waited on
        backends and tools (None before it finished)."""
        if self.finished_at is None:
            return None
        return max(0.0, self.finished_at - self.started - self.waited)

    @property
    def final_status(self) -> str:
        """The status it ended with: a response its client left before it ended is `client_left`."""
        if self.client_left and self.status not in TERMINAL_STATUSES:
            return "client_left"
        return self.status

    def note_events(self, now: float, generated: bool) -> None:
        """Something was sent at `now` (`generated`: it carried generated text or calls)."""
        if self.first_event_at is None:
            self.first_event_at = now
        if generated and self.first_token_at is None:
            self.first_token_at = now


def log_outcome(outcome: TurnOutcome, now: float) -> None:
    """The one line per response at INFO (no prompt text); its fields are the JSON log's keys."""
    if not log.isEnabledFor(logging.INFO):
        return  # (not even built: next to a relayed chat completion's small cost, building it shows)
    end = outcome.finished_at if outcome.finished_at is not None else now

    def ms(at: float | None) -> float | None:
        return round((at - outcome.started) * 1000, 1) if at is not None else None

    usage = outcome.usage or {}
    fields: dict[str, Any] = {
        "response_id": outcome.response_id,
        "request_id": outcome.request_id,
        "key": outcome.key or ANONYMOUS_KEY,  # (as the metrics' `key` label says it)
        "model": outcome.model,
        "transport": outcome.transport,
        "status": outcome.final_status,
        "http_status": outcome.http_status,
        "backend": outcome.backend,
        "duration_ms": ms(end),
        "first_event_ms": ms(outcome.first_event_at),
        "first_token_ms": ms(outcome.first_token_at),
        "input_tokens": usage.get("input_tokens", usage.get("prompt_tokens")),
        "output_tokens": usage.get("output_tokens", usage.get("completion_tokens")),
        "rounds": outcome.rounds,
        "error": (outcome.error or {}).get("code"),
        "client_left": outcome.client_left,
    }
    text = " ".join(
        f"{name}={'-' if value is None else value}"
        for name, value in fields.items()
        if name not in ("response_id", "client_left") and (value is not None or name == "first_event_ms")
    )
    log.info("%s %s%s", outcome.response_id, text, " client_left" if outcome.client_left else "", extra={"fields": fields})
