"""A chat completion: `/v1/chat/completions` as a turn, in the same shape as a Responses one.

    prepare_chat   before anything is sent: the gateway's tools it is offered
                   (the one offering rule, `tools.offers_gateway_tools`), the
                   key's model and limits (tokens reserved), and whether it
                   can go to the backend as it is (`ChatTurn.relayed`: no
                   gateway tools, no token limit to count from a session)
    ChatTurn.run   the backend rounds and the gateway's tool calls, each batch
                   of chunks to the transport's `emit`, under the drain;
                   whatever fails, it ends with one error chunk (never an
                   exception but cancellation), gives back its slot, counts
                   its tokens, and fills in its outcome

A relayed chat completion is not run here: the passthrough transport relays
its bytes and reports the same outcome.  Nothing here knows HTTP or bytes.
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from ..errors import GatewayError, InternalError, ShuttingDown
from ..intake import RequestContext
from ..keys import StreamSlot, token_reservation
from ..observe.outcome import TurnOutcome
from ..streams.chat_session import ChatSession
from .engine import Emit, Resources, report_outcome, run_rounds
from .tools import RequestTools, offer_configured, offers_gateway_tools

__all__ = ["ChatTurn", "prepare_chat"]

log = logging.getLogger("gateway.turn")


async def prepare_chat(resources: Resources, body: dict[str, Any], ctx: RequestContext) -> ChatTurn:
    """Everything that can refuse the request, before any byte is sent.

    Raises:
        NotFound: the key may not use the model.
        RateLimited: a limit of the key is reached.
        StoreUnavailable: the key store failed.
    """
    caller = ctx.caller
    enabled = ctx.gateway_tools(body.pop("gateway_tools", None))
    tools = RequestTools()
    if enabled and offers_gateway_tools(body.get("tool_choice")):
        own = {t.get("function", {}).get("name") for t in body.get("tools") or () if isinstance(t, dict)}
        offer_configured(tools, resources.mcp, taken=own, limits=caller.limits)
    tokens, max_tokens = token_reservation(body, caller.limits)
    if max_tokens is not None:
        body["max_tokens"] = max_tokens  # what it reserved bounds what it may use
    chat_id = resources.ids("chatcmpl")
    model = str(body.get("model") or "")
    slot = await resources.limiter.admit_stream(caller, model, chat_id, tokens=tokens)
    streamed = bool(body.get("stream"))
    relayed = not tools.routes and caller.limits.tpm is None
    transport = "chat-relay" if relayed else "chat-sse" if streamed else "chat-json"
    outcome = TurnOutcome(chat_id, model, transport, trio.current_time(), key=caller.name, request_id=ctx.request_id)
    return ChatTurn(resources, body, tools, ctx, outcome, slot, relayed=relayed, streamed=streamed)


class ChatTurn:
    """One chat completion being produced (see the module docstring)."""

    def __init__(
        self,
        resources: Resources,
        body: dict[str, Any],
        tools: RequestTools,
        ctx: RequestContext,
        outcome: TurnOutcome,
        slot: StreamSlot | None,
        *,
        relayed: bool,
        streamed: bool,
    ) -> None:
        self.resources = resources
        self.body = body
        self.tools = tools
        self.caller = ctx.caller
        self.outcome = outcome
        self.slot = slot
        self.relayed = relayed
        self.streamed = streamed
        if tools.chat_tools:
            body["tools"] = [*(body.get("tools") or []), *tools.chat_tools]
        self.session = ChatSession(body, set(tools.routes), max_rounds=resources.settings.max_tool_call_iterations)
        self.failure: GatewayError | None = None  # what failed it, when a gateway error did

    async def run(self, emit: Emit) -> None:
        """Produce the chat completion, each batch of chunks to `emit`; the last is its end (a finish
        chunk, or one error chunk).  Never raises but for cancellation (the client left, shutdown)."""
        resources = self.resources
        settings = resources.settings
        session = self.session
        outcome = self.outcome
        resources.telemetry.turn_started(outcome)

        async def timed(chunks: list[dict[str, Any]]) -> None:
            if chunks:
                outcome.note_events(trio.current_time(), _generated(chunks))
                await emit(chunks)

        try:
            with resources.drain.stoppable() as stop:  # a drain out of time ends the turn here
                self.failure = await run_rounds(
                    session,
                    resources.backend,
                    timed,
                    self.tools,
                    call_timeout=settings.mcp_call_timeout,
                    concurrency=settings.mcp_call_concurrency,
                    telemetry=resources.telemetry,
                    admit_round=self._admit_round,
                    outcome=outcome,
                )
            if stop.cancelled_caught and not session.done:
                self.failure = ShuttingDown.stopped()
                await timed(session.fail(self.failure.code or "server_shutting_down", self.failure.message))
        except trio.Cancelled:
            outcome.client_left = True
            raise
        except GatewayError as error:
            self.failure = error
            await timed(session.fail(error.code or "server_error", error.message, type=error.type, param=error.param))
        except Exception:
            log.debug("chat completion %s failed", outcome.response_id, exc_info=True)
            self.failure = InternalError("The gateway failed to process the chat completion.")
            await timed(session.fail(self.failure.code or "server_error", self.failure.message, type=self.failure.type))
        finally:
            with trio.CancelScope(shield=True):
                await self._settle()

    async def _admit_round(self, request: dict[str, Any]) -> None:
        """A tool loop's next backend round reserves its tokens like a request of its own."""
        await self.resources.limiter.reserve(self.slot, self.caller, token_reservation(request, self.caller.limits)[0])

    async def _settle(self) -> None:
        """Give back the stream slot, count the tokens, fill in the outcome (as a Responses turn does)."""
        session = self.session
        usage = session.usage or {}
        outcome = self.outcome
        # Not done and not failed: it was cancelled (its client left), which the outcome says.
        outcome.status = "failed" if session.failure else "completed" if session.done else "in_progress"
        outcome.error = {"code": session.failure} if session.failure else None
        outcome.usage = {
            "input_tokens": usage.get("prompt_tokens"),
            "output_tokens": usage.get("completion_tokens"),
            "total_tokens": usage.get("total_tokens"),
        }
        outcome.rounds = session.rounds + 1
        outcome.finished_at = trio.current_time()
        try:
            await self.resources.limiter.settle(self.slot, self.caller, int(usage.get("total_tokens") or 0))
        except GatewayError:
            log.warning("could not count the tokens of chat completion %s", outcome.response_id)

    def observe(self) -> None:
        """Hand the outcome to telemetry and the log line (once the transport has filled in its part)."""
        report_outcome(self.resources, self.outcome)


def _generated(chunks: list[dict[str, Any]]) -> bool:
    for chunk in chunks:
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("content") or delta.get("tool_calls") or delta.get("reasoning_content"):
                return True
    return False
