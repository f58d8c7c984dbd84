"""The server-side tool loop: rounds of backend calls with gateway tools run between them.

A round is one backend call.  When the model calls tools the gateway runs
(MCP tools), the gateway runs them, gives the results back to the model and
calls the backend again, up to `max_rounds`.  Calls to the client's own
functions end the response (they are returned as `function_call` items).

This module decides what the next round's messages are and runs the calls;
it does not know how events reach the client.  A tool failure is data for
the model (its text goes back as the tool result), never an exception.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio

from .translator import RoundCall

__all__ = ["ToolLoop", "ToolOutcome", "ToolRunner", "next_round_body"]

log = logging.getLogger("gateway.tools")


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    output: str | None = None
    error: str | None = None

    @property
    def text_for_model(self) -> str:
        return (self.output or "") if self.error is None else f"Error: {self.error}"


class ToolRunner(Protocol):
    async def run(self, call: RoundCall) -> ToolOutcome:
        """Run one gateway tool call; failures come back as `ToolOutcome(error=...)`."""
        ...


@dataclass
class ToolLoop:
    runner: ToolRunner
    max_rounds: int
    call_timeout: float = 120.0
    concurrency: int = 8
    rounds: int = field(default=0, init=False)

    async def run_calls(
        self, calls: Sequence[RoundCall], on_result: Callable[[RoundCall, ToolOutcome], Awaitable[None]]
    ) -> dict[str, ToolOutcome]:
        """Run the gateway's calls concurrently (bounded, each with a timeout).

        `on_result` is awaited once per call as soon as it finishes, one at a
        time (so a caller can emit events in order).
        """
        results: dict[str, ToolOutcome] = {}
        limiter = trio.CapacityLimiter(self.concurrency)
        send, receive = trio.open_memory_channel[tuple[RoundCall, ToolOutcome]](len(calls) or 1)

        async def one(call: RoundCall, send: trio.MemorySendChannel[tuple[RoundCall, ToolOutcome]]) -> None:
            async with send, limiter:
                try:
                    with trio.fail_after(self.call_timeout):
                        outcome = await self.runner.run(call)
                except trio.TooSlowError:
                    outcome = ToolOutcome(error=f"the tool call timed out after {self.call_timeout:g} s")
                except Exception as exc:  # a runner bug must not end the response
                    log.warning("tool %s failed unexpectedly (%s)", call.name, type(exc).__name__)
                    outcome = ToolOutcome(error="the tool failed")
                await send.send((call, outcome))

        async with trio.open_nursery() as nursery:
            async with send:
                for call in calls:
                    nursery.start_soon(one, call, send.clone())
            async with receive:
                async for call, outcome in receive:
                    results[call.item_id] = outcome
                    await on_result(call, outcome)
        return results


def next_round_body(
    body: dict[str, Any], text: str, calls: Sequence[RoundCall], results: dict[str, ToolOutcome]
) -> dict[str, Any]:
    """The chat request for the next round: the assistant's calls and the tools' results appended."""
    nxt = copy.copy(body)
    messages = list(body["messages"])
    messages.append(
        {
            "role": "assistant",
            "content": text or None,
            "tool_calls": [
                {"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments or "{}"}}
                for c in calls
            ],
        }
    )
    for c in calls:
        messages.append({"role": "tool", "tool_call_id": c.call_id, "content": results[c.item_id].text_for_model})
    nxt["messages"] = messages
    return nxt
