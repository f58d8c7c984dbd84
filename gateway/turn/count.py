"""Counting a request's input tokens (`POST /v1/responses/input_tokens`), exactly.

The body is a create's, planned by the same steps a create takes
(`prepare_turn`: `previous_response_id` and its chain, a `conversation`'s
items, `instructions`, the client's tools; then the gateway's own tools,
hosted and configured, offered by the same rule as in `Turn`), so that what
is counted is the chat request the first backend round would send.  The
backend counts it (`ChatBackend.count_tokens`): its tokenizer, or a
completion's usage, never an estimate.

Nothing is stored, no tokens are reserved and no stream slot is taken: the
key's model list still holds (404 `model_not_found`, as for a create).
Knows the turn engine and the backend interface; nothing of HTTP.
"""

from __future__ import annotations

import contextlib
from typing import Any

from ..wire import CreateResponseRequest
from .context import RequestContext
from .engine import Resources, prepare_turn

__all__ = ["count_input_tokens"]


async def count_input_tokens(resources: Resources, req: CreateResponseRequest, ctx: RequestContext) -> dict[str, Any]:
    """`{"object": "response.input_tokens", "input_tokens": N}` for the create request `req`.

    Raises:
        InvalidRequest: the request could not be created as it is (400).
        NotFound: the key may not use the model (`model_not_found`), or
            `previous_response_id` names no response the caller may see.
        PermissionDenied: the key may not use an MCP server the request names.
        BackendStatusError: the backend refused the request (its 4xx is the client's).
        BackendError: the backend could not be reached, or cannot count
            (`token_count_unavailable`, 502).
    """
    # `store` and `background` are a generation's: a count is never stored nor run in the background.
    planned = req.model_copy(update={"store": False, "background": False})
    tools_wanted = ctx.gateway_tools((req.model_extra or {}).get("gateway_tools"))
    turn = await prepare_turn(
        resources, planned, transport="count", caller=ctx.caller, gateway_tools=tools_wanted, request_id=ctx.request_id,
        admit=False,  # no lock, no reservation, no slot: only the key's model list holds
    )

    async def discard(events: list[Any]) -> None:
        pass  # the tool listings a create would stream

    async with contextlib.AsyncExitStack() as stack:  # hosted MCP servers, connected to list their tools
        await turn.offer_tools(stack, discard)  # the turn's own offering: one rule, not a copy
    tokens = await resources.backend.count_tokens(turn.session.request, headers=resources.telemetry.trace_headers())
    return {"object": "response.input_tokens", "input_tokens": tokens}
