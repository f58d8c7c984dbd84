"""Anthropic's Messages API, for Claude Code and the Anthropic SDKs, on any backend.

    POST /v1/messages                 a message, streamed (SSE, Anthropic's events,
                                      `ping` as the keep-alive) or as JSON; also
                                      with `?beta=true`, as Claude Code sends it
    POST /v1/messages/count_tokens    `{"input_tokens": N}`, counted by the backend

Each is wiring: the body read strictly (`wire.messages`: a 400 naming the
field), a turn prepared (`turn.messages`), and a transport that answers
(`transport.sse.MessagesEventStream`, `transport.json.messages_answer`).
Errors, before a stream or as its `error` event, are in Anthropic's shape
(`render.dialect_of`); keys (`x-api-key` too), limits, drain, metrics and
the outcome line are the gateway's as for every route.

`ROUTES` is the route table `gateway.app` registers (see `gateway.call`).
"""

from __future__ import annotations

from .call import Call, Route
from .transport.json import JsonBody, messages_answer
from .transport.sse import DeferredHeadBody, MessagesEventStream
from .turn.messages import count_message_tokens, prepare_messages
from .wire.messages import parse_count_request, parse_messages_request

__all__ = ["ROUTES"]


async def create(call: Call) -> DeferredHeadBody:
    body = parse_messages_request(await call.read())
    turn = await prepare_messages(call.shared.resources, body, call.ctx, call.headers)
    where = f"POST /v1/messages {call.ctx.request_id or ''}".rstrip()
    if turn.streamed:
        return MessagesEventStream(turn, heartbeats=call.shared.heartbeats, request_id=call.ctx.request_id)
    return messages_answer(turn, where, call.ctx.request_id)


async def count_tokens(call: Call) -> DeferredHeadBody:
    body = parse_count_request(await call.read())
    return JsonBody(await count_message_tokens(call.shared.resources, body, call.ctx, call.headers))


ROUTES: list[Route] = [
    ("POST", "/messages", create),
    ("POST", "/messages/count_tokens", count_tokens),
]
