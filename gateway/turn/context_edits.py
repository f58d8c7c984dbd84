"""Anthropic's context editing (`context_management.edits`) done by the gateway for a chat backend.

    clear_thinking     `clear_thinking_20251015`: the thinking blocks of all but
                       the last `keep` assistant turns that have any (default
                       1; `"all"` keeps every one) are left out
    clear_tool_uses    `clear_tool_uses_20250919`: once `trigger` is passed
                       (input tokens, default 100,000, or tool uses), the
                       results of all but the last `keep` tool uses (default 3)
                       are replaced by a note saying so (and their inputs
                       emptied, with `clear_tool_inputs`), sparing
                       `exclude_tools`; with `clear_at_least`, only when that
                       many input tokens go
    apply_edits        the edits in the order given, each counted before and
                       after by the backend (`count`), and the `applied_edits`
                       the answer reports, as Anthropic shapes them

An edit of another type (`compact_20260112`) is left to a backend that speaks
Messages: a chat backend gets the request without it.  Pure but for `count`.
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from ..errors import GatewayError

__all__ = ["CLEARED", "apply_edits", "clear_thinking", "clear_tool_uses"]

Messages = list[dict[str, Any]]
CLEARED = "[This tool result was cleared to save context.]"
_THINKING = ("thinking", "redacted_thinking")
_DEFAULT_TRIGGER = 100_000
_DEFAULT_KEEP_TOOL_USES = 3


def _blocks(message: Mapping[str, Any]) -> list[Any]:
    content = message.get("content")
    return content if isinstance(content, list) else []


def clear_thinking(messages: Messages, keep: Any = None) -> tuple[Messages, int]:
    """`messages` without the thinking of older assistant turns, and how many turns lost theirs."""
    if keep == "all" or (isinstance(keep, Mapping) and keep.get("type") == "all"):
        return messages, 0
    kept = keep.get("value", 1) if isinstance(keep, Mapping) else 1
    turns = [i for i, m in enumerate(messages) if m.get("role") == "assistant" and any(
        isinstance(b, Mapping) and b.get("type") in _THINKING for b in _blocks(m))]
    cleared = turns[: max(0, len(turns) - int(kept))]
    if not cleared:
        return messages, 0
    out = list(messages)
    for i in cleared:
        out[i] = {**out[i], "content": [b for b in _blocks(out[i]) if not (isinstance(b, Mapping) and b.get("type") in _THINKING)]}
    return out, len(cleared)


def _tool_uses(messages: Messages) -> list[tuple[int, int, Mapping[str, Any]]]:
    """(message index, block index, block) of every `tool_use`, oldest first."""
    return [
        (i, j, block)
        for i, message in enumerate(messages)
        if message.get("role") == "assistant"
        for j, block in enumerate(_blocks(message))
        if isinstance(block, Mapping) and block.get("type") == "tool_use"
    ]


def clear_tool_uses(messages: Messages, edit: Mapping[str, Any], input_tokens: int | None) -> tuple[Messages, int]:
    """`messages` with the older tool uses cleared when `edit`'s trigger is passed, and how many
    were (`input_tokens`: the request's, None when uncounted: an input-tokens trigger then
    does not fire)."""
    uses = _tool_uses(messages)
    trigger = edit.get("trigger") or {"type": "input_tokens", "value": _DEFAULT_TRIGGER}
    if trigger.get("type") == "tool_uses":
        if len(uses) <= int(trigger.get("value") or 0):
            return messages, 0
    elif input_tokens is None or input_tokens <= int(trigger.get("value") or _DEFAULT_TRIGGER):
        return messages, 0
    keep = int((edit.get("keep") or {}).get("value", _DEFAULT_KEEP_TOOL_USES))
    spared = set(edit.get("exclude_tools") or ())
    inputs = edit.get("clear_tool_inputs")
    clearable = [use for use in uses if use[2].get("name") not in spared]
    chosen = clearable[: max(0, len(clearable) - keep)]
    if not chosen:
        return messages, 0
    out = copy.deepcopy(messages)
    ids = set()
    for i, j, block in chosen:
        ids.add(block.get("id"))
        if inputs is True or (isinstance(inputs, list) and block.get("name") in inputs):
            out[i]["content"][j]["input"] = {}
    for message in out:
        if message.get("role") != "user":
            continue
        for block in _blocks(message):
            if isinstance(block, dict) and block.get("type") == "tool_result" and block.get("tool_use_id") in ids:
                block["content"] = CLEARED
    return out, len(chosen)


async def apply_edits(
    edits: list[Any], messages: Messages, count: Callable[[Messages], Awaitable[int]]
) -> tuple[Messages, list[dict[str, Any]], int | None]:
    """The edits applied in order: the messages after them, the `applied_edits` (each that
    cleared something, with the input tokens it cleared) and the input tokens before any (None
    when nothing needed counting, or the backend could not count).  Counts are asked only when
    an edit needs one: an edit that clears nothing costs none."""

    async def counted(candidate: Messages) -> int | None:
        try:
            return await count(candidate)
        except GatewayError:
            return None

    unknown = object()
    original: Any = unknown
    before: int | None = None
    applied: list[dict[str, Any]] = []
    for edit in edits:
        if not isinstance(edit, Mapping):
            continue
        kind = edit.get("type")
        if kind == "clear_thinking_20251015":
            edited, cleared = clear_thinking(messages, edit.get("keep"))
            field = "cleared_thinking_turns"
        elif kind == "clear_tool_uses_20250919":
            tokens_trigger = (edit.get("trigger") or {}).get("type", "input_tokens") == "input_tokens"
            if tokens_trigger and original is unknown and _tool_uses(messages):
                original = before = await counted(messages)
            edited, cleared = clear_tool_uses(messages, edit, before)
            field = "cleared_tool_uses"
        else:
            continue
        if not cleared:
            continue
        if original is unknown:
            original = before = await counted(messages)
        after = await counted(edited)
        gone = max(0, before - after) if before is not None and after is not None else 0
        least = edit.get("clear_at_least") if kind == "clear_tool_uses_20250919" else None
        if isinstance(least, Mapping) and gone < int(least.get("value") or 0):
            continue  # it would not clear enough to be worth the cache it breaks
        messages, before = edited, after
        applied.append({"type": kind, field: cleared, "cleared_input_tokens": gone})
    return messages, applied, None if original is unknown else original
