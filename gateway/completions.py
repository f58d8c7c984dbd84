"""OpenAI's Chat Completions front end: `POST /v1/chat/completions`.

    create   a chat completion: relayed to the backend as it is when the
             gateway has nothing to add (no gateway tools offered, no token
             limit to count), else the gateway's chat turn (its MCP tools in
             a tool loop), streamed as chat chunks or answered as JSON

Wiring only: the body read by the intake, the turn prepared (`turn.chat`),
a transport that answers (`transport.passthrough`, `transport.sse`,
`transport.json`).  `ROUTES` is the route table `gateway.app` serves (see
`gateway.call`).
"""

from __future__ import annotations

from typing import cast

import orjson

from . import intake
from .backends import PassthroughBackend
from .call import Call, Route
from .transport.json import chat_answer
from .transport.passthrough import PassthroughBody
from .transport.sse import ChatEventStream, DeferredHeadBody
from .turn.chat import prepare_chat
from .turn.relay import chat_relay

__all__ = ["ROUTES"]


async def create(call: Call) -> DeferredHeadBody:
    resources = call.shared.resources
    turn = await prepare_chat(resources, intake.chat_request(await call.read()), call.ctx)
    if turn.relayed:  # nothing of the gateway's to add: the backend's answer, as it sends it
        relay = chat_relay(resources, turn, call.query, dict(call.headers), orjson.dumps(turn.body))
        return PassthroughBody(
            cast(PassthroughBackend, resources.backend), relay, heartbeats=call.shared.heartbeats, drain=resources.drain
        )
    if turn.streamed:
        return ChatEventStream(turn, heartbeats=call.shared.heartbeats)
    return chat_answer(turn, f"POST /v1/chat/completions {call.ctx.request_id or ''}".rstrip())


ROUTES: list[Route] = [
    ("POST", "/chat/completions", create),
]
