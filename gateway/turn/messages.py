"""An Anthropic message: `/v1/messages` as a chat-shaped turn over the same engine.

    prepare_messages   before anything is sent: the Messages request mapped to
                       the engine's chat request (`messages_plan`), admitted as
                       a chat completion is (`chat.admit_chat`: the one tool
                       offering rule, the key's model and limits, tokens
                       reserved), with the client's own request beside it for a
                       backend that speaks Messages (`NativeRequest`: it goes
                       only while the gateway adds no tools of its own)
    count_message_tokens   `POST /v1/messages/count_tokens`: the same request,
                       counted by the backend its model routes to

The turn is a `ChatTurn` whose session is a `MessagesSession`: its events
are Anthropic's, its failures one `error` event; slots, token counts, drain
and the outcome (`transport=messages`) are the chat turn's.  Nothing here
knows HTTP or bytes.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from ..backends import NativeRequest
from ..intake import RequestContext
from ..streams.messages import MessagesSession
from .chat import ChatTurn, admit_chat
from .engine import Resources
from .context_edits import apply_edits
from .messages_plan import chat_request, native_body, unmapped
from .threads import THREADS_BETA, open_thread

__all__ = ["count_message_tokens", "prepare_messages"]

log = logging.getLogger("gateway.turn")


def _native(body: dict[str, Any], headers: Mapping[str, str]) -> NativeRequest:
    # The gateway holds the thread: the backend gets the whole conversation, without the threads beta.
    betas = ",".join(b for b in (headers.get("anthropic-beta") or "").split(",") if b.strip() and b.strip() != THREADS_BETA)
    return NativeRequest("anthropic-messages", native_body(body), {"anthropic-beta": betas} if betas else {})


def _mapped(body: dict[str, Any], headers: Mapping[str, str]) -> dict[str, Any]:
    chat = chat_request(body)
    if log.isEnabledFor(logging.DEBUG):
        left = unmapped(body)
        if left or headers.get("anthropic-beta"):
            log.debug(
                "messages request: %s not given to chat backends; betas: %s",
                ", ".join(left) or "nothing",
                headers.get("anthropic-beta") or "none",
            )
    return chat


async def prepare_messages(
    resources: Resources, body: dict[str, Any], ctx: RequestContext, headers: Mapping[str, str]
) -> ChatTurn:
    """A checked Messages request (`wire.messages`) as a turn ready to run.

    A `thread` is opened first (`threads.open_thread`): a continue's conversation put back, its
    answer claimed, and let go again should the turn not be admitted.

    Raises:
        ThreadRefused: the thread cannot be used.
        InvalidRequest: a continue's `tool_result` answers no `tool_use` of the conversation.
        NotFound: the key may not use the model.
        RateLimited: a limit of the key is reached.
        StoreUnavailable: the key store or the conversation store failed.
    """
    message_id = resources.ids("msg")
    threading = await open_thread(
        resources.store,
        body,
        owner=ctx.caller.owner,
        answer_id=message_id,
        clock=resources.clock,
        enabled=resources.settings.message_threads,
    )
    try:
        edited, applied = await _edited(resources, body)
        chat = _mapped(edited, headers)
        admitted = await admit_chat(resources, chat, ctx, "msg", ctx.gateway_tools(), turn_id=message_id)
    except BaseException:
        if threading is not None:
            await threading.release()
        raise
    admitted.outcome.transport = "messages"
    native = None if admitted.tools.routes else _native(body, headers)
    session = MessagesSession(
        chat,
        set(admitted.tools.routes),
        max_rounds=resources.settings.max_tool_call_iterations,
        message_id=admitted.outcome.response_id,
        model=str(body["model"]),
        ids=resources.ids,
        native=native,
        collect=threading is not None,
    )
    session.events.applied_edits = applied
    turn = ChatTurn(resources, session, admitted, relayed=False, streamed=bool(body.get("stream")))
    turn.threading = threading
    return turn


async def _edited(resources: Resources, body: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]] | None]:
    """The body a chat backend gets after `context_management.edits` (`context_edits`), and the
    edits applied (None: none were asked).  A backend that speaks Messages gets the client's
    own body and applies them itself."""
    config = body.get("context_management")
    edits = config.get("edits") if isinstance(config, dict) else None
    if not isinstance(edits, list):
        return body, None

    async def count(messages: list[dict[str, Any]]) -> int:
        chat = chat_request({**body, "messages": messages})
        return await resources.backend.count_tokens(chat, headers=resources.telemetry.trace_headers())

    messages, applied, _ = await apply_edits(edits, body["messages"], count)
    return {**body, "messages": messages}, applied


async def count_message_tokens(
    resources: Resources, body: dict[str, Any], ctx: RequestContext, headers: Mapping[str, str]
) -> dict[str, Any]:
    """`{"input_tokens": N}` for a checked `count_tokens` body: the request a create would send
    (the gateway's tools offered by the same rule), counted by the backend (its tokenizer, or a
    completion's usage), never an estimate.  Nothing is reserved; the key's model list holds.

    Raises:
        NotFound: the key may not use the model, or no route names it.
        BackendStatusError: the backend refused the request (its 4xx is the client's).
        BackendError: the backend could not be reached, or cannot count
            (`token_count_unavailable`, 502).
    """
    await open_thread(
        resources.store, body, owner=ctx.caller.owner, answer_id="", clock=resources.clock,
        enabled=resources.settings.message_threads, claim=False,
    )  # (a continue counted whole)
    chat = _mapped(body, headers)
    admitted = await admit_chat(resources, chat, ctx, "msg", ctx.gateway_tools(), admit=False)
    native = None if admitted.tools.routes else _native(body, headers)
    tokens = await resources.backend.count_tokens(chat, headers=resources.telemetry.trace_headers(), native=native)
    return {"input_tokens": tokens}
