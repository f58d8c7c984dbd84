"""OpenAI's Chat Completions front end.

    create   a chat completion: relayed to the backend as it is when the
             gateway has nothing to add (no gateway tools offered, no token
             limit to count), else the gateway's chat turn (its MCP tools in
             a tool loop), streamed as chat chunks or answered as JSON

Wiring only: the turn prepared (`turn.chat`), a transport that answers
(`transport.passthrough`, `transport.sse`, `transport.json`).
"""

from __future__ import annotations

import orjson

from ..transport.body import DeferredHeadBody
from ..transport.json import chat_answer
from ..transport.passthrough import passthrough
from ..transport.sse import ChatEventStream
from ..turn.chat import prepare_chat
from ..turn.relay import chat_relay
from ..wire.requests import chat_request
from .routes import Call

__all__ = ["create"]


async def create(call: Call) -> DeferredHeadBody:
    resources = call.shared.resources
    turn = await prepare_chat(resources, chat_request(await call.read()), call.ctx)
    if turn.relayed:  # nothing of the gateway's to add: the backend's answer, as it sends it
        relay = chat_relay(resources, turn, call.query, dict(call.headers), orjson.dumps(turn.body))
        return passthrough(resources, relay, call.shared.heartbeats)
    if turn.streamed:
        return ChatEventStream(turn, heartbeats=call.shared.heartbeats)
    return chat_answer(turn, call.ctx.where)
