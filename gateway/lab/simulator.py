"""A fast, deterministic Chat Completions server for load tests (``gateway simulate-backend``).

It owns a minimal HTTP/1.1 server on raw trio sockets (h11 parses requests; response bytes are
written by hand), the simulator's configuration language (run defaults, ``sim:key=value,...``
model names, ``x-sim-*`` headers), the generation of fake completions and the run's counters.
It knows nothing about the gateway: it is the *backend* a gateway is measured against.

Why not hypercorn/quart: the point is to measure the gateway, so the backend must cost little
per chunk. Each chunk is one pre-framed ``bytes`` (per-request prefixes plus a word, no JSON
encoding per token) and one write to the socket, a TCP segment of its own as a real token
stream is. Measured on 2 cores with a raw-socket client in another process: 1.0-1.1 ms of CPU
per 200-token zero-delay stream (70% of it in the kernel's TCP), about 890 such streams/s when
the simulator has a core to itself; 2000 connections streaming 20 tokens 50 ms apart cost
about 0.57 ms per stream.

A client that leaves is noticed at the next write (during a ``hang``, at once), counted in
``SimStats.client_disconnects`` and otherwise ignored: no traceback.

Per-request behaviour (headers win over the model name, which wins over the run defaults)::

    model: "sim:ttft=0.03,tokens=200,delay=0.01,jitter=0.002,kinds=500+midstream,fail=0.1,seed=7"
    headers: x-sim-ttft: 0.03, x-sim-kinds: 500,midstream, ...

Any other model name (``"sim"``, ``"gpt-4o"``) uses the run defaults. An unknown key or a bad
value is a 400 ``invalid_request_error`` whose ``param`` names the key.

Timing: response headers go out at once (as llama.cpp and vLLM do); after ``ttft`` seconds the
role chunk and the first token; every later token after ``delay`` ± ``jitter`` (never
negative); the finish/usage/``[DONE]`` chunks follow the last token without delay. Times are
kept on an absolute schedule, so a stream lasts ``ttft`` + the sum of its delays (trio's timers
are up to 1 ms late each, which would otherwise add up). With ``step``, every later token
leaves at the next multiple of ``step`` on a clock all streams share, as a batched model server
gives each stream of a batch its token in the same decoding step: many streams' chunks then
arrive together. A non-streamed response waits the same total time, then sends the whole JSON.

HTTP: HTTP/1.1 with keep-alive (``connection: close`` honoured) and ``Expect: 100-continue``;
streams are always chunked, so HTTP/1.0 clients can use the JSON endpoints only.

Content: ``reasoning`` chunks of ``reasoning_content`` ("think12 "), then ``tokens`` content
chunks ("tok345 "; only ``max_tokens`` of them, with ``finish_reason: "length"``, when the
request's ``max_tokens``/``max_completion_tokens`` is smaller), then ``tools`` parallel tool
calls (names taken from the request's ``tools`` when present; ``finish_reason: "tool_calls"``).
Use ``tokens=0`` for a tool-calls-only answer.

Failures: with probability ``fail`` a request fails in one of ``kinds`` (a repeated kind
weighs more, e.g. ``500+500+drop``): ``500`` is an HTTP 500 JSON error before anything else;
``midstream`` sends some chunks, then ``data: {"error": {...}}`` (as llama.cpp would) and ends
the chunked body cleanly without ``[DONE]``; ``hang`` sends the headers and then nothing until
the client leaves; ``drop`` sends some chunks and closes the TCP connection without the
terminating chunk (httpx2: ``RemoteProtocolError``). Without streaming, ``midstream`` becomes a
500 after the generation time and ``drop`` closes the connection without a response.

Determinism: each chat request gets its own ``random.Random`` seeded from ``(seed, n)``, where
``n`` counts the chat requests this process has received *with that seed* (0, 1, 2, ...). All
random choices of one request (failure roll, kind, failure point, words, jitter values) are
drawn from it in a fixed order, so they never depend on timing. Two runs with the same seed
therefore behave identically request by request when requests arrive in the same order (for
example one at a time); with concurrent clients the arrival order, and so which connection
gets the n-th behaviour, is up to the network, but the sequence itself is the same.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import heapq
import itertools
import logging
import math
import os
import random
import signal
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import h11
import orjson
import trio

from . import client_host
from .fdlimit import raise_fd_limit

__all__ = [
    "FAILURE_KINDS",
    "SimConfig",
    "SimConfigError",
    "SimStats",
    "Simulator",
    "add_arguments",
    "main",
]

logger = logging.getLogger(__name__)

FAILURE_KINDS = ("500", "midstream", "hang", "drop")

_BACKLOG = 4096
_RECV_SIZE = 65536
_MAX_BODY = 32 * 1024 * 1024
_VOCABULARY = 1000  # words are "tok0 " ... "tok999 "
_TOOL_ARG_CHUNKS = 3  # a tool call's arguments arrive in this many pieces
_FRAMES_PER_CHECKPOINT = 32  # zero-delay frames written between two trips through the scheduler
_DIRECT_WRITES = sys.platform != "win32"  # os.write() on a socket is a POSIX thing


# --------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------


class SimConfigError(ValueError):
    """An invalid simulator setting; ``key`` names it (``"ttft"``, ``"kinds"``, ...)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"invalid simulator setting {key!r}: {message}")
        self.key = key


