"""`/v1/chat/completions` with the gateway's tools: the tool loop in Chat Completions shapes (pure).

The same round protocol as `ResponseSession` (the turn engine drives both),
but what the client sees are chat chunks: content as it is generated (so
the final answer is streamed once, never fetched twice), the client's own
tool calls re-indexed across rounds, and never the gateway's tool calls,
the intermediate finish reasons or the per-round usage (usage is summed
and sent once, at the end, after the one finish chunk).  A failure is one
`{"error": {...}}` chunk.  `collect_chat_completion` folds the chunks into
the `chat.completion` object of a request that did not stream.
"""

from __future__ import annotations

from typing import Any

from ..errors import error_fields
from .chunks import DONE
from .session import ENDED_EARLY, tool_exchange
from .translator import RoundCall, chunk_problem, chunk_usage, sum_usage

__all__ = ["ChatSession", "RoundFilter", "collect_chat_completion"]

Chunk = dict[str, Any]


class RoundFilter:
    """One round's chunks in, what the client may see out."""

    def __init__(self, gateway_tools: set[str], client_index_base: int) -> None:
        self._gateway = gateway_tools
        self._calls: dict[Any, dict[str, Any]] = {}  # backend index -> {id, name, args, client_index|None}
        self._client_base = client_index_base
        self.client_calls = 0
        self.text: list[str] = []
        self.finish_reason: str | None = None
        self.stop_sequence: str | None = None
        self.usage: dict[str, Any] | None = None
        self.template: dict[str, Any] = {}

    def feed(self, chunk: Chunk) -> Chunk | None:
        """The chunk to forward (possibly trimmed), or None."""
        if not self.template:
            self.template = {k: chunk[k] for k in ("id", "object", "created", "model") if k in chunk}
        if chunk.get("usage"):
            self.usage = chunk_usage(chunk)
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
            arguments = function.get("arguments") or ""
            state["args"].append(arguments if isinstance(arguments, str) else _json_text(arguments))
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
                    forwarded_calls.append({"index": state["client"], "function": {"arguments": state["args"][-1]}})
        if forwarded_calls:
            delta["tool_calls"] = forwarded_calls
        finish = choice.get("finish_reason")
        if finish:
            self.finish_reason = finish
            choice["finish_reason"] = None  # the loop decides what the client's finish reason is
            stopped_by = choice.pop("stop_reason", None)
            if isinstance(stopped_by, str):
                self.stop_sequence = stopped_by  # vLLM's (and the Anthropic adapter's): the stop string that ended it
        choice["delta"] = delta
        if not delta and not forwarded_calls:
            return None
        return {**chunk, "choices": [choice], "usage": None} if "usage" in chunk else {**chunk, "choices": [choice]}

    def gateway_calls(self) -> list[RoundCall]:
        return [
            RoundCall(
                item_id=s["id"] or f"call_{i}",
                call_id=s["id"] or f"call_{i}",
                name=s["name"],
                arguments="".join(s["args"]),
                server="gateway",
            )
            for i, s in enumerate(self._calls.values())
            if s["name"] in self._gateway
        ]


