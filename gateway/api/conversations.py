"""The Conversations API: conversations and their items, kept in the store, each one key's own.

    create        a conversation (optional `items`, at most 20, and `metadata`)
    retrieve      one
    update        its metadata
    delete        it, and its items with it
    add_items     items (at most 20 a call)
    list_items    its items (`limit` 1-100, `order`, `after`, `include`)
    get_item      one item
    delete_item   remove one item (answers the conversation)

Objects and ids are OpenAI's (`conv_…`, `object: "conversation"`,
`created_at`, `metadata`: 16 pairs, keys up to 64 characters, values up to
512); items are Responses items (messages, function calls and outputs,
reasoning, MCP and compaction items), each with an id.  Another key's
conversation answers exactly as one that does not exist.  A response that
names a conversation adds its items itself (turn/conversation.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pydantic import TypeAdapter, ValidationError

from ..errors import InvalidRequest, NotFound
from ..store.base import StoredConversation
from ..transport.json import JsonBody
from ..turn import Resources
from ..turn.conversation import input_item_records
from ..wire import (
    InputItem,
    ItemReference,
    invalid_request_from_pydantic,
)
from .args import page
from .routes import Call

__all__ = ["MAX_ITEMS", "add_items", "create", "delete", "delete_item", "get_item", "list_items", "retrieve", "update"]

MAX_ITEMS = 20  # items one call may add (create, or items.create)
_METADATA_PAIRS, _METADATA_KEY, _METADATA_VALUE = 16, 64, 512
_ITEMS = TypeAdapter(list[InputItem])
# What `include` may name on items (OpenAI's list); what is stored is what is shown.
_INCLUDABLE = frozenset(
    {
        "web_search_call.action.sources",
        "web_search_call.results",
        "code_interpreter_call.outputs",
        "computer_call_output.output.image_url",
        "file_search_call.results",
        "message.input_image.image_url",
        "message.output_text.logprobs",
        "reasoning.encrypted_content",
    }
)


async def _conversation(call: Call) -> StoredConversation:
    """The conversation the path names, if the caller may see it.

    Raises:
        NotFound: no such conversation for this caller (`conversation_not_found`).
    """
    conversation_id = call.params["conversation_id"]
    found = await call.shared.resources.store.load_conversation(conversation_id)
    if found is None or found.owner != call.ctx.caller.owner:
        raise NotFound(
            f"Conversation with id '{conversation_id}' not found.", param="conversation_id", code="conversation_not_found"
        )
    return found


async def _change(call: Call, change: Callable[[StoredConversation], StoredConversation | None]) -> StoredConversation:
    """Apply `change` to the caller's conversation atomically; the conversation afterwards."""
    await _conversation(call)  # the caller's own, or NotFound
    changed = await call.shared.resources.store.update_conversation(call.params["conversation_id"], change)
    if changed is None:  # deleted in between
        return await _conversation(call)
    return changed


def _object(conversation: StoredConversation) -> dict[str, Any]:
    return {
        "id": conversation.id,
        "object": "conversation",
        "created_at": conversation.created_at,
        "metadata": conversation.metadata,
    }


def _metadata(value: Any) -> dict[str, str]:
    """OpenAI's metadata: up to 16 string pairs, keys up to 64 characters, values up to 512.

    Raises:
        InvalidRequest: naming `metadata`.
    """
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise InvalidRequest("Invalid value for 'metadata': expected an object of strings.", param="metadata", code="invalid_type")
    if len(value) > _METADATA_PAIRS:
        raise InvalidRequest(f"'metadata' may hold at most {_METADATA_PAIRS} pairs.", param="metadata", code="invalid_value")
    for key, text in value.items():
        if len(key) > _METADATA_KEY or len(text) > _METADATA_VALUE:
            raise InvalidRequest(
                f"'metadata' keys may be at most {_METADATA_KEY} characters and values {_METADATA_VALUE}.",
                param=f"metadata.{key[:_METADATA_KEY]}",
                code="invalid_value",
            )
    return dict(value)


