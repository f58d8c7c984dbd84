"""Log probabilities end to end: llama.cpp (xllamacpp) + SmolLM2-135M behind the gateway.

llama.cpp's OpenAI-compatible chat endpoint returns `choices[0].logprobs.content`
when asked (`logprobs: true, top_logprobs: N`): the gateway must carry them
into each `response.output_text.delta`, token for token.
"""

from __future__ import annotations

import functools

import openai
import pytest
import trio

import gateway
from conftest import make_settings
from gateway.lab.llamacpp import run_llama_server
from spec import validate_event, validate_response

pytestmark = pytest.mark.e2e


async def test_a_real_models_log_probabilities_reach_each_delta_and_their_tokens_make_the_text(nursery):
    with trio.fail_after(180):
        backend_url = await nursery.start(run_llama_server)
        url = await nursery.start(functools.partial(gateway.serve, make_settings(backend_url)))
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        async with client.responses.stream(
            model="SmolLM2-135M-Instruct",
            input="Say hello.",
            max_output_tokens=16,
            temperature=0,
            include=["message.output_text.logprobs"],
            top_logprobs=2,
        ) as stream:
            events = [event async for event in stream]
    assert events[-1].type in ("response.completed", "response.incomplete")  # incomplete: cut at 16 tokens
    final = events[-1].response

    for event in events:
        validate_event(event.model_dump(mode="json", exclude_unset=True, warnings=False))
    validate_response(final.model_dump(mode="json", exclude_unset=True, warnings=False))
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert deltas and all(d.logprobs for d in deltas), "every delta carries the log probabilities of its tokens"
    for delta in deltas:
        assert "".join(lp.token for lp in delta.logprobs) == delta.delta
        assert all(len(lp.top_logprobs) <= 2 and lp.logprob <= 0 for lp in delta.logprobs)
        assert all(lp.bytes == list(lp.token.encode()) for lp in delta.logprobs)
    text = final.output_text
    assert "".join(lp.token for d in deltas for lp in d.logprobs) == text
    part = final.output[0].content[0]
    assert [lp.token for lp in part.logprobs] == [lp.token for d in deltas for lp in d.logprobs]
    assert any(len(lp.top_logprobs) == 2 for lp in part.logprobs)
