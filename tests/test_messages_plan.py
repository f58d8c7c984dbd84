"""The Messages request mapping (`gateway.turn.messages_plan`), pure: what a chat backend and an
Anthropic backend are sent for an Anthropic Messages request, and the 400s of its intake."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.backends.anthropic import messages_request
from gateway.errors import InvalidRequest
from gateway.turn.messages_plan import chat_request, native_body, reasoning_effort, unmapped
from gateway.wire.messages import parse_count_request, parse_messages_request

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "claude_code"


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}], **fields}


def parsed(data: dict[str, Any]) -> dict[str, Any]:
    return parse_messages_request(orjson.dumps(data))


# --- system prompts and messages --------------------------------------------------------


def test_a_system_prompt_in_blocks_leads_and_a_system_message_among_the_others_keeps_its_place():
    request = body(
        system=[{"type": "text", "text": "You are terse."}, {"type": "text", "text": "Answer in French.", "cache_control": {"type": "ephemeral", "ttl": "1h", "scope": "global"}}],
        messages=[
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "salut"},
            {"role": "system", "content": "From now on, answer in German."},
            {"role": "user", "content": "again"},
        ],
    )
    chat = chat_request(parsed(request))
    assert chat["messages"] == [
        {"role": "system", "content": "You are terse.\n\nAnswer in French."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "salut"},
        {"role": "system", "content": "From now on, answer in German."},
        {"role": "user", "content": "again"},
    ]


def test_images_by_data_and_by_url_and_documents_become_chat_parts():
    request = body(
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Compare these."},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
                    {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}},
                    {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "Plain notes."}, "title": "Notes"},
                    {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0x"}, "title": "paper.pdf"},
                    {"type": "document", "source": {"type": "content", "content": [{"type": "text", "text": "Inline."}]}},
                    {"type": "document", "source": {"type": "url", "url": "https://example.com/a.pdf"}},
                ],
            }
        ]
    )
    [message] = chat_request(parsed(request))["messages"]
    assert message["content"] == [
        {"type": "text", "text": "Compare these."},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}},
        {"type": "text", "text": "Notes\nPlain notes."},
        {"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBERi0x", "filename": "paper.pdf"}},
        {"type": "text", "text": "Inline."},
        # A document the backend cannot be handed: the model is told it is there, not misled.
        {"type": "text", "text": "[document not available to this model: https://example.com/a.pdf]"},
    ]


def test_tool_use_and_tool_results_become_calls_and_tool_messages_in_order_with_errors_shown():
    request = body(
        messages=[
            {"role": "user", "content": "Weather in Paris and Oslo?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "Two cities.", "signature": "sig-1"},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_a", "name": "get_weather", "input": {"city": "Paris"}},
                    {"type": "tool_use", "id": "toolu_b", "name": "get_weather", "input": {"city": "Oslo"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_a", "content": "18C"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_b",
                        "is_error": True,
                        "content": [
                            {"type": "text", "text": "station offline"},
                            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
                        ],
                    },
                    {"type": "text", "text": "Also, be brief."},
                ],
            },
        ]
    )
    messages = chat_request(parsed(request))["messages"]
    assert messages[1] == {
        "role": "assistant",
        "content": "Checking.",
        "reasoning_content": "Two cities.",
        "reasoning_signature": "sig-1",
        "tool_calls": [
            {"id": "toolu_a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
            {"id": "toolu_b", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}},
        ],
    }
    assert messages[2:] == [
        {"role": "tool", "tool_call_id": "toolu_a", "content": "18C"},
        {"role": "tool", "tool_call_id": "toolu_b", "content": "Error: station offline"},
        # A tool message holds only text: the result's image follows, with the user's own text.
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                {"type": "text", "text": "Also, be brief."},
            ],
        },
    ]


def test_an_assistant_turn_of_only_tool_calls_has_no_content():
    request = body(
        messages=[
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "run", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1"}]},
        ]
    )
    messages = chat_request(parsed(request))["messages"]
    assert messages[1]["content"] is None and messages[1]["tool_calls"][0]["function"]["arguments"] == "{}"
    assert messages[2] == {"role": "tool", "tool_call_id": "toolu_1", "content": ""}


def test_blocks_a_chat_backend_cannot_read_are_left_out_of_the_chat_request():
    request = body(
        messages=[
            {"role": "user", "content": "search"},
            {
                "role": "assistant",
                "content": [
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "x"}},
                    {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []},
                    {"type": "text", "text": "Found it."},
                ],
            },
        ]
    )
    assert chat_request(parsed(request))["messages"][1] == {"role": "assistant", "content": "Found it."}


# --- tools and settings -----------------------------------------------------------------


def test_tools_become_functions_without_what_chat_backends_refuse_and_anthropics_own_tools_stay_out():
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
        "additionalProperties": False,
    }
    request = body(
        tools=[
            {"name": "Bash", "description": "Run a command", "input_schema": schema, "cache_control": {"type": "ephemeral"}},
            {"name": "Later", "input_schema": {"type": "object"}, "defer_loading": True},
            {"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
            {"type": "custom", "name": "Mine", "input_schema": {"type": "object", "properties": {}}},
        ]
    )
    tools = chat_request(parsed(request))["tools"]
    assert tools == [
        {
            "type": "function",
            "function": {
                "name": "Bash",
                "parameters": {k: v for k, v in schema.items() if k != "$schema"},
                "description": "Run a command",
            },
        },
        # A deferred tool is still the client's: the model may call it.
        {"type": "function", "function": {"name": "Later", "parameters": {"type": "object", "properties": {}}}},
        {"type": "function", "function": {"name": "Mine", "parameters": {"type": "object", "properties": {}}}},
    ]


@pytest.mark.parametrize(
    ("choice", "expected", "parallel"),
    [
        ({"type": "auto"}, "auto", None),
        ({"type": "any"}, "required", None),
        ({"type": "tool", "name": "Bash"}, {"type": "function", "function": {"name": "Bash"}}, None),
        ({"type": "none"}, "none", None),
        ({"type": "auto", "disable_parallel_tool_use": True}, "auto", False),
        ({"type": "any", "disable_parallel_tool_use": True}, "required", False),
    ],
)
def test_tool_choice_and_parallel_calls_map_to_chats(choice: dict[str, Any], expected: Any, parallel: Any):
    tools = [{"name": "Bash", "input_schema": {"type": "object"}}]
    chat = chat_request(parsed(body(tools=tools, tool_choice=choice)))
    assert chat["tool_choice"] == expected
    assert chat.get("parallel_tool_calls") == parallel


def test_without_tools_no_tool_choice_is_sent():
    chat = chat_request(parsed(body(tool_choice={"type": "auto"})))
    assert "tools" not in chat and "tool_choice" not in chat


def test_generation_settings_are_forwarded():
    chat = chat_request(parsed(body(max_tokens=300, stop_sequences=["END", "###"], temperature=0.2, top_p=0.9, top_k=40)))
    assert chat["max_tokens"] == 300 and chat["stop"] == ["END", "###"]
    assert (chat["temperature"], chat["top_p"], chat["top_k"]) == (0.2, 0.9, 40)
    assert "stream" not in chat  # the session's, which always streams


@pytest.mark.parametrize(
    ("fields", "effort"),
    [
        ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "low"),
        ({"thinking": {"type": "enabled", "budget_tokens": 8000}}, "medium"),
        ({"thinking": {"type": "enabled", "budget_tokens": 32000}}, "high"),
        ({"thinking": {"type": "adaptive"}, "output_config": {"effort": "low"}}, "low"),
        ({"thinking": {"type": "adaptive"}, "output_config": {"effort": "max"}}, "high"),
        ({"thinking": {"type": "adaptive"}}, None),
        ({"thinking": {"type": "disabled"}}, None),
        ({}, None),
    ],
)
def test_thinking_becomes_the_chat_backends_reasoning_switch(fields: dict[str, Any], effort: str | None):
    assert reasoning_effort(fields) == effort
    assert chat_request(parsed(body(**fields))).get("reasoning_effort") == effort


def test_a_json_schema_output_format_becomes_a_response_format():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    chat = chat_request(parsed(body(output_config={"format": {"type": "json_schema", "schema": schema}})))
    assert chat["response_format"] == {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}


def test_fields_a_chat_backend_does_not_get_are_named_for_the_debug_line():
    request = body(metadata={"user_id": "u"}, context_management={"edits": []}, service_tier="auto", container="c")
    assert unmapped(parsed(request)) == ["container", "context_management", "metadata", "service_tier"]


# --- the native body --------------------------------------------------------------------


def test_an_anthropic_backend_gets_the_clients_body_untouched_but_for_stream():
    request = body(
        stream=True,
        system=[{"type": "text", "text": "S", "cache_control": {"type": "ephemeral", "ttl": "1h", "scope": "global"}}],
        messages=[
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "sig"}, {"type": "text", "text": "ok"}]},
            {"role": "user", "content": [{"type": "text", "text": "more", "cache_control": {"type": "ephemeral"}}]},
        ],
        context_management={"edits": [{"type": "clear_thinking_20251015"}]},
        metadata={"user_id": '{"device_id":"d"}'},
        thinking={"type": "adaptive"},
    )
    native = native_body(parsed(request))
    assert native == {k: v for k, v in request.items() if k != "stream"}


def test_a_system_message_among_the_others_reaches_an_anthropic_backend_as_user_text_in_its_place():
    request = body(
        messages=[
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {"role": "system", "content": "Be formal."},
            {"role": "user", "content": [{"type": "text", "text": "next"}]},
        ]
    )
    native = native_body(parsed(request))
    assert native["messages"] == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": [{"type": "text", "text": "Be formal."}, {"type": "text", "text": "next"}]},
    ]


# --- what Claude Code sends -------------------------------------------------------------


@pytest.mark.parametrize("name", ["request_tool_turn.json", "request_tool_result_turn.json"])
def test_claude_codes_own_requests_are_read_and_mapped(name: str):
    path = FIXTURES / name
    if not path.exists():
        pytest.skip(f"{name} was not captured")
    raw = path.read_bytes()
    request = parse_messages_request(raw)
    chat = chat_request(request)
    assert chat["model"] == request["model"] and chat["max_tokens"] == request["max_tokens"]
    assert len(chat["tools"]) == len([t for t in request["tools"] if t.get("type") in (None, "custom")])
    assert all("$schema" not in tool["function"]["parameters"] for tool in chat["tools"])
    assert chat["messages"][0]["role"] == "system"
    assert native_body(request)["messages"]  # and the native body stays a valid request
    json.dumps(chat)  # plain JSON all the way down


# --- the intake's 400s ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "param"),
    [
        ({"model": "m", "max_tokens": 5}, "messages"),
        ({"model": "m", "max_tokens": 5, "messages": []}, "messages"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}, "model"),
        ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "bogus"}]}]}, "messages.0.content.0.type"),
        ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"text": "no type"}]}]}, "messages.0.content.0.type"),
        ({"model": "m", "max_tokens": 5, "messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
        ({"model": "m", "max_tokens": "5", "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        (
            {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "r"}]}]},
            "messages.0.content.0.tool_use_id",
        ),
        (
            {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "data": "x"}}]}]},
            "messages.0.content.0.source.media_type",
        ),
        ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "tool"}}, "tool_choice.name"),
        ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tools": [{"input_schema": {}}]}, "tools.0.name"),
    ],
)
def test_a_request_that_cannot_be_mapped_is_a_400_naming_the_field(data: dict[str, Any], param: str):
    with pytest.raises(InvalidRequest) as caught:
        parse_messages_request(orjson.dumps(data))
    assert caught.value.param == param
    assert caught.value.message.startswith(param + ":")


@pytest.mark.parametrize("raw", [b"[1, 2]", b'"text"', b"not json", b"{" * 100 + b"}" * 100])
def test_a_body_that_is_not_a_json_object_of_sane_depth_is_a_400(raw: bytes):
    with pytest.raises(InvalidRequest):
        parse_messages_request(raw)


def test_a_count_needs_no_max_tokens_but_is_checked_as_a_message():
    assert parse_count_request(b'{"model": "m", "messages": [{"role": "user", "content": "x"}]}')["model"] == "m"
    with pytest.raises(InvalidRequest) as caught:
        parse_count_request(b'{"model": "m", "messages": [{"role": "user", "content": [{"type": "nope"}]}]}')
    assert caught.value.param == "messages.0.content.0.type"


def test_fields_no_one_defines_are_accepted():
    request = body(some_future_field={"x": 1}, messages=[{"role": "user", "content": [{"type": "text", "text": "x", "citations": None, "new": 1}]}])
    assert parsed(request)["some_future_field"] == {"x": 1}


# --- the mirror of the Anthropic adapter ------------------------------------------------

_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12)
_inputs = st.dictionaries(st.sampled_from(["city", "n", "q"]), st.one_of(st.integers(-5, 5), _text), max_size=2)


@st.composite
def conversations(draw: Any) -> list[dict[str, Any]]:
    """User and assistant turns as Anthropic takes them: text, signed thinking, tool calls, and
    their results first in the next user turn."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": draw(_text)}]
    calls = 0
    for _ in range(draw(st.integers(0, 3))):
        blocks: list[dict[str, Any]] = []
        if draw(st.booleans()):
            blocks.append({"type": "thinking", "thinking": draw(_text), "signature": draw(_text)})
        if draw(st.booleans()):
            blocks.append({"type": "text", "text": draw(_text)})
        ids = []
        for _ in range(draw(st.integers(0 if blocks else 1, 2))):
            calls += 1
            ids.append(f"toolu_{calls}")
            blocks.append({"type": "tool_use", "id": ids[-1], "name": draw(st.sampled_from(["a", "b"])), "input": draw(_inputs)})
        messages.append({"role": "assistant", "content": blocks})
        answer: list[dict[str, Any]] = [{"type": "tool_result", "tool_use_id": i, "content": draw(_text)} for i in ids]
        if draw(st.booleans()) or not answer:
            answer.append({"type": "text", "text": draw(_text)})
        messages.append({"role": "user", "content": answer})
    return messages


