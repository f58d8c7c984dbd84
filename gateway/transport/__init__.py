"""Transports: how a turn's events reach a client.

    sse.py   streamed bodies (`/v1/responses`, `/v1/chat/completions`) that own
             the request's nursery: the turn beside a heartbeat, events as SSE

The HTTP routes (`gateway.app`) wire a transport to a turn; the JSON and
WebSocket transports are small enough to live beside them.
"""

__all__: list[str] = []
