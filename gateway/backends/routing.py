"""Many backends as one: model routes, fallback before the first chunk, circuit breakers, caps.

`Router` is itself a `ChatBackend` and a `PassthroughBackend`, so the turn
engine and the routes do not know there is more than one backend.

For a chat stream the router walks the route's backends in order:

- a backend whose circuit is open (it kept failing) is skipped until its
  cool-down has passed; then one request probes it;
- a capped backend (`max_concurrent_streams`) is waited for, at most its
  `queue_timeout`, then counted as busy and passed over;
- a failure before the first chunk (no connection, a timeout before
  headers, 429, 5xx or 529, or a stream that fails before yielding
  anything) moves on to the next backend, up to `max_attempts`;
- a 4xx other than 429 is the client's mistake and is answered as it is;
- once a chunk has been handed on, there is no retry: a failure then ends
  the response as with one backend.

When every backend is out, a `Retry-After` no longer than `max_retry_after`
is waited out once.  What is tried and why is logged at DEBUG; every failure
counts against the backend's circuit.

A token count asks the backend a generation would go to: the first of the
route's backends whose circuit lets requests through (and, when that one
cannot be reached, the next, as a generation would move on).  Counting
takes no stream slot and does not touch a circuit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import orjson
import trio

from ..errors import (
    BackendError,
    BackendStatusError,
    BackendStreamError,
    BackendUnavailable,
    GatewayError,
    NotFound,
)
from ..wire import model_of
from .config import BackendConfig, FallbackConfig, GatewayConfig, RouteTarget
from .native import NativeRequest
from .openai import COUNT_UNAVAILABLE

__all__ = ["BackendState", "Router", "backend_models", "build_router", "context_window_of", "models_for"]

log = logging.getLogger("gateway.backends")


@dataclasses.dataclass
class BackendState:
    """One named backend: its adapter, its cap, its circuit."""

    config: BackendConfig
    adapter: Any  # a ChatBackend (and, for OpenAI-compatible ones, a PassthroughBackend)
    slots: trio.Semaphore | None = None
    failures: int = 0  # consecutive
    open_until: float = 0.0  # while the clock is before this, the circuit is open
    probing: bool = False  # a request is testing a backend whose cool-down has passed
    last_error: str | None = None  # what its last failure said (for readiness)

    @property
    def name(self) -> str:
        return self.config.name


class _NoBackend(BackendUnavailable):
    """Every backend of the route failed, was busy or had its circuit open."""


class Router:
    def __init__(
        self,
        config: GatewayConfig,
        adapters: Mapping[str, Any],
        *,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        self.config = config
        self.fallback: FallbackConfig = config.fallback
        self._clock = clock
        self.backends = {
            name: BackendState(
                backend,
                adapters[name],
                trio.Semaphore(backend.max_concurrent_streams) if backend.max_concurrent_streams else None,
            )
            for name, backend in config.backends.items()
        }

    async def aclose(self) -> None:
        for state in self.backends.values():
            close = getattr(state.adapter, "aclose", None)
            if close is not None:
                await close()

    # --- choosing ------------------------------------------------------------------------

    def targets(self, model: str) -> list[RouteTarget]:
        """The backends `model` goes to, in order of preference.

        Raises:
            NotFound: no route names the model and there is more than one backend.
        """
        route = self.config.route_for(model)
        if route is not None:
            return list(route.targets)
        if len(self.backends) == 1:
            return [RouteTarget(next(iter(self.backends)))]
        raise NotFound(
            f"The model '{model}' does not exist or you do not have access to it.", param="model", code="model_not_found"
        )

    def _available(self, state: BackendState) -> bool:
        """Closed circuit, or open with its cool-down over and nobody probing yet."""
        if state.failures < self.fallback.failures_to_open:
            return True
        return self._clock() >= state.open_until and not state.probing

    def circuit_open(self, state: BackendState) -> bool:
        """Whether requests skip the backend now (it kept failing and its cool-down runs)."""
        return state.failures >= self.fallback.failures_to_open and self._clock() < state.open_until

    def _failed(self, state: BackendState, error: BaseException) -> None:
        state.last_error = error.message if isinstance(error, GatewayError) else type(error).__name__
        state.failures += 1
        state.probing = False
        if state.failures >= self.fallback.failures_to_open:
            state.open_until = self._clock() + self.fallback.cooldown
            if state.failures == self.fallback.failures_to_open:
                log.warning("backend %s failed %d times in a row; skipped for %g s", state.name, state.failures, self.fallback.cooldown)
        log.debug("backend %s failed (%s)", state.name, type(error).__name__)

    def _succeeded(self, state: BackendState) -> None:
        if state.failures >= self.fallback.failures_to_open:
            log.info("backend %s answers again", state.name)
        state.failures = 0
        state.probing = False

    # --- the chat interface ------------------------------------------------------------

    def begin_chat(
        self, body: dict[str, Any], *, headers: Mapping[str, str] | None = None, native: NativeRequest | None = None
    ) -> _Opening | None:
        """The request begun on the backend `open_chat_stream` would try first (see
        `ChatBackend`), when that one takes requests without queueing and can begin one."""
        try:
            target = self.targets(str(body.get("model") or ""))[0]
        except NotFound:
            return None  # (refused by `open_chat_stream`)
        state = self.backends[target.backend]
        begin = getattr(state.adapter, "begin_chat", None)
        if begin is None or state.slots is not None or state.failures >= self.fallback.failures_to_open:
            return None
        sent = _for_target(body, target)
        opening = begin(sent, headers=headers, native=native)
        return _Opening(target, opening) if opening is not None else None

    @contextlib.asynccontextmanager
    async def open_chat_stream(
        self,
        body: dict[str, Any],
        *,
        headers: Mapping[str, str] | None = None,
        native: NativeRequest | None = None,
        opening: _Opening | None = None,
    ) -> AsyncIterator[Any]:
        """(`opening`: what `begin_chat` began for this body: its answer is read, if the
        first backend tried is still the one it began on.)"""
        try:
            async with self._open_chat_stream(body, headers, native, opening) as stream:
                yield stream
        finally:
            if opening is not None:
                opening.close()

    @contextlib.asynccontextmanager
    async def _open_chat_stream(
        self, body: dict[str, Any], headers: Mapping[str, str] | None, native: NativeRequest | None, opening: _Opening | None
    ) -> AsyncIterator[Any]:
        model = str(body.get("model") or "")
        targets = self.targets(model)
        last_error: BaseException | None = None
        waited = False
        while True:
            attempts = 0
            retry_after: float | None = None
            for target in targets:
                state = self.backends[target.backend]
                if attempts >= self.fallback.max_attempts:
                    break
                if not self._available(state):
                    continue
                attempts += 1
                if state.failures >= self.fallback.failures_to_open:
                    state.probing = True
                sent = _for_target(body, target)
                async with contextlib.AsyncExitStack() as stack:
                    try:
                        if state.slots is not None:
                            with trio.move_on_after(state.config.queue_timeout) as queued:
                                await stack.enter_async_context(state.slots)
                            if queued.cancelled_caught:
                                state.probing = False
                                last_error = BackendUnavailable(f"backend {state.name} is busy")
                                continue
                        begun = opening.take(target) if opening is not None else None
                        opening = None  # (for the first backend tried only)
                        if begun is not None:
                            opened = state.adapter.open_chat_stream(sent, headers=headers, native=native, opening=begun)
                        else:
                            opened = state.adapter.open_chat_stream(sent, headers=headers, native=native)
                        stream = await stack.enter_async_context(opened)
                        first = await _first_batch(stream)
                        if first and all(_is_error(chunk) for chunk in first):
                            said = first[0]["error"].get("message") if isinstance(first[0]["error"], dict) else None
                            raise BackendStreamError(str(said or "the backend's stream failed before its first chunk"))
                    except BackendStatusError as error:
                        if 400 <= error.backend_status < 500 and error.backend_status != 429:
                            self._succeeded(state)  # it answered: the request is the problem
                            raise
                        self._failed(state, error)
                        last_error = error
                        if error.retry_after is not None:
                            retry_after = error.retry_after if retry_after is None else min(retry_after, error.retry_after)
                        continue
                    except BackendError as error:
                        self._failed(state, error)
                        last_error = error
                        continue
                    self._succeeded(state)
                    yield _Replayed(first, stream)
                    return
            if not waited and retry_after is not None and retry_after <= self.fallback.max_retry_after:
                waited = True
                await trio.sleep(retry_after)  # the backend asked for exactly this pause
                continue
            break
        if isinstance(last_error, GatewayError):
            raise last_error
        raise _NoBackend(f"no backend could serve the model '{model}' (all failing or busy)")

    async def count_tokens(self, body: dict[str, Any], *, headers: Mapping[str, str] | None = None, native: NativeRequest | None = None) -> int:
        """The prompt tokens of `body`, counted by the backend its model's route would use.

        Raises:
            NotFound: no route names the model and there is more than one backend.
            BackendStatusError: the backend refused the request.
            BackendError: no backend of the route could be reached, or it cannot count.
        """
        model = str(body.get("model") or "")
        last_error: GatewayError = _NoBackend(f"no backend can count tokens for the model '{model}' (all failing)")
        for target in [t for t in self.targets(model) if self._available(self.backends[t.backend])][: self.fallback.max_attempts]:
            state = self.backends[target.backend]
            counter = getattr(state.adapter, "count_tokens", None)
            if counter is None:
                raise BackendError(f"The backend '{state.name}' cannot count tokens.", code=COUNT_UNAVAILABLE)
            try:
                sent = _for_target(body, target)
                return int(await counter(sent, headers=headers, native=native))
            except BackendStatusError as error:
                if 400 <= error.backend_status < 500 and error.backend_status != 429:
                    raise  # the request is the problem
                last_error = error  # a generation would move on too
            except BackendError as error:
                if error.code == COUNT_UNAVAILABLE:
                    raise  # it would serve the generation: another's count would not be its
                last_error = error
        raise last_error

    # --- the passthrough interface -----------------------------------------------------------

    @contextlib.asynccontextmanager
    async def open_passthrough(
        self, method: str, path: str, query: bytes, headers: Mapping[str, str], body: bytes
    ) -> AsyncIterator[Any]:
        """Forward to the first available backend of the body's model (or the first backend)."""
        model = model_of(body)
        targets = self.targets(model) if model is not None else [RouteTarget(next(iter(self.backends)))]
        last_error: GatewayError = _NoBackend("no backend can take this request")
        for target in targets[: self.fallback.max_attempts]:
            state = self.backends[target.backend]
            if not hasattr(state.adapter, "open_passthrough") or not self._available(state):
                continue
            sent = _with_model(body, target.model) if target.model and model is not None else body
            async with contextlib.AsyncExitStack() as stack:
                try:
                    response = await stack.enter_async_context(state.adapter.open_passthrough(method, path, query, headers, sent))
                except BackendError as error:  # not reached: the next one may be
                    self._failed(state, error)
                    last_error = error
                    continue
                if response.status == 429 or response.status >= 500:
                    self._failed(state, BackendUnavailable(f"status {response.status}"))
                else:
                    self._succeeded(state)
                yield response
                return
        raise last_error

    def speaks_messages(self, model: str) -> bool:
        """Whether `model`'s first backend speaks Anthropic's Messages API (it runs Anthropic's
        server tools itself)."""
        try:
            target = self.targets(model)[0]
        except GatewayError:
            return False
        backend = self.config.backends.get(target.backend)
        return backend is not None and backend.type == "anthropic"

    async def context_window(self, model: str) -> int | None:
        """`model`'s context window: its route's `context_window`, else what the backend of its
        first target says (asked once, `context_window_of`), else None."""
        route = self.config.route_for(model)
        if route is None:
            return None
        if route.context_window:
            return route.context_window
        target = route.targets[0]
        return await context_window_of(self.backends[target.backend].adapter, target.model or model)

    async def list_models(self) -> list[dict[str, Any]]:
        """Every configured model name and each backend's own list, deduplicated, OpenAI's shape."""
        models: dict[str, dict[str, Any]] = {}
        for route in self.config.routes:
            if not route.is_glob:
                entry = {"id": route.model, "object": "model", "created": 0, "owned_by": route.targets[0].backend}
                if route.context_window:
                    entry["context_window"] = route.context_window
                models[route.model] = entry
        for state in self.backends.values():
            for entry in await backend_models(state.adapter):
                models.setdefault(str(entry["id"]), {**entry, "owned_by": entry.get("owned_by") or state.name})
        return list(models.values())


