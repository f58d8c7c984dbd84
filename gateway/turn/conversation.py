"""Conversation state for one request: what came before, and what to keep.

Resolves `previous_response_id` into the earlier turns' items (previous
input, then previous output, walking back along the chain; instructions
are not carried over), resolves `item_reference` inputs from stored items,
gives every input item an id, and builds the record stored when the
response ends.  A request that names a `conversation` takes its lock
(`ConversationLocks`: one response at a time, on every instance) and its
items as history; the items it added are appended when it ends.  It talks
to a `ResponseStore` and knows nothing of HTTP or of how the backend is
called.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import trio
from pydantic import TypeAdapter, ValidationError

from ..errors import GatewayError, InvalidRequest, NotFound
from ..store import StoredResponse
from ..wire import CreateResponseRequest, InputItem, ItemReference, MessageItem
from .plan import results_without_calls

__all__ = [
    "ConversationLock",
    "ConversationLocks",
    "Prepared",
    "Records",
    "check_outputs_answer_calls",
    "conversation_id_of",
    "input_item_records",
    "prepare",
    "record_for",
    "to_wire",
]

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
            wire.append(item if item is not None else _user_text(record))
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


def _user_text(record: dict[str, Any]) -> MessageItem:
    """The wire item of a string input's record (`input_item_records`), as `to_wire` makes it,
    by the message's own schema rather than the whole input-item union's."""
    return MessageItem.model_validate(record)


def to_wire(items: list[dict[str, Any]]) -> list[Any]:
    """Stored item dicts as wire items (an item that no longer parses is skipped)."""
    if not items:
        return []
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


# --- conversations (the Conversations API) ----------------------------------------------------------


def conversation_id_of(req: CreateResponseRequest) -> str | None:
    """The conversation a create request names (`"conversation": "conv_…"` or `{"id": "conv_…"}`), if any.

    Raises:
        InvalidRequest: a `conversation` that is neither, or given with `previous_response_id`.
    """
    # (not a declared field: it comes in the request's extras)
    value = req.model_extra.get("conversation") if req.model_extra else None
    if value is None:
        return None
    if isinstance(value, dict):
        value = value.get("id")
    if not isinstance(value, str) or not value:
        raise InvalidRequest(
            "Invalid value for 'conversation': expected a conversation id or {\"id\": ...}.",
            param="conversation",
            code="invalid_type",
        )
    if req.previous_response_id:
        raise InvalidRequest(
            "'previous_response_id' and 'conversation' cannot be used together: a conversation keeps its own history.",
            param="conversation",
            code="invalid_request",
        )
    return value


class ConversationLock:
    """The lock a response holds on its conversation while it runs (see `ConversationLocks`)."""

    def __init__(self, locks: ConversationLocks, conversation_id: str, holder: str) -> None:
        self.locks = locks
        self.conversation_id = conversation_id
        self.holder = holder
        self.held = True

    async def run_renewals(self) -> None:
        """Renew the lease a third of a lease apart, until cancelled (by the turn that holds it)."""
        while True:
            await trio.sleep(self.locks.lease / 3)
            try:
                await self.locks.renew(self)
            except GatewayError:
                pass  # tried again at the next renewal; a lease outlives two missed ones

    async def finish(self, items: Sequence[dict[str, Any]]) -> None:
        """Append `items` to the conversation and let it go, in one atomic change.

        Raises:
            StoreUnavailable: the store failed (the lock then lapses with its lease).
        """
        await self.locks.finish(self, items)

    async def release(self) -> None:
        """Let the conversation go without appending (a failed or cancelled response); never raises."""
        if self.held:
            try:
                await self.locks.finish(self, ())
            except GatewayError:
                pass  # the lease lapses on its own


class ConversationLocks:
    """One response at a time per conversation, on every instance: a lease in the stored conversation.

    A response takes the lock before any byte is sent (a second one gets 400
    `conversation_locked`), renews it while it runs, and lets it go when it
    ends, in the same change that appends its items.  A holder that dies
    cannot let go: its lease lapses after `lease` seconds.
    """

    def __init__(self, store: Any, *, clock: Callable[[], float], lease: float) -> None:
        self.store = store
        self.clock = clock
        self.lease = lease

    async def acquire(self, conversation_id: str, owner: str | None, holder: str) -> tuple[ConversationLock, list[dict[str, Any]]]:
        """Take the conversation for `holder`; the lock and the conversation's items.

        Raises:
            NotFound: no such conversation for `owner` (`conversation_not_found`).
            InvalidRequest: another response is running on it (`conversation_locked`).
            StoreUnavailable: the store failed.
        """
        now = self.clock()
        state: dict[str, Any] = {}

        def take(current: Any) -> Any:
            state["owner"] = current.owner
            if current.owner != owner:
                return None
            if current.lock not in (None, holder) and (current.lock_until or 0) > now:
                state["locked"] = True
                return None
            current.lock, current.lock_until = holder, now + self.lease
            state["taken"] = True
            return current

        found = await self.store.update_conversation(conversation_id, take)
        if found is None or state.get("owner") != owner:
            raise NotFound(
                f"Conversation with id '{conversation_id}' not found.", param="conversation", code="conversation_not_found"
            )
        if not state.get("taken"):
            raise InvalidRequest(
                f"Another response is in progress for conversation '{conversation_id}'; wait for it to finish.",
                param="conversation",
                code="conversation_locked",
            )
        return ConversationLock(self, conversation_id, holder), list(found.items)

    async def items(self, conversation_id: str, owner: str | None) -> list[dict[str, Any]]:
        """The conversation's items, without taking it (a count of a request's input).

        Raises:
            NotFound: no such conversation for `owner` (`conversation_not_found`).
        """
        found = await self.store.load_conversation(conversation_id)
        if found is None or found.owner != owner:
            raise NotFound(
                f"Conversation with id '{conversation_id}' not found.", param="conversation", code="conversation_not_found"
            )
        return list(found.items)

    async def renew(self, lock: ConversationLock) -> None:
        until = self.clock() + self.lease

        def renew(current: Any) -> Any:
            if current.lock != lock.holder:
                return None
            current.lock_until = until
            return current

        await self.store.update_conversation(lock.conversation_id, renew)

    async def finish(self, lock: ConversationLock, items: Sequence[dict[str, Any]]) -> None:
        def finish(current: Any) -> Any:
            if current.lock == lock.holder:
                current.lock, current.lock_until = None, None
            elif not items:
                return None
            current.items.extend(items)
            return current

        await self.store.update_conversation(lock.conversation_id, finish)
        lock.held = False
