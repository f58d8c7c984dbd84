"""What Quart's router costs a request: one row of the route table served ahead of it and through it.

The route table (`gateway.api.ROUTES`) marks a row `served="ahead"` only
where the framework's router and request objects cost it more than 0.1 ms of
CPU a request.  This measures that cost in-process, on the whole app (the
edge, the dispatcher, the body read, the answer written): the same trivial
handler at two paths, one row served ahead of Quart and one through it,
driven over ASGI in interleaved rounds, the CPU time of each request
counted.  `gateway bench --only dispatch` prints it as a row.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import trio

from ..api import ROUTES
from ..api.routes import Call, Route
from ..config import Settings
from ..transport.body import DeferredHeadBody
from ..transport.json import JsonBody

__all__ = ["DispatchCost", "measure"]

_AHEAD, _FRAMEWORK = "/v1/lab/ahead", "/v1/lab/framework"


async def _echo(call: Call) -> DeferredHeadBody:
    await call.read()
    return JsonBody({"ok": True})


def _routes() -> Sequence[Route]:
    return (
        Route("POST", _AHEAD, _echo, served="ahead", cost="measured here"),
        Route("POST", _FRAMEWORK, _echo),
        *ROUTES,
    )


@dataclass(frozen=True)
class DispatchCost:
    """CPU per request, in microseconds, round by round."""

    ahead: list[float]
    framework: list[float]

    @property
    def added(self) -> list[float]:
        """What the framework's router added, round by round."""
        return [f - a for a, f in zip(self.ahead, self.framework)]

    @staticmethod
    def median(values: list[float]) -> float:
        return statistics.median(values)


def _scope(path: str, body: bytes) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"lab"), (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 0),
        "extensions": {},
    }


async def _request(app: Any, path: str, body: bytes) -> int:
    done = trio.Event()
    status = 0
    given = False

    async def receive() -> dict[str, Any]:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            done.set()

    await app(_scope(path, body), receive, send)
    done.set()
    return status


async def measure(*, requests: int = 2000, rounds: int = 5) -> DispatchCost:
    """The trivial row's CPU per request, served ahead and through Quart, in `rounds` interleaved rounds."""
    from .. import create_app  # (as an embedder builds one: the package face)

    settings = Settings(_env_file=None, store_backend="memory", log_file_path="", metrics_enabled=False)  # type: ignore[call-arg]
    app = create_app(settings, routes=_routes())
    body = b'{"model": "lab", "input": "hi"}'
    ahead: list[float] = []
    framework: list[float] = []
    async with trio.open_nursery() as nursery:
        startup, shutdown = trio.Event(), trio.Event()
        started = trio.Event()

        async def lifespan_receive() -> dict[str, Any]:
            if not startup.is_set():
                startup.set()
                return {"type": "lifespan.startup"}
            await shutdown.wait()
            return {"type": "lifespan.shutdown"}

        async def lifespan_send(message: dict[str, Any]) -> None:
            if message["type"] == "lifespan.startup.complete":
                started.set()
            elif message["type"] == "lifespan.startup.failed":
                raise RuntimeError(message.get("message", "the app did not start"))

        nursery.start_soon(app, {"type": "lifespan", "asgi": {"version": "3.0"}}, lifespan_receive, lifespan_send)
        await started.wait()
        for path in (_AHEAD, _FRAMEWORK):  # warm: first requests build what is cached
            for _ in range(200):
                assert await _request(app, path, body) == 200
        for _ in range(rounds):
            for path, into in ((_AHEAD, ahead), (_FRAMEWORK, framework)):
                began = time.process_time()
                for _ in range(requests):
                    await _request(app, path, body)
                into.append((time.process_time() - began) / requests * 1e6)
        shutdown.set()
    return DispatchCost(ahead, framework)


if __name__ == "__main__":
    cost = trio.run(measure)
    added = cost.added
    print(
        f"served ahead: {DispatchCost.median(cost.ahead):.1f} µs a request; through Quart: "
        f"{DispatchCost.median(cost.framework):.1f} µs; Quart adds {DispatchCost.median(added):+.1f} µs "
        f"[{min(added):+.1f} to {max(added):+.1f}]"
    )
