"""A request relayed to the backend as it is: `/v1/{path}`, and chat completions the gateway adds nothing to.

    prepare_relay   a `/v1/{path}` request, checked as every door is: the body
                    read strictly for a key with a model list (`wire`), the
                    models in the body, the query and the path, and for the
                    generation endpoints the key's tokens and streams
                    (reserved before the backend is called)
    Relay           what the relay transport needs, and `finish`: the
                    reservation settled from the usage the body reported,
                    and the outcome (for the generation endpoints and relayed
                    chat completions) reported like every response's

Nothing here reads or writes the relayed bytes (transport/passthrough.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import trio

from ..errors import GatewayError
from ..keys import ANONYMOUS, Caller, StreamSlot, token_reservation
from ..observe.outcome import TurnOutcome
from ..wire import read_relayed_body
from .context import RequestContext
from .engine import Resources
from .rounds import report_outcome

__all__ = ["GENERATION_PATHS", "Relay", "chat_relay", "prepare_relay"]

log = logging.getLogger("gateway.turn")

# Relayed paths that generate (or embed) tokens: admitted against a key's token
# limit and concurrent streams, their usage counted, their outcome reported.
GENERATION_PATHS = frozenset({"completions", "chat/completions", "embeddings"})


@dataclass
class Relay:
    """One relayed request: what to send, and what to settle when its answer has been relayed."""

    resources: Resources
    method: str
    path: str  # under /v1, normalised and percent-encoded
    query: bytes
    headers: dict[str, str]
    body: bytes
    caller: Caller = ANONYMOUS
    slot: StreamSlot | None = None
    outcome: TurnOutcome | None = None  # for generations: reported like every response's
    finished: bool = field(default=False, init=False)

    async def finish(self, *, status: int | None, usage: dict[str, int] | None, failed: str | None, client_left: bool) -> None:
        """The relayed answer is over: settle the reservation from `usage` (kept whole when the body
        reported none), and report the outcome (`failed`: the error code it ended with)."""
        if self.finished:
            return
        self.finished = True
        tokens = usage["total_tokens"] if usage is not None else (0 if status is None or status >= 400 else None)
        try:
            await self.resources.limiter.settle(self.slot, self.caller, tokens)
        except GatewayError:
            log.warning("could not count the tokens of a relayed /v1/%s", self.path)
        outcome = self.outcome
        if outcome is None:
            return
        outcome.http_status = status
        outcome.usage = usage
        outcome.client_left = client_left
        outcome.finished_at = trio.current_time()
        if failed is not None or status is None or status >= 400:
            outcome.status = "failed"
            outcome.error = {"code": failed or f"http_{status}"}
        elif not client_left:
            outcome.status = "completed"
        report_outcome(self.resources, outcome)


async def prepare_relay(
    resources: Resources, ctx: RequestContext, method: str, path: str, query: bytes, headers: dict[str, str], raw: bytes
) -> Relay:
    """A `/v1/{path}` request admitted for relaying (`path` already normalised).

    Raises:
        InvalidRequest: a body a key with a model list cannot have read strictly.
        NotFound: a model the key may not use (in the body, `?model=` or `models/{model}`).
        RateLimited: (generation endpoints) the key's tokens or streams are used up.
    """
    caller, limits = ctx.caller, ctx.caller.limits
    content_type = next((v for k, v in headers.items() if k.lower() == "content-type"), "")
    relayed = read_relayed_body(raw, content_type, strict=caller.key is not None and limits.models is not None)
    if relayed.content_type is not None:
        headers = {k: v for k, v in headers.items() if k.lower() != "content-type"}
        headers["content-type"] = relayed.content_type
    for model in (relayed.model, *_query_models(query), _model_in_path(path)):
        if model is not None:
            resources.limiter.check_model(caller, model)
    relay = Relay(resources, method, path, query, headers, relayed.data, caller)
    if method == "POST" and path in GENERATION_PATHS:
        fields = relayed.fields or ({"input": relayed.data.decode("utf-8", "replace")} if relayed.data else {})
        tokens, _ = token_reservation(fields, limits, generates=path != "embeddings")
        relay_id = resources.ids("relay")
        model = relayed.model or ""
        relay.slot = await resources.limiter.admit_stream(caller, model, relay_id, tokens=tokens)
        started = ctx.arrived if ctx.arrived is not None else trio.current_time()
        relay.outcome = TurnOutcome(relay_id, model, "relay", started, key=caller.name, request_id=ctx.request_id)
        resources.telemetry.turn_started(relay.outcome)
    return relay


def chat_relay(resources: Resources, turn: Any, query: bytes, headers: dict[str, str], body: bytes) -> Relay:
    """A chat completion the gateway adds nothing to (`ChatTurn.relayed`), relayed as bytes."""
    resources.telemetry.turn_started(turn.outcome)
    return Relay(
        resources, "POST", "chat/completions", query, headers, body, turn.caller, slot=turn.slot, outcome=turn.outcome
    )


def _query_models(query: bytes) -> list[str]:
    from urllib.parse import parse_qsl

    return [value for name, value in parse_qsl(query.decode("latin-1"), keep_blank_values=True) if name == "model"]


def _model_in_path(path: str) -> str | None:
    """The model a relayed path names (`models/{model}`), decoded."""
    head, _, rest = path.partition("/")
    return unquote(rest) if head == "models" and rest and "/" not in rest else None
