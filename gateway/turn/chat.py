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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from ..errors import BackendStreamError, GatewayError, InternalError, ShuttingDown
from ..keys import Caller, StreamSlot, token_reservation
from ..observe.outcome import TurnOutcome
from ..streams.chat import ChatSession
from .context import RequestContext
from .base import TurnBase
from .engine import Resources
from .rounds import Emit, Session, failed_with, run_rounds
from .tools import RequestTools, offer_configured, offers_gateway_tools

__all__ = ["Admitted", "ChatShaped", "ChatTurn", "admit_chat", "prepare_chat"]

log = logging.getLogger("gateway.turn")


async def prepare_chat(resources: Resources, body: dict[str, Any], ctx: RequestContext) -> ChatTurn:
    """Everything that can refuse the request, before any byte is sent.

    Raises:
        NotFound: the key may not use the model.
        RateLimited: a limit of the key is reached.
        StoreUnavailable: the key store failed.
    """
    admitted = await admit_chat(resources, body, ctx, "chatcmpl", ctx.gateway_tools(body.pop("gateway_tools", None)))
    streamed = bool(body.get("stream"))
    relayed = not admitted.tools.routes and ctx.caller.limits.tpm is None
    admitted.outcome.transport = "chat-relay" if relayed else "chat-sse" if streamed else "chat-json"
    session = ChatSession(body, set(admitted.tools.routes), max_rounds=resources.settings.max_tool_call_iterations)
    return ChatTurn(resources, session, admitted, relayed=relayed, streamed=streamed)


@dataclass
class Admitted:
    """A chat request let in: the gateway's tools it is offered (added to its `tools`), its stream
    slot and tokens reserved, and its outcome (transport to be named by the front end)."""

    body: dict[str, Any]
    tools: RequestTools
    caller: Caller
    slot: StreamSlot | None
    outcome: TurnOutcome


async def admit_chat(
    resources: Resources,
    body: dict[str, Any],
    ctx: RequestContext,
    kind: str,
    gateway_tools: bool,
    *,
    admit: bool = True,
    turn_id: str | None = None,
) -> Admitted:
    """The admission every chat-shaped front end shares (chat completions, Messages): the one
    tool-offering rule, the key's model and limits, tokens reserved (`max_tokens` bounded by
    them); `kind` prefixes the id (or `turn_id` is it).  `admit=False` (a token count): only the key's model list
    holds; nothing is reserved and no stream slot is taken.

    Raises:
        NotFound: the key may not use the model.
        RateLimited: a limit of the key is reached.
        StoreUnavailable: the key store failed.
    """
    caller = ctx.caller
    tools = RequestTools()
    if gateway_tools and offers_gateway_tools(body.get("tool_choice")):
        own = {t.get("function", {}).get("name") for t in body.get("tools") or () if isinstance(t, dict)}
        offer_configured(tools, resources.mcp, taken=own, limits=caller.limits)
    turn_id = turn_id or resources.ids(kind)
    model = str(body.get("model") or "")
    slot = None
    if admit:
        tokens, max_tokens = token_reservation(body, caller.limits)
        if max_tokens is not None:
            body["max_tokens"] = max_tokens  # what it reserved bounds what it may use
        slot = await resources.limiter.admit_stream(caller, model, turn_id, tokens=tokens)
    else:
        resources.limiter.check_model(caller, model)
    if tools.chat_tools:
        body["tools"] = [*(body.get("tools") or []), *tools.chat_tools]
    started = ctx.arrived if ctx.arrived is not None else trio.current_time()
    outcome = TurnOutcome(turn_id, model, kind, started, key=caller.name, request_id=ctx.request_id)
    return Admitted(body, tools, caller, slot, outcome)


class Keeper(Protocol):
    """What keeps a turn's answer beyond it (a message thread, `threads.Threading`)."""

    async def keep(self, message: Mapping[str, Any]) -> None: ...

    async def release(self) -> None: ...


class ChatShaped(Session, Protocol):
    """What a chat-shaped turn's session is beyond the engine's `Session` (`ChatSession`,
    `MessagesSession`): its opening output, its summed usage, how it failed, and which of its
    output the model generated."""

    @property
    def rounds(self) -> int: ...

    @property
    def usage(self) -> dict[str, Any] | None: ...

    @property
    def failure(self) -> str | None: ...

    @property
    def failure_message(self) -> str | None: ...

    def start(self) -> list[Any]: ...

    def generated(self, output: list[Any]) -> bool: ...

    @property
    def answer(self) -> Any: ...  # the answer as it is made, when kept (`MessageCollector`), or None


class ChatTurn(TurnBase):
    """One chat-shaped turn being produced (see the module docstring): a chat completion, or an
    Anthropic message (`session` decides what the client sees)."""

    session: ChatShaped

    def __init__(self, resources: Resources, session: ChatShaped, admitted: Admitted, *, relayed: bool, streamed: bool) -> None:
        super().__init__(resources, admitted.caller, admitted.slot, admitted.outcome)
        self.body = admitted.body
        self.tools = admitted.tools
        self.relayed = relayed
        self.streamed = streamed
        self.session = session
        # Keeps the complete answer before its last events go out (a message thread), else lets go.
        self.threading: Keeper | None = None

    async def _produce(self, emit: Emit) -> None:
        resources = self.resources
        settings = resources.settings
        session = self.session
        outcome = self.outcome

        async def timed(chunks: list[dict[str, Any]]) -> None:
            if chunks:
                generated = session.generated(chunks)
                outcome.note_events(trio.current_time(), generated)
                if not self.answered.is_set() and (generated or session.done):
                    self._answered(generated)
                if session.done and not session.failure:
                    await self._keep()
                await emit(chunks)

        try:
            await timed(session.start())
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
                    on_answer=self._on_answer,
                    opening=self._opening,
                    watch=resources.read_watch,
                )
            if stop.cancelled_caught and not session.done:
                self.failure = ShuttingDown.stopped()
                await timed(failed_with(session, self.failure))
        except trio.Cancelled:
            outcome.client_left = True
            raise
        except GatewayError as error:
            self.failure = error
            await timed(failed_with(session, error))
        except Exception:
            log.debug("turn %s failed", outcome.response_id, exc_info=True)
            self.failure = InternalError("The gateway failed to process the request.")
            await timed(failed_with(session, self.failure))

    async def _keep(self) -> None:
        threading, self.threading = self.threading, None
        message = self.session.answer.message if self.session.answer is not None else None
        if threading is not None and message is not None:
            with trio.CancelScope(shield=True):  # (a client that leaves now has its answer made)
                await threading.keep(message)

    def _on_answer(self, error: GatewayError | None) -> None:
        if error is not None and not self.answered.is_set():  # the backend refused, or could not be reached
            self.rejection = error
            self.answered.set()

    def _answered(self, generated: bool) -> None:
        """The first content, or the end before any: what failed it then is its rejection."""
        session = self.session
        if not generated and session.failure:
            self.rejection = self.failure or BackendStreamError(session.failure_message or "the backend failed", code=session.failure)
        self.answered.set()

    def _conclude(self) -> None:
        """The outcome, as a Responses turn's: its status, usage and rounds."""
        if not self.answered.is_set():
            self._answered(False)
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

    async def _settle(self) -> None:
        """A message thread never kept (no answer) let go, then the slot and tokens."""
        threading, self.threading = self.threading, None
        if threading is not None:
            await threading.release()
        await super()._settle()

    def _usage(self) -> dict[str, Any]:
        return self.session.usage or {}
