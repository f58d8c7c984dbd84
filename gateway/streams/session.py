"""One response across its backend rounds: a pure state machine around the translator.

Owns the decisions the async shells used to make: what the end of a
backend stream means (`[DONE]`, or the body closing with or without a
finish reason), what follows a round (run the gateway's tool calls, call
the backend again with their results, or end the response), the next
round's chat request, and the messages for tool calls resumed from an
approval.  No I/O, no clock of its own, no trio: the turn engine feeds it
and does what it says.

    session = ResponseSession(translator, body, max_rounds=25)  # None: no tool loop
    events = session.start()
    while not session.done:
        # one backend round, asking with session.request
        for chunk in round:  events += session.feed(chunk)     # DONE ends the round
        events += session.end_of_stream()                      # the body closed
        #   or, if the backend failed:  events += session.fail(code, message)
        for call in session.calls:                             # the gateway's calls, if any
            events += session.tool_result(call, output=..., error=...)
        events += session.tools_done()                         # the next round, or the end

Every method returns the events it produced; after the terminal event they
return nothing.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from .chunks import DONE
from .translator import ResponseTranslator, RoundCall

__all__ = ["ResponseSession", "tool_exchange"]

Event = dict[str, Any]

# finish reasons after which the round's calls are not run: the model was cut off.
_CUT_OFF = frozenset({"length", "content_filter"})
ENDED_EARLY = "the backend closed the stream before finishing the response"


class ResponseSession:
    """One response: its rounds and their tool calls, over one translator."""

    native = None  # no request in a backend's own API: every backend gets the chat request

    def __init__(self, translator: ResponseTranslator, body: dict[str, Any], *, max_rounds: int | None = None) -> None:
        """`body` is the first round's chat request; `max_rounds` enables the
        tool loop (the gateway runs its tools and asks again, at most that many
        rounds), None ends the response with the first round."""
        self.translator = translator
        self.request = body
        self._max_rounds = max_rounds
        self.rounds = 0
        self.calls: list[RoundCall] = []  # the gateway's calls of the round just ended, awaiting results
        self._results: dict[str, str] = {}  # item id -> text for the model
        self._round_text = ""
        self._client_calls = False
        self._streaming = True

    @property
    def done(self) -> bool:
        """The terminal event has been produced."""
        return self.translator.done

    @property
    def logprobs_missing(self) -> bool:
        """Log probabilities were asked of the backend, it sent text, and none came with it.

        The response's `logprobs` are then empty.  Data for the shell, which
        logs it once (INFO) when the response ends: the gateway says so
        rather than pretending.
        """
        translator = self.translator
        return self.request.get("logprobs") is True and translator.text_seen and not translator.logprobs_seen

    @property
    def round_over(self) -> bool:
        """The current backend round needs no more chunks."""
        return not self._streaming or self.translator.done

    def start(self) -> list[Event]:
        return self.translator.start()

    def feed(self, chunk: Any) -> list[Event]:
        """Events for one item of a backend round: a decoded chunk, or `DONE`."""
        if self.round_over:
            return []
        if chunk is DONE:
            return self._end_round()
        return self.translator.feed(chunk)

    def feed_batch(self, batch: list[Any]) -> list[Event]:
        """`feed` for each item of a batch, in one call (the hot path)."""
        events: list[Event] = []
        translator = self.translator
        for chunk in batch:
            if not self._streaming or translator.done:
                break
            if chunk is DONE:
                events += self._end_round()
                break
            events += translator.feed(chunk)
        return events

    def end_of_stream(self) -> list[Event]:
        """The backend closed the round's body.  Without `[DONE]`, a finish
        reason still ends the round normally; without either, the stream was
        cut and the response fails."""
        if self.round_over:
            return []
        if self.translator.finish_reason:
            return self._end_round()
        return self.fail("backend_stream_ended", ENDED_EARLY)

    def fail(
        self, code: str, message: str, *, type: str = "server_error", param: str | None = None, status: int = 500
    ) -> list[Event]:
        """The response fails: `error` then `response.failed` (`status`: the HTTP status the
        failure would have had before the stream, which a Responses stream does not show)."""
        self._streaming = False
        self.calls = []
        return self.translator.fail(code, message, type=type, param=param)

    def finish(self, *, incomplete_reason: str | None = None) -> list[Event]:
        """End the response now (a client's request is complete)."""
        self._streaming = False
        self.calls = []
        return self.translator.finish(incomplete_reason=incomplete_reason)

    def tool_result(
        self, call: RoundCall, *, output: str | None = None, error: str | None = None, detail: dict[str, Any] | None = None
    ) -> list[Event]:
        """The outcome of one of `calls`: its `mcp_call` item completes (or fails); a built-in
        tool's item takes `detail`."""
        self._results[call.item_id] = _text_for_model(output, error)
        return self.translator.complete_mcp_call(call.item_id, output=output, error=error, detail=detail)

    def tools_done(self) -> list[Event]:
        """Every call of the round has its result: ask the backend again, or end.

        The response ends when the client has calls of its own to run (its
        functions, approvals to give), or when the rounds run out
        (`incomplete`, reason `max_tool_calls`).  Otherwise `request` becomes
        the next round's chat request and `round_over` turns false.
        """
        if self.done or not self.calls:
            return []
        calls, self.calls = self.calls, []
        self.rounds += 1
        if self._client_calls:
            return self.finish()
        if self._max_rounds is not None and self.rounds >= self._max_rounds:
            return self.finish(incomplete_reason="max_tool_calls")
        results = [self._results.pop(call.item_id, "") for call in calls]
        self.request = tool_exchange(self.request, self._round_text, calls, results)
        self._streaming = True
        return []

    def resume(self, call: RoundCall, *, output: str | None, error: str | None, approval_request_id: str) -> list[Event]:
        """A call the client approved in an earlier response, run before the first round.

        Its `mcp_call` item is recorded whole, and the model sees the call
        and its result in the first round's request.
        """
        events = self.translator.record_mcp_call(
            call.server or "", call.name, call.arguments, output=output, error=error, approval_request_id=approval_request_id
        )
        self.request = tool_exchange(self.request, "", [call], [_text_for_model(output, error)])
        return events

    def decline(self, call: RoundCall, reason: str | None) -> None:
        """A call the client declined: the model is told so in the first round's request."""
        text = "The user did not approve this tool call." + (f" Reason: {reason}" if reason else "")
        self.request = tool_exchange(self.request, "", [call], [text])

    # ------------------------------------------------------------ internals

    def _end_round(self) -> list[Event]:
        self._streaming = False
        translator = self.translator
        if (
            self._max_rounds is None
            or translator.finish_reason in _CUT_OFF
            or not translator.gateway_calls_open()
        ):
            return translator.finish()
        events, produced = translator.end_round()
        ours = [c for c in produced.calls if c.server is not None and not c.approval]
        if not ours:  # nothing after all (a call that never got its name)
            return events + self.finish()
        self.calls = ours
        self._client_calls = len(ours) < len(produced.calls)
        self._round_text = produced.text
        return events


def tool_exchange(
    body: dict[str, Any], text: str, calls: Sequence[RoundCall], results: Sequence[str]
) -> dict[str, Any]:
    """`body` with the assistant's tool calls and their results appended (a new request; `body` is kept)."""
    exchange: list[dict[str, Any]] = [
        {
            "role": "assistant",
            "content": text or None,
            "tool_calls": [
                {"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments or "{}"}}
                for c in calls
            ],
        }
    ]
    exchange += [{"role": "tool", "tool_call_id": c.call_id, "content": result} for c, result in zip(calls, results)]
    following = copy.copy(body)
    following["messages"] = [*body["messages"], *exchange]
    choice = body.get("tool_choice")
    if choice == "required" or isinstance(choice, dict):
        # A forced call was made: forcing it again would loop until the round limit
        # (as the Agents SDK's reset_tool_choice avoids); the model may now answer.
        following["tool_choice"] = "auto"
    return following


def _text_for_model(output: str | None, error: str | None) -> str:
    return (output or "") if error is None else f"Error: {error}"
