"""Compaction on the server: Responses `context_management` with the openai SDK, over real sockets.

The scripted backend counts tokens as vLLM's `/tokenize` does and answers
every request (the summary too) with its `text` script.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest
import trio

from conftest import parse_sse
from spec import validate_event, validate_response

WORDS = " ".join(f"word{n}" for n in range(40))
HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": f"first: {WORDS}"},
    {"role": "assistant", "content": f"noted: {WORDS}"},
    {"role": "user", "content": f"second: {WORDS}"},
    {"role": "assistant", "content": f"noted again: {WORDS}"},
    {"role": "user", "content": "And now?"},
]
COMPACT = [{"type": "compaction", "compact_threshold": 100}]


def sdk(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)


@pytest.fixture
def counting(backend):
    backend.tokenizer = "vllm"
    return backend


async def test_an_input_past_the_threshold_is_summarised_first_and_the_compaction_item_leads_the_output(gateway_url, counting):
    before = len(counting.chat_requests)
    with trio.fail_after(20):
        answer = await sdk(gateway_url).responses.create(
            model="text", instructions="Be brief.", input=HISTORY, context_management=COMPACT  # type: ignore[arg-type]
        )
    assert [item.type for item in answer.output] == ["compaction", "message"]
    assert answer.output[0].encrypted_content and answer.output_text == "Hello, world!"
    validate_response(answer.model_dump(mode="json", exclude_unset=True, warnings=False))
    summary_request, turn_request = counting.chat_requests[before:]
    assert summary_request["messages"][:-1] == turn_request_messages_before(HISTORY)
    assert summary_request["messages"][-1]["role"] == "user" and "Summarise" in summary_request["messages"][-1]["content"]
    assert turn_request["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "system", "content": "Summary of the conversation so far:\nHello, world!"},
        {"role": "user", "content": "And now?"},
    ]
    # The summary's tokens count in the response's usage: two calls' worth.
    assert answer.usage is not None and answer.usage.input_tokens > 0


def turn_request_messages_before(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"role": "system", "content": "Be brief."}, *history]


async def test_a_streamed_compaction_is_an_output_item_of_its_own_in_spec_events(gateway_url, counting, client):
    r = await client.post(
        gateway_url + "/v1/responses",
        json={"model": "text", "input": HISTORY, "context_management": COMPACT, "stream": True},
    )
    events = [e for e in parse_sse(r.content) if isinstance(e, dict)]
    for event in events:
        validate_event(event)
    added = [e for e in events if e["type"] == "response.output_item.added"]
    assert added[0]["item"]["type"] == "compaction" and added[0]["output_index"] == 0
    assert events[-1]["type"] == "response.completed"
    assert [i["type"] for i in events[-1]["response"]["output"]] == ["compaction", "message"]


async def test_an_input_under_the_threshold_is_not_compacted(gateway_url, counting):
    before = len(counting.chat_requests)
    with trio.fail_after(20):
        answer = await sdk(gateway_url).responses.create(
            model="text", input="hi", context_management=[{"type": "compaction", "compact_threshold": 5000}]  # type: ignore[arg-type]
        )
    assert [item.type for item in answer.output] == ["message"]
    assert len(counting.chat_requests) == before + 1


async def test_a_later_turn_starts_from_the_compaction_by_id_and_by_input(gateway_url, counting):
    client = sdk(gateway_url)
    with trio.fail_after(20):
        first = await client.responses.create(model="text", input=HISTORY, context_management=COMPACT)  # type: ignore[arg-type]
        await client.responses.create(model="text", input="Next?", previous_response_id=first.id)
        chained = counting.chat_requests[-1]["messages"]
        replayed = [*HISTORY, *(item.model_dump(exclude_none=True) for item in first.output), {"role": "user", "content": "Next?"}]
        await client.responses.create(model="text", input=replayed, store=False)  # type: ignore[arg-type]
        stateless = counting.chat_requests[-1]["messages"]
    for messages in (chained, stateless):
        assert messages[0] == {"role": "system", "content": "Summary of the conversation so far:\nHello, world!"}
        assert [m["role"] for m in messages[1:]] == ["assistant", "user"] and messages[-1]["content"] == "Next?"
        assert not any("first:" in str(m.get("content")) for m in messages)


@pytest.mark.parametrize("threshold", [0, -3, "many", 1.5, True])
async def test_a_compact_threshold_that_is_not_a_positive_integer_is_a_400_naming_it(gateway_url, client, backend, threshold):
    before = len(backend.chat_requests)
    r = await client.post(
        gateway_url + "/v1/responses",
        json={"model": "text", "input": "hi", "context_management": [{"type": "compaction", "compact_threshold": threshold}]},
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "context_management[0].compact_threshold"
    assert len(backend.chat_requests) == before
