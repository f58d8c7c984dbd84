"""Anthropic Messages events from the turn's chat chunks (pure): the `/v1/messages` stream.

    MessagesEvents    chat chunks (as a `ChatSession` lets the client see them)
                      in, Messages stream events out: `message_start`, then per
                      content block `content_block_start`, its deltas
                      (`text_delta`, `thinking_delta`, `signature_delta`,
                      `input_json_delta`) and `content_block_stop`, then
                      `message_delta` (stop reason, usage) and `message_stop`;
                      or, from any point, one `error` event and nothing more
    MessagesSession   the round protocol the turn engine drives (`run_rounds`):
                      a `ChatSession` (the gateway's tool loop, hidden from the
                      client) whose chunks go through `MessagesEvents`
    collect_message   the `message` object a stream's events add up to (a
                      request that did not stream; `MessageCollector` event by
                      event, for a session that keeps its answer)

`MessagesEvents` alone owns the message id, block indexes, tool-use ids
(`toolu_…`), stop reasons and usage.  Keep-alive `ping`s are the transport's.
No I/O, no clock: ids come from the factory it is given.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import anthropic_error_body
from .chat import ChatSession
from .translator import RoundCall, chunk_usage

__all__ = ["MessageCollector", "MessagesEvents", "MessagesSession", "STOP_REASONS", "collect_message"]

Event = dict[str, Any]

# A chat finish reason as a Messages stop reason.
STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}


class MessagesEvents:
    """One message's events, chunk by chunk (see the module docstring)."""

    def __init__(self, message_id: str, model: str, ids: Callable[[str], str]) -> None:
        self.id = message_id
        self.model = model
        self._ids = ids
        self._blocks = 0  # content blocks started
        self._open: str | None = None  # the open block's kind: text, thinking, tool_use
        self._tools: dict[int, int] = {}  # the chunks' tool call index -> its block's index
        self._stop_reason: str | None = None
        self._refused = False
        self._stop_sequence: str | None = None
        self._usage: Mapping[str, Any] | None = None
        self.started = False
        self.over = False  # message_stop or error sent: nothing more
        self.failed = False
        # `context_management.applied_edits` for `message_delta` (None: the request asked for none).
        self.applied_edits: list[dict[str, Any]] | None = None
        self.web_search_requests = 0  # the gateway's searches, as `usage.server_tool_use` counts them
        self.web_fetch_requests = 0  # and its page fetches
        # What the gateway's searches found, for `citations` (url -> the citation's fields), and the open
        # text block's text (kept only once there is something to cite).
        self._citable: dict[str, dict[str, Any]] = {}
        self._text: list[str] = []

    def start(self) -> list[Event]:
        """`message_start` (once; every other method starts with it when it has not been sent)."""
        if self.started:
            return []
        self.started = True
        message: dict[str, Any] = {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        return [{"type": "message_start", "message": message}]

    def feed(self, chunk: Mapping[str, Any]) -> list[Event]:
        """The events of one chat chunk (an `{"error": ...}` chunk is the session's: see `fail`)."""
        if self.over:
            return []
        events = self.start()
        usage = chunk_usage(chunk)
        if usage:
            self._usage = usage
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            thinking = delta.get("reasoning_content")
            if thinking:
                events += self._into("thinking", {"type": "thinking", "thinking": "", "signature": ""})
                events.append(self._delta({"type": "thinking_delta", "thinking": thinking}))
            signature = delta.get("reasoning_signature")
            if signature and self._open == "thinking":
                events.append(self._delta({"type": "signature_delta", "signature": signature}))
            text = delta.get("content")
            refusal = delta.get("refusal")
            if refusal:  # a model's refusal is its text, and the message's stop reason
                text, self._refused = refusal, True
            if text:
                events += self._into("text", {"type": "text", "text": ""})
                events.append(self._delta({"type": "text_delta", "text": text}))
                if self._citable:
                    self._text.append(text)
            for call in delta.get("tool_calls") or ():
                events += self._tool(call)
            finish = choice.get("finish_reason")
            if finish:
                self._stop_reason = "refusal" if self._refused and finish == "stop" else STOP_REASONS.get(finish, "end_turn")
                stopped_by = choice.get("stop_reason")  # the stop string that ended it, where the backend says
                if finish == "stop" and isinstance(stopped_by, str) and not self._refused:
                    self._stop_reason, self._stop_sequence = "stop_sequence", stopped_by
        return events

    def finish(self) -> list[Event]:
        """The message is complete: its open block closed, `message_delta` and `message_stop`."""
        if self.over:
            return []
        events = self.start() + self._close()
        self.over = True
        usage = self._usage or {}
        details = usage.get("prompt_tokens_details") or {}
        cached = _count(details.get("cached_tokens"))
        created = _count(details.get("cache_creation_tokens"))
        shown: dict[str, int] = {
            "input_tokens": max(0, _count(usage.get("prompt_tokens")) - cached - created),
            "output_tokens": _count(usage.get("completion_tokens")),
            "cache_read_input_tokens": cached,
            "cache_creation_input_tokens": created,
        }
        if self.web_search_requests or self.web_fetch_requests:
            server = {"web_search_requests": self.web_search_requests}
            if self.web_fetch_requests:
                server["web_fetch_requests"] = self.web_fetch_requests
            shown["server_tool_use"] = server  # type: ignore[assignment]
        delta = {"stop_reason": self._stop_reason or "end_turn", "stop_sequence": self._stop_sequence}
        last: Event = {"type": "message_delta", "delta": delta, "usage": shown}
        if self.applied_edits is not None:
            last["context_management"] = {"applied_edits": self.applied_edits}
        return events + [last, {"type": "message_stop"}]

    def fail(self, status: int, message: str) -> list[Event]:
        """The message cannot be completed: one `error` event (Anthropic's shape) ends the stream."""
        if self.over:
            return []
        self.over = self.failed = True
        return [anthropic_error_body(status, message)]

    def server_tool_use(self, block_id: str, name: str, arguments: str) -> list[Event]:
        """A server tool the gateway runs (its web search): a `server_tool_use` block, its input
        streamed as one `input_json_delta`."""
        if self.over:
            return []
        events = self.start() + self._close()
        events += self._begin("server_tool_use", {"type": "server_tool_use", "id": block_id, "name": name, "input": {}})
        if arguments:
            events.append(self._delta({"type": "input_json_delta", "partial_json": arguments}))
        return events + self._close()

    def server_tool_result(self, block: dict[str, Any], citable: Sequence[Mapping[str, Any]] = ()) -> list[Event]:
        """What a server tool found (`web_search_tool_result`): one block, whole; `citable`, the
        `web_search_result_location`s the answer's text may cite (a text block that writes a
        result's URL gets its citation)."""
        if self.over:
            return []
        for citation in citable:
            self._citable.setdefault(citation["url"], dict(citation))
        if block.get("type") == "web_search_tool_result":
            self.web_search_requests += 1
        elif block.get("type") == "web_fetch_tool_result":
            self.web_fetch_requests += 1
        events = self.start() + self._close()
        return events + self._begin(str(block["type"]), block) + self._close()

    # --- blocks ---------------------------------------------------------------------

    def _into(self, kind: str, block: dict[str, Any]) -> list[Event]:
        """Make sure a block of `kind` is open (closing another), for a delta of that kind."""
        if self._open == kind:
            return []
        return self._close() + self._begin(kind, block)

    def _begin(self, kind: str, block: dict[str, Any]) -> list[Event]:
        self._open = kind
        self._blocks += 1
        return [{"type": "content_block_start", "index": self._blocks - 1, "content_block": block}]

    def _close(self) -> list[Event]:
        if self._open is None:
            return []
        events: list[Event] = []
        if self._open == "text" and self._text:
            text, self._text = "".join(self._text), []
            for url, citation in self._citable.items():
                if url in text:
                    events.append(self._delta({"type": "citations_delta", "citation": dict(citation)}))
        self._open = None
        return events + [{"type": "content_block_stop", "index": self._blocks - 1}]

    def _delta(self, delta: dict[str, Any], index: int | None = None) -> Event:
        return {"type": "content_block_delta", "index": self._blocks - 1 if index is None else index, "delta": delta}

    def _tool(self, call: Mapping[str, Any]) -> list[Event]:
        """A tool call's chunk: its first starts a `tool_use` block (the whole call so far, as
        the session forwards it), later ones add to its input."""
        position = call.get("index", 0)
        function = call.get("function") or {}
        arguments = function.get("arguments") or ""
        index = self._tools.get(position)
        events: list[Event] = []
        if index is None:
            events += self._close()
            raw_id = call.get("id") or ""
            tool_id = raw_id if raw_id.startswith("toolu_") else self._ids("toolu")
            block: dict[str, Any] = {"type": "tool_use", "id": tool_id, "name": function.get("name") or "", "input": {}}
            events += self._begin("tool_use", block)
            index = self._tools[position] = self._blocks - 1
        if arguments:
            # A backend that interleaves its calls' arguments is rare; such a delta still names its block.
            events.append(self._delta({"type": "input_json_delta", "partial_json": arguments}, index))
        return events


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


class MessagesSession:
    """The turn engine's session for `/v1/messages`: a `ChatSession` whose chunks become events.

    The chat session runs the rounds (the gateway's tools hidden, the
    client's calls numbered across rounds, usage summed, one finish); each
    method hands its chunks to `MessagesEvents`.  `native` (the request in
    the client's own API, for a backend that speaks it) goes with the first
    round only, while the chat request is still the client's.
    """

    def __init__(
        self,
        body: dict[str, Any],
        gateway_tools: set[str],
        *,
        max_rounds: int,
        message_id: str,
        model: str,
        ids: Callable[[str], str],
        native: Any = None,
        collect: bool = False,
        server_tools: set[str] | None = None,
    ) -> None:
        self.chat = ChatSession(body, gateway_tools, max_rounds=max_rounds)
        self.events = MessagesEvents(message_id, model, ids)
        self.native = native
        # The gateway's tools the client sees as Anthropic's server tools (web_search): name -> shown.
        self._server_tools = set(server_tools or ())
        self._server_ids: dict[str, str] = {}  # a call's item id -> its server_tool_use block's id
        self._ids = ids
        # The answer as a `message`, kept as it is made (`collect`: for a thread to store).
        self.answer = MessageCollector() if collect else None

    # The chat session's state, as the engine and the shell read it.
    @property
    def request(self) -> dict[str, Any]:
        return self.chat.request

    @property
    def calls(self) -> list[RoundCall]:
        return self.chat.calls

    @property
    def done(self) -> bool:
        return self.chat.done

    @property
    def round_over(self) -> bool:
        return self.chat.round_over

    @property
    def rounds(self) -> int:
        return self.chat.rounds

    @property
    def usage(self) -> dict[str, Any] | None:
        return self.chat.usage

    @property
    def failure(self) -> str | None:
        return self.chat.failure

    @property
    def failure_message(self) -> str | None:
        return self.chat.failure_message

    def start(self) -> list[Event]:
        events = self.events.start()
        if self.answer is not None:
            self.answer.feed(events)
        return events

    def feed(self, chunk: Any) -> list[Event]:
        return self._events(self.chat.feed(chunk))

    def feed_batch(self, batch: list[Any]) -> list[Event]:
        return self._events(self.chat.feed_batch(batch))

    def end_of_stream(self) -> list[Event]:
        return self._events(self.chat.end_of_stream())

    def fail(
        self, code: str, message: str, *, type: str = "api_error", param: str | None = None, status: int = 500
    ) -> list[Event]:
        self.chat.fail(code, message, type=type, param=param, status=status)
        events = self.events.fail(status, message)
        if self.answer is not None:
            self.answer.feed(events)
        return events

    def tool_result(
        self, call: RoundCall, *, output: str | None = None, error: str | None = None, detail: dict[str, Any] | None = None
    ) -> list[Event]:
        shown: list[Event] = []
        block_id = self._server_ids.get(call.item_id)
        if block_id is not None:
            block = dict((detail or {}).get("block") or {"type": "web_search_tool_result", "content": {"type": "web_search_tool_result_error", "error_code": "unavailable"}})
            shown = self.events.server_tool_result({**block, "tool_use_id": block_id}, (detail or {}).get("cite") or [])
        out = shown + self._events(self.chat.tool_result(call, output=output, error=error))
        if self.answer is not None and shown:
            self.answer.feed(shown)
        return out

    def tools_done(self) -> list[Event]:
        self.native = None  # the next round's request is the gateway's, with its tools' results
        return self._events(self.chat.tools_done())

    @staticmethod
    def generated(events: list[Event]) -> bool:
        """Whether `events` carry something the model generated (for the first token's time)."""
        return any(event["type"] == "content_block_delta" for event in events)

    def _events(self, chunks: list[dict[str, Any]]) -> list[Event]:
        out: list[Event] = []
        for chunk in chunks:
            error = chunk.get("error")
            if error is not None and not chunk.get("choices"):  # the chat session failed on its own
                return out + self.events.fail(502, str(error.get("message") or "the backend failed"))
            out += self.events.feed(chunk)
        for call in self.chat.calls:  # the round ended with calls to run: the server tools' are shown now
            if call.name in self._server_tools and call.item_id not in self._server_ids:
                block_id = self._server_ids[call.item_id] = self._ids("srvtoolu")
                out += self.events.server_tool_use(block_id, call.name, call.arguments)
        if self.chat.done and not self.events.over:
            out += self.events.finish()
        if self.answer is not None:
            self.answer.feed(out)
        return out


class MessageCollector:
    """The `message` object a stream's events add up to, event by event (`message`: None until
    `message_start`, and once an `error` ended it)."""

    def __init__(self) -> None:
        self.message: dict[str, Any] | None = None
        self._blocks: list[dict[str, Any]] = []
        self._inputs: dict[int, list[str]] = {}
        self.failed = False

    def feed(self, events: list[Event]) -> None:
        if self.failed:
            return
        blocks = self._blocks
        for event in events:
            kind = event["type"]
            if kind == "message_start":
                self.message = {**event["message"], "content": blocks}
            elif kind == "content_block_start":
                blocks.append(dict(event["content_block"]))
            elif kind == "content_block_delta":
                block, delta = blocks[event["index"]], event["delta"]
                if delta["type"] == "text_delta":
                    block["text"] += delta["text"]
                elif delta["type"] == "thinking_delta":
                    block["thinking"] += delta["thinking"]
                elif delta["type"] == "signature_delta":
                    block["signature"] += delta["signature"]
                elif delta["type"] == "input_json_delta":
                    self._inputs.setdefault(event["index"], []).append(delta["partial_json"])
                elif delta["type"] == "citations_delta":
                    block.setdefault("citations", []).append(delta["citation"])
            elif kind == "content_block_stop":
                parts = self._inputs.pop(event["index"], None)
                if parts is not None:
                    blocks[event["index"]]["input"] = _input("".join(parts))
            elif kind == "message_delta" and self.message is not None:
                self.message.update(event["delta"])
                self.message["usage"] = {**self.message.get("usage", {}), **event["usage"]}
                if "context_management" in event:
                    self.message["context_management"] = event["context_management"]
            elif kind == "error":
                self.message, self.failed = None, True
                return
        for index, parts in self._inputs.items():  # (a block not stopped yet: its input so far)
            blocks[index]["input"] = _input("".join(parts))


def collect_message(events: list[Event]) -> dict[str, Any] | None:
    """The `message` object a stream's events add up to; None when it ended with an `error`."""
    collector = MessageCollector()
    collector.feed(events)
    return None if collector.failed else collector.message or {}


def _input(arguments: str) -> Any:
    """A tool call's input: its arguments as JSON (an object), or `{}` when they are not one."""
    import orjson

    try:
        value = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}
