"""The official openai SDK as the client: what real users run."""

from __future__ import annotations

from typing import Any

import openai
import pytest
import trio

from test_http_responses import STREAM_SCENARIOS

TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
]


@pytest.fixture
def sdk(gateway_url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gateway_url + "/v1", api_key="sk-test", max_retries=0)


async def test_create_with_stream_true_yields_typed_events(sdk):
    with trio.fail_after(20):
        stream = await sdk.responses.create(model="text", input="hi", stream=True)
        events = [event async for event in stream]
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == "Hello, world!" == events[-1].response.output_text


@pytest.mark.parametrize("scenario,status", sorted(STREAM_SCENARIOS.items()))
async def test_the_stream_helper_accepts_every_scenario(sdk, scenario, status):
    with trio.fail_after(20):
        async with sdk.responses.stream(model=scenario, input="hi", tools=TOOLS) as stream:
            if status == "failed":
                # The spec's error event nests its payload under "error"; the SDK
                # raises that payload as an APIError, which is how it reports
                # a failed stream to its callers.
                with pytest.raises(openai.APIError) as caught:
                    async for _ in stream:
                        pass
                assert isinstance(caught.value.body, dict) and caught.value.body["code"]
                return
            events = [event async for event in stream]
            assert events[-1].type == f"response.{status}"
            if status == "completed":
                final = await stream.get_final_response()
                assert final.status == "completed"
                assert [item.type for item in final.output] == [
                    e.item.type for e in events if e.type == "response.output_item.done"
                ]


async def test_stream_helper_final_response_has_text_and_usage(sdk):
    async with sdk.responses.stream(model="reasoning", input="2+2?") as stream:
        async for _ in stream:
            pass
        final = await stream.get_final_response()
    assert final.output_text == "The answer is 4."
    assert final.output[0].type == "reasoning"
    assert final.output[0].content[0].text == "Let me think."
    assert final.usage.total_tokens == 18 and final.usage.input_tokens_details.cached_tokens == 3


async def test_non_streaming_create_returns_a_parsed_response(sdk):
    response = await sdk.responses.create(model="text", input="hi", instructions="Be nice.")
    assert response.output_text == "Hello, world!"
    assert response.status == "completed" and response.instructions == "Be nice."


async def test_stateless_function_call_round_trip(sdk, backend):
    history: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
    first = await sdk.responses.create(model="weather", input=history, tools=TOOLS, store=False)
    calls = [item for item in first.output if item.type == "function_call"]
    assert [c.name for c in calls] == ["get_weather"] and calls[0].id != calls[0].call_id
    history += [item.model_dump(exclude_none=True) for item in first.output]
    history.append({"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny, 21C"})
    async with sdk.responses.stream(model="weather", input=history, tools=TOOLS, store=False) as stream:
        async for _ in stream:
            pass
        second = await stream.get_final_response()
    assert second.output_text == "The tool said: sunny, 21C"
    messages = backend.chat_requests[-1]["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[1]["tool_calls"][0]["id"] == messages[2]["tool_call_id"] == calls[0].call_id


async def test_backend_4xx_raises_the_matching_sdk_error(sdk):
    with pytest.raises(openai.BadRequestError) as caught:
        await sdk.responses.create(model="http-400", input="hi", stream=True)
    assert caught.value.code == "context_length_exceeded"
    with pytest.raises(openai.NotFoundError):
        await sdk.responses.create(model="unknown-model", input="hi")
