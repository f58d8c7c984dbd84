"""Call ids that repeat across turns: backends that number them per response (llama.cpp, some vLLM
tool parsers, Mistral-style templates) call `call_0` in every response.  A resumed conversation
must still reach the backend with each tool result right after its own call, however the history
reaches the gateway: replayed whole in `input` (Codex, `store: false`), walked back along a stored
`previous_response_id` chain, or continued from a WebSocket connection's cache.

The scripted `numbered-calls` model refuses a request whose tool sequence a strict backend would
refuse (400 "tool_call_ids did not have response messages", as vLLM and OpenAI answer)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import httpx2
import pytest

from test_websocket import aconnect_ws, turn, ws_url

LOOKUP = {"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {"turn": {"type": "integer"}}}}
TURNS = 3

# Sends one turn's new input items (and the previous response's id) and returns the response.
SendTurn = Callable[[list[dict[str, Any]], "str | None"], Awaitable[dict[str, Any]]]


def arguments(number: int) -> str:
    return '{"turn": %d}' % number  # as the scripted model writes them


def result(number: int) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": "call_0", "output": f"result {number}"}


def stateless(gateway_url: str, client: httpx2.AsyncClient) -> SendTurn:
    """Codex with `store: false`: the whole history in `input` every turn, outputs as received."""
    history: list[dict[str, Any]] = []

    async def send(items: list[dict[str, Any]], previous: str | None) -> dict[str, Any]:
        history.extend(items)
        body = {"model": "numbered-calls", "input": history, "tools": [LOOKUP], "store": False}
        r = await client.post(gateway_url + "/v1/responses", json=body)
        assert r.status_code == 200, r.text
        response: dict[str, Any] = r.json()
        history.extend(response["output"])
        return response

    return send


def stateful(gateway_url: str, client: httpx2.AsyncClient) -> SendTurn:
    """The gateway keeps the chain: each turn sends only its new items and `previous_response_id`."""

    async def send(items: list[dict[str, Any]], previous: str | None) -> dict[str, Any]:
        body = {"model": "numbered-calls", "input": items, "tools": [LOOKUP], "previous_response_id": previous}
        r = await client.post(gateway_url + "/v1/responses", json=body)
        assert r.status_code == 200, r.text
        return r.json()

    return send


def websocket(ws: Any) -> SendTurn:
    """One WebSocket connection, `store: false`: each turn continues from the connection's cache."""

    async def send(items: list[dict[str, Any]], previous: str | None) -> dict[str, Any]:
        events = await turn(ws, model="numbered-calls", input=items, tools=[LOOKUP], store=False, previous_response_id=previous)
        assert events[-1]["type"] == "response.completed", events[-1]
        return events[-1]["response"]

    return send


def expected_messages(results: int) -> list[dict[str, Any]]:
    """The conversation as a strict backend needs it: each call of `call_0`, then its own result."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "look it up"}]
    for number in range(results):
        call = {"id": "call_0", "type": "function", "function": {"name": "lookup", "arguments": arguments(number)}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": "call_0", "content": f"result {number}"})
    return messages


async def resume_turns(send: SendTurn, chat_requests: Callable[[], list[Any]]) -> None:
    response = await send([{"type": "message", "role": "user", "content": "look it up"}], None)
    for number in range(TURNS):
        calls = [item for item in response["output"] if item["type"] == "function_call"]
        assert [(c["call_id"], c["arguments"]) for c in calls] == [("call_0", arguments(number))]
        assert response["status"] == "completed"
        response = await send([result(number)], response["id"])
        # The backend got every result right after its own call (or it would have answered 400).
        assert chat_requests()[-1]["messages"] == expected_messages(number + 1)
    assert len(chat_requests()) == TURNS + 1


@pytest.mark.parametrize("history", ["stateless input replay", "previous_response_id chain"])
async def test_each_result_follows_its_own_call_when_the_backend_numbers_call_ids_per_response(
    gateway_url: str, client: httpx2.AsyncClient, backend: Any, history: str
) -> None:
    send = stateless(gateway_url, client) if history == "stateless input replay" else stateful(gateway_url, client)
    await resume_turns(send, lambda: backend.chat_requests)


async def test_each_result_follows_its_own_call_over_a_websocket_continued_from_its_cache(
    gateway_url: str, backend: Any
) -> None:
    async with aconnect_ws(ws_url(gateway_url)) as ws:
        await resume_turns(websocket(ws), lambda: backend.chat_requests)


async def test_a_resent_result_for_a_repeated_call_id_is_sent_once(gateway_url: str, client: httpx2.AsyncClient, backend: Any) -> None:
    """A client that retries sends its last output again: the duplicate is dropped, not paired with an older call."""
    send = stateless(gateway_url, client)
    first = await send([{"type": "message", "role": "user", "content": "look it up"}], None)
    second = await send([result(0)], first["id"])
    await send([result(1), result(1)], second["id"])
    assert backend.chat_requests[-1]["messages"] == expected_messages(2)
