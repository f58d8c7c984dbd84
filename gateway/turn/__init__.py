"""The turn: one response, from a parsed request to its stored end.

    base.py          what every turn is: begun early, run, concluded, settled,
                     its delivery handed over once (`Delivery`, `finish`)
    rounds.py        `run_rounds`: the one loop through backend rounds and tool calls
    engine.py        `prepare_turn`, `Turn`: the one path every Responses
                     transport (SSE, JSON, WebSocket, background) runs
    chat.py          a chat completion, or an Anthropic message, as a turn of the same shape
    messages.py      Anthropic's Messages API as a chat-shaped turn (its plan: messages_plan.py)
    compact.py       compaction: a conversation summarised into a sealed item
    relay.py         a request relayed as it is (`/v1/{path}`, plain chat
                     completions): the key's checks, its reservation, its outcome
    plan.py          a Responses request as a Chat Completions request (pure)
    conversation.py  `previous_response_id` and item references resolved
    tools.py         which gateway tools a turn offers, and how their calls run

The engine's names are loaded when first used, so that importing the pure
planner does not load trio or the backends.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the type checker sees the names; at run time they load on first use
    from .engine import Resources, Turn, prepare_turn
    from .rounds import Emit, Session, report_outcome, run_rounds

__all__ = ["Emit", "Resources", "Session", "Turn", "prepare_turn", "report_outcome", "run_rounds"]


_HOME = {"Resources": ".engine", "Turn": ".engine", "prepare_turn": ".engine"}


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module(_HOME.get(name, ".rounds"), __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