class _Opening:
    """A request `begin_chat` began on one route target's backend, until a round takes it."""

    __slots__ = ("target", "_begun")

    def __init__(self, target: RouteTarget, begun: Any) -> None:
        self.target = target
        self._begun = begun

    def take(self, target: RouteTarget) -> Any:
        """The begun request, for the first backend tried when it is the one it began on."""
        if target != self.target:
            return None
        begun, self._begun = self._begun, None
        return begun

    def close(self) -> None:
        if self._begun is not None:
            self._begun.close()
            self._begun = None


class _Replayed:
    """A backend stream whose first batch was read ahead (to know the backend answered)."""

    def __init__(self, first: list[Any] | None, stream: Any) -> None:
        self._first = first
        self._stream = stream
        self._rest = stream.__aiter__()

    @property
    def saw_done(self) -> bool:
        return bool(self._stream.saw_done)

    @property
    def waited(self) -> float:
        return float(getattr(self._stream, "waited", 0.0))

    def __aiter__(self) -> _Replayed:
        return self

    async def __anext__(self) -> list[Any]:
        if self._first is not None:
            first, self._first = self._first, None
            return first
        return await self._rest.__anext__()


def _is_error(chunk: Any) -> bool:
    return isinstance(chunk, dict) and "error" in chunk and not chunk.get("choices")