class ChatSession:
    """One chat completion across its rounds (see the module docstring)."""

    native = None  # no request in a backend's own API: every backend gets the chat request
    answer = None  # nothing keeps a chat completion's answer beyond its turn

    def __init__(self, body: dict[str, Any], gateway_tools: set[str], *, max_rounds: int) -> None:
        self.request = {**body, "stream": True, "stream_options": {"include_usage": True}}
        self.calls: list[RoundCall] = []
        self.rounds = 0
        self._gateway = gateway_tools
        self._max_rounds = max_rounds
        self._filter = RoundFilter(gateway_tools, 0)
        self._client_calls = 0
        self._usage: dict[str, Any] | None = None
        self._template: dict[str, Any] = {}
        self._results: dict[str, str] = {}
        self._streaming = True
        self._done = False
        self.failure: str | None = None  # the error code it ended with, if it failed
        self.failure_message: str | None = None  # and its message

    @property
    def done(self) -> bool:
        return self._done

    @property
    def usage(self) -> dict[str, Any] | None:
        """Chat usage summed over the rounds so far."""
        return sum_usage(self._usage, self._filter.usage) if not self.round_over else self._usage

    @property
    def round_over(self) -> bool:
        return not self._streaming or self._done

    def start(self) -> list[Chunk]:
        return []

    @staticmethod
    def generated(chunks: list[Chunk]) -> bool:
        """Whether `chunks` carry something the model generated (for the first token's time)."""
        for chunk in chunks:
            for choice in chunk.get("choices") or ():
                delta = choice.get("delta") or {}
                if delta.get("content") or delta.get("tool_calls") or delta.get("reasoning_content"):
                    return True
        return False

    def feed(self, chunk: Any) -> list[Chunk]:
        if self.round_over:
            return []
        if chunk is DONE:
            return self._end_round()
        problem = chunk_problem(chunk)
        if problem is not None:
            return self.fail("backend_error", f"The backend sent an invalid chunk: {problem}.")
        if chunk.get("error") and not chunk.get("choices"):
            message, _type, code, _param = error_fields(chunk)
            return self.fail(code or "backend_stream_error", message or "the backend reported an error")
        out = self._filter.feed(chunk)
        if out is None:
            return []
        self._template.update({k: out[k] for k in ("id", "object", "created", "model") if k in out})
        return [out]

    def feed_batch(self, batch: list[Any]) -> list[Chunk]:
        out: list[Chunk] = []
        for chunk in batch:
            out += self.feed(chunk)
        return out

    def end_of_stream(self) -> list[Chunk]:
        """The backend closed the round's body.  Without `[DONE]`, a finish reason still ends the
        round normally; without either, the stream was cut: the completion fails."""
        if self.round_over:
            return []
        if self._filter.finish_reason:
            return self._end_round()
        return self.fail("backend_stream_ended", ENDED_EARLY)

    def fail(
        self, code: str, message: str, *, type: str = "server_error", param: str | None = None, status: int = 500
    ) -> list[Chunk]:
        """The completion fails: one error chunk (`status` is not shown in it)."""
        if self._done:
            return []
        self._done = True
        self.failure = code
        self.failure_message = message
        self.calls = []
        return [{"error": {"message": message, "type": type, "param": param, "code": code}}]

    def tool_result(
        self, call: RoundCall, *, output: str | None = None, error: str | None = None, detail: dict[str, Any] | None = None
    ) -> list[Chunk]:
        self._results[call.item_id] = (output or "") if error is None else f"Error: {error}"
        return []

    def tools_done(self) -> list[Chunk]:
        if self._done or not self.calls:
            return []
        calls, self.calls = self.calls, []
        self.rounds += 1
        if self._client_calls or self.rounds >= self._max_rounds:
            return self._finish("tool_calls" if self._client_calls else "length")
        results = [self._results.pop(call.item_id, "") for call in calls]
        self.request = tool_exchange(self.request, "".join(self._filter.text), calls, results)
        self._filter = RoundFilter(self._gateway, self._client_calls)
        self._streaming = True
        return []

    def _end_round(self) -> list[Chunk]:
        self._streaming = False
        flt = self._filter
        self._usage = sum_usage(self._usage, flt.usage)
        self._client_calls += flt.client_calls
        self._template = {**flt.template, **self._template}
        calls = flt.gateway_calls()
        if flt.finish_reason == "length":  # cut off: a call it was making is not whole, and none is run
            return self._finish("length")
        if not calls:
            reason = "tool_calls" if self._client_calls else flt.finish_reason or "stop"
            return self._finish(reason, flt.stop_sequence if reason == "stop" else None)
        self.calls = calls
        return []

    def _finish(self, reason: str, stop_sequence: str | None = None) -> list[Chunk]:
        self._done = True
        self.calls = []
        choice: dict[str, Any] = {"index": 0, "delta": {}, "finish_reason": reason}
        if stop_sequence is not None:
            choice["stop_reason"] = stop_sequence  # as vLLM names it
        chunks: list[Chunk] = [{**self._template, "choices": [choice]}]
        if self._usage:
            chunks.append({**self._template, "choices": [], "usage": self._usage})
        return chunks


def collect_chat_completion(chunks: list[Chunk]) -> dict[str, Any]:
    """The `chat.completion` object the chunks of a `ChatSession` add up to."""
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    template: dict[str, Any] = {}
    finish: str | None = None
    usage: dict[str, Any] | None = None
    for chunk in chunks:
        template.update({k: chunk[k] for k in ("id", "created", "model") if k in chunk})
        if chunk.get("usage"):
            usage = chunk_usage(chunk)
        for choice in chunk.get("choices") or ():
            finish = choice.get("finish_reason") or finish
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str):
                content.append(delta["content"])
            for call in delta.get("tool_calls") or ():
                slot = calls.setdefault(call["index"], {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
                slot["id"] = call.get("id") or slot["id"]
                function = call.get("function") or {}
                slot["function"]["name"] += function.get("name") or ""
                slot["function"]["arguments"] += function.get("arguments") or ""
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content) or None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return {
        "object": "chat.completion",
        **template,
        "choices": [{"index": 0, "message": message, "finish_reason": finish or "stop"}],
        "usage": usage,
    }


def _json_text(value: Any) -> str:
    import orjson

    return orjson.dumps(value).decode()
