"""The prompt tokens a backend had cached are reported: Responses `usage.input_tokens_details.cached_tokens`,
Messages `usage.cache_read_input_tokens` (with `input_tokens` the uncached rest, as Anthropic counts).

A backend says so in OpenAI's way (`prompt_tokens_details.cached_tokens`) or, llama.cpp, in its own
`timings.cache_n` beside the usage.
"""

from __future__ import annotations

import pytest

from conftest import parse_sse
from gateway.streams.translator import chunk_usage, usage_from_chat


def test_llamacpps_timings_become_the_cached_tokens_openai_reports():
    usage = {"prompt_tokens": 40, "completion_tokens": 2, "total_tokens": 42}
    assert chunk_usage({"usage": usage, "timings": {"cache_n": 30}})["prompt_tokens_details"] == {"cached_tokens": 30}
    # OpenAI's own figure wins; nothing cached, or no timings, is left as it is.
    told = {**usage, "prompt_tokens_details": {"cached_tokens": 8}}
    assert chunk_usage({"usage": told, "timings": {"cache_n": 30}}) is told
    assert chunk_usage({"usage": usage, "timings": {"cache_n": 0}}) is usage
    assert chunk_usage({"usage": usage}) is usage
    assert usage_from_chat(chunk_usage({"usage": usage, "timings": {"cache_n": 30}}))["input_tokens_details"] == {"cached_tokens": 30}


@pytest.mark.parametrize("model, cached", [("cached-prompt", 32), ("llamacpp-cached-prompt", 30)])
@pytest.mark.parametrize("stream", [True, False])
async def test_responses_report_the_backends_cached_prompt_tokens(gateway_url, client, model, cached, stream):
    r = await client.post(gateway_url + "/v1/responses", json={"model": model, "input": "hi", "stream": stream})
    final = parse_sse(r.content)[-2]["response"] if stream else r.json()
    assert final["usage"]["input_tokens"] == 40 and final["usage"]["input_tokens_details"] == {"cached_tokens": cached}


@pytest.mark.parametrize("model, cached", [("cached-prompt", 32), ("llamacpp-cached-prompt", 30)])
@pytest.mark.parametrize("stream", [True, False])
async def test_messages_report_cache_reads_and_the_uncached_rest_as_input(gateway_url, client, model, cached, stream):
    body = {"model": model, "max_tokens": 10, "stream": stream, "messages": [{"role": "user", "content": "hi"}]}
    r = await client.post(gateway_url + "/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"})
    if stream:
        usage = next(e["usage"] for e in parse_sse(r.content) if isinstance(e, dict) and e["type"] == "message_delta")
    else:
        usage = r.json()["usage"]
    assert usage["cache_read_input_tokens"] == cached and usage["input_tokens"] == 40 - cached
