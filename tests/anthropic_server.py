"""A scripted Anthropic Messages server for tests: a real ASGI app on hypercorn.

The model name picks the scenario; every request is recorded.  Events are
sent as Anthropic sends them (`event:` and `data:` lines), some split across
network writes on purpose.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
import trio
from hypercorn.config import Config
from hypercorn.trio import serve

from asgi_helpers import answer_lifespan, read_body


def _start(model: str, input_tokens: int = 12, cache_read: int = 0) -> dict[str, Any]:
    usage = {"input_tokens": input_tokens, "output_tokens": 1, "cache_read_input_tokens": cache_read, "cache_creation_input_tokens": 0}
    message = {"id": "msg_01", "type": "message", "role": "assistant", "model": model, "content": [], "stop_reason": None, "usage": usage}
    return {"type": "message_start", "message": message}


def _text_block(index: int, *parts: str) -> list[dict[str, Any]]:
    return [
        {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}},
        *({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": p}} for p in parts),
        {"type": "content_block_stop", "index": index},
    ]


def _end(reason: str, output_tokens: int = 9) -> list[dict[str, Any]]:
    return [
        {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": None}, "usage": {"output_tokens": output_tokens}},
        {"type": "message_stop"},
    ]


def _tool_block(index: int, call_id: str, name: str, *json_parts: str) -> list[dict[str, Any]]:
    return [
        {"type": "content_block_start", "index": index, "content_block": {"type": "tool_use", "id": call_id, "name": name, "input": {}}},
        *({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": p}} for p in json_parts),
        {"type": "content_block_stop", "index": index},
    ]


def scenario(model: str, body: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    if model == "claude-text":
        return [_start(model), {"type": "ping"}, *_text_block(0, "Hello", ", world"), {"type": "ping"}, *_end("end_turn")]
    if model == "claude-cached":
        return [_start(model, input_tokens=5, cache_read=100), *_text_block(0, "Cached."), *_end("end_turn", 3)]
    if model == "claude-thinking":
        thinking = [
            {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}},
            {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "Two and two "}},
            {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "make four."}},
            {"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "EqQBCgIYAhIM"}},
            {"type": "content_block_stop", "index": 0},
        ]
        return [_start(model), *thinking, *_text_block(1, "4"), *_end("end_turn")]
    if model == "claude-tools":
        return [
            _start(model),
            *_text_block(0, "Checking."),
            *_tool_block(1, "toolu_01", "get_weather", '{"ci', 'ty": "Par', 'is"}'),
            *_tool_block(2, "toolu_02", "get_time", "", '{"tz": "CET"}'),
            *_end("tool_use"),
        ]
    if model == "claude-mcp-add":  # calls add, then reports the result it is given
        last = ((body or {}).get("messages") or [{}])[-1].get("content") or []
        result = next((b for b in last if isinstance(b, dict) and b.get("type") == "tool_result"), None)
        if result is not None:
            return [_start(model), *_text_block(0, f"Tool result: {result['content']}"), *_end("end_turn")]
        return [_start(model), *_tool_block(0, "toolu_add", "add", '{"a": 2, ', '"b": 3}'), *_end("tool_use")]
    if model == "claude-overloaded-mid":
        return [_start(model), *_text_block(0, "Part"), {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}]
    if model == "claude-max-tokens":
        return [_start(model), *_text_block(0, "Once upon"), *_end("max_tokens")]
    if model == "claude-stop-sequence":
        stop = [
            {"type": "message_delta", "delta": {"stop_reason": "stop_sequence", "stop_sequence": "END"}, "usage": {"output_tokens": 2}},
            {"type": "message_stop"},
        ]
        return [_start(model), *_text_block(0, "Once"), *stop]
    if model == "claude-refusal":
        return [_start(model), *_text_block(0, "I can't"), *_end("refusal")]
    return [_start(model), *_text_block(0, "ok"), *_end("end_turn")]


_STATUS = {
    "claude-529": (529, "overloaded_error", "Overloaded"),
    "claude-400": (400, "invalid_request_error", "messages: prompt is too long"),
    "claude-404": (404, "not_found_error", "model: claude-404"),
}


# What `POST /v1/messages/count_tokens` takes; anything else is refused, as Anthropic refuses it.
COUNT_FIELDS = frozenset({"model", "messages", "system", "tools", "tool_choice", "thinking", "output_config", "mcp_servers", "context_management"})


def input_tokens(body: dict[str, Any]) -> int:
    """This server's count of a request's input: the words of everything but the model."""
    return len(orjson.dumps({k: v for k, v in body.items() if k != "model"}).decode().replace('":', '": ').split())


@dataclass
class AnthropicServer:
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    counts: list[dict[str, Any]] = field(default_factory=list)  # the bodies of token counts (not in `requests`)
    count_headers: list[dict[str, str]] = field(default_factory=list)
    url: str = ""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        raw = await read_body(receive)
        body = orjson.loads(raw)
        if scope["path"] == "/v1/messages/count_tokens":
            await self._count(body, {k.decode(): v.decode() for k, v in scope["headers"]}, send)
            return
        self.requests.append(body)
        self.headers.append({k.decode(): v.decode() for k, v in scope["headers"]})
        model = body.get("model", "")
        if model in _STATUS:
            status, kind, text = _STATUS[model]
            extra = [(b"retry-after", b"0")] if status == 529 else []
            await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json"), *extra]})
            await send({"type": "http.response.body", "body": orjson.dumps({"type": "error", "error": {"type": kind, "message": text}})})
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        for event in scenario(model, body):
            frame = b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"
            half = len(frame) // 2  # split on purpose: the reader must reassemble events
            await send({"type": "http.response.body", "body": frame[:half], "more_body": True})
            await send({"type": "http.response.body", "body": frame[half:], "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


    async def _count(self, body: dict[str, Any], headers: dict[str, str], send: Any) -> None:
        self.counts.append(body)
        self.count_headers.append(headers)
        model = body.get("model", "")
        extra = sorted(set(body) - COUNT_FIELDS)
        if model in _STATUS or extra:
            status, kind, text = _STATUS.get(model) or (400, "invalid_request_error", f"{', '.join(extra)}: Extra inputs are not permitted")
            await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": orjson.dumps({"type": "error", "error": {"type": kind, "message": text}})})
            return
        answer = {} if model == "claude-no-count" else {"input_tokens": input_tokens(body)}
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": orjson.dumps(answer)})


async def serve_anthropic(server: AnthropicServer, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.graceful_timeout = 0.1
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(serve, server, config)
        server.url = binds[0]
        task_status.started(binds[0])
