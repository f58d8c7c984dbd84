"""Readiness: whether this instance can serve, checked in the background, never per request.

`Readiness.run` is a long-running task the app starts in its lifespan
nursery.  Every `READINESS_INTERVAL` seconds it asks the store for a record
that does not exist (a round trip to Redis, a read of the SQLite file) and
each backend for `GET /v1/models` (any HTTP answer counts: it is reachable);
a check that takes longer than the interval (at most 10 s) counts as a failure.  `/ready`
answers from what the last check found: 503 with the reasons while the
store is unreachable, no backend is usable (unreachable, or its circuit
open), or a drain has begun; each backend's state is named (never its URL:
`/ready` needs no key).  Every change of state is logged once, naming the
store or backend and its URL.

Knows the store and backend interfaces and a clock; nothing of HTTP.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio

from ..errors import GatewayError
from ..ops.drain import Drain

__all__ = ["BackendHealth", "Readiness"]

log = logging.getLogger("gateway.app.readiness")

_PROBE_ID = "resp_readiness_probe"  # a record no one stores: the store's answer is the check
_START_WAIT = 1.0  # how long start-up waits for the first check
_PROBE_BOUND = 10.0  # a probe takes at most this (or the interval, if shorter), else it failed


@dataclass
class BackendHealth:
    name: str
    url: str  # for the log, never for /ready
    reachable: bool | None = None  # None: not checked yet
    circuit_open: bool = False
    last_error: str | None = None

    @property
    def usable(self) -> bool:
        return self.reachable is not False and not self.circuit_open

    def public(self) -> dict[str, Any]:
        state = "unknown" if self.reachable is None else "reachable" if self.reachable else "unreachable"
        return {
            "name": self.name,
            "state": state,
            "circuit": "open" if self.circuit_open else "closed",
            "last_error": self.last_error,
        }


class Readiness:
    def __init__(
        self, store: Any, backend: Any, drain: Drain, *, interval: float, store_location: str, clock: Callable[[], float] = trio.current_time
    ) -> None:
        self._store = store
        self._backend = backend
        self._drain = drain
        self._interval = interval
        self._clock = clock
        self.store_location = store_location
        self.store_ok: bool | None = None  # None: not checked yet
        self.backends = [BackendHealth(name, url) for name, url, _ in _backends(backend)]
        self.search: Any = None  # the web search engine (WEB_SEARCH_URL), if any: shown, never gating
        self.search_ok: bool | None = None
        self.checked_at = -math.inf
        self._bound = min(interval, _PROBE_BOUND)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Check now and every interval, until cancelled; started once the first check is done, or
        after `_START_WAIT` (a backend that is itself starting must not hold up start-up: until the
        first check ends, /ready says so)."""
        first = trio.Event()
        async with trio.open_nursery() as nursery:  # owned here: the checks
            nursery.start_soon(self._check_forever, first)
            with trio.move_on_after(_START_WAIT):
                await first.wait()
            task_status.started()

    async def _check_forever(self, first: trio.Event) -> None:
        while True:
            await self.check()
            first.set()
            await trio.sleep_until(max(self.checked_at + self._interval, self._clock()))

    async def check(self) -> None:
        """One look at the store and every backend, at once, each bounded (the interval, at most 10 s)."""
        async with trio.open_nursery() as nursery:  # owned here: one probe per dependency
            nursery.start_soon(self._check_store)
            for health, (_, _, probe) in zip(self.backends, _backends(self._backend)):
                nursery.start_soon(self._check_backend, health, probe)
            if self.search is not None:
                nursery.start_soon(self._check_search)
        self.checked_at = self._clock()

    async def _check_search(self) -> None:
        ok = False
        with trio.move_on_after(self._bound):
            try:
                await self.search.probe()
                ok = True
            except Exception as error:  # (a SearchError: the engine's own words are in the log)
                log.debug("the web search engine does not answer: %s", error)
        if ok != self.search_ok and not (self.search_ok is None and ok):
            log.warning("the web search engine %s", "answers again" if ok else "does not answer (searches are tool errors)")
        self.search_ok = ok

    async def _check_store(self) -> None:
        error: str | None = None
        with trio.move_on_after(self._bound) as waited:
            try:
                await self._store.load(_PROBE_ID)
            except GatewayError as failure:
                error = failure.cause or f"store ({self.store_location}): {failure.message}"
        if waited.cancelled_caught:
            error = f"store ({self.store_location}): no answer within {self._bound:g} s"
        ok = error is None
        if ok != self.store_ok:
            if ok:
                if self.store_ok is not None:
                    log.warning("the store (%s) answers again", self.store_location)
            else:
                log.warning("the store is unreachable: %s", error)
        self.store_ok = ok

    async def _check_backend(self, health: BackendHealth, probe: Callable[[], Any] | None) -> None:
        error: str | None = None
        if probe is not None:
            with trio.move_on_after(self._bound) as waited:
                try:
                    await probe()
                except GatewayError as failure:
                    error = failure.message
            if waited.cancelled_caught:
                error = f"no answer within {self._bound:g} s"
        reachable = error is None
        if reachable != health.reachable:
            if reachable:
                if health.reachable is not None:
                    log.warning("backend %r (%s) answers again", health.name, health.url)
            else:
                log.warning("backend %r (%s) is unreachable: %s", health.name, health.url, error)
        health.reachable = reachable
        health.last_error = error if error is not None else health.last_error
        circuit = _circuit(self._backend, health.name)
        if circuit is not None:
            health.circuit_open, last = circuit
            health.last_error = error or last

    def report(self) -> tuple[bool, dict[str, Any]]:
        """(ready, the body /ready answers with)."""
        for health in self.backends:  # the circuit changes with every request: read it now
            circuit = _circuit(self._backend, health.name)
            if circuit is not None:
                health.circuit_open = circuit[0]
        reasons = []
        if self._drain.draining.is_set():
            reasons.append("draining: the gateway is shutting down")
        if self.store_ok is None:
            reasons.append("the first check has not finished")
        if self.store_ok is False:
            reasons.append("the store is unreachable")  # where and why: in the log, not to whoever asks
        if self.backends and not any(health.usable for health in self.backends):
            reasons.append("no backend is reachable")
        ready = not reasons
        status = "ready" if ready else "draining" if self._drain.draining.is_set() else "not_ready"
        body = {
            "status": status,
            "reasons": reasons,
            "store": {"state": "unknown" if self.store_ok is None else "reachable" if self.store_ok else "unreachable"},
            "backends": [health.public() for health in self.backends],
        }
        if self.search is not None:
            body["web_search"] = {"state": "unknown" if self.search_ok is None else "reachable" if self.search_ok else "unreachable"}
        return ready, body


def _backends(backend: Any) -> list[tuple[str, str, Callable[[], Any] | None]]:
    """(name, URL, probe) of each backend behind the app's one: a router's several, or the one."""
    states = getattr(backend, "backends", None)
    if isinstance(states, dict):
        return [(name, getattr(state.adapter, "url", ""), getattr(state.adapter, "probe", None)) for name, state in states.items()]
    if hasattr(backend, "probe"):
        return [(getattr(backend, "name", "default"), getattr(backend, "url", ""), backend.probe)]
    return []  # an embedder's own backend: nothing to ask


def _circuit(backend: Any, name: str) -> tuple[bool, str | None] | None:
    states = getattr(backend, "backends", None)
    if not isinstance(states, dict) or name not in states:
        return None
    state = states[name]
    return backend.circuit_open(state), state.last_error
