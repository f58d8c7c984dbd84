"""Chat Completions chunks in, Responses events out: a pure state machine.

This module owns everything about the Responses event stream: item ids
(`msg_`, `rs_`, `fc_`; function-call item ids are distinct from call ids),
`output_index`, `content_index`, `sequence_number` (contiguous from 0), every
item and response status, and the one terminal event.

It must not know about I/O, time or randomness: the clock and the id factory
are injected, chunks arrive as already-decoded dicts, events leave as plain
dicts (encoding them is the transport's job).  Calling it never raises for
odd backend data; a protocol failure is reported to it through `fail()`.

Life cycle:

    t = ResponseTranslator(skeleton, ids=..., clock=...)
    events = t.start()              # response.created, response.in_progress
    events += t.feed(chunk)         # any number of times
    events += t.finish()            # [DONE] or end of stream: the terminal event
    # or: events += t.fail(code, message)   -> error + response.failed

After the terminal event every call returns [] and `t.response` is final.

Two settings echoed in the skeleton are honoured here: `max_tool_calls`
(calls beyond it are dropped, as calls `tool_choice` does not allow are)
and `top_logprobs` (each token's alternatives are cut to that many).  A
chunk's `logprobs.content` goes, mapped to OpenAI's `LogProb`, into the
`response.output_text.delta` of its text, and all of a part's into its
`response.output_text.done`, the `output_text` part and the final response.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

import orjson

from ..errors import error_fields

__all__ = [
    "chunk_usage",
    "TERMINAL_EVENTS",
    "Round",
    "ResponseTranslator",
    "RoundCall",
    "cancel_recorded",
    "chunk_problem",
    "ends_with_terminal",
    "fail_recorded",
    "random_id",
    "sum_usage",
    "usage_from_chat",
]

Event = dict[str, Any]

# finish_reason -> incomplete reason; anything not listed completes normally.
_INCOMPLETE_REASONS = {"length": "max_output_tokens", "content_filter": "content_filter"}

_REASONING_EVENT_NAMES = {
    "openai": ("response.reasoning_text.delta", "response.reasoning_text.done"),
    "spec": ("response.reasoning.delta", "response.reasoning.done"),
}


@dataclass(frozen=True, slots=True)
class RoundCall:
    """A tool call the model made in one backend call."""

    item_id: str
    call_id: str
    name: str
    arguments: str
    server: str | None  # the gateway tool's server label; None for the client's own functions
    approval: bool = False  # an mcp_approval_request: not run until the client approves it


@dataclass(frozen=True, slots=True)
class Round:
    """What one backend call produced, for the tool loop: its calls and its message text."""

    calls: list[RoundCall]
    text: str


def chunk_usage(chunk: Mapping[str, Any]) -> Any:
    """A chunk's `usage`, with the prompt tokens the backend had cached as OpenAI reports them
    (`prompt_tokens_details.cached_tokens`): llama.cpp says so in its own `timings.cache_n`
    beside the usage when it does not fill the details."""
    usage = chunk.get("usage")
    timings = chunk.get("timings")
    if not usage or not isinstance(usage, Mapping) or not isinstance(timings, Mapping):
        return usage
    cached = timings.get("cache_n")
    details = usage.get("prompt_tokens_details")
    if not isinstance(cached, int) or isinstance(cached, bool) or cached <= 0:
        return usage
    if isinstance(details, Mapping) and _int(details.get("cached_tokens")):
        return usage
    return {**usage, "prompt_tokens_details": {**(details if isinstance(details, Mapping) else {}), "cached_tokens": cached}}


def sum_usage(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Chat usage objects added together (token counts and their details)."""
    if not isinstance(a, Mapping):
        return dict(b) if isinstance(b, Mapping) else None
    if not isinstance(b, Mapping):
        return dict(a)
    out: dict[str, Any] = {}
    for key in set(a) | set(b):
        x, y = a.get(key), b.get(key)
        if isinstance(x, Mapping) or isinstance(y, Mapping):
            out[key] = sum_usage(x if isinstance(x, Mapping) else None, y if isinstance(y, Mapping) else None)
        elif isinstance(x, int) or isinstance(y, int):
            out[key] = _int(x) + _int(y)
    return out


def _error_fields(code: str, message: str, type: str, param: str | None) -> dict[str, Any]:
    """The `error` event's payload.  The spec nests it under "error"; OpenAI's
    SDKs read the same fields at the top level.  Both are sent."""
    return {"error": {"type": type, "code": code, "message": message, "param": param}, "code": code, "message": message, "param": param}


def fail_recorded(response: dict[str, Any], events: list[Event], code: str, message: str) -> list[Event]:
    """`error` + `response.failed` for a response known only from its stored record.

    Used when the process that ran it is gone (a background response whose
    lease expired): `response` becomes failed, its output what the recorded
    events finished, and the returned events continue the recorded sequence.
    """
    done = [e for e in events if e.get("type") == "response.output_item.done"]
    done.sort(key=lambda e: e.get("output_index", 0))
    response.update(
        status="failed", error={"code": code, "message": message}, output=[e["item"] for e in done], completed_at=None
    )
    seq = events[-1]["sequence_number"] + 1 if events else 0
    return [
        {"type": "error", "sequence_number": seq, **_error_fields(code, message, "server_error", None)},
        {"type": "response.failed", "sequence_number": seq + 1, "response": dict(response)},
    ]


def cancel_recorded(response: dict[str, Any], events: list[Event]) -> list[Event]:
    """`error` (`response_cancelled`) + `response.failed` carrying the `cancelled` response, for a
    background response stopped by a cancel.

    Neither the spec nor OpenAI names an event for a cancelled stream; a
    follower still needs one that ends it, with the response as `GET` then
    returns it: `status: "cancelled"`, its output what the recorded events
    finished.
    """
    done = [e for e in events if e.get("type") == "response.output_item.done"]
    done.sort(key=lambda e: e.get("output_index", 0))
    response.update(status="cancelled", output=[e["item"] for e in done], completed_at=None)
    seq = events[-1]["sequence_number"] + 1 if events else 0
    message = "The response was cancelled."
    return [
        {"type": "error", "sequence_number": seq, **_error_fields("response_cancelled", message, "invalid_request_error", None)},
        {"type": "response.failed", "sequence_number": seq + 1, "response": dict(response)},
    ]


TERMINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})


def ends_with_terminal(events: list[Event]) -> bool:
    """Whether an event log ends as every stream must: with a terminal event."""
    return bool(events) and events[-1].get("type") in TERMINAL_EVENTS


def random_id(prefix: str) -> str:
    """The default id factory: `prefix_`, the Unix time in milliseconds (12 hex digits), then 32
    random hex digits (128 bits from the OS's CSPRNG).

    The time first, as OpenAI's own ids have it: ids made one after another sort one after
    another, so the store's indexes on them (a response's id, its items' ids) grow at their
    right edge instead of at a random page each.  With random ids alone a save dirtied a
    page of each index per record, and more of them the larger the store: the commit's WAL
    writes and the checkpoints grew with it (measured in docs/load-lab.md).  The id stays
    opaque to clients and as unguessable as before.
    """
    return f"{prefix}_{int(_wall_clock() * 1000):012x}{_random_hex()}"


_wall_clock = time.time


class _RandomHex:
    """32 random hex digits at a time, cut from one `os.urandom` read of 256 (a few responses'
    ids per system call instead of one each).  A child process forked with a part of the read
    left must not repeat it, so a fork forgets it."""

    def __init__(self) -> None:
        self._hex = ""
        self._at = 0

    def __call__(self) -> str:
        at = self._at
        if at >= len(self._hex):
            self._hex, at = os.urandom(_RANDOM_READ).hex(), 0
        self._at = at + 32
        return self._hex[at : at + 32]

    def forget(self) -> None:
        self._hex, self._at = "", 0


_RANDOM_READ = 256  # bytes: 16 ids
_random_hex = _RandomHex()
os.register_at_fork(after_in_child=_random_hex.forget)


