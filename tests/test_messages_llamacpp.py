"""Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`) end to end: the official
`anthropic` SDK against the gateway, in front of a real llama.cpp with SmolLM2-135M, as a Chat
Completions backend (the default) and as an Anthropic backend (llama.cpp serves `/v1/messages`).

What llama.cpp does, and these tests rely on:

* Its prompt cache: a request that shares a prefix with the one before is billed for the new
  tokens only (`cache_read_input_tokens` holds the rest), as Anthropic bills.  `count_tokens`
  counts the whole prompt, so it equals `input_tokens + cache_read_input_tokens +
  cache_creation_input_tokens` of a create of the same request; `input_tokens` alone only
  when nothing was cached (the first request to a fresh server).
* SmolLM2's own chat template has no tools: llama.cpp drops `tools` and never calls one, even
  with `tool_choice` "required".  A named `tool_choice` object is not supported at all (its
  log: "Wrong type supplied for parameter 'tool_choice' ... type must be string, but is
  object"; it falls back to auto).  So the tool call test starts llama.cpp with a ChatML
  template that describes tools (`chat_template_file`; Hermes/Qwen style, `<tool_call>{...}</tool_call>`), asks for
  a call (`tool_choice` any, which is "required"), and opens the assistant's turn with
  `<tool_call>` (a prefill): llama.cpp's grammar then makes the call, the same every time at
  temperature 0.
* The installed SDK (anthropic 2.14) has no `temperature` argument: it goes in `extra_body`.
"""

from __future__ import annotations

import functools
import json
import pathlib
from typing import Any

import anthropic
import pytest
import trio

import gateway
from conftest import SequentialIds, make_settings
from gateway.backends import OpenAICompatibleBackend
from gateway.lab.llamacpp import DEFAULT_ALIAS, run_llama_server

pytestmark = pytest.mark.e2e

