"""`/v1/chat/completions` with the gateway's tools: the tool loop in Chat Completions shapes.

Each round streams from the backend.  The pure `RoundFilter` decides, chunk
by chunk, what the client sees: content as it is generated (so the final
answer is streamed once, never fetched twice), the client's own tool calls
(re-indexed), and never the gateway's tool calls, intermediate finish
reasons or per-round usage (usage is summed and sent once, at the end).
`ChatLoopStream` is the streamed response body: one nursery with the loop
driver and a heartbeat that sends SSE comments while tools run.  Without
streaming, `run_chat_loop` returns one `chat.completion` object.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from types import TracebackType
from typing import Any

import orjson
import trio

from .backend import ChatBackend
from .errors import BackendStreamError, GatewayError, InternalError, error_fields
from .streams.chunks import DONE
from .streams.relay import SSE_HEADERS, EventChannelBody
from .streams.sse import encode_done
from .streams.toolloop import ToolLoop, ToolOutcome, next_round_body
from .streams.translator import RoundCall, chunk_problem, sum_usage

__all__ = ["ChatLoopStream", "RoundFilter", "run_chat_loop"]

log = logging.getLogger("gateway.chat")


class RoundFilter:
    """One round's chunks in, what the client may see out (pure)."""

    def __init__(self, gateway_tools: set[str], client_index_base: int) -> None:
        self._gateway = gateway_tools
        self._calls: dict[Any, dict[str, Any]] = {}  # backend index -> {id, name, args, client_index|None}
        self._client_base = client_index_base
        self.client_calls = 0
        self.text: list[str] = []
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.template: dict[str, Any] = {}

    def feed(self, chunk: dict[str, Any]) -> dict[str, Any] | None:
        """The chunk to forward (possibly trimmed), or None."""
        if not self.template:
            self.template = {k: chunk[k] for k in ("id", "object", "created", "model") if k in chunk}
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        choices = chunk.get("choices") or []
        if not choices:
            return None
        choice = dict(choices[0])
        delta = dict(choice.get("delta") or {})
        if isinstance(delta.get("content"), str):
            self.text.append(delta["content"])
        forwarded_calls = []
        for call in delta.pop("tool_calls", None) or []:
            key = call.get("index", 0)
            state = self._calls.get(key)
            if state is None or (call.get("id") and state["id"] and call["id"] != state["id"]):
                state = self._calls[key] = {"id": call.get("id") or "", "name": "", "args": [], "client": None}
            function = call.get("function") or {}
            state["name"] += function.get("name") or ""
            state["args"].append(function.get("arguments") or "")
            if call.get("id"):
                state["id"] = call["id"]
            if state["name"] and state["name"] not in self._gateway:
                if state["client"] is None:
                    state["client"] = self._client_base + self.client_calls
                    self.client_calls += 1
                    # First forward: the whole call so far, under the client's index.
                    forwarded_calls.append(
                        {
                            "index": state["client"],
                            "id": state["id"],
                            "type": "function",
                            "function": {"name": state["name"], "arguments": "".join(state["args"])},
                        }
                    )
                else:
                    forwarded_calls.append({"index": state["client"], "function": {"arguments": function.get("arguments") or ""}})
        if forwarded_calls:
            delta["tool_calls"] = forwarded_calls
        finish = choice.get("finish_reason")
        if finish:
            self.finish_reason = finish
            choice["finish_reason"] = None  # the loop decides what the client's finish reason is
        choice["delta"] = delta
        if not delta and not forwarded_calls:
            return None
        return {**chunk, "choices": [choice], "usage": None} if "usage" in chunk else {**chunk, "choices": [choice]}

    def gateway_calls(self) -> list[RoundCall]:
        return [
            RoundCall(item_id=s["id"] or f"call_{i}", call_id=s["id"] or f"call_{i}", name=s["name"], arguments="".join(s["args"]), server="gateway")
            for i, s in enumerate(self._calls.values())
            if s["name"] in self._gateway
        ]


async def _stream_round(
    backend: ChatBackend, body: dict[str, Any], flt: RoundFilter, emit: Callable[[dict[str, Any]], Any]
) -> None:
    async with backend.open_chat_stream(body) as upstream:
        async for batch in upstream:
            for chunk in batch:
                if chunk is DONE:
                    break
                problem = chunk_problem(chunk)
                if problem is not None:
                    raise BackendStreamError(f"The backend sent an invalid chunk: {problem}.", code="backend_error")
                if chunk.get("error") and not chunk.get("choices"):
                    raise _stream_error(chunk)
                out = flt.feed(chunk)
                if out is not None:
                    await emit(out)


def _stream_error(chunk: dict[str, Any]) -> GatewayError:
    message, _type, code, _param = error_fields(chunk)
    return BackendStreamError(message or "the backend reported an error", code=code)