def _items(value: Any, resources: Resources, *, required: bool) -> list[dict[str, Any]]:
    """Items to add (at most 20), as stored: Responses items, each with an id.

    Raises:
        InvalidRequest: not a list, too many, an item of a wrong shape (`param` names it), or an
            `item_reference` (a conversation holds items, not references).
    """
    if value is None and not required:
        return []
    if not isinstance(value, list) or (required and not value):
        raise InvalidRequest.missing("items") if value is None else InvalidRequest(
            "Invalid value for 'items': expected a list of 1 to 20 items.", param="items", code="invalid_value"
        )
    if len(value) > MAX_ITEMS:
        raise InvalidRequest(f"At most {MAX_ITEMS} items may be added at once.", param="items", code="invalid_value")
    try:
        parsed = _ITEMS.validate_python(value, strict=True)
    except ValidationError as exc:
        error = invalid_request_from_pydantic(exc)
        error.param = f"items{error.param}" if error.param and error.param.startswith("[") else "items"
        raise error from None
    for index, item in enumerate(parsed):
        if isinstance(item, ItemReference):
            raise InvalidRequest("A conversation holds items, not references.", param=f"items[{index}]", code="invalid_value")
    return input_item_records(parsed, resources.ids)


def _include(args: Mapping[str, str] | Any) -> None:
    values = args.getlist("include") if hasattr(args, "getlist") else [args.get("include")]
    for value in filter(None, values):
        if value not in _INCLUDABLE:
            raise InvalidRequest(f"Invalid value for 'include': '{value}'.", param="include", code="invalid_value")


# --- the routes -----------------------------------------------------------------------------------


async def create(call: Call) -> JsonBody:
    body = await call.json()
    resources = call.shared.resources
    conversation = StoredConversation(
        id=resources.ids("conv"),
        created_at=int(resources.clock()),
        metadata=_metadata(body.get("metadata")),
        items=_items(body.get("items"), resources, required=False),
        owner=call.ctx.caller.owner,
    )
    await resources.store.save_conversation(conversation)
    return JsonBody(_object(conversation))


async def retrieve(call: Call) -> JsonBody:
    return JsonBody(_object(await _conversation(call)))


async def update(call: Call) -> JsonBody:
    body = await call.json()
    if "metadata" not in body:
        raise InvalidRequest.missing("metadata")
    metadata = _metadata(body["metadata"])

    def replace(current: StoredConversation) -> StoredConversation:
        current.metadata = metadata
        return current

    return JsonBody(_object(await _change(call, replace)))


async def delete(call: Call) -> JsonBody:
    conversation = await _conversation(call)
    await call.shared.resources.store.delete_conversation(conversation.id)
    return JsonBody({"id": conversation.id, "object": "conversation.deleted", "deleted": True})


async def add_items(call: Call) -> JsonBody:
    _include(call.args)
    added = _items((await call.json()).get("items"), call.shared.resources, required=True)

    def append(current: StoredConversation) -> StoredConversation:
        current.items.extend(added)
        return current

    await _change(call, append)
    return JsonBody(
        {"object": "list", "data": added, "first_id": added[0]["id"], "last_id": added[-1]["id"], "has_more": False}
    )


async def list_items(call: Call) -> JsonBody:
    _include(call.args)
    return JsonBody(page((await _conversation(call)).items, call.args))


async def get_item(call: Call) -> JsonBody:
    _include(call.args)
    item = (await _conversation(call)).find_item(call.params["item_id"])
    if item is None:
        raise NotFound(f"Item with id '{call.params['item_id']}' not found.", param="item_id", code="item_not_found")
    return JsonBody(item)


async def delete_item(call: Call) -> JsonBody:
    item_id = call.params["item_id"]
    if (await _conversation(call)).find_item(item_id) is None:
        raise NotFound(f"Item with id '{item_id}' not found.", param="item_id", code="item_not_found")

    def remove(current: StoredConversation) -> StoredConversation:
        current.items = [item for item in current.items if item.get("id") != item_id]
        return current

    return JsonBody(_object(await _change(call, remove)))
