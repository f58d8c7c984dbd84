"""A chat request fitted into its model's context window (`truncation: "auto"`), counted exactly.

    groups(messages)   the parts of a conversation that may be dropped, oldest
                       first (pure): every message but the instructions (system
                       and developer messages stay wherever they are) and the
                       last user turn with all that follows it; an assistant's
                       tool calls and their results are one part, so that no
                       call is left without its output nor an output without
                       its call
    fit                the fewest oldest parts dropped for the request to fit
                       `room` tokens, each candidate counted by the backend
                       (its tokenizer: `ChatBackend.count_tokens`), found by
                       bisection (a few counts, not one per part)
    room_for           the prompt tokens a window leaves beside the answer

Knows no HTTP; the only I/O is the count it is given.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from ..errors import InvalidRequest

__all__ = ["ANSWER_SHARE", "fit", "groups", "room_for", "without"]

Messages = list[dict[str, Any]]
ANSWER_SHARE = 8  # without max_output_tokens, 1/8 of the window is kept for the answer (at most 4096 tokens)
_KEPT_ROLES = ("system", "developer")


def groups(messages: Messages) -> list[list[int]]:
    """The indexes of each droppable part of `messages`, oldest first (see the module docstring)."""
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=len(messages))
    parts: list[list[int]] = []
    i = 0
    while i < last_user:
        message = messages[i]
        if message.get("role") in _KEPT_ROLES:
            i += 1
            continue
        part = [i]
        i += 1
        if message.get("role") == "assistant" and message.get("tool_calls"):
            while i < len(messages) and messages[i].get("role") == "tool":
                part.append(i)
                i += 1
        if part[-1] >= last_user:  # (results that run into the last user turn stay with it)
            break
        parts.append(part)
    return parts


def without(messages: Messages, parts: list[list[int]], count: int) -> Messages:
    """`messages` less the first `count` parts."""
    dropped = {i for part in parts[:count] for i in part}
    return [m for i, m in enumerate(messages) if i not in dropped]


def room_for(window: int, max_output: int | None, param: str) -> int:
    """The prompt tokens `window` leaves beside an answer of `max_output` tokens (unset: a share).

    Raises:
        InvalidRequest: `max_output` leaves no room (named `param`).
    """
    if max_output is None:
        return window - min(window // ANSWER_SHARE, 4096)
    if max_output >= window:
        raise InvalidRequest(
            f"{param}: {max_output} leaves no room for the input in the model's context window of {window} tokens; "
            "ask for fewer output tokens.",
            param=param,
            code="invalid_value",
        )
    return window - max_output


async def fit(messages: Messages, room: int, count: Callable[[Messages], Awaitable[int]]) -> tuple[Messages, int]:
    """`messages` with the fewest oldest parts dropped so that `count` of them is at most `room`,
    and how many messages were dropped (0: they fit as they are).

    Raises:
        InvalidRequest: even the instructions and the last user turn alone do not fit
            (`context_length_exceeded`).
    """
    if await count(messages) <= room:
        return messages, 0
    parts = groups(messages)
    if not parts or await count(without(messages, parts, len(parts))) > room:
        raise InvalidRequest(
            f"input: the instructions and the last user turn alone do not fit the model's context window "
            f"({room} tokens for the input); shorten them.",
            param="input",
            code="context_length_exceeded",
        )
    low, high = 1, len(parts)  # the fewest parts to drop lies in [low, high]; all of them fit
    while low < high:
        middle = (low + high) // 2
        if await count(without(messages, parts, middle)) <= room:
            high = middle
        else:
            low = middle + 1
    fitted = without(messages, parts, low)
    return fitted, len(messages) - len(fitted)