def usage_from_chat(usage: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Map Chat Completions usage to the Responses `Usage` object."""
    if not isinstance(usage, Mapping):
        return None
    input_tokens = _int(usage.get("prompt_tokens"))
    output_tokens = _int(usage.get("completion_tokens"))
    total = usage.get("total_tokens")
    prompt_details = usage.get("prompt_tokens_details")
    completion_details = usage.get("completion_tokens_details")
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "total_tokens": _int(total) if total is not None else input_tokens + output_tokens,
        "input_tokens_details": {
            "cached_tokens": _int(prompt_details.get("cached_tokens")) if isinstance(prompt_details, Mapping) else 0
        },
        "output_tokens_details": {
            "reasoning_tokens": _int(completion_details.get("reasoning_tokens"))
            if isinstance(completion_details, Mapping)
            else 0
        },
    }


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def chunk_problem(chunk: Any) -> str | None:
    """What makes `chunk` something the Chat Completions protocol does not allow, or None.

    Only the fields the gateway reads are judged, and only by type: extra
    fields, missing ones and nulls are fine.  A backend's variations that
    clients meet in practice pass: `message` for `delta`, content as a list
    of text parts, tool-call arguments as a JSON object.
    """
    if type(chunk) is dict:
        # The common case first, in a few lookups: one choice whose delta
        # carries text and nothing else (what nearly every chunk of a stream is).
        choices = chunk.get("choices")
        if type(choices) is list and len(choices) == 1 and chunk.get("usage") is None:
            choice = choices[0]
            if type(choice) is dict and choice.get("finish_reason") is None:
                delta = choice.get("delta")
                if type(delta) is dict and type(delta.get("content")) is str and len(delta) <= 2:
                    if len(delta) == 1 or type(delta.get("role", "")) is str:
                        return None
    elif not isinstance(chunk, dict):
        return f"a chunk must be a JSON object, not {_kind(chunk)}"
    problem = _mistyped(chunk, "usage", dict) or _mistyped(chunk, "choices", list)
    if problem:
        return problem
    for choice in chunk.get("choices") or ():
        if not isinstance(choice, dict):
            return f"a choice must be an object, not {_kind(choice)}"
        problem = _mistyped(choice, "finish_reason", str)
        if problem:
            return problem
        delta = choice.get("delta")
        if delta is None:
            delta = choice.get("message")
        if delta is None:
            continue
        if not isinstance(delta, dict):
            return f"'delta' must be an object, not {_kind(delta)}"
        content = delta.get("content")
        if isinstance(content, list) and all(isinstance(part, dict) for part in content):
            content = None  # text parts
        problem = (
            _mistyped({"content": content}, "content", str, where="delta.")
            or _mistyped(delta, "reasoning_content", str, where="delta.")
            or _mistyped(delta, "refusal", str, where="delta.")
            or _mistyped(delta, "tool_calls", list, where="delta.")
            or next(filter(None, (_call_problem(call, "delta.tool_calls[]") for call in delta.get("tool_calls") or ())), None)
            or _function_problem(delta.get("function_call"), "delta.function_call")
        )
        if problem:
            return problem
    return None


def _call_problem(call: Any, where: str) -> str | None:
    if not isinstance(call, dict):
        return f"'{where}' must be an object, not {_kind(call)}"
    index = call.get("index")
    if isinstance(index, bool):
        return f"'{where}.index' must be an integer, not a boolean"
    return (
        _mistyped(call, "index", int, where=f"{where}.")
        or _mistyped(call, "id", str, where=f"{where}.")
        or _function_problem(call.get("function"), f"{where}.function")
    )


def _function_problem(function: Any, where: str) -> str | None:
    if function is None:
        return None
    if not isinstance(function, dict):
        return f"'{where}' must be an object, not {_kind(function)}"
    return _mistyped(function, "name", str, where=f"{where}.") or _mistyped(
        function, "arguments", (str, dict), where=f"{where}."
    )


_TYPE_NAMES = {dict: "an object", list: "a list", str: "a string", int: "an integer"}


def _mistyped(container: dict[str, Any], key: str, kinds: type | tuple[type, ...], *, where: str = "") -> str | None:
    """Why `container[key]` is neither null nor of `kinds`, or None."""
    value = container.get(key)
    if value is None or isinstance(value, kinds):
        return None
    first = kinds[0] if isinstance(kinds, tuple) else kinds
    return f"'{where}{key}' must be {_TYPE_NAMES[first]}, not {_kind(value)}"


def _kind(value: Any) -> str:
    """The JSON type of a decoded value, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"


def _parts_text(parts: list[dict[str, Any]]) -> str:
    """The text of content given as a list of parts (some backends stream it so)."""
    return "".join(
        part["text"] for part in parts if part.get("type") in ("text", "output_text") and isinstance(part.get("text"), str)
    )


def _logprobs(entries: Any, top: int | None) -> list[dict[str, Any]]:
    """Chat `logprobs.content` as Responses `LogProb`s, each with at most `top` alternatives.

    Log probabilities are extra data: an entry the gateway cannot read (no
    string token, no number) is left out rather than failing the response.
    """
    if not isinstance(entries, list):
        return []
    out: list[dict[str, Any]] = []
    for entry in entries:
        mapped = _logprob(entry)
        if mapped is None:
            continue
        alternatives = entry.get("top_logprobs")
        tops = [t for t in map(_logprob, alternatives) if t is not None] if isinstance(alternatives, list) else []
        mapped["top_logprobs"] = tops if top is None else tops[:top]
        out.append(mapped)
    return out


def _logprob(entry: Any) -> dict[str, Any] | None:
    """One chat token (`token`, `logprob`, `bytes`) as a `TopLogProb`, or None."""
    if not isinstance(entry, dict):
        return None
    token = entry.get("token")
    logprob = entry.get("logprob")
    if not isinstance(token, str) or isinstance(logprob, bool) or not isinstance(logprob, (int, float)):
        return None
    raw = entry.get("bytes")
    if isinstance(raw, list) and all(type(b) is int for b in raw):
        data = raw
    else:  # OpenAI sends null for a token without a byte form; the spec wants a list
        data = list(token.encode("utf-8", "surrogatepass"))
    return {"token": token, "logprob": logprob, "bytes": data}


class _Message:
    __slots__ = ("index", "id", "parts", "kind", "chunks", "logprobs")

    def __init__(self, index: int, item_id: str) -> None:
        self.index = index
        self.id = item_id
        self.parts: list[dict[str, Any]] = []  # finished content parts
        self.kind: str | None = None  # "output_text" | "refusal" while a part is open
        self.chunks: list[str] = []
        self.logprobs: list[dict[str, Any]] = []  # the open output_text part's


class _Reasoning:
    __slots__ = ("index", "id", "chunks", "signature")

    def __init__(self, index: int, item_id: str) -> None:
        self.index = index
        self.id = item_id
        self.chunks: list[str] = []
        self.signature: str | None = None  # a backend's proof of its thinking (Anthropic), kept sealed


class _Call:
    __slots__ = (
        "index", "id", "call_id", "backend_id", "name", "chunks", "pending", "suppressed", "kind", "server",
        "shown_name", "namespace",
    )

    def __init__(self, backend_id: str | None) -> None:
        self.index: int = -1  # output_index once the item is opened
        self.id: str = ""
        self.call_id: str = backend_id or ""
        self.backend_id: str | None = backend_id
        self.name: str = ""
        self.chunks: list[str] = []
        self.pending: list[str] = []  # argument fragments seen before the name
        self.suppressed: bool = False
        self.kind: _CallKind = FUNCTION_CALL  # decided when the item opens
        self.server: str | None = None  # the gateway tool's server label (mcp kinds)
        self.shown_name: str = ""  # the name the client knows (without the namespace)
        self.namespace: str | None = None


@dataclass(frozen=True, slots=True)
class _CallKind:
    """How one kind of tool call appears in the event stream, described once.

    `opened` and `done` give the item's fields after `id` and `type` (at
    `output_item.added`, and once finished with a status); `closing` the
    events (type, fields) sent when its arguments are complete.  A kind
    without `done` (an `mcp_call`) stays open until the gateway's tool has
    answered.  `delta_event` streams the arguments as they arrive; without
    one they are shown whole when complete.
    """

    item_type: str
    id_prefix: str
    delta_event: str | None
    opened: Callable[[_Call], dict[str, Any]]
    closing: Callable[[_Call, str], list[tuple[str, dict[str, Any]]]]
    done: Callable[[_Call, str, str], dict[str, Any]] | None
    needs_approval: bool = False

    def item(self, call: _Call, fields: dict[str, Any]) -> dict[str, Any]:
        item = {"id": call.id, "type": self.item_type, **fields}
        if call.namespace is not None:
            item["namespace"] = call.namespace
        return item


def _custom_closing(call: _Call, arguments: str) -> list[tuple[str, dict[str, Any]]]:
    text = _custom_input(arguments)
    delta = [("response.custom_tool_call_input.delta", {"delta": text})] if text else []
    return [*delta, ("response.custom_tool_call_input.done", {"input": text})]


FUNCTION_CALL = _CallKind(
    "function_call",
    "fc",
    "response.function_call_arguments.delta",
    opened=lambda c: {"status": "in_progress", "call_id": c.call_id, "name": c.shown_name, "arguments": ""},
    closing=lambda c, a: [("response.function_call_arguments.done", {"name": c.shown_name, "arguments": a})],
    done=lambda c, a, status: {"status": status, "call_id": c.call_id, "name": c.shown_name, "arguments": a},
)
CUSTOM_TOOL_CALL = _CallKind(  # a freeform tool: its input is a string inside the function's JSON
    "custom_tool_call",
    "ctc",
    None,
    opened=lambda c: {"status": "in_progress", "call_id": c.call_id, "name": c.shown_name, "input": ""},
    closing=_custom_closing,
    done=lambda c, a, status: {"status": status, "call_id": c.call_id, "name": c.shown_name, "input": _custom_input(a)},
)
MCP_CALL = _CallKind(
    "mcp_call",
    "mcp",
    "response.mcp_call_arguments.delta",
    opened=lambda c: {"server_label": c.server, "name": c.name, "arguments": "", "output": None, "error": None, "status": "in_progress"},
    closing=lambda c, a: [("response.mcp_call_arguments.done", {"arguments": a}), ("response.mcp_call.in_progress", {})],
    done=None,
)
WEB_SEARCH_CALL = _CallKind(  # the gateway's web search (`gateway.builtins`): searched, then completed
    "web_search_call",
    "ws",
    None,
    opened=lambda c: {"status": "in_progress", "action": {"type": c.name if c.name in ("open_page", "find_in_page") else "search"}},
    closing=lambda c, a: [("response.web_search_call.in_progress", {}), ("response.web_search_call.searching", {})],
    done=None,
)
MCP_APPROVAL_REQUEST = _CallKind(
    "mcp_approval_request",
    "mcpr",
    None,
    opened=lambda c: {"server_label": c.server, "name": c.name, "arguments": ""},
    closing=lambda c, a: [],
    done=lambda c, a, status: {"server_label": c.server, "name": c.name, "arguments": a},
    needs_approval=True,
)


class ResponseTranslator:
    """Translate one Chat Completions stream into one Responses event stream."""

    def __init__(
        self,
        response: dict[str, Any],
        *,
        ids: Callable[[str], str] = random_id,
        clock: Callable[[], float],
        reasoning_events: Literal["openai", "spec"] = "openai",
        allowed_tools: Iterable[str] | None = None,
        gateway_tools: Mapping[str, str] | None = None,
        input_tokens_estimate: int | Callable[[], int] = 0,
        tool_kinds: Mapping[str, Any] | None = None,
        seal_reasoning: Callable[[str], str] | None = None,
        seal_approval: Callable[[dict[str, Any]], str] | None = None,
        required_action: bool = False,
        seal_signed: Callable[[str, str], str] | None = None,
    ) -> None:
        """`response` is the `ResponseResource` skeleton (id, echoed settings).

        `required_action`: the opt-in protocol of clients that wait for
        `response.required_action` (TOOL_CALL_PROTOCOL=required_action): a
        response that ends with the client's function calls says so in that
        event, just before its terminal event, and in its `required_action`.

        `allowed_tools`: when given, calls to any other function are suppressed
        (tool_choice "none" passes an empty set, `allowed_tools` its subset).
        """
        self.response = response
        self._ids = ids
        self._clock = clock
        self._reasoning_delta, self._reasoning_done = _REASONING_EVENT_NAMES[reasoning_events]
        self._allowed = None if allowed_tools is None else frozenset(allowed_tools)
        # name -> server label: calls the gateway runs itself become mcp_call items.
        self._gateway_tools = dict(gateway_tools or {})
        self._approval: frozenset[str] = frozenset()
        self._builtins: dict[str, str] = {}  # name -> item type: the gateway's built-in tools (web_search_call)
        self._cited: dict[str, str] = {}  # url -> title: what the gateway's searches found, for url_citation annotations
        # chat function name -> the client's tool (kind "custom" or a namespaced "function")
        self._tool_kinds = dict(tool_kinds or {})
        self._seal_reasoning = seal_reasoning  # include: reasoning.encrypted_content
        # Seals reasoning that came with a signature (text, signature), whether or not the
        # client asked: a backend such as Anthropic takes its thinking back only signed.
        self._seal_signed = seal_signed
        # Seals an approval request, so that a client replaying it proves the gateway issued it.
        self._seal_approval = seal_approval
        self._required_action = required_action
        self._round_calls: list[RoundCall] = []
        self._pending_mcp: dict[str, tuple[int, dict[str, Any]]] = {}  # item id -> (index, mcp_call awaiting its result)
        self._round_text: list[str] = []  # the round's message text, for the next round's assistant message
        self._usage_total: dict[str, Any] | None = None
        # When the backend reports no usage, clients still get an estimate.
        self._input_estimate = input_tokens_estimate
        self._output_chars = 0
        self._seq = 0
        self._slots: list[dict[str, Any] | None] = []
        self._message: _Message | None = None
        self._reasoning: _Reasoning | None = None
        self._calls: dict[Any, _Call] = {}  # current call per backend index
        self._unopened: list[_Call] = []  # calls whose name may still be growing
        self._open_calls: list[_Call] = []
        self._finish_reason: str | None = None
        self._usage: Mapping[str, Any] | None = None
        self.suppressed_calls: list[str] = []
        # Settings the skeleton echoes that the event stream honours.
        max_calls = response.get("max_tool_calls")
        self._max_calls: int | None = max_calls if isinstance(max_calls, int) else None
        self._calls_made = 0
        top = response.get("top_logprobs")
        self._top_logprobs: int | None = top if isinstance(top, int) else None
        self._stray_logprobs: list[dict[str, Any]] = []  # came without text: they go with the next delta
        self.text_seen = False  # output text was produced
        self.logprobs_seen = False  # and log probabilities with it
        self.started = False
        self.done = False

    # ------------------------------------------------------------------ API

    @property
    def finish_reason(self) -> str | None:
        return self._finish_reason

    def start(self) -> list[Event]:
        """The opening events: `response.created` then `response.in_progress`."""
        if self.started:
            return []
        self.started = True
        self.response["status"] = "in_progress"
        return [
            self._event("response.created", response=self._snapshot()),
            self._event("response.in_progress", response=self._snapshot()),
        ]

    def feed(self, chunk: Any) -> list[Event]:
        """Events for one decoded Chat Completions chunk.

        A chunk the protocol does not allow (see `chunk_problem`) fails the
        response with `backend_error` naming what was wrong.
        """
        if self.done:
            return []
        delta_event = self._plain_text_delta(chunk)
        if delta_event is not None:
            return [delta_event]
        events = self.start() if not self.started else []
        problem = chunk_problem(chunk)
        if problem is not None:
            events += self.fail("backend_error", f"The backend sent an invalid chunk: {problem}.")
            return events
        error = chunk.get("error")
        if error is not None and not chunk.get("choices"):
            message, type_, code, _param = error_fields(chunk)
            events += self.fail(
                code or "backend_stream_error", message or "the backend reported an error", type=type_ or "server_error"
            )
            return events
        usage = chunk_usage(chunk)
        if usage:
            self._usage = usage
        choices = chunk.get("choices")
        if not choices:
            return events
        choice = choices[0]
        delta = choice.get("delta") or choice.get("message")
        if delta:
            reasoning = delta.get("reasoning_content")
            if reasoning is None:
                reasoning = delta.get("reasoning")
            if isinstance(reasoning, str) and reasoning:
                self._on_reasoning(reasoning, events)
            signature = delta.get("reasoning_signature")
            if isinstance(signature, str) and signature and self._reasoning is not None:
                self._reasoning.signature = (self._reasoning.signature or "") + signature
            content = delta.get("content")
            if content and not isinstance(content, str):
                content = _parts_text(content)
            logprobs = choice.get("logprobs")
            tokens = _logprobs(logprobs.get("content"), self._top_logprobs) if isinstance(logprobs, dict) else []
            if content:
                self._on_text("output_text", content, events, tokens)
            elif tokens:
                self._stray_logprobs += tokens
            refusal = delta.get("refusal")
            if refusal:
                self._on_text("refusal", refusal, events)
            tool_calls = delta.get("tool_calls")
            if tool_calls:
                for call in tool_calls:
                    self._on_tool_call(call, events)
            function_call = delta.get("function_call")
            if function_call:
                self._on_tool_call({"index": "legacy", "function": function_call}, events)
        finish_reason = choice.get("finish_reason")
        if finish_reason:
            self._finish_reason = finish_reason
        return events

    def _plain_text_delta(self, chunk: Any) -> Event | None:
        """The event for a chunk that only adds text to the open text part, or None.

        Nearly every chunk of a stream is one: the same event `feed` makes
        through `chunk_problem` and `_on_text`, in a few lookups.
        """
        message = self._message
        if (
            message is None
            or message.kind != "output_text"
            or self._reasoning is not None
            or type(chunk) is not dict
            or self._stray_logprobs
        ):
            return None
        choices = chunk.get("choices")
        if type(choices) is not list or len(choices) != 1 or chunk.get("usage") is not None:
            return None
        choice = choices[0]
        if type(choice) is not dict or choice.get("finish_reason") is not None or choice.get("logprobs") is not None:
            return None
        delta = choice.get("delta")
        if type(delta) is not dict or not (len(delta) == 1 or (len(delta) == 2 and type(delta.get("role")) is str)):
            return None
        text = delta.get("content")
        if type(text) is not str or not text:
            return None
        message.chunks.append(text)
        self._output_chars += len(text)
        seq = self._seq
        self._seq = seq + 1
        return {
            "type": "response.output_text.delta",
            "sequence_number": seq,
            "item_id": message.id,
            "output_index": message.index,
            "content_index": len(message.parts),
            "delta": text,
            "logprobs": [],
        }

    def finish(self, *, incomplete_reason: str | None = None) -> list[Event]:
        """The backend's stream is over ([DONE], or ended after a finish_reason).

        `incomplete_reason` ends the response as incomplete whatever the
        backend said (the tool loop uses it when it runs out of rounds).
        """
        if self.done:
            return []
        events = self.start() if not self.started else []
        reason = incomplete_reason or _INCOMPLETE_REASONS.get(self._finish_reason or "")
        self._fail_pending_mcp("the response ended before the tool call finished", events)
        item_status = "incomplete" if reason else "completed"
        self._close_all(item_status, events)
        response = self.response
        response["output"] = self._final_output()
        response["usage"] = usage_from_chat(self._total_usage())
        if reason:
            response["status"] = "incomplete"
            response["incomplete_details"] = {"reason": reason}
            events.append(self._event("response.incomplete", response=self._snapshot()))
        else:
            response["status"] = "completed"
            response["completed_at"] = int(self._clock())
            if self._required_action:
                events += self._required_action_events()
            events.append(self._event("response.completed", response=self._snapshot()))
        self.done = True
        return events

    def _required_action_events(self) -> list[Event]:
        calls = [item for item in self.response["output"] if item.get("type") == "function_call"]
        if not calls:
            return []
        action = {
            "type": "submit_tool_outputs",
            "submit_tool_outputs": {
                "tool_calls": [
                    {"id": c["call_id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                    for c in calls
                ]
            },
        }
        self.response["required_action"] = action
        summary = {key: self.response.get(key) for key in ("id", "object", "created_at", "status", "model")}
        return [self._event("response.required_action", response=summary, required_action=action)]

    def fail(self, code: str, message: str, *, type: str = "server_error", param: str | None = None) -> list[Event]:
        """End with an `error` event and `response.failed`; open items become incomplete."""
        if self.done:
            return []
        events = self.start() if not self.started else []
        self._close_all("incomplete", events)
        self._fail_pending_mcp("the response failed before the tool call finished", events)
        response = self.response
        response["output"] = self._final_output()
        response["usage"] = usage_from_chat(self._total_usage())
        events += self._failure(code, message, type=type, param=param)
        self.done = True
        return events

    def retract_terminal(self, code: str, message: str, *, type: str = "server_error") -> list[Event]:
        """Replace the terminal event just returned, which was never sent, by a failure.

        For a response that ended but could not be stored: the caller held
        its terminal event back, and sends `error` + `response.failed` in its
        place (same sequence number onwards, output and usage kept).
        """
        if not self.done or self.response.get("status") == "failed":
            return []
        self._seq -= 1  # the withheld event's number is given to the failure
        response = self.response
        response["completed_at"] = None
        response["incomplete_details"] = None
        return self._failure(code, message, type=type)

    def _failure(self, code: str, message: str, *, type: str = "server_error", param: str | None = None) -> list[Event]:
        self.response["status"] = "failed"
        self.response["error"] = {"code": code, "message": message}
        return [
            self._event("error", **_error_fields(code, message, type, param)),
            self._event("response.failed", response=self._snapshot()),
        ]

    # ------------------------------------------------------------ mcp tools

    def set_gateway_tools(
        self, routes: Mapping[str, str], approval: Iterable[str] = (), builtins: Mapping[str, str] | None = None
    ) -> None:
        """Which names the gateway runs (name -> server label), which of them need approval
        first, and which are its built-in tools (name -> the item type their calls show as)."""
        self._gateway_tools = dict(routes)
        self._approval = frozenset(approval)
        self._builtins = dict(builtins or {})

    def list_tools(self, server_label: str, tools: list[dict[str, Any]], error: str | None = None) -> list[Event]:
        """An `mcp_list_tools` item: the tools a hosted MCP server offers (or why it could not say)."""
        events = self.start() if not self.started else []
        index = self._new_slot()
        item: dict[str, Any] = {"id": self._ids("mcpl"), "type": "mcp_list_tools", "server_label": server_label, "tools": []}
        events.append(self._event("response.output_item.added", output_index=index, item=dict(item)))
        common = {"item_id": item["id"], "output_index": index}
        events.append(self._event("response.mcp_list_tools.in_progress", **common))
        if error is None:
            item["tools"] = tools
            events.append(self._event("response.mcp_list_tools.completed", **common))
        else:
            item["error"] = error
            events.append(self._event("response.mcp_list_tools.failed", **common))
        self._item_done(index, item, events)
        return events

    def add_item(self, item: dict[str, Any], usage: Mapping[str, Any] | None = None) -> list[Event]:
        """An item the gateway made whole (a turn's own `compaction`): added and done at once;
        `usage`, what the backend spent making it, counts in the response's."""
        if usage:
            self._usage_total = sum_usage(self._usage_total, usage)
        events = self.start() if not self.started else []
        index = self._new_slot()
        events.append(self._event("response.output_item.added", output_index=index, item=_copy_item(item)))
        self._item_done(index, item, events)
        return events

    def record_mcp_call(
        self,
        server_label: str,
        name: str,
        arguments: str,
        *,
        output: str | None,
        error: str | None,
        approval_request_id: str | None = None,
    ) -> list[Event]:
        """A gateway tool call made outside a backend round (an approved request): the whole item at once."""
        events = self.start() if not self.started else []
        self._calls_made += 1
        call = _Call(None)
        call.kind, call.server, call.name = MCP_CALL, server_label, name
        call.index, call.id = self._new_slot(), self._ids(MCP_CALL.id_prefix)
        item = MCP_CALL.item(call, {**MCP_CALL.opened(call), "arguments": arguments})
        if approval_request_id is not None:
            item["approval_request_id"] = approval_request_id
        events.append(self._event("response.output_item.added", output_index=call.index, item=dict(item)))
        for event_type, fields in MCP_CALL.closing(call, arguments):
            events.append(self._event(event_type, item_id=call.id, output_index=call.index, **fields))
        self._pending_mcp[call.id] = (call.index, item)
        return events + self.complete_mcp_call(call.id, output=output, error=error)

    # --------------------------------------------------------------- rounds

    def end_round(self) -> tuple[list[Event], Round]:
        """Close this backend call's items without ending the response.

        Returns the closing events and what the round produced: the calls
        the model made (in output order) and its message text.  Calls to
        gateway tools stay open (as `mcp_call` items in progress) until
        `complete_mcp_call`.
        """
        if self.done:
            return [], Round([], "")
        events = self.start() if not self.started else []
        self._close_all("completed", events)
        calls, self._round_calls = self._round_calls, []
        text, self._round_text = "".join(self._round_text), []
        self._add_round_usage()
        self._finish_reason = None
        return events, Round(calls, text)

    def gateway_calls_open(self) -> bool:
        """Whether the round so far has calls the gateway would run (not awaiting approval)."""
        return any(
            self._gateway_tools.get(c.name) is not None and c.name not in self._approval and not c.suppressed
            for c in (*self._open_calls, *self._unopened)
        )

    def complete_mcp_call(
        self, item_id: str, *, output: str | None = None, error: str | None = None, detail: Mapping[str, Any] | None = None
    ) -> list[Event]:
        """The result of a gateway tool call: `mcp_call.completed` or `.failed`, then the item is
        done; a built-in tool's item takes its `detail` (`web_search_call.completed`)."""
        pending = self._pending_mcp.pop(item_id, None)
        if pending is None or self.done:
            return []
        index, item = pending
        if item["type"] == WEB_SEARCH_CALL.item_type:
            shown = dict(detail or {"status": "failed" if error is not None else "completed"})
            for source in shown.pop("cite", ()):  # (what the model may cite; not part of the item)
                self._cited.setdefault(source["url"], source.get("title") or source["url"])
            item.update(shown)
            events = [self._event("response.web_search_call.completed", item_id=item_id, output_index=index)]
            self._item_done(index, item, events)
            return events
        failed = error is not None
        item.update(output=output, error=error, status="failed" if failed else "completed")
        kind = "response.mcp_call.failed" if failed else "response.mcp_call.completed"
        events = [self._event(kind, item_id=item_id, output_index=index)]
        self._item_done(index, item, events)
        return events

    def _fail_pending_mcp(self, message: str, events: list[Event]) -> None:
        for item_id in list(self._pending_mcp):
            events += self.complete_mcp_call(item_id, error=message)

    def _add_round_usage(self) -> None:
        self._usage_total = sum_usage(self._usage_total, self._usage)
        self._usage = None

    def _total_usage(self) -> Mapping[str, Any] | None:
        total = sum_usage(self._usage_total, self._usage)
        if total is not None:
            return total
        output = -(-self._output_chars // 4)  # about four characters a token
        estimate = self._input_estimate
        prompt = estimate() if callable(estimate) else estimate  # only now: most backends report usage
        return {"prompt_tokens": prompt, "completion_tokens": output, "total_tokens": prompt + output}

    # ------------------------------------------------------------ internals

    def ping(self, emitted: int) -> Event | None:
        """A `ping` event with the next sequence number (the required_action protocol's
        keep-alive), or None while events numbered before it are still on their way
        (`emitted`: how many have been handed on) or before the response has started."""
        if not self.started or self.done or emitted != self._seq:
            return None
        return self._event("ping")

    def _event(self, type_: str, **fields: Any) -> Event:
        event = {"type": type_, "sequence_number": self._seq}
        event.update(fields)
        self._seq += 1
        return event

    def _snapshot(self) -> dict[str, Any]:
        snapshot = dict(self.response)
        snapshot["output"] = list(snapshot.get("output") or ())
        return snapshot

    def _item_done(self, index: int, item: dict[str, Any], events: list[Event]) -> None:
        """The item is final: it takes its output slot and `output_item.done` carries a copy."""
        self._slots[index] = item
        events.append(self._event("response.output_item.done", output_index=index, item=_copy_item(item)))

    def _new_slot(self) -> int:
        self._slots.append(None)
        return len(self._slots) - 1

    def _final_output(self) -> list[dict[str, Any]]:
        return [item for item in self._slots if item is not None]

    # reasoning ---------------------------------------------------------

    def _on_reasoning(self, text: str, events: list[Event]) -> None:
        item = self._reasoning
        if item is None:
            self._open_pending(events)
            self._close_message("completed", events)
            item = self._reasoning = _Reasoning(self._new_slot(), self._ids("rs"))
            events.append(
                self._event(
                    "response.output_item.added",
                    output_index=item.index,
                    item={"id": item.id, "type": "reasoning", "summary": [], "content": []},
                )
            )
            events.append(
                self._event(
                    "response.content_part.added",
                    item_id=item.id,
                    output_index=item.index,
                    content_index=0,
                    part={"type": "reasoning_text", "text": ""},
                )
            )
        item.chunks.append(text)
        self._output_chars += len(text)
        events.append(
            self._event(
                self._reasoning_delta, item_id=item.id, output_index=item.index, content_index=0, delta=text
            )
        )

    def _close_reasoning(self, events: list[Event]) -> None:
        item = self._reasoning
        if item is None:
            return
        self._reasoning = None
        text = "".join(item.chunks)
        part = {"type": "reasoning_text", "text": text}
        events.append(
            self._event(self._reasoning_done, item_id=item.id, output_index=item.index, content_index=0, text=text)
        )
        events.append(
            self._event(
                "response.content_part.done", item_id=item.id, output_index=item.index, content_index=0, part=part
            )
        )
        done: dict[str, Any] = {"id": item.id, "type": "reasoning", "summary": [], "content": [part]}
        if item.signature and self._seal_signed is not None:
            done["encrypted_content"] = self._seal_signed(text, item.signature)
        elif self._seal_reasoning is not None:
            done["encrypted_content"] = self._seal_reasoning(text)
        self._item_done(item.index, done, events)

    # message text and refusal -------------------------------------------

    def _on_text(self, kind: str, text: str, events: list[Event], logprobs: list[dict[str, Any]] | None = None) -> None:
        self._close_reasoning(events)
        message = self._message
        if message is None:
            self._open_pending(events)
            message = self._message = _Message(self._new_slot(), self._ids("msg"))
            events.append(
                self._event(
                    "response.output_item.added",
                    output_index=message.index,
                    item={
                        "id": message.id,
                        "type": "message",
                        "status": "in_progress",
                        "role": "assistant",
                        "content": [],
                    },
                )
            )
        if message.kind != kind:
            self._close_part(message, events)
            message.kind = kind
            events.append(
                self._event(
                    "response.content_part.added",
                    item_id=message.id,
                    output_index=message.index,
                    content_index=len(message.parts),
                    part=_part(kind, ""),
                )
            )
        message.chunks.append(text)
        self._output_chars += len(text)
        if kind == "output_text":
            self.text_seen = True
            if self._stray_logprobs:
                logprobs = [*self._stray_logprobs, *(logprobs or ())]
                self._stray_logprobs = []
            if logprobs:
                self.logprobs_seen = True
                message.logprobs += logprobs
            events.append(
                self._event(
                    "response.output_text.delta",
                    item_id=message.id,
                    output_index=message.index,
                    content_index=len(message.parts),
                    delta=text,
                    logprobs=logprobs or [],
                )
            )
        else:
            events.append(
                self._event(
                    "response.refusal.delta",
                    item_id=message.id,
                    output_index=message.index,
                    content_index=len(message.parts),
                    delta=text,
                )
            )

    def _close_part(self, message: _Message, events: list[Event]) -> None:
        kind = message.kind
        if kind is None:
            return
        text = "".join(message.chunks)
        index = len(message.parts)
        common = {"item_id": message.id, "output_index": message.index, "content_index": index}
        logprobs = message.logprobs
        annotations = url_citations(text, self._cited) if kind == "output_text" and self._cited else []
        for n, annotation in enumerate(annotations):
            events.append(self._event("response.output_text.annotation.added", **common, annotation_index=n, annotation=dict(annotation)))
        if kind == "output_text":
            self._round_text.append(text)
            events.append(self._event("response.output_text.done", **common, text=text, logprobs=list(logprobs)))
        else:
            events.append(self._event("response.refusal.done", **common, refusal=text))
        part = _part(kind, text, logprobs)
        if annotations:
            part["annotations"] = annotations
        events.append(self._event("response.content_part.done", **common, part=_copy_part(part)))
        message.parts.append(part)
        message.kind = None
        message.chunks = []
        message.logprobs = []

    def _close_message(self, status: str, events: list[Event]) -> None:
        message = self._message
        if message is None:
            return
        self._message = None
        self._close_part(message, events)
        done = {
            "id": message.id,
            "type": "message",
            "status": status,
            "role": "assistant",
            "content": message.parts,
        }
        self._item_done(message.index, done, events)

    # tool calls ---------------------------------------------------------

    def _on_tool_call(self, delta: dict[str, Any], events: list[Event]) -> None:
        key = delta.get("index", 0)
        backend_id = delta.get("id") or None
        function = delta.get("function")
        if not isinstance(function, dict):
            function = {}
        call = self._calls.get(key)
        if call is None or (backend_id is not None and call.backend_id is not None and backend_id != call.backend_id):
            # A new call (a backend that puts every call at index 0 is told
            # apart by the call id): the names of earlier calls are complete.
            self._open_pending(events)
            call = self._calls[key] = _Call(backend_id)
            self._unopened.append(call)
        elif backend_id is not None and call.backend_id is None:
            call.backend_id = backend_id
            if call.index < 0:  # once announced, the call id never changes
                call.call_id = backend_id
        name = function.get("name")
        arguments = function.get("arguments")
        if not isinstance(arguments, str):
            arguments = "" if arguments is None else _json_text(arguments)
        if call.suppressed:
            return
        if call.index < 0:
            # The item opens once its name is complete: when its arguments
            # begin, or when anything else follows.
            if isinstance(name, str):
                call.name += name
            if arguments:
                call.pending.append(arguments)
            if call.name and call.pending:
                self._open_call(call, events)
            return
        if arguments:
            self._append_arguments(call, arguments, events)

    def _append_arguments(self, call: _Call, arguments: str, events: list[Event]) -> None:
        call.chunks.append(arguments)
        self._output_chars += len(arguments)
        if call.kind.delta_event is not None:
            events.append(self._event(call.kind.delta_event, item_id=call.id, output_index=call.index, delta=arguments))

    def _open_pending(self, events: list[Event], status: str = "completed") -> None:
        for call in self._unopened[:]:
            if call.name:
                self._open_call(call, events, status)

    def _open_call(self, call: _Call, events: list[Event], status: str = "completed") -> None:
        self._unopened.remove(call)
        over_limit = self._max_calls is not None and self._calls_made >= self._max_calls
        if over_limit or (self._allowed is not None and call.name not in self._allowed):
            call.suppressed = True
            self.suppressed_calls.append(call.name)
            return
        self._calls_made += 1
        self._close_reasoning(events)
        self._close_message(status, events)
        call.index = self._new_slot()
        call.server = self._gateway_tools.get(call.name)
        client_tool = self._tool_kinds.get(call.name) if call.server is None else None
        if call.server is not None and call.name in self._builtins:
            call.kind = WEB_SEARCH_CALL
        elif call.server is not None:
            call.kind = MCP_APPROVAL_REQUEST if call.name in self._approval else MCP_CALL
        elif client_tool is not None and client_tool.kind == "custom":
            call.kind = CUSTOM_TOOL_CALL
        call.shown_name = client_tool.name if client_tool is not None else call.name
        call.namespace = client_tool.namespace if client_tool is not None else None
        call.id = self._ids(call.kind.id_prefix)
        if not call.call_id:
            call.call_id = self._ids("call")
        self._open_calls.append(call)
        item = call.kind.item(call, call.kind.opened(call))
        events.append(self._event("response.output_item.added", output_index=call.index, item=item))
        if call.pending:
            arguments = "".join(call.pending)
            call.pending = []
            self._append_arguments(call, arguments, events)

    def _close_call(self, call: _Call, status: str, events: list[Event]) -> None:
        kind = call.kind
        arguments = "".join(call.chunks)
        self._round_calls.append(
            RoundCall(
                item_id=call.id,
                call_id=call.call_id,
                name=call.name,
                arguments=arguments,
                server=call.server,
                approval=kind.needs_approval,
            )
        )
        common = {"item_id": call.id, "output_index": call.index}
        for event_type, fields in kind.closing(call, arguments):
            events.append(self._event(event_type, **common, **fields))
        if kind.done is None:
            # Arguments are complete; the item stays open until the gateway's tool answers.
            pending = kind.item(call, kind.opened(call))
            if kind is MCP_CALL:
                pending["arguments"] = arguments
            self._pending_mcp[call.id] = (call.index, pending)
            return
        item = kind.item(call, kind.done(call, arguments, status))
        if kind.needs_approval and self._seal_approval is not None:
            item["encrypted_content"] = self._seal_approval(item)
        self._item_done(call.index, item, events)

    def _close_all(self, status: str, events: list[Event]) -> None:
        """Close whatever is open, in output order."""
        self._open_pending(events, status)
        self._unopened = []  # calls that never got a name cannot be reported
        closers: list[tuple[int, Callable[[], None]]] = []
        if self._reasoning is not None:  # interrupted reasoning still carries its text
            closers.append((self._reasoning.index, lambda: self._close_reasoning(events)))
        if self._message is not None:
            closers.append((self._message.index, lambda: self._close_message(status, events)))
        for call in self._open_calls:
            closers.append((call.index, functools.partial(self._close_call, call, status, events)))
        for _, close in sorted(closers, key=lambda pair: pair[0]):
            close()
        self._open_calls = []
        self._calls = {}


def url_citations(text: str, sources: Mapping[str, str]) -> list[dict[str, Any]]:
    """A `url_citation` for each place `text` writes the URL of a source the gateway's searches
    found (`sources`: url -> title), in order; `text[start_index:end_index]` is the URL."""
    found: list[dict[str, Any]] = []
    for url, title in sources.items():
        start = text.find(url)
        while start != -1:
            end = start + len(url)
            if end == len(text) or not (text[end].isalnum() or text[end] in "/-_~%?#=&+"):  # (not a longer URL's head)
                found.append({"type": "url_citation", "url": url, "title": title, "start_index": start, "end_index": end})
            start = text.find(url, end)
    return sorted(found, key=lambda a: a["start_index"])


def _part(kind: str, text: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    if kind == "output_text":
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}
    return {"type": "refusal", "refusal": text}


def _copy_part(part: dict[str, Any]) -> dict[str, Any]:
    copy = dict(part)
    if copy.get("logprobs"):
        copy["logprobs"] = list(copy["logprobs"])  # the entries themselves are never changed
    return copy


def _copy_item(item: dict[str, Any]) -> dict[str, Any]:
    copy = dict(item)
    if "content" in copy:
        copy["content"] = [_copy_part(part) for part in copy["content"]]
    return copy


def _custom_input(arguments: str) -> str:
    """A custom tool's raw input: the `input` string the model put in its JSON, or the text itself."""
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return arguments
    if isinstance(value, dict) and isinstance(value.get("input"), str):
        return str(value["input"])
    return arguments


def _json_text(value: Any) -> str:
    return orjson.dumps(value).decode()
