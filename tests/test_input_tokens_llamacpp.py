"""`POST /v1/responses/input_tokens` against a real llama.cpp with SmolLM2-135M: the count equals
the prompt tokens of the real completion of the same request (`usage.input_tokens` of a create)."""

from __future__ import annotations

import functools
from typing import Any

import openai
import pytest
import trio

import gateway
from conftest import SequentialIds, make_settings
from gateway.backends import OpenAICompatibleBackend
from gateway.lab.llamacpp import DEFAULT_ALIAS, run_llama_server

pytestmark = pytest.mark.e2e

TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
]
ASKS: list[dict[str, Any]] = [
    {"input": "Say hello."},
    {"input": "Say hello.", "instructions": "You are a pirate. Answer in one short line."},
    {"input": "What is the weather in Paris?", "tools": TOOLS},
    {
        "instructions": "Be brief.",
        "tools": TOOLS,
        "input": [
            {"role": "developer", "content": "Prefer metric units."},
            {"role": "user", "content": [{"type": "input_text", "text": "Weather in Oslo?"}]},
            {"role": "assistant", "content": "It is 4 degrees and raining."},
            {"role": "user", "content": "And in Rome?"},
        ],
    },
]


async def test_the_count_equals_the_prompt_tokens_of_the_real_completion_of_the_same_request(nursery):
    with trio.fail_after(300):
        base = await nursery.start(run_llama_server)
        settings = make_settings(base)
        adapter = OpenAICompatibleBackend(settings)
        app = gateway.create_app(settings, backend=adapter, ids=SequentialIds())
        url = await nursery.start(functools.partial(gateway.serve, settings, app=app))
        sdk = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        counts = []
        for ask in ASKS:
            counted = await sdk.responses.input_tokens.count(model=DEFAULT_ALIAS, **ask)
            created = await sdk.responses.create(model=DEFAULT_ALIAS, **ask, max_output_tokens=16, temperature=0)
            assert counted.object == "response.input_tokens"
            assert counted.input_tokens == created.usage.input_tokens, ask
            counts.append(counted.input_tokens)
        assert adapter.counts_by == "llamacpp"  # its tokenizer, not a completion
        assert counts[0] != counts[1]  # the instructions are counted (they replace SmolLM2's default system prompt)
        # A continuation counts its whole chain, as the create sends it.
        continued = await sdk.responses.input_tokens.count(model=DEFAULT_ALIAS, input="Again.", previous_response_id=created.id)
        again = await sdk.responses.create(
            model=DEFAULT_ALIAS, input="Again.", previous_response_id=created.id, max_output_tokens=16, temperature=0
        )
        assert continued.input_tokens == again.usage.input_tokens > counts[-1]
        await adapter.aclose()


async def test_the_anthropic_adapter_counts_with_llamacpps_count_tokens_as_its_messages_are_billed(nursery, tmp_path):
    with trio.fail_after(300):
        base = await nursery.start(run_llama_server)
        config = tmp_path / "gateway.toml"
        config.write_text(f'[backends.llama]\ntype = "anthropic"\nbase_url = "{base}"\n[[routes]]\nmodel = "*"\nbackends = ["llama"]\n')
        settings = make_settings("http://127.0.0.1:9", gateway_config=str(config))
        url = await nursery.start(functools.partial(gateway.serve, settings))
        sdk = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        for ask in ASKS[:2]:
            counted = await sdk.responses.input_tokens.count(model=DEFAULT_ALIAS, **ask)
            created = await sdk.responses.create(model=DEFAULT_ALIAS, **ask, max_output_tokens=16, temperature=0)
            assert counted.input_tokens == created.usage.input_tokens, ask