def _normal(messages: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    out: list[tuple[str, list[dict[str, Any]]]] = []
    for message in messages:
        content = message["content"]
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if out and out[-1][0] == message["role"]:
            out[-1][1].extend(blocks)
        else:
            out.append((message["role"], list(blocks)))
    return out


@settings(max_examples=200, deadline=None)
@given(conversations(), st.one_of(st.none(), _text))
def test_mapped_to_chat_and_back_by_the_anthropic_adapter_a_conversation_is_what_it_was(
    messages: list[dict[str, Any]], system: str | None
):
    request = body(messages=messages, **({"system": system} if system else {}))
    back = messages_request(chat_request(parsed(request)))
    assert back.get("system") == system
    assert _normal(back["messages"]) == _normal(messages)


# --- a prefix the backend can cache ------------------------------------------------------------


def _claude_code(billing: str) -> dict[str, Any]:
    recorded = json.loads((FIXTURES / "request_tool_turn.json").read_text())
    body = recorded.get("body", recorded)
    system = [dict(block) for block in body["system"]]
    system[0]["text"] = f"x-anthropic-billing-header: cc_version=2.1.332.{billing}; cc_entrypoint=sdk-cli;"
    return {**body, "system": system}


def test_claude_codes_billing_header_is_left_out_so_two_requests_of_a_session_share_their_prefix():
    first, second = (chat_request(parse_messages_request(orjson.dumps(_claude_code(suffix)))) for suffix in ("a18", "bf1"))
    system = first["messages"][0]
    assert system["role"] == "system" and "x-anthropic-billing-header" not in system["content"]
    assert system["content"].startswith("You are a Claude agent")  # the instructions that follow keep their place
    assert first["messages"] == second["messages"] and first["tools"] == second["tools"]


def test_an_anthropic_backend_still_gets_the_billing_header_untouched():
    body = _claude_code("a18")
    assert native_body(parse_messages_request(orjson.dumps(body)))["system"][0]["text"].startswith("x-anthropic-billing-header:")


@pytest.mark.parametrize(
    "system, expected",
    [
        ("x-anthropic-billing-header: cc_version=1.2.3.abc;\nYou are helpful.", "You are helpful."),
        ("You are helpful. x-anthropic-billing-header: is quoted here.", "You are helpful. x-anthropic-billing-header: is quoted here."),
        ([{"type": "text", "text": "x-anthropic-billing-header: cc_version=1; with\nmore lines"}], "x-anthropic-billing-header: cc_version=1; with\nmore lines"),
    ],
    ids=["a leading line of a string", "only at the start", "a block of several lines is instructions"],
)
def test_only_a_leading_billing_line_or_block_is_left_out(system, expected):
    body = {"model": "m", "max_tokens": 5, "system": system, "messages": [{"role": "user", "content": "hi"}]}
    assert chat_request(parse_messages_request(orjson.dumps(body)))["messages"][0]["content"] == expected
