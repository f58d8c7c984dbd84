"""Anthropic's Messages API, for Claude Code and the Anthropic SDKs, on any backend.

    create         a message, streamed (SSE, Anthropic's events, `ping` as the
                   keep-alive) or as JSON; also with `?beta=true`, as Claude
                   Code sends it
    count_tokens   `{"input_tokens": N}`, counted by the backend

Each is wiring: the body read strictly (`wire.messages`: a 400 naming the
field), a turn prepared (`turn.messages`), and a transport that answers
(`transport.sse.MessagesEventStream`, `transport.json.messages_answer`).
Errors, before a stream or as its `error` event, are in Anthropic's shape
(`transport.render.dialect_of`); keys (`x-api-key` too), limits, drain,
metrics and the outcome line are the gateway's as for every route.
"""

from __future__ import annotations

from ..transport.body import DeferredHeadBody
from ..transport.json import JsonBody, messages_answer
from ..transport.sse import MessagesEventStream
from ..turn.messages import count_message_tokens, prepare_messages
from ..wire.messages import parse_count_request, parse_messages_request
from .routes import Call

__all__ = ["count_tokens", "create"]


async def create(call: Call) -> DeferredHeadBody:
    body = parse_messages_request(await call.read())
    turn = await prepare_messages(call.shared.resources, body, call.ctx, call.headers)
    if turn.streamed:
        return MessagesEventStream(turn, heartbeats=call.shared.heartbeats, request_id=call.ctx.request_id)
    return messages_answer(turn, call.ctx.where, call.ctx.request_id)


async def count_tokens(call: Call) -> DeferredHeadBody:
    body = parse_count_request(await call.read())
    return JsonBody(await count_message_tokens(call.shared.resources, body, call.ctx, call.headers))
