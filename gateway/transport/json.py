"""JSON answers: a body whose status and bytes are known once something has run to its end.

    JsonBody       a JSON answer already decided (an object, or an error);
                   `FixedBody` any other answer already decided
    JsonAnswer     one decided by awaiting a producer (a turn run to its end)
                   before the head is sent
    run_to_end     a Responses turn without streaming: its final response, or
                   the error a JSON answer carries
    turn_answer, chat_answer, messages_answer, compaction_answer
                   a Responses turn, a chat turn, an Anthropic message, a
                   compaction turn answered as JSON (the outcome's HTTP status
                   is the one sent)

Both are `DeferredHeadBody`s, written by `asgi.send_body` however they are
served (ahead of the framework, or through it).  Errors become bytes in
`gateway.transport.render`; nothing here decides the protocol.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
import trio

from ..errors import BackendStreamError, GatewayError
from ..streams.chat import collect_chat_completion
from ..streams.messages import collect_message
from ..turn import Resources, Turn
from ..turn.base import Delivery
from ..turn.chat import ChatTurn
from ..turn.compact import compact
from .body import DeferredHeadBody
from .render import Dialect, answer

__all__ = ["FixedBody", "JsonAnswer", "JsonBody", "chat_answer", "compaction_answer", "messages_answer", "run_to_end", "turn_answer"]

Answer = tuple[int, bytes, dict[str, str]]
_JSON = {"content-type": "application/json"}


class JsonAnswer(DeferredHeadBody):
    """A JSON answer decided by `produce` (run to its end before the head is sent)."""

    def __init__(self, produce: Callable[[], Awaitable[Answer]]) -> None:
        self._produce = produce
        self._body: bytes | None = None

    async def head(self) -> tuple[int, dict[str, str]]:
        status, self._body, headers = await self._produce()
        return status, {**headers, "content-length": str(len(self._body))}

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._once()

    async def _once(self) -> AsyncIterator[bytes]:
        if self._body:
            yield self._body


class FixedBody(JsonAnswer):
    """An answer already decided: its bytes, status and content type."""

    def __init__(self, data: bytes, status: int = 200, content_type: str = "application/json") -> None:
        decided: Answer = (status, data, _JSON if content_type == "application/json" else {"content-type": content_type})

        async def produce() -> Answer:
            return decided

        super().__init__(produce)


class JsonBody(FixedBody):
    """A JSON answer already decided: an object or bytes (`status`, 200 by default)."""

    def __init__(self, value: Any, status: int = 200) -> None:
        super().__init__(value if isinstance(value, bytes) else orjson.dumps(value), status)


async def run_to_end(turn: Turn) -> dict[str, Any]:
    """A Responses turn without streaming: its final response, or the error the JSON answer carries.

    Raises:
        GatewayError: the backend refused (its 4xx), failed or timed out, or
            the response could not be stored.
    """

    async def ignore(events: list[dict[str, Any]]) -> None:
        pass

    try:
        await turn.run(ignore)
    except trio.Cancelled:
        turn.finish(Delivery(client_left=True))
        raise
    error = turn.rejection or turn.error_for_json()
    turn.finish(Delivery(status=error.status if error is not None else None))
    if error is not None:
        raise error
    return turn.response


def turn_answer(turn: Turn, where: str = "") -> JsonAnswer:
    """A Responses turn answered as JSON: the final response, or its error (`where`: the request,
    for the log line of a 5xx)."""

    async def produce() -> Answer:
        try:
            return 200, orjson.dumps(await run_to_end(turn)), _JSON
        except GatewayError as error:
            return answer(error, where)

    return JsonAnswer(produce)


def chat_answer(turn: ChatTurn, where: str = "") -> JsonAnswer:
    """A chat turn answered as JSON: the `chat.completion` its chunks add up to, or its error."""

    def fold(chunks: list[dict[str, Any]]) -> dict[str, Any] | GatewayError:
        errors = [chunk["error"] for chunk in chunks if "error" in chunk]
        if errors:
            return BackendStreamError(errors[0]["message"], code=errors[0]["code"])
        return collect_chat_completion(chunks)

    return _chat_shaped_answer(turn, fold, where)


def messages_answer(turn: ChatTurn, where: str = "", request_id: str | None = None) -> JsonAnswer:
    """An Anthropic message answered as JSON: the `message` its events add up to, or its error
    in Anthropic's shape with the status it has."""

    def fold(events: list[dict[str, Any]]) -> dict[str, Any] | GatewayError:
        message = collect_message(events)
        if message is None:
            return BackendStreamError(next(e["error"]["message"] for e in events if e["type"] == "error"))
        return message

    return _chat_shaped_answer(turn, fold, where, dialect="anthropic", request_id=request_id)


def _chat_shaped_answer(
    turn: ChatTurn,
    fold: Callable[[list[dict[str, Any]]], dict[str, Any] | GatewayError],
    where: str,
    *,
    dialect: Dialect = "openai",
    request_id: str | None = None,
) -> JsonAnswer:
    """A chat-shaped turn run to its end: the object `fold` makes of its output, or the error
    that failed it (the turn's own, else what its output said)."""

    async def produce() -> Answer:
        output: list[dict[str, Any]] = []

        async def collect(batch: list[dict[str, Any]]) -> None:
            output.extend(batch)

        try:
            await turn.run(collect)
        except trio.Cancelled:
            turn.finish()  # (the turn said its client left)
            raise
        folded = fold(output)
        if isinstance(folded, GatewayError):
            answered = answer(turn.failure or folded, where, dialect=dialect, request_id=request_id)
        else:
            answered = 200, orjson.dumps(folded), _JSON
        turn.finish(Delivery(status=answered[0]))
        return answered

    return JsonAnswer(produce)


def compaction_answer(resources: Resources, turn: Turn, where: str = "") -> JsonAnswer:
    """A compaction turn answered as JSON: the `response.compaction` object, or its error."""

    async def produce() -> Answer:
        try:
            return 200, orjson.dumps(compact(resources, turn, await run_to_end(turn))), _JSON
        except GatewayError as error:
            return answer(error, where)

    return JsonAnswer(produce)