async def _first_batch(stream: Any) -> list[Any] | None:
    """Read one batch ahead (None: the stream was empty); its failure is the backend's."""
    try:
        return await stream.__aiter__().__anext__()
    except StopAsyncIteration:
        return None


async def context_window_of(backend: Any, model: str) -> int | None:
    """A backend's context window for `model` (an optional capability, looked up by name: an
    adapter without it, such as Anthropic's, does not know one)."""
    ask = getattr(backend, "context_window", None)
    return await ask(model) if ask is not None else None


async def backend_models(adapter: Any) -> list[dict[str, Any]]:
    """A backend's own model list (its `list_models`, or `GET /v1/models`); empty if it has none."""
    lister = getattr(adapter, "list_models", None)
    if lister is not None:
        try:
            return list(await lister())
        except GatewayError:
            return []
    if not hasattr(adapter, "open_passthrough"):
        return []
    try:
        with trio.move_on_after(5):
            async with adapter.open_passthrough("GET", "models", b"", {}, b"") as response:
                if response.status != 200:
                    return []
                raw = b"".join([chunk async for chunk in response])
                data = orjson.loads(raw).get("data")
                return [entry for entry in data if isinstance(entry, dict) and "id" in entry] if isinstance(data, list) else []
    except (GatewayError, orjson.JSONDecodeError, AttributeError):
        return []
    return []


