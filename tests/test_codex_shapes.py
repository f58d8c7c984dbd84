"""Request and response shapes Codex CLI uses: custom (freeform) tools, namespaces, replayed history."""

from __future__ import annotations

from typing import Any

import openai

from conftest import parse_sse
from spec import validate_event, validate_response

APPLY_PATCH = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Apply a patch to files.",
    "format": {"type": "grammar", "syntax": "lark", "definition": "start: begin_patch hunk+ end_patch"},
}
CRM = {
    "type": "namespace",
    "name": "crm",
    "description": "Customer records.",
    "tools": [{"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {"id": {"type": "integer"}}}}],
}
SHELL = {"type": "function", "name": "shell", "parameters": {"type": "object", "properties": {"command": {"type": "array"}}}}


async def test_a_custom_tool_is_offered_as_one_string_and_returned_as_a_custom_tool_call(gateway_url, client, backend):
    r = await client.post(gateway_url + "/v1/responses", json={"model": "custom-call", "input": "patch it", "stream": True, "tools": [APPLY_PATCH]})
    frames = parse_sse(r.content)
    for event in frames[:-1]:
        validate_event(event)
    kinds = [f["type"] for f in frames[:-1]]
    assert "response.custom_tool_call_input.done" in kinds and "response.function_call_arguments.delta" not in kinds
    final = frames[-2]["response"]
    validate_response(final)
    call = final["output"][0]
    assert (call["type"], call["name"]) == ("custom_tool_call", "apply_patch")
    assert call["input"] == "*** Begin Patch\n*** Add File: a.txt\n+hi\n*** End Patch"
    offered = backend.chat_requests[-1]["tools"][0]["function"]
    assert offered["name"] == "apply_patch" and offered["parameters"]["required"] == ["input"]
    assert "lark" in offered["parameters"]["properties"]["input"]["description"]


async def test_namespaced_tools_are_flattened_for_the_backend_and_restored_in_calls(gateway_url, client, backend):
    final = (await client.post(gateway_url + "/v1/responses", json={"model": "namespace-call", "input": "x", "tools": [CRM]})).json()
    assert backend.chat_requests[-1]["tools"][0]["function"]["name"] == "crm__lookup"
    call = final["output"][0]
    assert (call["type"], call["namespace"], call["name"], call["arguments"]) == ("function_call", "crm", "lookup", '{"id": 7}')


async def test_a_codex_style_stateless_history_is_replayed_to_the_backend(gateway_url, client, backend):
    history: list[Any] = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix the bug"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque-blob"},
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "shell", "arguments": '{"command": ["ls"]}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "a.txt"},
        {"type": "custom_tool_call", "id": "ctc_1", "call_id": "call_2", "name": "apply_patch", "input": "*** Begin Patch"},
        {"type": "custom_tool_call_output", "call_id": "call_2", "output": "Done!"},
        {"type": "function_call", "call_id": "call_3", "name": "lookup", "namespace": "crm", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_3", "output": "{}"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "and now?"}]},
    ]
    r = await client.post(
        gateway_url + "/v1/responses",
        json={
            "model": "text",
            "instructions": "base instructions",
            "input": history,
            "tools": [SHELL, APPLY_PATCH, CRM, {"type": "web_search"}, {"type": "local_shell"}],
            "store": False,
            "stream": True,
            "include": ["reasoning.encrypted_content"],
            "prompt_cache_key": "conversation-1",
            "reasoning": {"effort": "medium", "summary": "auto"},
            "parallel_tool_calls": False,
        },
        headers={"originator": "codex_cli_rs", "session_id": "s-1", "openai-beta": "responses=experimental"},
    )
    assert r.status_code == 200
    frames = parse_sse(r.content)
    assert frames[-2]["type"] == "response.completed" and frames[-2]["response"]["usage"]["total_tokens"] > 0
    messages = backend.chat_requests[-1]["messages"]
    roles = [m["role"] for m in messages]
    assert roles == ["system", "system", "user", "assistant", "tool", "assistant", "tool", "assistant", "tool", "user"]
    assert messages[5]["tool_calls"][0]["function"] == {"name": "apply_patch", "arguments": '{"input":"*** Begin Patch"}'}
    assert messages[7]["tool_calls"][0]["function"]["name"] == "crm__lookup"
    names = [t["function"]["name"] for t in backend.chat_requests[-1]["tools"]]
    assert names == ["shell", "apply_patch", "crm__lookup"]


async def test_the_sdk_stream_helper_accepts_custom_tool_calls(gateway_url):
    sdk = openai.AsyncOpenAI(base_url=gateway_url + "/v1", api_key="x", max_retries=0)
    async with sdk.responses.stream(model="custom-call", input="x", tools=[APPLY_PATCH]) as stream:
        async for _ in stream:
            pass
        final = await stream.get_final_response()
    assert final.output[0].type == "custom_tool_call" and final.output[0].input.startswith("*** Begin Patch")


async def test_a_stateless_codex_session_over_three_turns(gateway_url, client, backend):
    """Codex sends store: false and the whole history each turn, reasoning sealed, tools its own."""
    common = {"store": False, "include": ["reasoning.encrypted_content"], "tools": [SHELL, APPLY_PATCH], "instructions": "You are Codex."}
    history: list[Any] = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "think first"}]}]

    one = (await client.post(gateway_url + "/v1/responses", json={"model": "reasoning", "input": history, **common})).json()
    history += one["output"]
    history.append({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "now patch"}]})

    two = (await client.post(gateway_url + "/v1/responses", json={"model": "custom-call", "input": history, **common})).json()
    patch = two["output"][0]
    assert patch["type"] == "custom_tool_call"
    history += two["output"]
    history.append({"type": "custom_tool_call_output", "call_id": patch["call_id"], "output": "Success. Updated a.txt"})

    three = (await client.post(gateway_url + "/v1/responses", json={"model": "text", "input": history, **common})).json()
    assert three["status"] == "completed" and three["usage"]["total_tokens"] > 0
    messages = backend.chat_requests[-1]["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant", "tool"]
    assert messages[2]["reasoning_content"] == "Let me think."  # opened from the sealed reasoning
    assert messages[4]["tool_calls"][0]["function"]["name"] == "apply_patch"
    assert messages[5] == {"role": "tool", "tool_call_id": patch["call_id"], "content": "Success. Updated a.txt"}
