"""A scripted Chat Completions server for tests: a real ASGI app on hypercorn.

The model name picks the scenario.  The server records every request it
receives and when each streaming client went away, so tests can assert what
the gateway sent upstream and that it hung up.
"""

from __future__ import annotations

import re

import functools
import gzip
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import trio
from hypercorn.config import Config
from hypercorn.trio import serve

from asgi_helpers import answer_lifespan, read_body

Send = Callable[[dict[str, Any]], Awaitable[None]]

USAGE = {
    "prompt_tokens": 11,
    "completion_tokens": 7,
    "total_tokens": 18,
    "prompt_tokens_details": {"cached_tokens": 3},
    "completion_tokens_details": {"reasoning_tokens": 2},
}


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta or {}, "finish_reason": finish}
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [choice], **extra}


def usage_chunk() -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [], "usage": USAGE}


def call_delta(index: int, *, id: str | None = None, name: str | None = None, args: str | None = None) -> dict[str, Any]:
    function: dict[str, Any] = {}
    if name is not None:
        function["name"] = name
    if args is not None:
        function["arguments"] = args
    call: dict[str, Any] = {"index": index, "function": function}
    if id is not None:
        call["id"] = id
        call["type"] = "function"
    return {"tool_calls": [call]}


def token_logprob(token: str, logprob: float, alternatives: Sequence[tuple[str, float]] = ()) -> dict[str, Any]:
    """One token's log probability as Chat Completions streams it (with its top alternatives)."""
    return {
        "token": token,
        "logprob": logprob,
        "bytes": list(token.encode()),
        "top_logprobs": [{"token": t, "logprob": lp, "bytes": list(t.encode())} for t, lp in alternatives],
    }


def logprobs_chunk(text: str, *tokens: dict[str, Any]) -> dict[str, Any]:
    """A text delta with its tokens' log probabilities (`choices[0].logprobs.content`)."""
    choice = {"index": 0, "delta": {"content": text}, "logprobs": {"content": list(tokens)}, "finish_reason": None}
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [choice]}


# "Hello, world!" token by token: (token, logprob, alternatives with their logprobs).
LOGPROB_TOKENS: list[tuple[str, float, list[tuple[str, float]]]] = [
    ("Hello", -0.25, [("Hello", -0.25), ("Hi", -1.75), ("Hey", -2.5), ("Greetings", -4.0), ("Good", -4.5)]),
    (",", -0.5, [(",", -0.5), ("!", -1.0), (".", -3.0), (" there", -3.5), (" and", -5.0)]),
    (" world", -0.125, [(" world", -0.125), (" there", -2.25), (" everyone", -3.0), (" all", -3.25), (" friend", -6.0)]),
    ("!", -0.0625, [("!", -0.0625), (".", -2.875), ("?", -5.5), (" :)", -6.5), ("!!", -7.0)]),
]


def _logprobs_script(body: dict[str, Any]) -> list[Any]:
    """"Hello, world!" with log probabilities only when asked (`logprobs: true`), with as many
    alternatives as `top_logprobs` asks, or all five (as llama.cpp gives its default when not told)."""
    if body.get("logprobs") is not True:
        return SCENARIOS["text"]
    count = body.get("top_logprobs", 5)
    script: list[Any] = [chunk({"role": "assistant", "content": ""})]
    for token, logprob, alternatives in LOGPROB_TOKENS:
        script.append(logprobs_chunk(token, token_logprob(token, logprob, alternatives[:count])))
    return script + [chunk(finish="stop"), usage_chunk(), b"[DONE]"]


# Each scenario: a list of chunks (dicts), b"[DONE]", or markers below.
HANG = "hang"  # stop sending and wait until the client leaves
WAIT_RELEASE = "wait-release"  # wait for the test to set backend.release
CLOSE = "close"  # end the body here (no [DONE])
COMMENTS_FOREVER = "comments-forever"  # an SSE comment every 50 ms, never data
TRICKLE = "trickle"  # one byte of a chunk every 50 ms, never a whole chunk
TOKENS_FOREVER = "tokens-forever"  # a token after another, as fast as the client reads, until it leaves

# 200 text chunks in one write of the backend's, as a fast server's reply often arrives.
_BURST = b"\n\ndata: ".join(orjson.dumps(chunk({"content": f"w{i} "})) for i in range(200))

# Served like SCENARIOS, but left out of the translator's recorded-stream tests (which feed every
# scenario byte by byte, a chunk per step): too large, or several chunks in one step.
LARGE_SCENARIOS: dict[str, list[Any]] = {
    "burst": [chunk({"role": "assistant", "content": ""}), _BURST, chunk(finish="stop"), usage_chunk(), b"[DONE]"],
    "big-stream": [  # 8 MiB of text in 64 KiB chunks: far more than the sockets between here and a client hold
        chunk({"role": "assistant", "content": ""}),
        *[chunk({"content": "x" * 65536})] * 128,
        chunk(finish="stop"),
        usage_chunk(),
        b"[DONE]",
    ],
}