MODEL = DEFAULT_ALIAS
GREEDY: dict[str, Any] = {"temperature": 0}
WEATHER: Any = {
    "name": "get_weather",
    "description": "Weather for a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
SYSTEM: Any = [{"type": "text", "text": "You are a pirate."}, {"type": "text", "text": "Answer in one short line."}]
HELLO: Any = [{"role": "user", "content": "Say hello."}]
# Requests whose count must be what a create of the same request is billed for.
ASKS: list[dict[str, Any]] = [
    {"messages": HELLO},
    {"system": SYSTEM, "messages": HELLO},
    {"system": "Be brief.", "tools": [WEATHER], "messages": [{"role": "user", "content": "What is the weather in Paris?"}]},
    {
        "tools": [WEATHER],
        "messages": [
            {"role": "user", "content": "What is the weather in Oslo?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "4 degrees and raining"}]},
        ],
    },
]


def client(url: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=url, api_key="x", max_retries=0)


def prompt_tokens(usage: Any) -> int:
    """The whole prompt a message was billed for: new tokens plus those read from (or written to)
    the cache, which is what `count_tokens` counts."""
    return usage.input_tokens + (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)


def text_of(message: Any) -> str:
    assert [block.type for block in message.content] == ["text"], message.content
    return message.content[0].text


async def streamed(sdk: anthropic.AsyncAnthropic, **request: Any) -> tuple[list[Any], Any]:
    """The stream's events (as the SDK gives them) and the message they add up to."""
    async with sdk.messages.stream(model=MODEL, extra_body=GREEDY, **request) as stream:
        events = [event async for event in stream]
        return events, await stream.get_final_message()


def check_stream(events: list[Any], final: Any) -> None:
    """Anthropic's event order, and the text deltas make the final text."""
    kinds = [event.type for event in events if event.type not in ("text", "input_json")]  # the SDK's own
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop", kinds
    assert kinds.count("message_delta") == 1 and kinds[-2] == "message_delta", kinds
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == len(final.content)
    deltas = [e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta"]
    assert deltas and "".join(deltas) == text_of(final)


async def gateway_on_anthropic_backend(nursery: trio.Nursery, tmp_path: pathlib.Path, base: str) -> str:
    """A gateway whose one backend is llama.cpp as `type = "anthropic"` (its own /v1/messages)."""
    config = tmp_path / "gateway.toml"
    config.write_text(f'[backends.llama]\ntype = "anthropic"\nbase_url = "{base}"\n[[routes]]\nmodel = "*"\nbackends = ["llama"]\n')
    settings = make_settings("http://127.0.0.1:9", gateway_config=str(config))
    url: str = await nursery.start(functools.partial(gateway.serve, settings))
    return url


# --- a Chat Completions backend ---------------------------------------------------------


async def test_a_message_has_a_text_block_a_stop_reason_and_the_tokens_it_used(nursery):
    with trio.fail_after(300):
        base = await nursery.start(run_llama_server)
        url = await nursery.start(functools.partial(gateway.serve, make_settings(base)))
        message = await client(url).messages.create(
            model=MODEL, max_tokens=16, system=SYSTEM, messages=HELLO, extra_body=GREEDY
        )
    assert message.type == "message" and message.role == "assistant" and message.model == MODEL
    assert message.id.startswith("msg_")
    assert text_of(message).strip()
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert message.usage.input_tokens > 0
    assert 0 < message.usage.output_tokens <= 16


async def test_a_streamed_message_is_the_one_its_events_add_up_to_and_the_same_as_unstreamed(nursery):
    with trio.fail_after(300):
        base = await nursery.start(run_llama_server)
        url = await nursery.start(functools.partial(gateway.serve, make_settings(base)))
        sdk = client(url)
        events, final = await streamed(sdk, max_tokens=16, system=SYSTEM, messages=HELLO)
        unstreamed = await sdk.messages.create(model=MODEL, max_tokens=16, system=SYSTEM, messages=HELLO, extra_body=GREEDY)
    check_stream(events, final)
    assert final.id.startswith("msg_") and final.model == MODEL
    assert final.stop_reason in ("end_turn", "max_tokens")
    assert final.usage.input_tokens > 0 and 0 < final.usage.output_tokens <= 16
    # Greedy: the same request gives the same message, streamed or not.
    assert text_of(final) == text_of(unstreamed)
    assert final.stop_reason == unstreamed.stop_reason
    assert final.usage.output_tokens == unstreamed.usage.output_tokens
    assert prompt_tokens(final.usage) == prompt_tokens(unstreamed.usage)


async def test_a_message_cut_by_max_tokens_says_max_tokens_streamed_or_not(nursery):
    with trio.fail_after(300):
        base = await nursery.start(run_llama_server)
        url = await nursery.start(functools.partial(gateway.serve, make_settings(base)))
        sdk = client(url)
        message = await sdk.messages.create(model=MODEL, max_tokens=1, messages=HELLO, extra_body=GREEDY)
        events, final = await streamed(sdk, max_tokens=1, messages=HELLO)
    for cut in (message, final):
        assert cut.stop_reason == "max_tokens"
        assert cut.usage.output_tokens == 1
        assert text_of(cut)
    check_stream(events, final)


async def test_count_tokens_is_the_whole_prompt_a_create_of_the_same_request_is_billed_for(nursery):
    with trio.fail_after(300):
        base = await nursery.start(run_llama_server)
        settings = make_settings(base)
        adapter = OpenAICompatibleBackend(settings)
        app = gateway.create_app(settings, backend=adapter, ids=SequentialIds())
        url = await nursery.start(functools.partial(gateway.serve, settings, app=app))
        sdk = client(url)
        counts = []
        for i, ask in enumerate(ASKS):
            counted = await sdk.messages.count_tokens(model=MODEL, **ask)
            created = await sdk.messages.create(model=MODEL, max_tokens=8, **ask, extra_body=GREEDY)
            assert counted.input_tokens == prompt_tokens(created.usage), (ask, created.usage)
            if i == 0:  # a fresh server has nothing cached: the count is the input tokens themselves
                assert created.usage.cache_read_input_tokens == 0
                assert counted.input_tokens == created.usage.input_tokens
            counts.append(counted.input_tokens)
        await adapter.aclose()
    assert adapter.counts_by == "llamacpp"  # llama.cpp's tokenizer, not a completion
    assert counts[1] != counts[0]  # the system prompt is counted (it replaces SmolLM2's default one)


# --- llama.cpp's own Messages API as an Anthropic backend -------------------------------


async def test_an_anthropic_backend_creates_streams_and_counts_what_it_bills(nursery, tmp_path):
    with trio.fail_after(300):
        base = await nursery.start(run_llama_server)
        sdk = client(await gateway_on_anthropic_backend(nursery, tmp_path, base))
        for i, ask in enumerate(ASKS):
            counted = await sdk.messages.count_tokens(model=MODEL, **ask)
            created = await sdk.messages.create(model=MODEL, max_tokens=8, **ask, extra_body=GREEDY)
            assert created.id.startswith("msg_") and created.model == MODEL
            assert text_of(created) and created.stop_reason in ("end_turn", "max_tokens")
            assert created.usage.input_tokens > 0 and 0 < created.usage.output_tokens <= 8
            assert counted.input_tokens == prompt_tokens(created.usage), (ask, created.usage)
            if i == 0:
                assert created.usage.cache_read_input_tokens == 0
                assert counted.input_tokens == created.usage.input_tokens
        events, final = await streamed(sdk, max_tokens=8, system=SYSTEM, messages=HELLO)
        counted = await sdk.messages.count_tokens(model=MODEL, system=SYSTEM, messages=HELLO)
        cut = await sdk.messages.create(model=MODEL, max_tokens=1, messages=HELLO, extra_body=GREEDY)
    check_stream(events, final)
    assert final.id.startswith("msg_") and final.stop_reason in ("end_turn", "max_tokens")
    assert 0 < final.usage.output_tokens <= 8
    assert counted.input_tokens == prompt_tokens(final.usage) > final.usage.input_tokens > 0  # mostly cached
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 1


# --- a tool call ------------------------------------------------------------------------

# ChatML (SmolLM2's format) with tools described as Hermes and Qwen do, so that llama.cpp
# recognises `<tool_call>{"name": ..., "arguments": ...}</tool_call>` and constrains it.
TOOL_TEMPLATE = """\
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}{%- else %}{{- 'You are a helpful AI assistant named SmolLM, trained by Hugging Face' }}{%- endif %}
{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}
{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}
{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}
{%- elif messages[0]['role'] == 'system' %}
{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{%- else %}
{{- '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) or (message.role == 'assistant' and not message.tool_calls) %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant' }}
{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}
{%- for tool_call in message.tool_calls %}
{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
{{- '\\n<tool_call>\\n{"name": "' + tool_call.name + '", "arguments": ' }}{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""
def check_tool_use(message: Any) -> None:
    """A message that calls `get_weather`: only tool_use blocks, each with its own `toolu_` id and
    an object for input, and stop_reason tool_use."""
    assert message.content and all(block.type == "tool_use" for block in message.content), message.content
    assert message.stop_reason == "tool_use"
    ids = [block.id for block in message.content]
    assert all(i.startswith("toolu_") for i in ids) and len(set(ids)) == len(ids), ids
    for block in message.content:
        assert block.name == "get_weather"
        assert isinstance(block.input, dict) and isinstance(block.input.get("city"), str), block.input


async def test_a_forced_tool_call_comes_back_as_tool_use_and_its_result_leads_to_a_text_answer(nursery, tmp_path):
    ask: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
    call: dict[str, Any] = {"tools": [WEATHER], "tool_choice": {"type": "any"}, "messages": [*ask, {"role": "assistant", "content": "<tool_call>\n"}]}
    with trio.fail_after(300):
        template = tmp_path / "tools.jinja"
        template.write_text(TOOL_TEMPLATE)
        base = await nursery.start(functools.partial(run_llama_server, chat_template_file=template))
        url = await nursery.start(functools.partial(gateway.serve, make_settings(base)))
        sdk = client(url)
        bare = await sdk.messages.count_tokens(model=MODEL, messages=ask)
        with_tools = await sdk.messages.count_tokens(model=MODEL, tools=[WEATHER], messages=ask)
        # The tools are part of the prompt (this template shows them to the model), and counted.
        assert with_tools.input_tokens > bare.input_tokens

        asked = await sdk.messages.create(model=MODEL, max_tokens=128, **call, extra_body=GREEDY)
        check_tool_use(asked)
        events, final = await streamed(sdk, max_tokens=128, **call)
        check_tool_use(final)
        assert [(b.name, b.input) for b in final.content] == [(b.name, b.input) for b in asked.content]
        # Streamed, each call's input comes as JSON pieces that add up to it.
        for index, block in enumerate(final.content):
            pieces = [e.delta.partial_json for e in events if e.type == "content_block_delta" and e.index == index]
            assert pieces and json.loads("".join(pieces)) == block.input

        # The results go back to the model, which answers in text.
        uses: list[Any] = [{"type": "tool_use", "id": b.id, "name": b.name, "input": b.input} for b in asked.content]
        results: list[Any] = [{"type": "tool_result", "tool_use_id": use["id"], "content": "18 degrees and sunny"} for use in uses]
        answer_to: dict[str, Any] = {"tools": [WEATHER], "messages": [*ask, {"role": "assistant", "content": uses}, {"role": "user", "content": results}]}
        counted = await sdk.messages.count_tokens(model=MODEL, **answer_to)
        answer = await sdk.messages.create(model=MODEL, max_tokens=32, **answer_to, extra_body=GREEDY)
    assert answer.content and all(block.type == "text" for block in answer.content), answer.content
    assert "".join(block.text for block in answer.content).strip()
    assert answer.stop_reason in ("end_turn", "max_tokens")
    assert counted.input_tokens == prompt_tokens(answer.usage) > with_tools.input_tokens
