"""Transports: how a turn's events reach a client.

    sse.py         streamed bodies (`/v1/responses`, `/v1/chat/completions`) that own
                   the request's nursery: the turn, events as SSE
    heartbeats.py  one ticker per process: keep-alives for quiet streams, and the
                   bound on clients that stop reading
    asgi.py        streamed bodies onto ASGI: one writer for Quart's responses and
                   the hot route's (app.py serves streamed `/v1/responses` beside
                   Quart: the body read, replayed to Quart when it is not for it)
    background.py  background responses: run detached, followed by id

The HTTP routes (`gateway.app`) wire a transport to a turn; the JSON and
WebSocket transports are small enough to live beside them.
"""

__all__: list[str] = []
