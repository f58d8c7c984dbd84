"""Anthropic's context editing (`context_management.edits`) done by the gateway for a chat backend.

The rules, pure; then over real sockets with the anthropic SDK against the
scripted backend (which counts tokens as vLLM's `/tokenize` does).
"""

from __future__ import annotations

from typing import Any

import anthropic
import pytest
import trio

from gateway.turn.context_edits import CLEARED, clear_thinking, clear_tool_uses

EDITS_BETA = "context-management-2025-06-27"


def tool_conversation(uses: int, *, thinking: bool = False) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "look things up"}]
    for n in range(uses):
        blocks: list[dict[str, Any]] = []
        if thinking:
            blocks.append({"type": "thinking", "thinking": f"thought {n}", "signature": f"sig{n}"})
        blocks.append({"type": "tool_use", "id": f"toolu_{n}", "name": "grep" if n % 2 else "read", "input": {"n": n}})
        messages.append({"role": "assistant", "content": blocks})
        messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{n}", "content": f"result {n} " * 20}]})
    return messages


def results(messages: list[dict[str, Any]]) -> list[Any]:
    return [b["content"] for m in messages if isinstance(m["content"], list) for b in m["content"] if b["type"] == "tool_result"]


# --- the rules (pure) -----------------------------------------------------------------------------


def test_clear_thinking_keeps_the_last_turns_thinking_by_default_all_when_asked_and_n_when_told():
    messages = tool_conversation(4, thinking=True)
    kept = lambda ms: [i for i, m in enumerate(ms) if any(b.get("type") == "thinking" for b in m["content"] if isinstance(b, dict))]  # noqa: E731
    default, cleared = clear_thinking(messages)
    assert cleared == 3 and kept(default) == [7]
    assert clear_thinking(messages, "all") == (messages, 0)
    assert clear_thinking(messages, {"type": "all"}) == (messages, 0)
    two, cleared = clear_thinking(messages, {"type": "thinking_turns", "value": 2})
    assert cleared == 2 and kept(two) == [5, 7]
    assert messages == tool_conversation(4, thinking=True)  # (the request itself is left as it came)


def test_clear_tool_uses_clears_the_oldest_results_past_its_trigger_sparing_kept_and_excluded_tools():
    messages = tool_conversation(5)
    edit: dict[str, Any] = {"type": "clear_tool_uses_20250919", "trigger": {"type": "tool_uses", "value": 3}, "keep": {"type": "tool_uses", "value": 2}}
    out, cleared = clear_tool_uses(messages, edit, None)
    assert cleared == 3 and results(out)[:3] == [CLEARED] * 3 and results(out)[3:] == results(messages)[3:]
    assert clear_tool_uses(messages, {**edit, "trigger": {"type": "tool_uses", "value": 5}}, None) == (messages, 0)
    spared, cleared = clear_tool_uses(messages, {**edit, "exclude_tools": ["grep"]}, None)  # grep is uses 1 and 3
    assert cleared == 1 and results(spared)[0] == CLEARED and results(spared)[1] == results(messages)[1]
    emptied, _ = clear_tool_uses(messages, {**edit, "clear_tool_inputs": True}, None)
    assert emptied[1]["content"][0]["input"] == {} and emptied[-2]["content"][0]["input"] == {"n": 4}
    by_tokens = {"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 1000}}
    assert clear_tool_uses(messages, by_tokens, 999)[1] == 0 and clear_tool_uses(messages, by_tokens, None)[1] == 0
    assert clear_tool_uses(messages, by_tokens, 1001)[1] == 2  # the default keep: the last 3


# --- over real sockets --------------------------------------------------------------------------


def sdk(url: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=url, api_key="sk-test", max_retries=0)


TOOL = {"name": "read", "input_schema": {"type": "object"}}
GREP = {"name": "grep", "input_schema": {"type": "object"}}


@pytest.mark.parametrize("streamed", [False, True])
async def test_cleared_tool_uses_reach_the_chat_backend_and_the_answer_says_what_was_applied(gateway_url, backend, streamed):
    backend.tokenizer = "vllm"
    config = {"edits": [{"type": "clear_tool_uses_20250919", "trigger": {"type": "tool_uses", "value": 2}, "keep": {"type": "tool_uses", "value": 1}}]}
    ask: dict[str, Any] = dict(model="text", max_tokens=32, tools=[TOOL, GREP], messages=tool_conversation(4), context_management=config, betas=[EDITS_BETA])
    with trio.fail_after(20):
        if streamed:
            async with sdk(gateway_url).beta.messages.stream(**ask) as stream:
                message = await stream.get_final_message()
        else:
            message = await sdk(gateway_url).beta.messages.create(**ask)
    assert message.context_management is not None
    [applied] = message.context_management.applied_edits
    assert applied.type == "clear_tool_uses_20250919" and applied.cleared_tool_uses == 3  # type: ignore[union-attr]
    assert applied.cleared_input_tokens > 0
    tool_messages = [m["content"] for m in backend.chat_requests[-1]["messages"] if m["role"] == "tool"]
    assert tool_messages[:3] == [CLEARED] * 3 and tool_messages[3].startswith("result 3")


async def test_claude_codes_clear_thinking_that_keeps_all_costs_no_count_and_applies_nothing(gateway_url, backend):
    backend.tokenizer = "vllm"
    config = {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}
    before = len(backend.requests)
    with trio.fail_after(20):
        message = await sdk(gateway_url).beta.messages.create(
            model="text", max_tokens=32, messages=tool_conversation(2, thinking=True), tools=[TOOL, GREP], context_management=config, betas=[EDITS_BETA]
        )
    assert message.context_management is not None and message.context_management.applied_edits == []
    assert [r.path for r in backend.requests[before:]] == ["/v1/chat/completions"]  # no /tokenize


async def test_cleared_thinking_leaves_the_older_turns_reasoning_out_of_the_chat_request(gateway_url, backend):
    backend.tokenizer = "vllm"
    config = {"edits": [{"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}}]}
    with trio.fail_after(20):
        message = await sdk(gateway_url).beta.messages.create(
            model="text", max_tokens=32, messages=tool_conversation(3, thinking=True), tools=[TOOL, GREP], context_management=config, betas=[EDITS_BETA]
        )
    [applied] = message.context_management.applied_edits  # type: ignore[union-attr]
    assert applied.type == "clear_thinking_20251015" and applied.cleared_thinking_turns == 2  # type: ignore[union-attr]
    sent = [m for m in backend.chat_requests[-1]["messages"] if m["role"] == "assistant"]
    assert "thought 2" in str(sent[-1]) and "thought 0" not in str(sent) and "thought 1" not in str(sent)
