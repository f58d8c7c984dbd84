"""Transports: how a turn's events reach a client.  Every body is a `DeferredHeadBody` (sse.py):
it decides its status and headers, then yields its writes.

    sse.py          streamed bodies (`/v1/responses`, `/v1/chat/completions`) that own
                    the request's nursery: the turn, events as SSE
    json.py         JSON answers, decided once a turn has run to its end
    websocket.py    WebSocket mode: `response.create` frames answered in order
    passthrough.py  the byte relay: a relayed request's answer as the backend sends it
    follow.py       stored events replayed, running background responses followed
    background.py   background responses: run in a server-owned nursery, with leases
    heartbeats.py   one ticker per process: keep-alives for quiet streams
    leaving.py      how a body hears its client left, at once (the server's call back,
                    or a task that reads)
    asgi.py         a body written on ASGI, and the bridge to Quart's responses

Transports turn event batches into bytes; they decide nothing about the
protocol.  The routes (`gateway.app`, `gateway.api.responses`) wire a transport
to a turn.
"""

__all__: list[str] = []
