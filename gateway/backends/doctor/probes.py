"""The doctor's probes: each backend tried over HTTP the way the gateway will try it for a client.

The async shell of `checks`: it sends what `checks` asks, the chat requests through the
gateway's own adapters (so a stream is sent, read and decoded as for a client, and a token count
takes the gateway's own path), the rest with httpx2 and the backend's key as the adapter sends
it.  Every probe is bounded by one timeout, so a backend that hangs costs one timeout and the run
ends.  Backend and library errors become `checks.Failure`s here, once (`_attempt`).  It decides
no verdict, and prints nothing.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx2
import trio

from ...errors import BackendStatusError, BackendTimeout, BackendUnavailable, GatewayError
from ...ops.redact import Redactor, public_url
from ..config import BackendConfig
from ..openai import map_backend_errors
from ..routing import context_window_of
from .checks import (
    Answer,
    Failure,
    Observed,
    Server,
    judge,
    parallel_request,
    prefix_requests,
    stream_request,
    tool_request,
    tool_result_request,
)
from .render import Report, redacted

__all__ = ["Target", "examine", "observe"]

T = TypeVar("T")

_ANTHROPIC_VERSION = "2023-06-01"  # as the Anthropic adapter sends it


@dataclass(frozen=True)
class Target:
    """One backend of one route, and the model a client's request would bring it."""

    route: str  # the route's model: a name or a glob
    backend: BackendConfig
    model: str | None  # None: picked from the backend's list (a glob route, no --model)
    route_window: int | None = None
    where: str = "OPENAI_BASE_URL_INTERNAL"  # where the backend's URL and key are set
    in_file: bool = False

    @property
    def v1(self) -> str:
        root = self.backend.base_url.rstrip("/")
        return root if root.endswith("/v1") else root + "/v1"

    @property
    def headers(self) -> dict[str, str]:
        """The headers the gateway's adapter sends this backend: its own, and its key."""
        key = self.backend.api_key
        if self.backend.type == "anthropic":
            return {**self.backend.headers, "anthropic-version": _ANTHROPIC_VERSION, **({"x-api-key": key} if key else {})}
        return {**self.backend.headers, **({"authorization": f"Bearer {key}"} if key else {})}


async def examine(targets: Sequence[Target], adapters: Mapping[str, Any], redactor: Redactor, *, timeout: float) -> list[Report]:
    """Every target observed in turn (a backend with one slot serves one probe at a time) and
    judged; the reports with the backends' keys redacted."""
    reports = []
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(timeout), trust_env=False, follow_redirects=False) as client:
        for target in targets:
            seen = await observe(target, adapters[target.backend.name], client, timeout=timeout)
            report = Report(
                route=target.route,
                backend=target.backend.name,
                model=seen.model,
                url=public_url(target.v1),
                server=seen.server.flavour,
                rows=tuple(judge(seen)),
            )
            reports.append(redacted(report, redactor.redact))
    return reports


async def observe(target: Target, adapter: Any, client: httpx2.AsyncClient, *, timeout: float) -> Observed:
    """What `target`'s backend answers to each probe, each bounded by `timeout` seconds.  Once the
    backend cannot be reached, refuses the key or leaves a stream unanswered, the rest is not
    tried (`Observed.skipped` says why).  Never raises for what the backend does."""
    backend = target.backend
    seen = Observed(
        backend=backend.name,
        kind=backend.type,
        model=target.model or target.route,
        timeout=timeout,
        where=target.where,
        in_file=target.in_file,
        route_window=target.route_window,
    )
    answered = await _attempt(timeout, lambda: _get(client, target.v1 + "/models", target.headers), where=public_url(target.v1))
    if isinstance(answered, Failure):
        seen.reached, seen.skipped = answered, "the backend is not reachable"
        return seen
    status, listing = answered
    seen.reached = status
    if status in (401, 403, 503):
        seen.skipped = "the backend is not ready" if status == 503 else "the backend refuses the key"
        return seen
    seen.tried.add("models listed")
    entries = listing.get("data") if status == 200 and isinstance(listing, dict) else None
    if isinstance(entries, list):
        seen.listed = [str(entry["id"]) for entry in entries if isinstance(entry, dict) and "id" in entry]
    else:
        seen.listed = Failure("status", f"answered HTTP {status}" + (" without a model list" if status == 200 else ""), status)
    if target.model is None:
        names = seen.listed if isinstance(seen.listed, list) else []
        chosen = next((name for name in names if fnmatch.fnmatchcase(name, target.route)), names[0] if names else None)
        if chosen is not None:
            seen.model, seen.picked = chosen, True
    if backend.type == "openai":
        seen.server = await _server(client, target, entries if isinstance(entries, list) else [], timeout)
    model = seen.model

    seen.tried.update({"streaming", "usage in streams", "reasoning"})
    seen.stream = await _attempt(timeout, lambda: _stream(adapter, stream_request(model)))
    if isinstance(seen.stream, Failure) and seen.stream.kind in ("timeout", "connect"):
        seen.skipped = f"a streamed completion got no answer ({seen.stream.message})"
        return seen

    seen.tried.add("forced tool call")
    seen.tool_call = await _attempt(timeout, lambda: _stream(adapter, tool_request(model)))
    if isinstance(seen.tool_call, Answer) and seen.tool_call.calls:
        call = next(iter(seen.tool_call.calls.values()))
        seen.tool_result = await _attempt(timeout, lambda: _stream(adapter, tool_result_request(model, call)))
    if backend.type == "anthropic":
        return seen

    seen.tried.add("parallel tool calls")
    seen.parallel = await _attempt(timeout, lambda: _stream(adapter, parallel_request(model)))
    seen.tried.add("context window")
    seen.window = await _attempt(timeout, lambda: context_window_of(adapter, model))
    seen.tried.add("tokenizer")
    seen.counted = await _attempt(timeout, lambda: _counted_by(adapter, stream_request(model)))
    seen.tried.add("prefix cache")
    seen.prefix = await _attempt(timeout * 2, lambda: _two_streams(adapter, *prefix_requests(model)))
    return seen


