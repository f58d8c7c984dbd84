"""The HTTP server: ASGI in, bytes out.  It knows sockets and ASGI, nothing of the gateway's app.

    loop.py       the serve loop: listening sockets, the app's lifespan, connections, an orderly stop
    workers.py    one process or several sharing the sockets, signals (`gateway serve`)
    http11.py     the gateway's own HTTP/1.1 connections (the I/O shell)
    h1.py         HTTP/1.1 framing without I/O: the request reader (httptools, checked as
                  strictly as h11), the response framer (headers checked, lengths accounted)
    websocket.py  WebSockets on those connections (wsproto parses the client's frames)
    hangups.py    the process's watch of clients that leave (epoll, no task per response)
    hypercorn.py  every use of hypercorn's internals (HTTP/2, and `HTTP1_SERVER=hypercorn`)
    ext.py        the ASGI extensions it offers an app (`gateway.http11`, `.disconnect`, `.batch`)

What the server needs of the app beyond ASGI comes as `Hooks` (where it
listens, the drain); what the app may use beyond ASGI, as extensions it
tests for (`ext`, which imports nothing: an app reads it without loading
the server).  This package imports only `gateway.config` and
`gateway.errors` of the gateway (a test keeps it so).
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .loop import GC_THRESHOLDS, LINGER, Hooks, StartupError, open_sockets, serve, serve_sockets, settle_garbage_collector
    from .workers import Build, run

_LAZY = {
    "GC_THRESHOLDS": ".loop",
    "LINGER": ".loop",
    "Hooks": ".loop",
    "StartupError": ".loop",
    "open_sockets": ".loop",
    "serve": ".loop",
    "serve_sockets": ".loop",
    "settle_garbage_collector": ".loop",
    "Build": ".workers",
    "run": ".workers",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'gateway.server' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    globals()[name] = value
    return value


__all__ = sorted(_LAZY)