def _parse_float(text: str) -> float:
    return float(text)


def _parse_kinds(text: str) -> tuple[str, ...]:
    # "+" is the separator inside a model name (where "," separates keys); accept both anywhere.
    return tuple(part.strip() for part in text.replace("+", ",").split(",") if part.strip())


_PARSERS: dict[str, Callable[[str], Any]] = {
    "ttft": _parse_float,
    "delay": _parse_float,
    "jitter": _parse_float,
    "tokens": int,
    "tools": int,
    "reasoning": int,
    "fail": _parse_float,
    "kinds": _parse_kinds,
    "seed": int,
    "step": _parse_float,
}


def _check(key: str, value: Any) -> None:
    """Raise `SimConfigError` unless ``value`` is valid for ``key``."""
    if key in ("ttft", "delay", "jitter", "fail", "step"):
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or not math.isfinite(value):
            raise SimConfigError(key, f"expected a finite number, got {value!r}")
        if value < 0:
            raise SimConfigError(key, f"must not be negative, got {value!r}")
        if key == "fail" and value > 1:
            raise SimConfigError(key, f"is a probability (0..1), got {value!r}")
    elif key in ("tokens", "tools", "reasoning", "seed"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise SimConfigError(key, f"expected an integer, got {value!r}")
        if key != "seed" and value < 0:
            raise SimConfigError(key, f"must not be negative, got {value!r}")
    elif key == "kinds":
        if not isinstance(value, tuple) or not value:
            raise SimConfigError(key, f"expected one or more of {'+'.join(FAILURE_KINDS)}")
        unknown = [kind for kind in value if kind not in FAILURE_KINDS]
        if unknown:
            known = "+".join(FAILURE_KINDS)
            raise SimConfigError(key, f"unknown kind(s) {unknown}; known: {known}")
    else:
        raise SimConfigError(key, f"unknown key; known: {', '.join(_PARSERS)}")


@dataclass(frozen=True, slots=True)
class SimConfig:
    """What the simulated backend does; run defaults, overridable per request.

    Raises:
        SimConfigError: a field is out of range (naming it).
    """

    ttft: float = 0.0  # seconds before the first chunk (headers are sent at once)
    delay: float = 0.0  # seconds between chunks
    jitter: float = 0.0  # uniform ± added to each delay, clipped at 0
    tokens: int = 20  # content chunks
    tools: int = 0  # parallel tool calls after the content
    reasoning: int = 0  # reasoning_content chunks before the content
    fail: float = 0.0  # probability that a request fails
    kinds: tuple[str, ...] = ("500",)  # failure kinds to choose from (see FAILURE_KINDS)
    seed: int = 0
    # > 0: chunks leave on a clock shared by every stream, at the next multiple of `step`
    # seconds, as a batched model server's decoding steps give every stream its token at once.
    step: float = 0.0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            _check(f.name, getattr(self, f.name))

    def merged(self, model: str, headers: Mapping[str, str]) -> SimConfig:
        """This config with the overrides of one request applied.

        ``model`` overrides when it has the form ``sim:key=value,...``; ``headers`` (names in
        any case) override with ``x-sim-KEY: value`` and win over the model name.

        Raises:
            SimConfigError: an unknown key or an invalid value (``key`` names it).
        """
        overrides: dict[str, Any] = {}
        if model.startswith("sim:"):
            for item in model[4:].split(","):
                if not item.strip():
                    continue
                key, sep, text = item.partition("=")
                key = key.strip()
                if not sep:
                    raise SimConfigError(key, "expected key=value in the model name")
                overrides[key] = _parse_setting(key, text.strip())
        for name, text in headers.items():
            name = name.lower()
            if name.startswith("x-sim-"):
                key = name[6:]
                overrides[key] = _parse_setting(key, text.strip())
        if not overrides:
            return self
        for key, value in overrides.items():
            _check(key, value)
        return dataclasses.replace(self, **overrides)


def _parse_setting(key: str, text: str) -> Any:
    parser = _PARSERS.get(key)
    if parser is None:
        raise SimConfigError(key, f"unknown key; known: {', '.join(_PARSERS)}")
    try:
        value = parser(text)
    except ValueError:
        raise SimConfigError(key, f"cannot parse {text!r}") from None
    _check(key, value)
    return value


# --------------------------------------------------------------------------------------------
# Stats
# --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class SimStats:
    """Counters of one run (``Simulator.stats``, ``GET /stats``)."""

    connections: int = 0  # TCP connections accepted
    requests: int = 0  # HTTP requests of any kind
    completions: int = 0  # chat completion requests accepted (after validation)
    active: int = 0  # chat completions being answered right now
    streams_completed: int = 0  # streams that reached [DONE]
    responses_completed: int = 0  # non-streamed completions sent in full
    failures: dict[str, int] = field(default_factory=dict)  # injected failures by kind
    client_disconnects: int = 0  # clients that left while a completion was being answered
    bad_requests: int = 0  # 4xx answers (invalid JSON, bad overrides, unknown paths, ...)
    internal_errors: int = 0  # bugs: an unexpected exception in a connection handler

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # a deep copy


# --------------------------------------------------------------------------------------------
# Fake completions (no I/O: a plan of chunks with the delay before each)
# --------------------------------------------------------------------------------------------

_WORDS = [f"tok{i} ".encode() for i in range(_VOCABULARY)]
_THOUGHTS = [f"think{i} ".encode() for i in range(_VOCABULARY)]
_END_OF_BODY = b"0\r\n\r\n"
_DONE_AND_END = b"e\r\ndata: [DONE]\n\n\r\n" + _END_OF_BODY


def _frame(json_bytes: bytes) -> bytes:
    """One SSE ``data:`` event as one HTTP chunk."""
    return b"%x\r\ndata: %b\n\n\r\n" % (len(json_bytes) + 8, json_bytes)


def _text_length(content: Any) -> int:
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        texts = (p.get("text") for p in content if isinstance(p, dict))
        return sum(len(text) for text in texts if isinstance(text, str))
    return 0


class _BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


@dataclass(slots=True)
class _Completion:
    """One chat completion: its settings, its random choices, and its chunks."""

    config: SimConfig
    rng: random.Random
    id: str
    created: int
    model: str
    stream: bool
    include_usage: bool
    prompt_tokens: int
    content_chunks: int
    finish_reason: str
    tool_names: list[str]
    failure: str | None = None
    fail_at: int = 0  # body chunks sent before the failure
    completion_tokens: int = 0

    @property
    def body_chunks(self) -> int:
        tools = self.config.tools if self.finish_reason == "tool_calls" else 0
        return self.config.reasoning + self.content_chunks + tools * (1 + _TOOL_ARG_CHUNKS)

    def gap(self) -> float:
        config = self.config
        if config.jitter:
            return max(0.0, config.delay + self.rng.uniform(-config.jitter, config.jitter))
        return config.delay

    def events(self) -> Iterator[tuple[float, str, Any]]:
        """``(delay_before, kind, value)`` for every body chunk, up to the failure point.

        kinds: ``reasoning``/``content`` (word bytes), ``tool`` (index, id, name) and
        ``args`` (index, text). Draws words and jitter from ``rng`` in a fixed order.
        """
        config = self.config
        limit = self.fail_at if self.failure is not None else self.body_chunks
        sent = 0
        rng = self.rng
        for vocabulary, count, kind in (
            (_THOUGHTS, config.reasoning, "reasoning"),
            (_WORDS, self.content_chunks, "content"),
        ):
            for _ in range(count):
                if sent == limit:
                    return
                gap = self.gap() if sent else 0.0
                sent += 1
                self.completion_tokens += 1
                yield gap, kind, vocabulary[rng.randrange(_VOCABULARY)]
        if self.finish_reason != "tool_calls":
            return
        for index in range(config.tools):
            if sent == limit:
                return
            names = self.tool_names
            name = names[index % len(names)] if names else f"tool_{index}"
            call_id = f"call_{self.id.removeprefix('chatcmpl-')}_{index}"
            gap = self.gap() if sent else 0.0
            sent += 1
            yield gap, "tool", (index, call_id, name)
            words = " ".join(_WORDS[rng.randrange(_VOCABULARY)].decode().strip() for _ in range(2))
            arguments = orjson.dumps({"text": words, "index": index}).decode()
            self.completion_tokens += 1 + len(arguments) // 4
            step = -(-len(arguments) // _TOOL_ARG_CHUNKS)
            for piece in range(_TOOL_ARG_CHUNKS):
                if sent == limit:
                    return
                gap = self.gap()
                sent += 1
                yield gap, "args", (index, arguments[piece * step : (piece + 1) * step])

    def usage(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": self.config.reasoning},
        }

    def error(self) -> dict[str, Any]:
        return {
            "error": {
                "message": f"simulated backend failure ({self.failure})",
                "type": "server_error",
                "param": None,
                "code": 500,
            }
        }

    # -- streaming ---------------------------------------------------------------------------

    def frames(self) -> Iterator[tuple[float, bytes]]:
        """``(delay_before, bytes)`` for every write after the response head.

        The role chunk comes ``ttft`` after the head, the first token right after it, the other
        tokens ``delay`` ± ``jitter`` apart; the closing frames (finish, usage, ``[DONE]`` with
        the terminating chunk, or the error event) follow at once. A ``drop`` failure just stops
        early: the caller closes the connection.
        """
        # Pre-encoded pieces: only the word changes from one content chunk to the next.
        chunk = {"id": self.id, "object": "chat.completion.chunk", "created": self.created}
        head = orjson.dumps({**chunk, "model": self.model})[:-1]  # the rest is added per chunk
        tail = b',"usage":null}' if self.include_usage else b"}"
        choice_open = head + b',"choices":[{"index":0,"delta":'
        choice_close = b',"logprobs":null,"finish_reason":null}]' + tail
        content_open = choice_open + b'{"content":"'
        reasoning_open = choice_open + b'{"reasoning_content":"'
        word_close = b'"}' + choice_close
        role = b'{"role":"assistant","content":""}'
        yield self.config.ttft, _frame(choice_open + role + choice_close)
        for gap, kind, value in self.events():
            if kind == "content":
                payload = content_open + value + word_close
            elif kind == "reasoning":
                payload = reasoning_open + value + word_close
            elif kind == "tool":
                index, call_id, name = value
                call = {"index": index, "id": call_id, "type": "function"}
                delta = {"tool_calls": [{**call, "function": {"name": name, "arguments": ""}}]}
                payload = choice_open + orjson.dumps(delta) + choice_close
            else:
                index, text = value
                delta = {"tool_calls": [{"index": index, "function": {"arguments": text}}]}
                payload = choice_open + orjson.dumps(delta) + choice_close
            # A framed chunk per write, so that every token is its own TCP segment.
            yield gap, b"%x\r\ndata: %b\n\n\r\n" % (len(payload) + 8, payload)
        if self.failure == "midstream":
            yield 0.0, _frame(orjson.dumps(self.error())) + _END_OF_BODY
            return
        if self.failure is not None:
            return
        finish = b',"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"%b"}]'
        yield 0.0, _frame(head + finish % self.finish_reason.encode() + tail)
        if self.include_usage:
            yield 0.0, _frame(head + b',"choices":[],"usage":' + orjson.dumps(self.usage()) + b"}")
        yield 0.0, _DONE_AND_END

    # -- non-streaming -----------------------------------------------------------------------

    def message(self) -> tuple[float, dict[str, Any]]:
        """The total time to wait and the ``chat.completion`` body (draws the same randoms)."""
        wait = self.config.ttft
        reasoning: list[bytes] = []
        content: list[bytes] = []
        calls: list[dict[str, Any]] = []
        for gap, kind, value in self.events():
            wait += gap
            if kind == "content":
                content.append(value)
            elif kind == "reasoning":
                reasoning.append(value)
            elif kind == "tool":
                index, call_id, name = value
                function = {"name": name, "arguments": ""}
                calls.append({"id": call_id, "type": "function", "function": function})
            else:
                index, text = value
                calls[index]["function"]["arguments"] += text
        text = b"".join(content).decode() if content or not calls else None
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if reasoning:
            message["reasoning_content"] = b"".join(reasoning).decode()
        if calls:
            message["tool_calls"] = calls
        end = self.finish_reason
        body = {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": end}],
            "usage": self.usage(),
        }
        return wait, body


def _request_rng(seed: int, n: int) -> random.Random:
    """The random source of the ``n``-th request with ``seed`` (see "Determinism" above)."""
    # Seeding with a str hashes it with SHA-512: stable across processes and Python versions.
    return random.Random(f"{seed}/{n}")


def _plan(config: SimConfig, body: Any, rng: random.Random, completion_id: str) -> _Completion:
    """Validate a chat request body and decide everything about its answer.

    Raises:
        _BadRequest: the body is not a plausible chat completion request.
    """
    if not isinstance(body, dict):
        raise _BadRequest("the request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _BadRequest("'messages' must be a non-empty array", "messages")
    model = body.get("model", "sim")
    if not isinstance(model, str):
        raise _BadRequest("'model' must be a string", "model")
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise _BadRequest("'stream' must be a boolean", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise _BadRequest("'stream_options' must be an object", "stream_options")
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise _BadRequest("'max_tokens' must be a non-negative integer", "max_tokens")
    tools = body.get("tools")
    tool_names = []
    if isinstance(tools, list):
        for tool in tools:
            function = tool.get("function") if isinstance(tool, dict) else None
            name = function.get("name") if isinstance(function, dict) else None
            if isinstance(name, str) and name:
                tool_names.append(name)
    chars = sum(_text_length(m.get("content")) for m in messages if isinstance(m, dict))
    content_chunks = config.tokens if limit is None else min(limit, config.tokens)
    if content_chunks < config.tokens:
        finish_reason = "length"
    elif config.tools:
        finish_reason = "tool_calls"
    else:
        finish_reason = "stop"
    completion = _Completion(
        config=config,
        rng=rng,
        id=completion_id,
        created=int(time.time()),
        model=model,
        stream=stream,
        include_usage=bool(options.get("include_usage")),
        prompt_tokens=max(1, -(-chars // 4)),
        content_chunks=content_chunks,
        finish_reason=finish_reason,
        tool_names=tool_names,
    )
    # The draw order is part of the determinism contract: roll, then kind and failure point.
    if rng.random() < config.fail:
        completion.failure = config.kinds[rng.randrange(len(config.kinds))]
        chunks = completion.body_chunks
        completion.fail_at = rng.randint(1, chunks) if chunks else 0
    return completion


# --------------------------------------------------------------------------------------------
# HTTP/1.1 shell
# --------------------------------------------------------------------------------------------

_REASONS = {
    200: b"OK",
    400: b"Bad Request",
    404: b"Not Found",
    405: b"Method Not Allowed",
    413: b"Payload Too Large",
    500: b"Internal Server Error",
}
_SERVER = b"server: gateway-simulator\r\n"
_CLOSE = b"connection: close\r\n"
_STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\n"
    + _SERVER
    + b"content-type: text/event-stream\r\ncache-control: no-cache\r\n"
    + b"x-accel-buffering: no\r\ntransfer-encoding: chunked\r\n"
)
_STREAM_HEAD_KEEP = _STREAM_HEAD + b"\r\n"
_STREAM_HEAD_CLOSE = _STREAM_HEAD + _CLOSE + b"\r\n"


def _json_bytes(status: int, body: Any, *, keep_alive: bool) -> bytes:
    payload = orjson.dumps(body)
    return b"".join(
        (
            b"HTTP/1.1 %d %b\r\n" % (status, _REASONS[status]),
            _SERVER,
            b"content-type: application/json\r\ncontent-length: %d\r\n" % len(payload),
            b"" if keep_alive else _CLOSE,
            b"\r\n",
            payload,
        )
    )


def _error_body(
    message: str, type_: str, param: str | None, code: str | int | None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


@dataclass(slots=True)
class _Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    keep_alive: bool


class _TooLarge(Exception):
    pass


async def _read_request(stream: trio.SocketStream, conn: h11.Connection) -> _Request | None:
    """The next whole request on ``conn``, or None when the client closed between requests.

    Raises:
        h11.RemoteProtocolError: malformed HTTP, or the client left in the middle of a request.
        _TooLarge: the body is larger than ``_MAX_BODY``.
        trio.BrokenResourceError: the connection was reset.
    """
    request: h11.Request | None = None
    body = bytearray()
    continued = False
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            if conn.they_are_waiting_for_100_continue and not continued:
                continued = True  # h11 does not see what we write, so remember it here
                await stream.send_all(b"HTTP/1.1 100 Continue\r\n\r\n")
            conn.receive_data(await stream.receive_some(_RECV_SIZE))
        elif isinstance(event, h11.Request):
            request = event
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > _MAX_BODY:
                raise _TooLarge
        elif isinstance(event, h11.EndOfMessage):
            assert request is not None
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in request.headers}
            tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
            if request.http_version == b"1.0":
                keep_alive = "keep-alive" in tokens
            else:
                keep_alive = "close" not in tokens
            target = request.target.decode("latin-1")
            return _Request(
                method=request.method.decode("latin-1"),
                path=target.partition("?")[0],
                headers=headers,
                body=bytes(body),
                keep_alive=keep_alive,
            )
        elif isinstance(event, h11.ConnectionClosed):
            return None


def _next_cycle(conn: h11.Connection) -> h11.Connection:
    """A parser for the next request, fed with what the client already sent.

    Responses are written by hand, so this connection's h11 never reaches DONE on our side;
    a fresh parser with the unread bytes is simpler and cheaper than feeding it our bytes.
    """
    data, closed = conn.trailing_data
    fresh = h11.Connection(h11.SERVER)
    if data:
        fresh.receive_data(bytes(data))
    if closed:
        fresh.receive_data(b"")
    return fresh


class _ClientGone(Exception):
    """The client left while a completion was being answered (already counted)."""


class _Timers:
    """Wake-ups for every streaming connection of one server, kept in one heap.

    ``trio.sleep`` enters and leaves a cancel scope per call: about 21 µs of CPU per sleep
    with 2000 tasks sleeping here. Parking the task with ``wait_task_rescheduled`` and keeping
    its wake-up time in a heap costs about 5 µs; `run` is the one task that sleeps on trio's
    clock, until the earliest wake-up, and reschedules whoever is due.
    """

    def __init__(self) -> None:
        self._heap: list[list[Any]] = []  # [when, tie-breaker, task or None once cancelled]
        self._order = itertools.count()
        self._scope: trio.CancelScope | None = None  # run()'s sleep, while it sleeps

    async def sleep_until(self, when: float) -> None:
        """Sleep until trio's clock reads ``when``; cancellable like ``trio.sleep_until``."""
        entry = [when, next(self._order), trio.lowlevel.current_task()]
        heapq.heappush(self._heap, entry)
        if self._scope is not None and when < self._scope.deadline:
            self._scope.deadline = when

        def abort(_: Any) -> trio.lowlevel.Abort:
            entry[2] = None  # left in the heap; run() skips it
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)

    async def run(self) -> None:
        heap = self._heap
        while True:
            with trio.CancelScope(deadline=heap[0][0] if heap else math.inf) as scope:
                self._scope = scope
                await trio.sleep_forever()
            self._scope = None
            now = trio.current_time()
            while heap and heap[0][0] <= now:
                task = heapq.heappop(heap)[2]
                if task is not None:
                    trio.lowlevel.reschedule(task)


class Simulator:
    """A simulated Chat Completions backend: run defaults, the run's counters, the server.

    ``stats`` (a `SimStats`) is live; ``wait_stats`` waits for a condition on it.
    """

    def __init__(self, config: SimConfig | None = None) -> None:
        self.config = config if config is not None else SimConfig()
        self.stats = SimStats()
        self._counters: dict[int, int] = {}  # requests seen per seed: the determinism key
        self._changed: trio.Event | None = None

    async def serve(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Serve until cancelled; ``task_status.started("http://HOST:PORT")`` with the real port.

        Raises:
            OSError: the address cannot be bound.
        """
        listeners = await trio.open_tcp_listeners(port, host=host, backlog=_BACKLOG)
        if port == 0 and len(listeners) > 1:
            # A name with several addresses gets a different free port on each: keep one URL.
            for extra in listeners[1:]:
                await extra.aclose()
            listeners = listeners[:1]
        bound_port = listeners[0].socket.getsockname()[1]
        timers = _Timers()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(timers.run)
            task_status.started(f"http://{client_host(host)}:{bound_port}")
            await trio.serve_listeners(functools.partial(self._run_connection, timers), listeners)

    async def wait_stats(self, predicate: Callable[[SimStats], bool]) -> None:
        """Wait until ``predicate(self.stats)`` holds.

        It is checked whenever a connection opens or closes, a completion starts or ends, and
        after every response.
        """
        while not predicate(self.stats):
            if self._changed is None:
                self._changed = trio.Event()
            await self._changed.wait()

    def _touch(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    # -- connections -------------------------------------------------------------------------

    async def _run_connection(self, timers: _Timers, stream: trio.SocketStream) -> None:
        # This handler must never raise: serve_listeners would take the whole server down.
        stats = self.stats
        stats.connections += 1
        self._touch()
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                try:
                    request = await _read_request(stream, conn)
                except _TooLarge:
                    stats.bad_requests += 1
                    body = _error_body("request body too large", "invalid_request_error", None, 413)
                    await stream.send_all(_json_bytes(413, body, keep_alive=False))
                    return
                except h11.RemoteProtocolError:
                    if not conn.trailing_data[1]:  # still open: say why before closing
                        stats.bad_requests += 1
                        body = _error_body("malformed HTTP", "invalid_request_error", None, 400)
                        await stream.send_all(_json_bytes(400, body, keep_alive=False))
                    return
                if request is None:
                    return
                stats.requests += 1
                keep_open = await self._respond(stream, request, timers)
                self._touch()
                if not keep_open or not request.keep_alive:
                    return
                conn = _next_cycle(conn)
        except (_ClientGone, trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the peer went away: nothing to answer, nobody to tell
        except Exception:
            stats.internal_errors += 1
            logger.exception("simulator: unexpected error in a connection handler")
        finally:
            self._touch()
            await trio.aclose_forcefully(stream)

    async def _respond(self, stream: trio.SocketStream, request: _Request, timers: _Timers) -> bool:
        """Answer one request; False when the connection must be closed."""
        keep = request.keep_alive
        path, method = request.path, request.method
        if path == "/v1/chat/completions":
            if method == "POST":
                return await self._complete(stream, request, timers)
        elif path == "/v1/models":
            if method == "GET":
                model = {"id": "sim", "object": "model", "created": 0, "owned_by": "simulator"}
                models = {"object": "list", "data": [model]}
                await stream.send_all(_json_bytes(200, models, keep_alive=keep))
                return True
        elif path == "/health":
            if method == "GET":
                await stream.send_all(_json_bytes(200, {"status": "ok"}, keep_alive=keep))
                return True
        elif path == "/stats":
            if method == "GET":
                body = {"stats": self.stats.as_dict(), "config": dataclasses.asdict(self.config)}
                await stream.send_all(_json_bytes(200, body, keep_alive=keep))
                return True
        else:
            self.stats.bad_requests += 1
            message = f"Invalid URL ({method} {path})"
            error = _error_body(message, "invalid_request_error", None, "not_found")
            await stream.send_all(_json_bytes(404, error, keep_alive=keep))
            return True
        self.stats.bad_requests += 1
        message = f"Method {method} not allowed on {path}"
        error = _error_body(message, "invalid_request_error", None, "method_not_allowed")
        await stream.send_all(_json_bytes(405, error, keep_alive=keep))
        return True

    async def _complete(
        self, stream: trio.SocketStream, request: _Request, timers: _Timers
    ) -> bool:
        stats = self.stats
        keep = request.keep_alive
        try:
            try:
                body = orjson.loads(request.body)
            except orjson.JSONDecodeError:
                raise _BadRequest("the request body is not valid JSON") from None
            model = body.get("model", "sim") if isinstance(body, dict) else "sim"
            try:
                name = model if isinstance(model, str) else "sim"
                config = self.config.merged(name, request.headers)
            except SimConfigError as exc:
                raise _BadRequest(str(exc), exc.key, "invalid_sim_setting") from None
            n = self._counters.get(config.seed, 0)
            self._counters[config.seed] = n + 1
            rng = _request_rng(config.seed, n)
            completion = _plan(config, body, rng, f"chatcmpl-sim-{config.seed}-{n}")
        except _BadRequest as exc:
            stats.bad_requests += 1
            error = _error_body(exc.message, "invalid_request_error", exc.param, exc.code)
            await stream.send_all(_json_bytes(400, error, keep_alive=keep))
            return True
        stats.completions += 1
        stats.active += 1
        if completion.failure is not None:
            stats.failures[completion.failure] = stats.failures.get(completion.failure, 0) + 1
        self._touch()
        try:
            if completion.failure == "500":
                await stream.send_all(_json_bytes(500, completion.error(), keep_alive=keep))
                return True
            if completion.stream:
                return await self._stream(stream, completion, keep, timers)
            return await self._reply(stream, completion, keep)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            stats.client_disconnects += 1
            raise _ClientGone from None
        finally:
            stats.active -= 1
            self._touch()

    async def _stream(
        self, stream: trio.SocketStream, completion: _Completion, keep: bool, timers: _Timers
    ) -> bool:
        await stream.send_all(_STREAM_HEAD_KEEP if keep else _STREAM_HEAD_CLOSE)
        if completion.failure == "hang":
            await _wait_for_eof(stream)
            raise trio.BrokenResourceError  # counted as a disconnect by the caller
        await _send_frames(stream, completion.frames(), timers, completion.config.step)
        if completion.failure == "drop":
            return False
        if completion.failure is None:
            self.stats.streams_completed += 1
        return True

    async def _reply(self, stream: trio.SocketStream, completion: _Completion, keep: bool) -> bool:
        if completion.failure == "hang":
            await _wait_for_eof(stream)
            raise trio.BrokenResourceError
        wait, body = completion.message()
        if wait > 0:
            await trio.sleep(wait)
        if completion.failure == "drop":
            return False
        if completion.failure == "midstream":
            await stream.send_all(_json_bytes(500, completion.error(), keep_alive=keep))
            return True
        await stream.send_all(_json_bytes(200, body, keep_alive=keep))
        self.stats.responses_completed += 1
        return True


async def _send_frames(
    stream: trio.SocketStream, frames: Iterator[tuple[float, bytes]], timers: _Timers, step: float = 0.0
) -> None:
    """Write each frame with its own write(2), at its time.

    Frame times are kept on an absolute schedule (start + ttft + the delays so far), so that
    trio's timer granularity (up to 1 ms late per sleep) does not add up over a long stream;
    a server too busy to keep up starts again from "now" instead of sending a burst.

    ``send_all`` costs a round trip through trio's scheduler per call: 2.2 ms of CPU for a
    zero-delay 200-token stream, against 1.0-1.1 ms when each frame is written straight to
    the non-blocking socket and trio is asked to wait only when the kernel buffer is full. A
    checkpoint every few frames keeps a zero-delay stream cancellable and fair to the other
    connections.

    Raises:
        trio.BrokenResourceError: the client has gone.
    """
    clock = trio.current_time
    due = clock()
    fd = stream.socket.fileno()
    write = os.write
    unyielded = 0
    for delay, data in frames:
        if delay > 0:
            due += delay
            if step > 0:  # on the shared clock: the next decoding step at or after `due`
                due = math.ceil(due / step - 1e-9) * step
            now = clock()
            if due > now:
                await timers.sleep_until(due)
                unyielded = 0
            else:
                due = now
        if unyielded >= _FRAMES_PER_CHECKPOINT:
            await trio.lowlevel.checkpoint()
            unyielded = 0
        unyielded += 1
        if not _DIRECT_WRITES:
            await stream.send_all(data)
            continue
        try:
            sent = write(fd, data)
        except BlockingIOError:
            sent = 0
        except OSError as exc:  # EPIPE, ECONNRESET: what send_all would report
            raise trio.BrokenResourceError(exc) from exc
        if sent < len(data):  # the kernel buffer is full: let trio wait for room
            await stream.send_all(data[sent:])
            unyielded = 0


async def _wait_for_eof(stream: trio.SocketStream) -> None:
    """Read and discard until the peer closes (or resets) the connection."""
    try:
        while await stream.receive_some(_RECV_SIZE):
            pass
    except trio.BrokenResourceError:
        pass


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The simulator's flags (used by ``gateway simulate-backend`` and ``python -m``)."""
    d = SimConfig()
    add = parser.add_argument
    add("--host", default="127.0.0.1", help="bind address (default: 127.0.0.1)")
    add("--port", type=int, default=8000, help="bind port, 0 = any free one (default: 8000)")
    add("--ttft", type=float, default=d.ttft, help="seconds before the first chunk")
    add("--delay", type=float, default=d.delay, help="seconds between chunks")
    add("--jitter", type=float, default=d.jitter, help="uniform ± seconds added to each delay")
    add("--tokens", type=int, default=d.tokens, help="content chunks per answer")
    add("--tools", type=int, default=d.tools, help="parallel tool calls per answer")
    add("--reasoning", type=int, default=d.reasoning, help="reasoning_content chunks per answer")
    add("--fail", type=float, default=d.fail, help="probability (0..1) that a request fails")
    add(
        "--kinds",
        default=",".join(d.kinds),
        help=f"failure kinds to choose from, e.g. 500,midstream (known: {','.join(FAILURE_KINDS)})",
    )
    add("--seed", type=int, default=d.seed, help="seed of the per-request random choices")
    add(
        "--step",
        type=float,
        default=d.step,
        help="seconds of a decoding step shared by every stream (0: none): each chunk leaves at a multiple of it",
    )


def main(args: argparse.Namespace) -> int:
    """Serve with the settings in ``args`` (see `add_arguments`) until Ctrl-C; print the URL."""
    try:
        config = SimConfig(
            ttft=args.ttft,
            delay=args.delay,
            jitter=args.jitter,
            tokens=args.tokens,
            tools=args.tools,
            reasoning=args.reasoning,
            fail=args.fail,
            kinds=_parse_kinds(args.kinds),
            seed=args.seed,
            step=args.step,
        )
    except SimConfigError as exc:
        print(f"simulate-backend: {exc}", file=sys.stderr)
        return 2
    raise_fd_limit()
    simulator = Simulator(config)

    async def run() -> int:
        # Signals are received as messages, so that Ctrl-C ends the server by cancellation
        # (a clean exit) instead of a KeyboardInterrupt out of the middle of a handler.
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                try:
                    url = await nursery.start(simulator.serve, args.host, args.port)
                except OSError as exc:
                    where = f"{args.host}:{args.port}"
                    print(f"simulate-backend: cannot serve on {where}: {exc}", file=sys.stderr)
                    return 1
                print(f"simulator: Chat Completions at {url}/v1 (Ctrl-C to stop)", flush=True)
                async for _ in signals:
                    nursery.cancel_scope.cancel()
                    break
        return 0

    return trio.run(run)


def _cli(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gateway.lab.simulator",
        description="A fast, deterministic Chat Completions backend for load tests.",
    )
    add_arguments(parser)
    return main(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(_cli())