async def _rounds(
    backend: ChatBackend, body: dict[str, Any], loop: ToolLoop, gateway_tools: set[str], emit: Callable[[dict[str, Any]], Any]
) -> tuple[RoundFilter, dict[str, Any] | None]:
    """Run rounds until the model answers (or calls the client's tools, or rounds run out)."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    usage: dict[str, Any] | None = None
    client_calls = 0
    while True:
        flt = RoundFilter(gateway_tools, client_calls)
        await _stream_round(backend, body, flt, emit)
        usage = sum_usage(usage, flt.usage)
        client_calls += flt.client_calls
        calls = flt.gateway_calls()
        loop.rounds += 1
        if not calls:
            return flt, usage
        results: dict[str, ToolOutcome] = {}

        async def on_result(call: RoundCall, outcome: ToolOutcome) -> None:
            results[call.item_id] = outcome

        await loop.run_calls(calls, on_result)
        if flt.client_calls or loop.rounds >= loop.max_rounds:
            return flt, usage
        body = next_round_body(body, "".join(flt.text), calls, results)


class ChatLoopStream(EventChannelBody):
    """Streamed chat completion with the tool loop; owns its nursery like ResponseEventStream."""

    def __init__(
        self, *, backend: ChatBackend, body: dict[str, Any], loop: ToolLoop, gateway_tools: set[str], heartbeat_interval: float
    ) -> None:
        super().__init__(heartbeat_interval)
        self._backend = backend
        self._body = body
        self._loop = loop
        self._gateway_tools = gateway_tools
        self._nursery_cm: Any = None
        self._loop_scope = trio.CancelScope()

    async def __aenter__(self) -> ChatLoopStream:
        self._last_write = trio.current_time()
        self._nursery_cm = trio.open_nursery()
        nursery = await self._nursery_cm.__aenter__()
        send, self._out_recv = trio.open_memory_channel[bytes](256)
        nursery.start_soon(self._run_heartbeat, send.clone())
        nursery.start_soon(self._run_loop, send)
        return self

    async def head(self) -> tuple[int, dict[str, str]]:
        return 200, dict(SSE_HEADERS)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._loop_scope.cancel()
        self._heartbeat_scope.cancel()
        try:
            await self._nursery_cm.__aexit__(exc_type, exc, tb)
        finally:
            if self._out_recv is not None:
                self._out_recv.close()

    async def _run_loop(self, send: trio.MemorySendChannel[bytes]) -> None:
        async with send:
            with self._loop_scope:
                last: dict[str, Any] = {}

                async def emit(chunk: dict[str, Any]) -> None:
                    last.update({k: chunk[k] for k in ("id", "object", "created", "model") if k in chunk})
                    await send.send(b"data: " + orjson.dumps(chunk) + b"\n\n")

                try:
                    flt, usage = await _rounds(self._backend, self._body, self._loop, self._gateway_tools, emit)
                    finish = _client_finish(flt, self._loop)
                    template = {**flt.template, **last}
                    await send.send(b"data: " + orjson.dumps({**template, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}) + b"\n\n")
                    if usage:
                        await send.send(b"data: " + orjson.dumps({**template, "choices": [], "usage": usage}) + b"\n\n")
                except GatewayError as error:
                    await send.send(b"data: " + orjson.dumps({"error": error.payload()}) + b"\n\n")
                except Exception:
                    log.debug("chat tool loop failed", exc_info=True)
                    await send.send(b"data: " + orjson.dumps({"error": InternalError("the tool loop failed").payload()}) + b"\n\n")
                finally:
                    self._heartbeat_scope.cancel()
                await send.send(encode_done())


def _client_finish(flt: RoundFilter, loop: ToolLoop) -> str:
    if flt.client_calls:
        return "tool_calls"
    if flt.gateway_calls():  # rounds ran out while the model still wanted tools
        return "length"
    return flt.finish_reason or "stop"


async def run_chat_loop(
    backend: ChatBackend, body: dict[str, Any], loop: ToolLoop, gateway_tools: set[str]
) -> dict[str, Any]:
    """The tool loop without streaming: one `chat.completion` object.

    Raises:
        GatewayError: the backend failed.
    """
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}

    async def collect(chunk: dict[str, Any]) -> None:
        delta = (chunk.get("choices") or [{}])[0].get("delta") or {}
        if isinstance(delta.get("content"), str):
            content.append(delta["content"])
        for call in delta.get("tool_calls") or []:
            slot = calls.setdefault(call["index"], {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
            slot["id"] = call.get("id") or slot["id"]
            function = call.get("function") or {}
            slot["function"]["name"] += function.get("name") or ""
            slot["function"]["arguments"] += function.get("arguments") or ""

    flt, usage = await _rounds(backend, copy.deepcopy(body), loop, gateway_tools, collect)
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content) or None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return {
        **{"object": "chat.completion"},
        **{k: v for k, v in flt.template.items() if k != "object"},
        "choices": [{"index": 0, "message": message, "finish_reason": _client_finish(flt, loop)}],
        "usage": usage,
    }
