"""Anthropic's Messages API behind the chat backend interface.

The turn engine speaks Chat Completions to every backend; this adapter
translates at the edge, both ways, so the translator and every rule it
keeps hold for Anthropic models too:

    messages_request(chat body)   Chat Completions request -> Messages request (pure)
    MessagesStream                Messages stream events -> Chat Completions chunks (pure)
    AnthropicBackend              the HTTP shell: POST /v1/messages, SSE framing, errors,
                                  and token counts (POST /v1/messages/count_tokens)

A thinking block's signature travels as `reasoning_signature` (the
translator keeps it sealed on the reasoning item and the plan brings it
back), since Anthropic takes thinking back only as it signed it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx2
import orjson
import trio

from ..errors import (
    BackendError,
    BackendStatusError,
    BackendStreamError,
    BackendTimeout,
)
from ..ops.redact import Redactor, public_url
from ..streams.chunks import DONE
from ..streams.sse import SSEDecoder, SSETooLarge
from .http1 import Http1Transport
from .native import NativeRequest
from .openai import (
    COUNT_UNAVAILABLE,
    PROBE_HEADERS,
    backend_error_from,
    map_backend_errors,
    naming_errors,
    read_bounded,
    retry_after_of,
)

__all__ = ["AnthropicBackend", "MessagesStream", "count_request", "messages_request"]

_VERSION = "2023-06-01"
_THINKING_BUDGETS = {"minimal": 1024, "low": 1024, "medium": 4096, "high": 16384, "xhigh": 32768}
_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}


# --- requests -----------------------------------------------------------------------------


def messages_request(chat: Mapping[str, Any], *, default_max_tokens: int = 4096) -> dict[str, Any]:
    """The Messages request for a Chat Completions request (streaming)."""
    system: list[str] = []
    messages: list[dict[str, Any]] = []
    for message in chat.get("messages") or ():
        role = message.get("role")
        if role in ("system", "developer"):
            text = _text(message.get("content"))
            if text:
                system.append(text)
        elif role == "tool":
            result = {"type": "tool_result", "tool_use_id": str(message.get("tool_call_id")), "content": _text(message.get("content"))}
            _append(messages, "user", [result])
        elif role == "assistant":
            _append(messages, "assistant", _assistant_blocks(message))
        else:
            _append(messages, "user", _user_blocks(message.get("content")))
    body: dict[str, Any] = {"model": chat.get("model"), "messages": messages, "stream": True}
    if system:
        body["system"] = "\n\n".join(system)
    max_tokens = chat.get("max_completion_tokens") or chat.get("max_tokens") or default_max_tokens
    budget = _THINKING_BUDGETS.get(str(chat.get("reasoning_effort") or ""))
    if budget is not None:
        body["thinking"] = {"type": "enabled", "budget_tokens": budget}
        max_tokens = max(int(max_tokens), budget + 1024)  # the budget is part of max_tokens
    else:
        for name in ("temperature", "top_p"):  # with thinking, Anthropic takes neither
            if chat.get(name) is not None:
                body[name] = chat[name]
    body["max_tokens"] = int(max_tokens)
    stop = chat.get("stop")
    if stop:
        body["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    response_format = chat.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") == "json_schema":
        schema = (response_format.get("json_schema") or {}).get("schema")
        if isinstance(schema, dict):  # Anthropic's structured outputs (GA: output_config.format)
            body["output_config"] = {"format": {"type": "json_schema", "schema": schema}}
    tools = [_tool(tool) for tool in chat.get("tools") or () if isinstance(tool, dict) and tool.get("type") == "function"]
    if tools:
        body["tools"] = tools
        choice = _tool_choice(chat.get("tool_choice"))
        if chat.get("parallel_tool_calls") is False and choice.get("type") != "none":
            choice["disable_parallel_tool_use"] = True
        body["tool_choice"] = choice
    return body


# What `count_tokens` takes of a Messages request (it refuses the generation's settings).
_COUNTED = ("model", "messages", "system", "tools", "tool_choice", "thinking", "output_config")


# What `count_tokens` takes of a client's own Messages request (its MCP servers and context edits count too).
_NATIVE_COUNTED = (*_COUNTED, "mcp_servers", "context_management")


def count_request(chat: Mapping[str, Any]) -> dict[str, Any]:
    """The `count_tokens` request for a Chat Completions request: its Messages request, without
    what only a generation takes (`max_tokens`, `stream`, sampling, stop sequences)."""
    body = messages_request(chat)
    return {name: body[name] for name in _COUNTED if name in body}


def _append(messages: list[dict[str, Any]], role: str, blocks: list[dict[str, Any]]) -> None:
    """Add blocks as a turn of `role`, joining a turn of the same role (Anthropic alternates)."""
    if not blocks:
        return
    if messages and messages[-1]["role"] == role:
        messages[-1]["content"].extend(blocks)
    else:
        messages.append({"role": role, "content": list(blocks)})


def _assistant_blocks(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    thinking, signature = message.get("reasoning_content"), message.get("reasoning_signature")
    if thinking and signature:  # unsigned thinking is refused: it is left out
        blocks.append({"type": "thinking", "thinking": thinking, "signature": signature})
    text = _text(message.get("content"))
    if text:
        blocks.append({"type": "text", "text": text})
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        blocks.append(
            {"type": "tool_use", "id": str(call.get("id")), "name": function.get("name", ""), "input": _arguments(function.get("arguments"))}
        )
    return blocks


def _user_blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    blocks: list[dict[str, Any]] = []
    for part in content or ():
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("text", "input_text") and part.get("text"):
            blocks.append({"type": "text", "text": part["text"]})
        elif kind == "image_url":
            url = (part.get("image_url") or {}).get("url", "")
            blocks.append({"type": "image", "source": _image_source(url)})
    return blocks


def _image_source(url: str) -> dict[str, Any]:
    if url.startswith("data:") and ";base64," in url:
        media_type, data = url[5:].split(";base64,", 1)
        return {"type": "base64", "media_type": media_type, "data": data}
    return {"type": "url", "url": url}


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _arguments(arguments: Any) -> dict[str, Any]:
    if isinstance(arguments, dict):
        return arguments
    try:
        value = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    function = tool.get("function") or {}
    out: dict[str, Any] = {"name": function.get("name", ""), "input_schema": function.get("parameters") or {"type": "object"}}
    if function.get("description"):
        out["description"] = function["description"]
    return out


def _tool_choice(choice: Any) -> dict[str, Any]:
    if choice == "none":
        return {"type": "none"}
    if choice == "required":
        return {"type": "any"}
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        return {"type": "tool", "name": choice["function"].get("name", "")}
    return {"type": "auto"}


# --- the stream ----------------------------------------------------------------------------


class MessagesStream:
    """Messages stream events in, Chat Completions chunks out (one event at a time, pure)."""

    def __init__(self) -> None:
        self.id = "msg"
        self.model = ""
        self._tools: dict[int, int] = {}  # content block index -> tool call index
        self._usage: dict[str, int] = {}
        self.done = False

    def feed(self, event: str | None, data: Mapping[str, Any]) -> list[Any]:
        kind = data.get("type") or event
        if kind == "message_start":
            message = data.get("message") or {}
            self.id = str(message.get("id") or self.id)
            self.model = str(message.get("model") or "")
            self._count(message.get("usage") or {})
            return [self._chunk({"role": "assistant", "content": ""})]
        if kind == "content_block_start":
            block = data.get("content_block") or {}
            if block.get("type") == "tool_use":
                index = self._tools[int(data.get("index", 0))] = len(self._tools)
                call = {"index": index, "id": block.get("id"), "type": "function", "function": {"name": block.get("name", ""), "arguments": ""}}
                return [self._chunk({"tool_calls": [call]})]
            if block.get("type") == "text" and block.get("text"):
                return [self._chunk({"content": block["text"]})]
            return []
        if kind == "content_block_delta":
            return self._delta(int(data.get("index", 0)), data.get("delta") or {})
        if kind == "message_delta":
            self._count(data.get("usage") or {})
            delta = data.get("delta") or {}
            reason = delta.get("stop_reason")
            if not reason:
                return []
            chunk = self._chunk({}, finish=_FINISH.get(str(reason), "stop"))
            if reason == "stop_sequence" and isinstance(delta.get("stop_sequence"), str):
                chunk["choices"][0]["stop_reason"] = delta["stop_sequence"]  # which one, as vLLM says it
            return [chunk]
        if kind == "message_stop":
            self.done = True
            return [self._usage_chunk(), DONE]
        if kind == "error":
            error = data.get("error") or {}
            self.done = True
            return [{"error": {"message": str(error.get("message") or "the backend failed"), "type": "server_error", "code": error.get("type")}}]
        return []  # ping, and events this version does not know

    def _delta(self, index: int, delta: Mapping[str, Any]) -> list[Any]:
        kind = delta.get("type")
        if kind == "text_delta":
            return [self._chunk({"content": delta.get("text", "")})]
        if kind == "thinking_delta":
            return [self._chunk({"reasoning_content": delta.get("thinking", "")})]
        if kind == "signature_delta":
            return [self._chunk({"reasoning_signature": delta.get("signature", "")})]
        if kind == "input_json_delta" and index in self._tools:
            call = {"index": self._tools[index], "function": {"arguments": delta.get("partial_json", "")}}
            return [self._chunk({"tool_calls": [call]})]
        return []

    def _count(self, usage: Mapping[str, Any]) -> None:
        for name, value in usage.items():
            if isinstance(value, int):
                self._usage[name] = value

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return {"id": self.id, "object": "chat.completion.chunk", "model": self.model, "choices": [choice]}

    def _usage_chunk(self) -> dict[str, Any]:
        cached = self._usage.get("cache_read_input_tokens", 0)
        prompt = self._usage.get("input_tokens", 0) + cached + self._usage.get("cache_creation_input_tokens", 0)
        completion = self._usage.get("output_tokens", 0)
        details = {"cached_tokens": cached}
        created = self._usage.get("cache_creation_input_tokens", 0)
        if created:
            details["cache_creation_tokens"] = created  # kept for a Messages client (its `cache_creation_input_tokens`)
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": details,
        }
        return {"id": self.id, "object": "chat.completion.chunk", "model": self.model, "choices": [], "usage": usage}


# --- the HTTP shell ------------------------------------------------------------------------


class _Chunks:
    """A Messages response read as batches of chat chunks (the engine's `ChatChunks`)."""

    def __init__(self, response: httpx2.Response, redactor: Redactor) -> None:
        self._bytes = response.aiter_raw().__aiter__()
        self._redact = redactor.stream()
        self._sse = SSEDecoder()
        self._mapper = MessagesStream()
        self.backend: str | None = None  # which backend this is (its adapter's label)
        self._ended = False
        self.waited = 0.0  # seconds its reads waited on the backend

    @property
    def saw_done(self) -> bool:
        return self._mapper.done

    def __aiter__(self) -> _Chunks:
        return self

    async def __anext__(self) -> list[Any]:
        while not self._ended:
            began = trio.current_time()
            try:
                data = await self._bytes.__anext__()
            except StopAsyncIteration:
                self._ended = True
                events = self._sse.decode(self._redact.flush()) + self._sse.flush()
            except httpx2.TimeoutException:
                raise BackendTimeout("the backend sent no data in time") from None
            except httpx2.TransportError as exc:
                raise backend_error_from(exc) from exc
            else:
                self.waited += trio.current_time() - began
                try:
                    events = self._sse.decode(self._redact.feed(data))
                except SSETooLarge as exc:
                    raise BackendStreamError(f"the backend sent an oversized event ({exc})") from None
            batch: list[Any] = []
            for event in events:
                try:
                    payload = orjson.loads(event.data)
                except orjson.JSONDecodeError:
                    raise BackendStreamError("the backend sent an event that is not JSON") from None
                if isinstance(payload, dict):
                    batch += self._mapper.feed(event.event, payload)
            if self._mapper.done:
                self._ended = True
            if batch:
                return batch
        raise StopAsyncIteration


class AnthropicBackend:
    """A server that speaks Anthropic's Messages API (`POST {base_url}/v1/messages`)."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        headers: Mapping[str, str] | None = None,
        connect_timeout: float = 10.0,
        read_timeout: float = 120.0,
        redactor: Redactor | None = None,
        default_max_tokens: int = 4096,
        max_connections: int = 1000,
        name: str = "default",
    ) -> None:
        root = base_url.rstrip("/")
        self._url = (root if root.endswith("/v1") else root + "/v1") + "/messages"
        self._count_url = self._url + "/count_tokens"
        self.name = name
        self.url = public_url(root)
        self.label = f"{name}@{self.url}"  # which backend answered, in a log line (no spaces, no secrets)
        self._headers = {
            **(headers or {}),
            "anthropic-version": _VERSION,
            "content-type": "application/json",
            "accept": "text/event-stream",
            "accept-encoding": "identity",
            **({"x-api-key": api_key} if api_key else {}),
        }
        self._redactor = redactor if redactor is not None else Redactor([api_key] if api_key else [])
        self._default_max_tokens = default_max_tokens
        timeout = httpx2.Timeout(connect=connect_timeout, read=read_timeout, write=read_timeout, pool=None)
        transport = Http1Transport(max_connections=max_connections)
        self._client = httpx2.AsyncClient(transport=transport, timeout=timeout, follow_redirects=False)

    async def aclose(self) -> None:
        await self._client.aclose()

    async def probe(self) -> None:
        """Whether the backend answers HTTP at all (`GET /v1/models`; any status will do).

        Raises:
            BackendError: it could not be reached, or timed out.
        """
        headers = {k: v for k, v in self._headers.items() if k in ("x-api-key", "anthropic-version", "authorization")}
        with naming_errors(self.name, self.url), map_backend_errors():
            response = await self._client.get(self._url.removesuffix("/messages") + "/models", headers={**headers, **PROBE_HEADERS})
            await response.aclose()

    def _messages(self, body: dict[str, Any], native: NativeRequest | None) -> tuple[dict[str, Any], Mapping[str, str]]:
        """The Messages request for a chat `body`: the client's own when it sent one (with the
        chat body's model and max_tokens, which a route or a key's limit may have changed), else
        the mapping of the chat request; and the headers it brings (`anthropic-beta`)."""
        if native is not None and native.api == "anthropic-messages":
            sent = {**native.body, "model": body.get("model"), "stream": True}
            max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
            if max_tokens:
                sent["max_tokens"] = max_tokens
            return sent, native.headers
        return messages_request(body, default_max_tokens=self._default_max_tokens), {}

    @contextlib.asynccontextmanager
    async def open_chat_stream(
        self, body: dict[str, Any], *, headers: Mapping[str, str] | None = None, native: NativeRequest | None = None
    ) -> AsyncIterator[_Chunks]:
        messages, extra = self._messages(body, native)
        payload = orjson.dumps(messages)
        sent = {**extra, **self._headers, **(headers or {})}
        request = self._client.build_request("POST", self._url, content=payload, headers=sent)
        with naming_errors(self.name, self.url):
            try:
                response = await self._client.send(request, stream=True)
            except httpx2.TransportError as exc:
                raise backend_error_from(exc) from exc
            try:
                if response.status_code >= 400:
                    raise await self._status_error(response)
                chunks = _Chunks(response, self._redactor)
                chunks.backend = self.label
                yield chunks
            finally:
                with trio.CancelScope(shield=True), trio.move_on_after(2):
                    await response.aclose()

    async def count_tokens(
        self, body: dict[str, Any], *, headers: Mapping[str, str] | None = None, native: NativeRequest | None = None
    ) -> int:
        """The input tokens of the chat request `body` (or of the client's own Messages request,
        `native`), as Anthropic counts them (`count_tokens`).

        Raises:
            BackendStatusError: the backend refused the request.
            BackendError: it could not be reached, timed out, or answered without a count
                (`token_count_unavailable`).
        """
        if native is not None and native.api == "anthropic-messages":
            messages, extra = {**native.body, "model": body.get("model")}, native.headers
            payload = orjson.dumps({name: messages[name] for name in _NATIVE_COUNTED if name in messages})
        else:
            payload, extra = orjson.dumps(count_request(body)), {}
        sent = {**extra, **self._headers, **(headers or {}), "accept": "application/json"}
        request = self._client.build_request("POST", self._count_url, content=payload, headers=sent)
        with naming_errors(self.name, self.url):
            with map_backend_errors():
                response = await self._client.send(request, stream=True)
            try:
                if response.status_code >= 400:
                    raise await self._status_error(response)
                answer = await read_bounded(response)
            finally:
                with trio.CancelScope(shield=True), trio.move_on_after(2):
                    await response.aclose()
            try:
                count = orjson.loads(answer).get("input_tokens")
            except (orjson.JSONDecodeError, AttributeError):
                count = None
            if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                raise BackendError(
                    f"The backend '{self.name}' answered a token count without a count.", code=COUNT_UNAVAILABLE
                )
            return count

    async def _status_error(self, response: httpx2.Response) -> BackendStatusError:
        raw = await read_bounded(response)
        try:
            error = orjson.loads(self._redactor.redact_bytes(raw)).get("error") or {}
        except (orjson.JSONDecodeError, AttributeError):
            error = {}
        kind = str(error.get("type") or "")
        message = str(error.get("message") or f"the backend answered {response.status_code}")
        code = "model_not_found" if response.status_code == 404 else kind or None
        failure = BackendStatusError(response.status_code, message, type="invalid_request_error", code=code)
        failure.retry_after = retry_after_of(response.headers.get("retry-after"))
        return failure