async def _attempt(timeout: float, step: Callable[[], Awaitable[T]], *, where: str = "") -> T | Failure:
    """`step`'s result, or the `Failure` it came to: the one place a probe's errors are mapped."""
    with trio.move_on_after(timeout):
        try:
            with map_backend_errors():
                return await step()
        except BackendStatusError as error:
            return Failure("status", error.message, error.backend_status)
        except BackendTimeout as error:
            return Failure("timeout", error.message)
        except BackendUnavailable as error:
            cause = error.__cause__
            if isinstance(cause, httpx2.ConnectError):
                return Failure("connect", f"cannot connect to {where or 'the backend'}: {cause}" if str(cause) else error.message)
            return Failure("broken", error.message)
        except GatewayError as error:
            return Failure("broken", error.message)
    return Failure("timeout", f"no answer within {timeout:g} s")


async def _get(client: httpx2.AsyncClient, url: str, headers: Mapping[str, str]) -> tuple[int, Any]:
    """The status of a GET and its JSON (None when the answer is not JSON)."""
    response = await client.get(url, headers={**headers, "accept": "application/json"})
    try:
        return response.status_code, response.json()
    except ValueError:
        return response.status_code, None


async def _server(client: httpx2.AsyncClient, target: Target, entries: list[Any], timeout: float) -> Server:
    """Which server this is, by the endpoints only it has: llama.cpp's `/props` (at the server's
    root, not under /v1), vLLM's `max_model_len` in its model list, Ollama's `/api/version`."""
    root = target.v1.removesuffix("/v1")
    props = await _attempt(timeout, lambda: _get(client, root + "/props", target.headers))
    if not isinstance(props, Failure) and props[0] == 200 and isinstance(props[1], dict) and "default_generation_settings" in props[1]:
        caps = props[1].get("chat_template_caps")
        caps = caps if isinstance(caps, dict) else {}
        slots = props[1].get("total_slots")
        metas: list[dict[str, Any]] = [entry["meta"] for entry in entries if isinstance(entry, dict) and isinstance(entry.get("meta"), dict)]
        trained = metas[0].get("n_ctx_train") if len(metas) == 1 else None
        return Server(
            "llama.cpp",
            slots=slots if isinstance(slots, int) else None,
            template_tools=caps.get("supports_tool_calls") if isinstance(caps.get("supports_tool_calls"), bool) else None,
            template_parallel=caps.get("supports_parallel_tool_calls") if isinstance(caps.get("supports_parallel_tool_calls"), bool) else None,
            trained=trained if isinstance(trained, int) else None,
        )
    if any(isinstance(entry, dict) and ("max_model_len" in entry or entry.get("owned_by") == "vllm") for entry in entries):
        return Server("vLLM")
    version = await _attempt(timeout, lambda: _get(client, root + "/api/version", target.headers))
    if not isinstance(version, Failure) and version[0] == 200 and isinstance(version[1], dict) and "version" in version[1]:
        return Server("Ollama")
    return Server()


async def _stream(adapter: Any, body: dict[str, Any]) -> Answer:
    """A streamed chat completion through the adapter, every chunk fed to an `Answer`."""
    answer = Answer()
    async with adapter.open_chat_stream(body) as stream:
        async for batch in stream:
            for chunk in batch:
                answer.feed(chunk)
    return answer


async def _two_streams(adapter: Any, first: dict[str, Any], second: dict[str, Any]) -> tuple[Answer, Answer]:
    return await _stream(adapter, first), await _stream(adapter, second)


async def _counted_by(adapter: Any, body: dict[str, Any]) -> str | None:
    """How the adapter counts this backend's tokens, once it has counted (its `counts_by`)."""
    await adapter.count_tokens(body)
    return getattr(adapter, "counts_by", None)
