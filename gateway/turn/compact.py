"""Compaction: a conversation summarised into a sealed `compaction` item.

    POST /v1/responses/compact   the conversation is run as a turn of its own
                     (no tools, nothing stored) asked to summarise it; the
                     answer is the user messages it retained plus the item
                     (`prepare_compaction`, `compact`)
    context_management   a turn's own input, when it passes the threshold:
                     summarised by one backend call (`summarise`), the turn
                     run on the instructions, the summary and the last user
                     turn (`compacted`); its item (`compaction_item`, marked
                     as standing for everything before it) leads the output

Only this gateway (and only for this key) can open an item's summary again,
in `plan` when a later request carries it.  Knows the turn and the sealer;
nothing of HTTP.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..errors import BackendStreamError
from ..wire import CreateResponseRequest
from .context import RequestContext
from .plan import SUMMARY_HEAD
from .sealing import Sealer

if TYPE_CHECKING:  # (the engine runs a turn's own compaction with the helpers here)
    from .engine import Resources, Turn

__all__ = ["compact", "compacted", "compaction_item", "prepare_compaction", "summarise"]

_PROMPT = (
    "Summarise the conversation above so that it can be continued from your summary alone: the user's goals, "
    "decisions made, important facts and names (files, functions, commands), work done, and what is still open. "
    "Be concise and complete; do not address the user."
)


def compaction_item(sealer: Sealer, item_id: str, summary: str, owner: str | None, *, replaces: bool = False) -> dict[str, Any]:
    """The `compaction` item of `summary`, sealed for `owner` (`replaces`: it stands for every item
    before it, as a turn's own compaction does)."""
    terms: dict[str, Any] = {"summary": summary, "owner": owner}
    if replaces:
        terms["replaces"] = True
    return {"type": "compaction", "id": item_id, "encrypted_content": sealer.seal("compaction", terms)}


def compacted(messages: list[dict[str, Any]], summary: str) -> list[dict[str, Any]]:
    """A chat request's `messages` after compaction (pure): the instructions (system and developer
    messages), the summary, and the last user turn with all that follows it."""
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=len(messages))
    kept = [m for m in messages[:last_user] if m.get("role") in ("system", "developer")]
    return [*kept, {"role": "system", "content": SUMMARY_HEAD + summary}, *messages[last_user:]]


async def summarise(backend: Any, request: Mapping[str, Any], *, headers: Mapping[str, str] | None = None) -> tuple[str, dict[str, Any]]:
    """The summary of a chat request's conversation, by one backend call (its tools kept for the
    template, none called), and that call's usage.

    Raises:
        BackendError: the backend failed, or its stream carried an error.
    """
    body = {k: v for k, v in request.items() if k not in ("response_format", "logprobs", "top_logprobs", "parallel_tool_calls")}
    body.update(messages=[*request["messages"], {"role": "user", "content": _PROMPT}], stream=True, stream_options={"include_usage": True})
    if body.get("tools"):
        body["tool_choice"] = "none"
    parts: list[str] = []
    usage: dict[str, Any] = {}
    async with backend.open_chat_stream(body, headers=headers) as stream:
        async for batch in stream:
            for chunk in batch:
                if not isinstance(chunk, dict):
                    continue  # (the end of the stream)
                if chunk.get("error") is not None and not chunk.get("choices"):
                    raise BackendStreamError("the backend failed while summarising the conversation")
                if isinstance(chunk.get("usage"), dict):
                    usage = chunk["usage"]
                for choice in chunk.get("choices") or ():
                    text = (choice.get("delta") or {}).get("content")
                    if isinstance(text, str):
                        parts.append(text)
    return "".join(parts).strip(), usage


async def prepare_compaction(resources: Resources, req: CreateResponseRequest, ctx: RequestContext) -> Turn:
    """The summarising turn (no tools, text, reasoning or storage), before any byte is sent.

    Raises:
        GatewayError: as `prepare_turn`.
    """
    summarising = req.model_copy(
        update={"tools": None, "tool_choice": None, "text": None, "reasoning": None, "store": False, "background": False}
    )
    from .engine import prepare_turn

    turn = await prepare_turn(
        resources, summarising, transport="compact", caller=ctx.caller, gateway_tools=False, request_id=ctx.request_id
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
    compaction = compaction_item(resources.sealer, resources.ids("cmp"), summary, turn.caller.owner)
    return {
        "id": final["id"],
        "object": "response.compaction",
        "output": [*retained, compaction],
        "created_at": int(resources.clock()),
        "usage": final["usage"],
    }
