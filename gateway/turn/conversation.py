"""Conversation state for one request: what came before, and what to keep.

Resolves `previous_response_id` into the earlier turns' items (previous
input, then previous output, walking back along the chain; instructions
are not carried over), resolves `item_reference` inputs from stored items,
gives every input item an id, and builds the record stored when the
response ends.  It talks to a `ResponseStore` and knows nothing of HTTP or
of how the backend is called.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import TypeAdapter, ValidationError

from ..errors import InvalidRequest, NotFound
from ..store import StoredResponse
from ..wire import CreateResponseRequest, InputItem, ItemReference
from .plan import results_without_calls

__all__ = ["Prepared", "Records", "check_outputs_answer_calls", "input_item_records", "prepare", "record_for", "to_wire"]

_ITEMS = TypeAdapter(list[InputItem])
_MAX_CHAIN = 10_000  # a loop in stored data must not hang a request
_ID_PREFIX = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "reasoning": "rs",
}


class Records(Protocol):
    """What resolving a conversation reads: a store, or one caller's view of it."""

    async def load(self, response_id: str) -> StoredResponse | None: ...

    async def holder_of(self, item_id: str) -> StoredResponse | None: ...


@dataclass
class Prepared:
    """The request's conversation: earlier items, and its own input (resolved)."""

    history: list[Any]  # wire items of earlier turns, oldest first
    input: list[Any]  # this request's wire items, item_references resolved
    input_records: list[dict[str, Any]]  # the same, as stored and listed (each with an id)


async def prepare(store: Records | None, req: CreateResponseRequest, ids: Callable[[str], str]) -> Prepared:
    """Resolve the request against stored state (`store`: what the caller may see of it).

    Raises:
        NotFound: `previous_response_id` names no stored response
            (code `previous_response_not_found`).
        InvalidRequest: an `item_reference` names no stored item.
    """
    history: list[dict[str, Any]] = []
    if req.previous_response_id:
        history = await _chain(store, req.previous_response_id)
    records = input_item_records(req.input, ids)
    resolved: list[dict[str, Any]] = []
    wire: list[Any] = []
    for index, (item, record) in enumerate(zip(_as_list(req.input), records)):
        if isinstance(item, ItemReference):
            holder = await store.holder_of(item.id) if store is not None else None
            found = holder.find_item(item.id) if holder is not None else None
            if found is None:
                raise InvalidRequest(
                    f"Item with id '{item.id}' not found.", param=f"input[{index}].id", code="item_not_found"
                )
            resolved.append(found)
            wire += to_wire([found])
        else:
            resolved.append(record)
            # The request's own items are wire items already; only a string input needs building.
            wire += to_wire([record]) if item is None else [item]
    return Prepared(history=to_wire(history), input=wire, input_records=resolved)


def check_outputs_answer_calls(prepared: Prepared) -> None:
    """In a continuation, every tool output must answer a call the conversation made.

    Outputs are matched to calls by position, as the planner matches them
    (`plan.results_without_calls`): a backend that numbers call ids per
    response makes `call_0` in every turn, so an id the chain has may still
    name no call waiting for this output.  Stateless clients replay whole
    histories, and an output whose call was dropped is repaired for them (see
    plan); with `previous_response_id` the gateway holds the chain, so such
    an output is a mistake, refused as OpenAI refuses it.  A duplicate (the
    same output again) is not refused: the planner drops it.

    Raises:
        InvalidRequest: an output of the input answers no call in the chain
            or the input.
    """
    offset = len(prepared.history)
    for position in results_without_calls([*prepared.history, *prepared.input]):
        if position < offset:
            continue  # the chain's own history, repaired as a stateless one is
        data = prepared.input[position - offset]
        data = data if isinstance(data, dict) else data.model_dump()
        raise InvalidRequest(
            f"No tool call found for function call output with call_id {data.get('call_id')}.",
            param=f"input[{position - offset}]",
        )


async def _chain(store: Records | None, response_id: str) -> list[dict[str, Any]]:
    turns: list[list[dict[str, Any]]] = []
    current: str | None = response_id
    seen: set[str] = set()
    while current is not None and len(seen) < _MAX_CHAIN and current not in seen:
        seen.add(current)
        record = await store.load(current) if store is not None else None
        if record is None:
            if current == response_id:
                raise NotFound(
                    f"Previous response with id '{response_id}' not found.",
                    param="previous_response_id",
                    code="previous_response_not_found",
                )
            break  # an older turn was deleted or expired: continue from what remains
        turns.append([*record.input_items, *(record.response.get("output") or ())])
        current = record.previous_response_id
    return [item for turn in reversed(turns) for item in turn]


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, str):
        return [None]  # one user message, built by input_item_records
    return list(value)


def to_wire(items: list[dict[str, Any]]) -> list[Any]:
    """Stored item dicts as wire items (an item that no longer parses is skipped)."""
    try:
        return _ITEMS.validate_python(items)
    except ValidationError:
        # Stored data is ours; a record that no longer parses is skipped
        # item by item rather than failing the conversation.
        out = []
        for item in items:
            try:
                out.extend(_ITEMS.validate_python([item]))
            except ValidationError:
                continue
        return out


def input_item_records(value: Any, ids: Callable[[str], str]) -> list[dict[str, Any]]:
    """The request's input as stored items: dicts in the Responses item shape, each with an id."""
    if value is None:
        return []
    if isinstance(value, str):
        return [
            {
                "id": ids("msg"),
                "type": "message",
                "role": "user",
                "status": "completed",
                "content": [{"type": "input_text", "text": value}],
            }
        ]
    records = []
    for item in value:
        data = item.model_dump(exclude_none=True)
        kind = data.get("type") or "message"
        data["type"] = kind
        if kind == "message" and isinstance(data.get("content"), str):
            part = "output_text" if data.get("role") == "assistant" else "input_text"
            data["content"] = [{"type": part, "text": data["content"]}]
            if part == "output_text":
                data["content"][0]["annotations"] = []
        if kind != "item_reference" and not data.get("id"):
            data["id"] = ids(_ID_PREFIX.get(kind, "item"))
        if kind in ("message", "function_call", "function_call_output") and not data.get("status"):
            data["status"] = "completed"
        records.append(data)
    return records


def record_for(
    req: CreateResponseRequest, prepared: Prepared, response: dict[str, Any], events: Sequence[dict[str, Any]]
) -> StoredResponse:
    return StoredResponse(
        id=response["id"],
        response=response,
        input_items=prepared.input_records,
        events=list(events),
        previous_response_id=req.previous_response_id,
    )