def _for_target(body: dict[str, Any], target: RouteTarget) -> dict[str, Any]:
    """A chat request as `target`'s backend is sent it: under the name it knows the model by."""
    return {**body, "model": target.model} if target.model else body


def _with_model(body: bytes, model: str) -> bytes:
    data = orjson.loads(body)
    data["model"] = model
    return orjson.dumps(data)


def build_router(config: GatewayConfig, settings: Any, redactor: Any) -> Router:
    """Adapters for the configured backends (their keys redacted like the gateway's own)."""
    from .openai import OpenAICompatibleBackend

    secrets = [backend.api_key for backend in config.backends.values() if backend.api_key]
    redactor = redactor.with_secrets(secrets) if secrets else redactor
    adapters: dict[str, Any] = {}
    for name, backend in config.backends.items():
        if backend.type == "anthropic":
            from .anthropic import AnthropicBackend

            adapters[name] = AnthropicBackend(
                backend.base_url,
                api_key=backend.api_key,
                headers=backend.headers,
                connect_timeout=backend.connect_timeout or settings.connect_timeout,
                read_timeout=backend.read_timeout or settings.stream_timeout,
                redactor=redactor,
                max_connections=settings.upstream_max_connections,
                name=name,
            )
        else:
            adapters[name] = OpenAICompatibleBackend(
                settings,
                redactor=redactor,
                base_url=backend.base_url,
                api_key=backend.api_key,
                headers=backend.headers,
                connect_timeout=backend.connect_timeout,
                read_timeout=backend.read_timeout,
                name=name,
            )
    return Router(config, adapters)


async def models_for(backend: Any, limits: Any) -> list[dict[str, Any]] | None:
    """The models a key (`limits`) may use: a router's configured names and each backend's own
    list, or one backend's list, filtered by the key's model list; None when the answer is the one
    backend's own, as it gives it (no router, no model list: relay it)."""
    lister = getattr(backend, "list_models", None)
    if lister is None and limits.models is None:
        return None
    listed = await lister() if lister is not None else await backend_models(backend)
    return [model for model in listed if limits.allows_model(str(model["id"]))]