SCENARIOS: dict[str, list[Any]] = {
    "text": [
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "Hello"}),
        chunk({"content": ", world"}),
        chunk({"content": "!"}),
        chunk(finish="stop"),
        usage_chunk(),
        b"[DONE]",
    ],
    "reasoning": [
        chunk({"role": "assistant", "reasoning_content": "Let me "}),
        chunk({"reasoning_content": "think."}),
        chunk({"content": "The answer"}),
        chunk({"content": " is 4."}),
        chunk(finish="stop"),
        usage_chunk(),
        b"[DONE]",
    ],
    "reasoning-field": [  # vLLM's newer field name
        chunk({"role": "assistant", "reasoning": "Hmm."}),
        chunk({"content": "Done."}),
        chunk(finish="stop"),
        b"[DONE]",
    ],
    "parallel-tools": [
        chunk({"role": "assistant", "content": None}),
        chunk(call_delta(0, id="call_a", name="get_weather", args="")),
        chunk(call_delta(0, args='{"city":')),
        chunk(call_delta(1, id="call_b", name="get_time", args="")),
        chunk(call_delta(0, args=' "Paris"}')),
        chunk(call_delta(1, args='{"tz": "CET"}')),
        chunk(finish="tool_calls"),
        usage_chunk(),
        b"[DONE]",
    ],
    "index0-collisions": [  # a backend that puts every call at index 0
        chunk(call_delta(0, id="call_1", name="get_weather", args='{"city": "Oslo"}')),
        chunk(call_delta(0, id="call_2", name="get_weather", args='{"city": ')),
        chunk(call_delta(0, args='"Rome"}')),
        chunk(call_delta(0, id="call_3", name="get_time", args="{}")),
        chunk(finish="tool_calls"),
        b"[DONE]",
    ],
    "legacy-function-call": [
        chunk({"role": "assistant", "function_call": {"name": "get_weather", "arguments": ""}}),
        chunk({"function_call": {"arguments": '{"city": '}}),
        chunk({"function_call": {"arguments": '"Lima"}'}}),
        chunk(finish="function_call"),
        b"[DONE]",
    ],
    "text-then-tool": [
        chunk({"content": "Let me check."}),
        chunk(call_delta(0, id="call_x", name="get_weather", args='{"city": "Kyiv"}')),
        chunk(finish="tool_calls"),
        b"[DONE]",
    ],
    "refusal": [
        chunk({"refusal": "I can't "}),
        chunk({"refusal": "help with that."}),
        chunk(finish="stop"),
        b"[DONE]",
    ],
    "length": [
        chunk({"content": "This answer is cut"}),
        chunk(finish="length"),
        usage_chunk(),
        b"[DONE]",
    ],
    "length-in-tool": [
        chunk(call_delta(0, id="call_l", name="get_weather", args='{"city": "Ber')),
        chunk(finish="length"),
        b"[DONE]",
    ],
    "stop-string": [  # vLLM names the stop string that ended the answer
        chunk({"content": "One, two"}),
        {**chunk(finish="stop"), "choices": [{"index": 0, "delta": {}, "finish_reason": "stop", "stop_reason": "###"}]},
        usage_chunk(),
        b"[DONE]",
    ],
    "content-filter": [
        chunk({"content": "Some"}),
        chunk(finish="content_filter"),
        b"[DONE]",
    ],
    "error-mid-stream": [  # llama.cpp reports failures inside a 200 stream
        chunk({"content": "Partial"}),
        {"error": {"code": 500, "message": "the model crashed", "type": "server_error"}},
    ],
    "done-no-finish": [
        chunk({"content": "No finish reason"}),
        b"[DONE]",
    ],
    "eof-after-finish": [
        chunk({"content": "Ends"}),
        chunk(finish="stop"),
        CLOSE,
    ],
    "error-first": [  # a stream that fails before its first token
        {"error": {"message": "the model is loading", "type": "server_error"}},
    ],
    "eof-abrupt": [
        chunk({"content": "Cut off"}),
        CLOSE,
    ],
    "not-json": [
        chunk({"content": "ok"}),
        b"{not json",
    ],
    "custom-call": [  # Codex's apply_patch, offered as a function with one string
        chunk(call_delta(0, id="call_p", name="apply_patch", args='{"input": "*** Begin Patch\\n*** Add File: a.txt\\n+hi\\n*** End Patch"}')),
        chunk(finish="tool_calls"),
        b"[DONE]",
    ],
    "namespace-call": [
        chunk(call_delta(0, id="call_n", name="crm__lookup", args='{"id": 7}')),
        chunk(finish="tool_calls"),
        b"[DONE]",
    ],
    "hang": [
        chunk({"content": "Waiting"}),
        HANG,
    ],
    "text-then-wait": [  # a stream in flight: one token, then nothing until backend.release
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "Hello"}),
        WAIT_RELEASE,
        chunk({"content": ", world"}),
        chunk(finish="stop"),
        usage_chunk(),
        b"[DONE]",
    ],
    "tokens-forever": [chunk({"role": "assistant", "content": ""}), TOKENS_FOREVER],
    # usage with the prompt tokens the backend had cached: OpenAI's way, and llama.cpp's `timings`
    "cached-prompt": [
        chunk({"content": "Hi"}),
        chunk(finish="stop"),
        {**usage_chunk(), "usage": {"prompt_tokens": 40, "completion_tokens": 2, "total_tokens": 42, "prompt_tokens_details": {"cached_tokens": 32}}},
        b"[DONE]",
    ],
    "llamacpp-cached-prompt": [
        chunk({"content": "Hi"}),
        chunk(finish="stop"),
        {**usage_chunk(), "usage": {"prompt_tokens": 40, "completion_tokens": 2, "total_tokens": 42}, "timings": {"cache_n": 30, "prompt_n": 10}},
        b"[DONE]",
    ],
    "slow-first-token": [
        WAIT_RELEASE,
        chunk({"content": "Finally"}),
        chunk(finish="stop"),
        b"[DONE]",
    ],
    # Chunks the Chat Completions protocol does not allow.
    "garbage-choices": [chunk({"content": "Hel"}), {"id": "x", "choices": "oops"}, b"[DONE]"],
    "garbage-content": [chunk({"content": 42}), chunk(finish="stop"), b"[DONE]"],
    "garbage-tool-calls": [chunk({"tool_calls": [{"index": 0, "function": "get_weather"}]}), b"[DONE]"],
    "garbage-not-object": [b"[1, 2, 3]", b"[DONE]"],
    # Bytes that never make data: the read timeout must still fire.
    "comments-forever": [COMMENTS_FOREVER],
    "trickle": [TRICKLE],
    "logprobs": [  # every token with its log probability and two alternatives
        chunk({"role": "assistant", "content": ""}),
        *[logprobs_chunk(token, token_logprob(token, logprob, alternatives[:2])) for token, logprob, alternatives in LOGPROB_TOKENS],
        chunk(finish="stop"),
        usage_chunk(),
        b"[DONE]",
    ],
    "unicode": [
        chunk({"content": "line\u2028sep"}),
        chunk({"content": " \u00e9\U0001f600"}),
        chunk(finish="stop"),
        b"[DONE]",
    ],
}


