"""The Responses API's own endpoints: creating a response, over HTTP or a WebSocket.

    create                a response: the body parsed (`wire.requests`), the
                          turn prepared, and the transport it asked for
    socket                WebSocket mode: its turns, in order, on one connection
    submit_tool_outputs   the required_action protocol: the client's outputs
                          continue a stored response as its next turn
    input_tokens          the input a request would send, counted
    compact               a conversation compacted into one item

`respond` is what `create` and a continuation run: an SSE stream, a JSON
answer, or a background job (its queued snapshot, or its events followed
live).  Stored responses are `api.stored`.
"""

from __future__ import annotations

from ..errors import NotFound
from ..server.ext import BATCH, extension
from ..transport.body import DeferredHeadBody
from ..transport.follow import EventReplay, follow_job
from ..transport.json import JsonBody, compaction_answer, turn_answer
from ..transport.sse import TurnEventStream
from ..transport.websocket import serve_asgi_websocket
from ..turn import prepare_turn
from ..turn.compact import prepare_compaction
from ..turn.count import count_input_tokens
from ..wire import CreateResponseRequest
from ..wire.requests import create_request, tool_outputs_request
from .routes import Call, Socket
from .stored import StoredResponses

__all__ = ["compact", "create", "input_tokens", "respond", "socket", "submit_tool_outputs"]


async def respond(call: Call, req: CreateResponseRequest) -> DeferredHeadBody:
    """A Responses request's turn, with the transport it asked for.

    Raises:
        GatewayError: the request cannot be served (as `prepare_turn`; a
            background request while the gateway shuts down: `ShuttingDown`).
    """
    shared, ctx = call.shared, call.ctx
    kind = "background" if req.background else "sse" if req.stream else "json"
    tools = ctx.gateway_tools((req.model_extra or {}).get("gateway_tools"))
    turn = await prepare_turn(
        shared.resources, req, transport=kind, caller=ctx.caller, gateway_tools=tools, request_id=ctx.request_id,
        arrived=ctx.arrived,
    )
    if req.background:
        job = await shared.runner.start(turn)
        return EventReplay(follow_job(job, -1)) if req.stream else JsonBody(job.record.response)
    return TurnEventStream(turn, heartbeats=shared.heartbeats) if req.stream else turn_answer(turn, ctx.where)


async def create(call: Call) -> DeferredHeadBody:
    return await respond(call, create_request(await call.read()))


async def submit_tool_outputs(call: Call) -> DeferredHeadBody:
    if call.shared.resources.settings.tool_call_protocol != "required_action":
        raise NotFound("Unknown endpoint: set TOOL_CALL_PROTOCOL=required_action to use it.", code="unknown_url")
    raw = await call.read()
    stored = StoredResponses(call.shared.runner, call.shared.resources.store)
    previous = await stored.record(call.params["response_id"], call.ctx.caller.owner)
    return await respond(call, tool_outputs_request(raw, previous.response))


async def input_tokens(call: Call) -> DeferredHeadBody:
    return JsonBody(await count_input_tokens(call.shared.resources, create_request(await call.read()), call.ctx))


async def compact(call: Call) -> DeferredHeadBody:
    turn = await prepare_compaction(call.shared.resources, create_request(await call.read()), call.ctx)
    return compaction_answer(call.shared.resources, turn, call.ctx.where)


async def socket(socket: Socket) -> None:
    batch = extension(socket.scope, BATCH)
    hold = batch["hold"] if batch else None
    await serve_asgi_websocket(
        socket.shared.resources, socket.ctx, socket.receive, socket.send, hold, socket.shared.heartbeats
    )
