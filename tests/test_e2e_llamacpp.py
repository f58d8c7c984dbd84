"""End to end through a real small model: llama.cpp (xllamacpp) + SmolLM2-135M."""

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


async def test_a_real_model_streams_a_reply_through_the_gateway_to_the_openai_sdk(nursery, begun):
    with trio.fail_after(180):
        backend_url = await nursery.start(run_llama_server)
        url = await nursery.start(functools.partial(gateway.serve, make_settings(backend_url)))
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        async with client.responses.stream(
            model="SmolLM2-135M-Instruct", input="Say hello.", max_output_tokens=24, temperature=0
        ) as stream:
            events = [event async for event in stream]
            final = await stream.get_final_response()
        for event in events:
            validate_event(event.model_dump(mode="json", exclude_unset=True, warnings=False))
        validate_response(final.model_dump(mode="json", exclude_unset=True, warnings=False))
        deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert deltas and deltas == final.output_text
        assert final.status in ("completed", "incomplete")
        assert final.usage.input_tokens > 0 and final.usage.output_tokens > 0
        assert [e.sequence_number for e in events] == list(range(len(events)))

        # Non-streaming, and the length limit becoming "incomplete".
        short = await client.responses.create(
            model="SmolLM2-135M-Instruct",
            input="Write a long story about a dragon who learns to bake bread.",
            max_output_tokens=16,
            temperature=0,
        )
        assert short.status == "incomplete" and short.incomplete_details.reason == "max_output_tokens"
        assert short.output_text

        # Requests begun before their turns run, on llama.cpp's kept-alive connection: the same
        # answers (temperature 0) as the first, sent by its round.
        for _ in range(2):
            async with client.responses.stream(
                model="SmolLM2-135M-Instruct", input="Say hello.", max_output_tokens=24, temperature=0
            ) as stream:
                again = [event async for event in stream]
            assert "".join(e.delta for e in again if e.type == "response.output_text.delta") == deltas
        assert begun == [False, True, True, True]  # (the first left to its round by the fixture)


async def test_an_input_larger_than_llamacpps_context_completes_with_truncation_auto_and_is_refused_without(nursery):
    """SmolLM2 on a 512-token context: llama.cpp says its `n_ctx` in `/props`, counts with
    `/apply-template` + `/tokenize`, and refuses a prompt that does not fit."""
    with trio.fail_after(300):
        backend_url = await nursery.start(functools.partial(run_llama_server, n_ctx=512))
        url = await nursery.start(functools.partial(gateway.serve, make_settings(backend_url)))
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        story = "The baker woke before dawn and lit the oven, as every day. " * 8
        history: list[dict[str, str]] = []
        for n in range(8):  # some 1,200 tokens of earlier turns
            history += [{"role": "user", "content": f"Part {n}: {story}"}, {"role": "assistant", "content": "Noted."}]
        history.append({"role": "user", "content": "Say hello."})
        with pytest.raises(openai.BadRequestError) as refused:
            await client.responses.create(model="SmolLM2-135M-Instruct", input=history, max_output_tokens=16, temperature=0)
        assert refused.value.code == "context_length_exceeded"
        fitted = await client.responses.create(
            model="SmolLM2-135M-Instruct", input=history, max_output_tokens=16, temperature=0, truncation="auto"
        )
        assert fitted.status in ("completed", "incomplete") and fitted.output_text
        assert fitted.truncation == "auto" and 0 < fitted.usage.input_tokens <= 512 - 16