# --- a tokenizer, as vLLM and llama.cpp serve theirs --------------------------------------------

BOS = 1  # the one token this vocabulary adds in front of every prompt


def chat_template(body: dict[str, Any]) -> str:
    """What this backend's chat template makes of a chat request: every message, the tools, and
    the generation prompt (llama.cpp's `/apply-template` answers it, without the BOS)."""
    parts = [f"<|{m.get('role')}|> " + orjson.dumps({k: v for k, v in m.items() if k != "role"}).decode() for m in body.get("messages") or ()]
    if body.get("tools"):
        parts.insert(0, "<|tools|> " + orjson.dumps(body["tools"]).decode())
    return "\n".join(parts) + "\n<|assistant|>"


def tokenize(text: str, *, add_special: bool, parse_special: bool) -> list[int]:
    """Whitespace-separated words; `<|x|>` is one special token only when special tokens are parsed."""
    if not parse_special:
        text = text.replace("<|", "< | ").replace("|>", " | >")
    return [BOS] * add_special + [2 + len(word) for word in text.split()]


def prompt_tokens(body: dict[str, Any]) -> int:
    """The tokens a completion of the chat request `body` is prompted with (BOS included)."""
    return len(tokenize(chat_template(body), add_special=True, parse_special=True))


@dataclass
class Recorded:
    path: str
    method: str
    headers: dict[str, str]
    body: Any


