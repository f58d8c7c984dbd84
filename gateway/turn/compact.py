"""Compaction (`POST /v1/responses/compact`): a conversation summarised into a sealed item.

The conversation is run as a turn of its own (no tools, nothing stored)
with a request to summarise it; the answer is the user messages it
retained plus a `compaction` item whose summary only this gateway (and
only for this key) can open again, in `plan` when a later request carries
it.  Knows the turn and the sealer; nothing of HTTP.
"""

from __future__ import annotations

from typing import Any

from ..intake import RequestContext
from ..wire import CreateResponseRequest
from .engine import Resources, Turn, prepare_turn

__all__ = ["compact", "prepare_compaction"]

_PROMPT = (
    "Summarise the conversation above so that it can be continued from your summary alone: the user's goals, "
    "decisions made, important facts and names (files, functions, commands), work done, and what is still open. "
    "Be concise and complete; do not address the user."
)


async def prepare_compaction(resources: Resources, req: CreateResponseRequest, ctx: RequestContext) -> Turn:
    """The summarising turn (no tools, text, reasoning or storage), before any byte is sent.

    Raises:
        GatewayError: as `prepare_turn`.
    """
    summarise = req.model_copy(
        update={"tools": None, "tool_choice": None, "text": None, "reasoning": None, "store": False, "background": False}
    )
    turn = await prepare_turn(
        resources, summarise, transport="compact", caller=ctx.caller, gateway_tools=False, request_id=ctx.request_id
    )
    turn.plan.body["messages"].append({"role": "user", "content": _PROMPT})
    return turn


def compact(resources: Resources, turn: Turn, final: dict[str, Any]) -> dict[str, Any]:
    """The `response.compaction` object for a summarising turn that ended with `final`."""
    summary = "".join(
        part.get("text", "")
        for item in final["output"]
        if item.get("type") == "message"
        for part in item.get("content") or ()
    )
    retained = [
        record
        for record in [*(i.model_dump(exclude_none=True) for i in turn.prepared.history), *turn.prepared.input_records]
        if record.get("type", "message") == "message" and record.get("role") == "user"
    ]
    compaction = {
        "type": "compaction",
        "id": resources.ids("cmp"),
        "encrypted_content": resources.sealer.seal("compaction", {"summary": summary, "owner": turn.caller.owner}),
    }
    return {
        "id": final["id"],
        "object": "response.compaction",
        "output": [*retained, compaction],
        "created_at": int(resources.clock()),
        "usage": final["usage"],
    }