@dataclass
class ScriptedBackend:
    requests: list[Recorded] = field(default_factory=list)
    release: trio.Event = field(default_factory=trio.Event)
    stream_started: trio.Event = field(default_factory=trio.Event)
    client_left: trio.Event = field(default_factory=trio.Event)
    client_left_at: float | None = None
    fail_with: int | None = None  # when set, every chat request is answered with this status
    probes: int = 0  # readiness checks the gateway made
    # How this backend counts tokens: "vllm" (`POST /tokenize` with messages), "llamacpp"
    # (`/apply-template`, then `/tokenize` of the prompt), "completion" (neither: an unstreamed
    # chat request is answered with its usage); None: none of that (the routes as before).
    tokenizer: str | None = None
    # A context window (tokens) it holds requests to, and how it says so: "vllm" (`max_model_len`
    # in /v1/models), "llamacpp" (`/props`), "ollama" (`/api/show`), "hidden" (only in its error
    # when a request does not fit: llama.cpp's, with `n_ctx`); None: any request fits.
    window: tuple[str, int] | None = None
    # The models `/v1/models` lists; a key every request must bear (`Bearer KEY`; None: any or none).
    listed: tuple[str, ...] = ("text",)
    key: str | None = None
    # What the model "capable" (a backend that does all a coding agent needs: `_capable_script`)
    # lacks, for `gateway doctor` to find: "stream-end", "tool-call", "tool-json", "tool-result",
    # "parallel", "usage", "cached-field", "prefix-cache", "reasoning".
    lacks: frozenset[str] = frozenset()
    _last_prompt: list[int] = field(default_factory=list)  # "capable"'s prompt cache: the prompt before
    url: str = ""
    _arrived: trio.Event = field(default_factory=trio.Event)

    async def wait_for(self, predicate: Callable[[], bool]) -> None:
        """Wait until `predicate()` holds; it is re-checked after each request arrives."""
        while not predicate():
            await self._arrived.wait()

    @property
    def chat_requests(self) -> list[Any]:
        return [r.body for r in self.requests if r.path == "/v1/chat/completions"]

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Send) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        raw = await read_body(receive)
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        try:
            body = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            body = raw
        path = scope["path"]
        if headers.get("x-gateway-probe") == "readiness":  # the gateway's background check, not a client's request
            self.probes += 1
            await _json(send, 200, {"object": "list", "data": []})
            return
        self.requests.append(Recorded(path, scope["method"], headers, body))
        self._arrived.set()
        self._arrived = trio.Event()
        if self.key is not None and headers.get("authorization") != f"Bearer {self.key}":
            await _json(send, 401, {"error": {"message": "Incorrect API key provided", "type": "invalid_request_error", "code": "invalid_api_key"}})
            return
        if path in ("/tokenize", "/apply-template") and self.tokenizer is not None:
            await self._tokenizer(path, body, send)
        elif path == "/v1/chat/completions" and scope["method"] == "POST":
            await self._chat(body, receive, send)
        elif path == "/v1/models":
            entries: list[dict[str, Any]] = [{"id": name, "object": "model", "owned_by": "tests"} for name in self.listed]
            if self.window is not None and self.window[0] == "vllm":
                for entry in entries:
                    entry["max_model_len"] = self.window[1]
            await _json(send, 200, {"object": "list", "data": entries})
        elif path == "/props" and self.window is not None and self.window[0] == "llamacpp":
            await _json(send, 200, {"default_generation_settings": {"n_ctx": self.window[1]}, "total_slots": 1})
        elif path == "/api/show" and self.window is not None and self.window[0] == "ollama":
            await _json(send, 200, {"parameters": f"stop \"<|im_end|>\"\nnum_ctx {self.window[1]}", "model_info": {"llama.context_length": 131072}})
        elif path == "/v1/embeddings":
            await _json(send, 200, {"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [0.1, 0.2]}], "echo_query": scope["query_string"].decode()})
        elif path == "/v1/completions" and scope["method"] == "POST":
            await self._completion(body, send)
        elif path == "/v1/audio/transcriptions":  # a multipart route: says what it was sent
            await _json(send, 200, {"text": "ok", "content_type": headers.get("content-type", ""), "size": len(raw)})
        elif path == "/v1/gzipped":  # compresses whatever the request asked for (some servers do)
            packed = gzip.compress(orjson.dumps({"unpacked": True, "size": len(raw)}))
            head = [(b"content-type", b"application/json"), (b"content-encoding", b"gzip")]
            await send({"type": "http.response.start", "status": 200, "headers": head})
            await send({"type": "http.response.body", "body": packed, "more_body": False})
        elif path == "/v1/stream-numbers":  # ?count=N&pad=P: N events, each padded with P dots, sent at once
            asked = {k: int(v) for k, v in (p.split("=", 1) for p in scope["query_string"].decode().split("&") if "=" in p)}
            pad = "." * asked.get("pad", 0)
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
            for n in range(asked.get("count", 20)):
                await send({"type": "http.response.body", "body": f"data: {n}{pad}\n\n".encode(), "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        elif not path.startswith("/v1/"):  # the backend's root: what a passthrough must never reach
            await _json(send, 200, {"escaped": True, "path": path, "headers": headers})
        elif path == "/v1/echo-headers":  # a 4xx whose message echoes the request's headers
            await _json(send, 400, {"error": {"message": f"bad request; headers were {headers}", "type": "invalid_request_error"}})
        elif path == "/v1/teapot":
            await _json(send, 418, {"error": {"message": "I am a teapot", "type": "invalid_request_error", "code": "teapot"}})
        else:
            await _json(send, 404, {"error": {"message": f"no route {path}", "type": "invalid_request_error", "code": "not_found"}})

    async def _tokenizer(self, path: str, body: Any, send: Send) -> None:
        """`/tokenize` and `/apply-template` as the server `tokenizer` names answers them."""
        body = body if isinstance(body, dict) else {}
        if self.tokenizer == "vllm" and path == "/tokenize":
            if not isinstance(body.get("messages"), list):
                await _json(send, 400, {"object": "error", "message": "messages: field required", "type": "BadRequestError", "code": 400})
                return
            template = chat_template(body) if body.get("add_generation_prompt") else chat_template(body).removesuffix("\n<|assistant|>")
            tokens = tokenize(template, add_special=True, parse_special=True)  # its template writes the BOS
            await _json(send, 200, {"count": len(tokens), "max_model_len": 8192, "tokens": tokens, "token_strs": None})
        elif self.tokenizer == "llamacpp" and path == "/apply-template":
            await _json(send, 200, {"prompt": chat_template(body)})
        elif self.tokenizer == "llamacpp":  # /tokenize: `add_special` defaults to false, `parse_special` to true
            content = body.get("content")
            tokens = tokenize(content, add_special=body.get("add_special", False), parse_special=body.get("parse_special", True)) if isinstance(content, str) else []
            await _json(send, 200, {"tokens": tokens})
        else:
            await _json(send, 404, {"error": {"message": "File Not Found", "type": "not_found_error", "code": 404}})

    async def _completion(self, body: Any, send: Send) -> None:
        """Legacy completions: `USAGE` reported as OpenAI does (the last chunk of a stream)."""
        model = body.get("model", "text") if isinstance(body, dict) else "text"
        text = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": model}
        if not (isinstance(body, dict) and body.get("stream")):
            await _json(send, 200, {**text, "choices": [{"index": 0, "text": "Hello", "finish_reason": "stop"}], "usage": USAGE})
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        frames = [{**text, "choices": [{"index": 0, "text": part, "finish_reason": None}]} for part in ("Hel", "lo")]
        frames.append({**text, "choices": [], "usage": USAGE})
        for frame in frames:
            await send({"type": "http.response.body", "body": b"data: " + orjson.dumps(frame) + b"\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})

    async def _chat(self, body: Any, receive: Any, send: Send) -> None:
        model = body.get("model", "text") if isinstance(body, dict) else "text"
        if self.window is not None and isinstance(body, dict):
            kind, n_ctx = self.window
            wanted = prompt_tokens(body) + int(body.get("max_tokens") or 0)
            if wanted > n_ctx:
                if kind == "vllm":
                    message = f"This model's maximum context length is {n_ctx} tokens. However, you requested {wanted} tokens."
                    await _json(send, 400, {"object": "error", "message": message, "type": "BadRequestError", "code": 400})
                else:
                    error = {"code": 400, "message": "the request exceeds the available context size, try increasing it", "type": "exceed_context_size_error", "n_prompt_tokens": wanted, "n_ctx": n_ctx}
                    await _json(send, 400, {"error": error})
                return
        if self.fail_with is not None:
            await _json(send, self.fail_with, {"error": {"message": "scripted failure", "type": "server_error"}})
            return
        if model == "http-429":
            await send({"type": "http.response.start", "status": 429, "headers": [(b"content-type", b"application/json"), (b"retry-after", b"0")]})
            await send({"type": "http.response.body", "body": b'{"error": {"message": "slow down", "type": "rate_limit_error"}}'})
            return
        if model == "http-500":
            await _json(send, 500, {"error": {"message": "internal explosion", "type": "server_error"}})
            return
        if model == "http-400":
            await _json(send, 400, {"error": {"message": "This model's maximum context length is 8 tokens.", "type": "invalid_request_error", "code": "context_length_exceeded", "param": "messages"}})
            return
        if model == "unknown-model":
            await _json(send, 404, {"error": {"message": "The model 'unknown-model' does not exist", "type": "invalid_request_error", "code": "model_not_found"}})
            return
        if model == "no-reasoning-content" and any("reasoning_content" in m for m in body.get("messages", [])):
            await _json(send, 400, {"error": {"message": "Unrecognized request argument supplied: reasoning_content", "type": "invalid_request_error"}})
            return
        if model == "echo-auth-400":
            message = f"rejected request with authorization {self.requests[-1].headers.get('authorization')}"
            await _json(send, 400, {"error": {"message": message, "type": "invalid_request_error"}})
            return
        if model == "hang-before-headers":
            await self._wait_client_left(receive)
            return
        if self.tokenizer == "completion" and body.get("stream") is not True:  # one JSON answer, with its usage
            message = {"role": "assistant", "content": "Hello"}
            answer: dict[str, Any] = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": model, "choices": [{"index": 0, "message": message, "finish_reason": "length"}]}
            if model != "no-usage":
                answer["usage"] = {"prompt_tokens": prompt_tokens(body), "completion_tokens": 1, "total_tokens": prompt_tokens(body) + 1}
            await _json(send, 200, answer)
            return
        script: list[Any]
        if model == "echo-auth-stream":  # an error inside the stream that echoes the request's key
            auth = self.requests[-1].headers.get("authorization")
            script = [chunk({"content": "ok"}), {"error": {"message": f"failed for {auth}", "type": "server_error"}}]
        elif model == "weather":
            script = _weather_script(body)
        elif model == "bash-agent":
            script = _bash_agent_script(body)
        elif model == "shell-agent":
            script = _shell_agent_script(body)
        elif model == "numbered-calls":
            refusal = _unanswered_calls(body)
            if refusal is not None:
                await _json(send, 400, {"error": {"message": refusal, "type": "invalid_request_error", "param": "messages"}})
                return
            script = _numbered_call_script(body)
        elif model == "searcher":
            script = _searcher_script(body)
        elif model == "searcher-twice":
            results = [m for m in body.get("messages") or () if m.get("role") == "tool"]
            script = _searcher_script(body) if len(results) != 1 else [
                chunk(call_delta(0, id="call_s2", name="web_search", args='{"query": "trio"}')), chunk(finish="tool_calls"), usage_chunk(), b"[DONE]",
            ]
        elif model in ("opener", "finder"):
            script = _page_script(model, body)
        elif model == "web-agent":
            script = _web_agent_script(body)
        elif model == "lookup-twice":
            refusal = _unanswered_calls(body)
            if refusal is not None:
                await _json(send, 400, {"error": {"message": refusal, "type": "invalid_request_error", "param": "messages"}})
                return
            script = _lookup_twice_script(body)
        elif model.startswith("mcp-"):
            script = _tool_user_script(model, body)
        elif model == "capable":
            if "tool-result" in self.lacks and any(m.get("role") == "tool" for m in body.get("messages") or ()):
                await _json(send, 400, {"error": {"message": "tool messages are not supported", "type": "invalid_request_error"}})
                return
            prompt = tokenize(chat_template(body), add_special=True, parse_special=True)
            reused = next((n for n, (a, b) in enumerate(zip(prompt, self._last_prompt)) if a != b), min(len(prompt), len(self._last_prompt)))
            self._last_prompt = prompt
            script = _capable_script(body, self.lacks, len(prompt), 0 if "prefix-cache" in self.lacks else reused)
        elif model == "logprobs-if-asked":
            script = _logprobs_script(body)
        else:
            script = SCENARIOS.get(model) or LARGE_SCENARIOS.get(model) or SCENARIOS["text"]
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        self.stream_started.set()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch_disconnect, receive, nursery.cancel_scope)
            for step in script:
                if step == HANG:
                    await trio.sleep_forever()
                elif step == WAIT_RELEASE:
                    await self.release.wait()
                elif step == CLOSE:
                    break
                elif step == COMMENTS_FOREVER:
                    while True:
                        await send({"type": "http.response.body", "body": b": ping\n\n", "more_body": True})
                        await trio.sleep(0.05)  # the backend's own pace, not a synchronisation
                elif step == TOKENS_FOREVER:
                    token = b"data: " + orjson.dumps(chunk({"content": "tok "})) + b"\n\n"
                    while True:
                        await send({"type": "http.response.body", "body": token, "more_body": True})
                        await trio.lowlevel.checkpoint()  # (the socket's back-pressure paces it)
                elif step == TRICKLE:
                    for byte in b'data: {"choices": [{"index": 0, "delta": {"content": "never complete"}}]}' * 100:
                        await send({"type": "http.response.body", "body": bytes([byte]), "more_body": True})
                        await trio.sleep(0.05)  # the backend's own pace, not a synchronisation
                else:
                    data = step if isinstance(step, bytes) else orjson.dumps(step)
                    await send({"type": "http.response.body", "body": b"data: " + data + b"\n\n", "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            nursery.cancel_scope.cancel()

    async def _watch_disconnect(self, receive: Any, scope: trio.CancelScope) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.client_left_at = trio.current_time()
                self.client_left.set()
                scope.cancel()
                return

    async def _wait_client_left(self, receive: Any) -> None:
        with trio.CancelScope() as scope:
            await self._watch_disconnect(receive, scope)


def _tool_user_script(model: str, body: dict[str, Any]) -> list[Any]:
    """A model that uses tools: `mcp-add` adds once and reports, `mcp-mixed` also calls the
    client's get_weather, `mcp-forever` never stops calling, `mcp-slow` calls `slow`, `mcp-fail` calls `fail`."""
    messages = body.get("messages") or []
    results = [m for m in messages if m.get("role") == "tool"]
    rounds = sum(1 for m in messages if m.get("role") == "assistant" and m.get("tool_calls"))
    if results and model != "mcp-forever":
        return [chunk({"content": f"Tool result: {results[-1]['content']}"}), chunk(finish="stop"), usage_chunk(), b"[DONE]"]
    calls = {
        "mcp-add": [("add", '{"a": 2, "b": 3}')],
        "mcp-forever": [("add", '{"a": %d, "b": 1}' % rounds)],
        "mcp-mixed": [("add", '{"a": 1, "b": 1}'), ("get_weather", '{"city": "Oslo"}')],
        "mcp-slow": [("slow", '{"seconds": 30}')],
        "mcp-fail": [("fail", '{"message": "boom"}')],
        "mcp-parallel": [("add", '{"a": 1, "b": 2}'), ("echo", '{"text": "hi"}')],
    }[model]
    script: list[Any] = [chunk({"content": "Let me use a tool."})]
    for index, (name, args) in enumerate(calls):
        script.append(chunk(call_delta(index, id=f"call_{model}_{rounds}_{index}", name=name, args=args)))
    return script + [chunk(finish="tool_calls"), usage_chunk(), b"[DONE]"]


def _capable_script(body: dict[str, Any], lacks: frozenset[str], prompt: int, cached: int) -> list[Any]:
    """A model on a server that does what coding agents need, less what `lacks` names: it thinks
    (`reasoning_content`) and answers; calls the function `tool_choice` names with arguments
    for its schema's required properties; calls every tool offered at once otherwise; answers a
    tool's result in text; reports usage with its cached prompt tokens when asked."""
    messages = body.get("messages") or []
    tools = [t.get("function") or {} for t in body.get("tools") or ()]
    choice = body.get("tool_choice")
    script: list[Any] = [chunk({"role": "assistant", "content": ""})]
    if tools and not any(m.get("role") == "tool" for m in messages) and "tool-call" not in lacks:
        named = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
        called = [t for t in tools if t.get("name") == named] if named else tools[:1] if "parallel" in lacks else tools
        for index, tool in enumerate(called):
            required = (tool.get("parameters") or {}).get("required") or ()
            arguments = "city=Paris" if "tool-json" in lacks else orjson.dumps({name: "Paris" for name in required}).decode()
            script.append(chunk(call_delta(index, id=f"call_{index}", name=tool.get("name"), args=arguments)))
        script.append(chunk(finish="tool_calls"))
    else:
        if "reasoning" not in lacks:
            script.append(chunk({"reasoning_content": "The user wants an answer."}))
        script += [chunk({"content": "Hello"}), chunk({"content": " there."})]
        if "stream-end" in lacks:
            return [*script, CLOSE]
        script.append(chunk(finish="stop"))
    if "usage" not in lacks and (body.get("stream_options") or {}).get("include_usage"):
        usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": 3, "total_tokens": prompt + 3}
        if "cached-field" not in lacks:
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        script.append({**usage_chunk(), "usage": usage})
    return [*script, b"[DONE]"]


BASH_COMMAND = "echo through-the-gateway > ran.txt"


def _bash_agent_script(body: dict[str, Any]) -> list[Any]:
    """A coding agent's model: asked to use Bash (and offered it), it runs BASH_COMMAND once,
    then reports what the tool said; asked anything else, it answers in text."""
    messages = body.get("messages") or []
    names = {(t.get("function") or {}).get("name") for t in body.get("tools") or ()}
    results = [m for m in messages if m.get("role") == "tool"]
    asked = " ".join(orjson.dumps(m.get("content")).decode() for m in messages if m.get("role") == "user")
    if "Bash" not in names or "with Bash" not in asked or results:
        said = f"Done: {results[-1]['content']!r}" if results else "Hello from the gateway."
        return [chunk({"role": "assistant", "content": ""}), chunk({"content": said}), chunk(finish="stop"), usage_chunk(), b"[DONE]"]
    arguments = orjson.dumps({"command": BASH_COMMAND, "description": "Write a file"}).decode()
    return [
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "I will run it."}),
        chunk(call_delta(0, id="call_bash_1", name="Bash", args=arguments[:20])),
        chunk(call_delta(0, args=arguments[20:])),
        chunk(finish="tool_calls"),
        usage_chunk(),
        b"[DONE]",
    ]


SHELL_COMMAND = "echo launched-through-the-gateway > launched.txt"
# Each coding agent's shell tool, and its arguments for SHELL_COMMAND: Claude Code's `Bash`, Codex's
# `shell_command` (its catalog's shell type) or `exec_command` (unified exec), opencode's `bash`.
SHELL_TOOLS: dict[str, dict[str, Any]] = {
    "Bash": {"command": SHELL_COMMAND, "description": "Write a file"},
    "shell_command": {"command": SHELL_COMMAND},
    "exec_command": {"cmd": SHELL_COMMAND},
    "bash": {"command": SHELL_COMMAND, "description": "Write a file"},
}


def _shell_agent_script(body: dict[str, Any]) -> list[Any]:
    """Any coding agent's model: asked to "use the shell", it runs SHELL_COMMAND once with the
    shell tool it is offered (SHELL_TOOLS), then reports what the tool said; asked anything
    else, it answers in text."""
    messages = body.get("messages") or []
    names = [(t.get("function") or {}).get("name") for t in body.get("tools") or ()]
    shell = next((name for name in names if name in SHELL_TOOLS), None)
    results = [m for m in messages if m.get("role") == "tool"]
    asked = " ".join(orjson.dumps(m.get("content")).decode() for m in messages if m.get("role") == "user")
    if shell is None or "use the shell" not in asked or results:
        said = f"Done: {str(results[-1]['content'])[:200]!r}" if results else "Hello from the gateway."
        return [chunk({"role": "assistant", "content": ""}), chunk({"content": said}), chunk(finish="stop"), usage_chunk(), b"[DONE]"]
    arguments = orjson.dumps(SHELL_TOOLS[shell]).decode()
    return [
        chunk({"role": "assistant", "content": ""}),
        chunk(call_delta(0, id="call_shell_1", name=shell, args=arguments)),
        chunk(finish="tool_calls"),
        usage_chunk(),
        b"[DONE]",
    ]


def _weather_script(body: dict[str, Any]) -> list[Any]:
    """Call get_weather first; once a tool result is present, answer with it."""
    messages = body.get("messages") or []
    results = [m for m in messages if m.get("role") == "tool"]
    if results:
        return [chunk({"content": f"The tool said: {results[-1]['content']}"}), chunk(finish="stop"), usage_chunk(), b"[DONE]"]
    return [
        chunk(call_delta(0, id="call_w1", name="get_weather", args='{"city": "Paris"}')),
        chunk(finish="tool_calls"),
        usage_chunk(),
        b"[DONE]",
    ]


def _numbered_call_script(body: dict[str, Any]) -> list[Any]:
    """Like llama.cpp: ids numbered per response, so every response calls `lookup` as `call_0`.

    The arguments say how many tool results the request held, so a test can tell the calls apart.
    """
    results = sum(1 for m in body.get("messages") or () if m.get("role") == "tool")
    return [
        chunk(call_delta(0, id="call_0", name="lookup", args='{"turn": %d}' % results)),
        chunk(finish="tool_calls"),
        usage_chunk(),
        b"[DONE]",
    ]


SEARCH_QUERY = "structured concurrency"


def _searcher_script(body: dict[str, Any]) -> list[Any]:
    """Search the web (`web_search`) once; with its results, answer citing the first URL they hold."""
    results = [m["content"] for m in body.get("messages") or () if m.get("role") == "tool"]
    if results:
        urls = re.findall(r"https?://\S+", str(results[-1]))
        text = f"See {urls[0]} for more." if urls else f"The search said: {results[-1][:60]}"
        return [chunk({"content": text}), chunk(finish="stop"), usage_chunk(), b"[DONE]"]
    return [
        chunk(call_delta(0, id="call_s1", name="web_search", args=orjson.dumps({"query": SEARCH_QUERY}).decode())),
        chunk(finish="tool_calls"),
        usage_chunk(),
        b"[DONE]",
    ]


def _page_script(model: str, body: dict[str, Any]) -> list[Any]:
    """Open (`opener`) or search (`finder`, for "nurseries") the page whose URL the user gave, with
    the gateway's `open_page` / `find_in_page` (or Anthropic's `web_fetch`, where that is what is
    offered); then say what the tool answered."""
    names = {(t.get("function") or {}).get("name") for t in body.get("tools") or ()}
    results = [m for m in body.get("messages") or () if m.get("role") == "tool"]
    if results:
        return [chunk({"content": "Read: " + str(results[-1]["content"])[:300]}), chunk(finish="stop"), usage_chunk(), b"[DONE]"]
    asked = " ".join(str(m.get("content")) for m in body.get("messages") or () if m.get("role") == "user")
    url = (re.findall(r"https?://\S+", asked) or ["http://nowhere.invalid/"])[0]
    if "web_fetch" in names:
        name, arguments = "web_fetch", {"url": url}
    elif model == "finder":
        name, arguments = "find_in_page", {"url": url, "pattern": "nurseries"}
    else:
        name, arguments = "open_page", {"url": url}
    return [chunk(call_delta(0, id="call_p1", name=name, args=orjson.dumps(arguments).decode())), chunk(finish="tool_calls"), usage_chunk(), b"[DONE]"]


def _web_agent_script(body: dict[str, Any]) -> list[Any]:
    """Claude Code's model, asked to search the web: in its own conversation it calls Claude
    Code's `WebSearch` tool; in the request `WebSearch` makes (offered the gateway's `web_search`)
    it searches, then sums up; with WebSearch's result in its conversation, it reports it."""
    names = {(t.get("function") or {}).get("name") for t in body.get("tools") or ()}
    results = [m for m in body.get("messages") or () if m.get("role") == "tool"]
    if "web_search" in names:
        return _searcher_script(body)
    if results:
        found = re.findall(r"https?://[^\s\"'),\]]+", str(results[-1]["content"]))
        said = f"Searched: {found[0]}" if found else f"Searched, and got: {str(results[-1]['content'])[:80]!r}"
        return [chunk({"role": "assistant", "content": ""}), chunk({"content": said}), chunk(finish="stop"), usage_chunk(), b"[DONE]"]
    if "WebSearch" in names:
        arguments = orjson.dumps({"query": SEARCH_QUERY}).decode()
        return [chunk(call_delta(0, id="call_ws_1", name="WebSearch", args=arguments)), chunk(finish="tool_calls"), usage_chunk(), b"[DONE]"]
    return [chunk({"content": "No search tool."}), chunk(finish="stop"), usage_chunk(), b"[DONE]"]


def _lookup_twice_script(body: dict[str, Any]) -> list[Any]:
    """Call `lookup` until the conversation holds two of its results, then answer with them (a
    strict backend: `_unanswered_calls` refuses a history that lost a call or its result)."""
    results = [m["content"] for m in body.get("messages") or () if m.get("role") == "tool"]
    if len(results) >= 2:
        return [chunk({"content": "Found: " + " and ".join(map(str, results))}), chunk(finish="stop"), usage_chunk(), b"[DONE]"]
    return [
        chunk(call_delta(0, id=f"call_{len(results)}", name="lookup", args='{"n": %d}' % len(results))),
        chunk(finish="tool_calls"),
        usage_chunk(),
        b"[DONE]",
    ]


def _unanswered_calls(body: dict[str, Any]) -> str | None:
    """What a strict backend (vLLM, OpenAI) says of a tool sequence it refuses, or None.

    Each assistant `tool_calls` must be followed at once by one tool message per call, and a
    tool message must answer a call of the assistant message before it.
    """
    messages = body.get("messages") or []
    index = 0
    while index < len(messages):
        message = messages[index]
        index += 1
        if message.get("role") == "tool":
            return "Invalid parameter: messages with role 'tool' must be a response to a preceding message with 'tool_calls'."
        ids = [c.get("id") for c in message.get("tool_calls") or ()]
        while index < len(messages) and messages[index].get("role") == "tool":
            if messages[index].get("tool_call_id") not in ids:
                return "Invalid parameter: messages with role 'tool' must be a response to a preceding message with 'tool_calls'."
            ids.remove(messages[index].get("tool_call_id"))
            index += 1
        if ids:
            return (
                "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
                f"'tool_call_id'. The following tool_call_ids did not have response messages: {', '.join(map(str, ids))}"
            )
    return None


async def _json(send: Send, status: int, payload: Any) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": orjson.dumps(payload), "more_body": False})


async def serve_backend(backend: ScriptedBackend, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.graceful_timeout = 0.1
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(functools.partial(serve, backend, config, mode="asgi"))
        backend.url = binds[0]
        task_status.started(binds[0])
