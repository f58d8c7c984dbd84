"""Responses request -> Chat Completions request, field by field.

Pure tests of `parse_create_request` and `plan_chat_request`: bytes in, a
chat body and a response skeleton (or an `InvalidRequest`) out.  No server,
no backend, no clock.  Errors are checked by `code` and `param`, never by
their message text.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spec import validate_response

from gateway.errors import InvalidRequest
from gateway.turn.plan import ChatPlan, TranslateOptions, plan_chat_request
from gateway.wire import parse_create_request

RESPONSE_ID = "resp_test"
CREATED_AT = 1_700_000_000

# --- helpers -----------------------------------------------------------------------


def plan(options: TranslateOptions | None = None, **fields: Any) -> ChatPlan:
    """Translate a request made of `fields`, with a model and a one-word input by default."""
    request: dict[str, Any] = {"model": "test-model", "input": "hi"}
    request.update(fields)
    return plan_raw(orjson.dumps(request), options)


def plan_raw(body: bytes, options: TranslateOptions | None = None) -> ChatPlan:
    req = parse_create_request(body)
    if options is None:
        return plan_chat_request(req, response_id=RESPONSE_ID, created_at=CREATED_AT)
    return plan_chat_request(req, response_id=RESPONSE_ID, created_at=CREATED_AT, options=options)


def rejection(**fields: Any) -> InvalidRequest:
    """The 400 a request made of `fields` gets (model and input default as in `plan`)."""
    with pytest.raises(InvalidRequest) as caught:
        plan(**fields)
    return checked_400(caught.value)


def raw_rejection(body: bytes) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        plan_raw(body)
    return checked_400(caught.value)


def checked_400(error: InvalidRequest) -> InvalidRequest:
    assert error.status == 400
    assert error.type == "invalid_request_error"
    assert error.payload()["param"] == error.param
    return error


def messages(**fields: Any) -> list[dict[str, Any]]:
    return plan(**fields).body["messages"]


def user(content: Any = "question") -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": content}


def call(call_id: str, name: str = "lookup", arguments: str = '{"q": 1}') -> dict[str, Any]:
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": arguments}


def output(call_id: str, result: Any = "result") -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": result}


def tool_call(call_id: str, name: str = "lookup", arguments: str = '{"q": 1}') -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def function_tool(name: str, **extra: Any) -> dict[str, Any]:
    return {"type": "function", "name": name, **extra}


TWO_TOOLS = [function_tool("lookup"), function_tool("weather")]


def assert_valid_tool_sequence(chat_messages: list[dict[str, Any]]) -> None:
    """What a strict Chat Completions backend demands of tool messages.

    Every assistant `tool_calls` is followed at once by exactly one tool
    message per call (in any order), every tool message answers a call of
    the assistant message just before it, and no id repeats within one
    message (across messages it may: backends that number ids per response
    call `call_0` in every turn).
    """
    index = 0
    while index < len(chat_messages):
        message = chat_messages[index]
        assert message["role"] != "tool", f"tool message {index} does not follow its call: {chat_messages}"
        index += 1
        calls = message.get("tool_calls")
        if not calls:
            continue
        assert message["role"] == "assistant"
        ids = [c["id"] for c in calls]
        assert len(set(ids)) == len(ids), f"a call id repeats within one message: {ids}"
        answered: list[str] = []
        while index < len(chat_messages) and chat_messages[index]["role"] == "tool":
            answered.append(chat_messages[index]["tool_call_id"])
            index += 1
        assert sorted(answered) == sorted(ids), f"calls {ids} answered by {answered}: {chat_messages}"


def assert_no_nulls_forwarded(body: dict[str, Any]) -> None:
    """No null reaches the backend, except `content` of an assistant message that carries tool calls."""

    def walk(value: Any, path: str) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                if inner is None:
                    allowed = key == "content" and value.get("role") == "assistant" and value.get("tool_calls")
                    assert allowed, f"null forwarded at {path}.{key}"
                walk(inner, f"{path}.{key}")
        elif isinstance(value, list):
            for position, inner in enumerate(value):
                assert inner is not None, f"null forwarded at {path}[{position}]"
                walk(inner, f"{path}[{position}]")

    assert all(value is not None for value in body.values()), body
    walk(body, "body")
    assert not isinstance(body.get("reasoning"), dict), "a reasoning object must not reach a chat backend"


# Every field of CreateResponseBody, set (the skeleton must echo them all).
EVERY_FIELD: dict[str, Any] = {
    "model": "test-model",
    "input": [
        {"type": "message", "role": "developer", "content": "be brief"},
        user([{"type": "input_text", "text": "look"}, {"type": "input_image", "image_url": "data:image/png;base64,AA", "detail": "low"}]),
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "need a lookup"}]},
        call("call_1"),
        output("call_1"),
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "done"}]},
        user("and now?"),
    ],
    "previous_response_id": "resp_previous",
    "include": ["reasoning.encrypted_content"],
    "tools": [
        function_tool("lookup", description="Look a thing up.", parameters={"type": "object", "properties": {"q": {"type": "integer"}}}, strict=True),
        function_tool("weather"),
    ],
    "tool_choice": {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "lookup"}]},
    "metadata": {"ticket": "T-1"},
    "text": {
        "format": {"type": "json_schema", "name": "answer", "description": "The answer.", "schema": {"type": "object"}, "strict": True},
        "verbosity": "low",
    },
    "temperature": 0.5,
    "top_p": 0.9,
    "presence_penalty": 0.25,
    "frequency_penalty": -0.25,
    "parallel_tool_calls": False,
    "stream": True,
    "stream_options": {"include_obfuscation": False},
    "background": False,
    "max_output_tokens": 256,
    "max_tool_calls": 3,
    "reasoning": {"effort": "high", "summary": "concise"},
    "safety_identifier": "user-1234",
    "prompt_cache_key": "cache-key-1",
    "truncation": "disabled",
    "instructions": "Answer in JSON.",
    "store": False,
    "service_tier": "flex",
    "top_logprobs": 5,
}

# --- input -------------------------------------------------------------------------


def test_a_string_input_becomes_exactly_one_user_message() -> None:
    text = "Hello, world — ünïcode and\nnewlines"
    assert messages(input=text) == [{"role": "user", "content": text}]


@pytest.mark.parametrize("with_type", [True, False], ids=["typed", "untyped"])
def test_message_items_are_accepted_with_or_without_a_type(with_type: bool) -> None:
    item: dict[str, Any] = {"role": "user", "content": "hello"}
    if with_type:
        item["type"] = "message"
    assert messages(input=[item]) == [{"role": "user", "content": "hello"}]


@pytest.mark.parametrize(
    ("role", "chat_role"),
    [("user", "user"), ("system", "system"), ("developer", "system"), ("assistant", "assistant")],
)
def test_each_role_reaches_the_backend_as_its_chat_role(role: str, chat_role: str) -> None:
    assert messages(input=[{"role": role, "content": "text"}]) == [{"role": chat_role, "content": "text"}]


def test_text_only_parts_collapse_to_one_string() -> None:
    parts = [{"type": "input_text", "text": "first"}, {"type": "input_text", "text": "second"}]
    assert messages(input=[user(parts)]) == [{"role": "user", "content": "first\nsecond"}]


def test_an_input_image_becomes_an_image_url_part_keeping_its_detail() -> None:
    parts = [
        {"type": "input_text", "text": "what is this?"},
        {"type": "input_image", "image_url": "https://example.com/cat.png", "detail": "high"},
    ]
    assert messages(input=[user(parts)]) == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is this?"},
                {"type": "image_url", "image_url": {"url": "https://example.com/cat.png", "detail": "high"}},
            ],
        }
    ]


def test_an_input_image_without_detail_sends_no_detail() -> None:
    parts = [{"type": "input_image", "image_url": "data:image/png;base64,AA"}]
    (message,) = messages(input=[user(parts)])
    assert message["content"] == [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]


def test_an_input_file_with_file_data_becomes_a_file_part() -> None:
    parts = [{"type": "input_file", "filename": "a.pdf", "file_data": "data:application/pdf;base64,JVBE"}]
    (message,) = messages(input=[user(parts)])
    assert message["content"] == [
        {"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBE", "filename": "a.pdf"}}
    ]


def test_an_input_file_with_only_a_file_url_is_rejected_naming_the_part() -> None:
    parts = [{"type": "input_text", "text": "read"}, {"type": "input_file", "file_url": "https://example.com/a.pdf"}]
    error = rejection(input=[user("first"), user(parts)])
    assert error.code == "invalid_value"
    assert error.param is not None and error.param.startswith("input[1].content[1]")


def test_media_parts_in_a_system_message_are_rejected_naming_the_part() -> None:
    parts = [{"type": "input_image", "image_url": "https://example.com/cat.png"}]
    error = rejection(input=[{"role": "system", "content": parts}])
    assert error.code == "invalid_value"
    assert error.param is not None and error.param.startswith("input[0].content[0]")


def test_assistant_output_text_and_refusal_parts_become_content_and_refusal() -> None:
    parts = [
        {"type": "output_text", "text": "Part one. "},
        {"type": "output_text", "text": "Part two."},
        {"type": "refusal", "refusal": "I won't do the rest."},
    ]
    assert messages(input=[user(), {"role": "assistant", "content": parts}]) == [
        {"role": "user", "content": "question"},
        {"role": "assistant", "content": "Part one. Part two.", "refusal": "I won't do the rest."},
    ]


def test_an_assistant_message_without_a_refusal_sends_no_refusal_key() -> None:
    (_, assistant) = messages(input=[user(), {"role": "assistant", "content": [{"type": "output_text", "text": "ok"}]}])
    assert assistant == {"role": "assistant", "content": "ok"}


# --- instructions --------------------------------------------------------------------


def test_instructions_become_a_leading_system_message_before_the_input() -> None:
    result = plan(instructions="Be terse.", input=[{"role": "system", "content": "later"}, user()])
    assert result.body["messages"] == [
        {"role": "system", "content": "Be terse."},
        {"role": "system", "content": "later"},
        {"role": "user", "content": "question"},
    ]


def test_instructions_are_echoed_in_the_skeleton() -> None:
    assert plan(instructions="Be terse.").response["instructions"] == "Be terse."
    assert plan().response["instructions"] is None


def test_empty_instructions_add_no_message() -> None:
    assert messages(instructions="") == [{"role": "user", "content": "hi"}]


# --- function calls and their outputs ------------------------------------------------


def test_a_call_and_its_output_become_assistant_tool_calls_and_a_tool_message() -> None:
    result = messages(input=[user(), call("call_1"), output("call_1", "42")])
    assert result == [
        {"role": "user", "content": "question"},
        {"role": "assistant", "content": None, "tool_calls": [tool_call("call_1")]},
        {"role": "tool", "tool_call_id": "call_1", "content": "42"},
    ]


def test_parallel_calls_merge_into_one_assistant_message() -> None:
    result = messages(
        input=[user(), call("call_1"), call("call_2", "weather", "{}"), output("call_1", "a"), output("call_2", "b")]
    )
    assert result == [
        {"role": "user", "content": "question"},
        {"role": "assistant", "content": None, "tool_calls": [tool_call("call_1"), tool_call("call_2", "weather", "{}")]},
        {"role": "tool", "tool_call_id": "call_1", "content": "a"},
        {"role": "tool", "tool_call_id": "call_2", "content": "b"},
    ]


def test_an_assistant_text_message_followed_by_calls_merges_into_one_message() -> None:
    result = messages(
        input=[user(), {"role": "assistant", "content": "Let me check."}, call("call_1"), call("call_2"), output("call_1"), output("call_2")]
    )
    assert result[1] == {"role": "assistant", "content": "Let me check.", "tool_calls": [tool_call("call_1"), tool_call("call_2")]}
    assert len(result) == 4
    assert_valid_tool_sequence(result)


def test_an_output_after_an_intervening_user_message_moves_back_to_its_call() -> None:
    result = messages(input=[user("first"), call("call_1"), user("second"), output("call_1")])
    assert [m["role"] for m in result] == ["user", "assistant", "tool", "user"]
    assert result[3] == {"role": "user", "content": "second"}
    assert_valid_tool_sequence(result)


def test_outputs_replayed_in_reverse_order_follow_their_calls() -> None:
    result = messages(input=[user(), call("call_1"), call("call_2"), output("call_2", "b"), output("call_1", "a")])
    assert [m["role"] for m in result] == ["user", "assistant", "tool", "tool"]
    assert_valid_tool_sequence(result)


@pytest.mark.parametrize(
    "items",
    [
        [user(), call("call_1"), output("call_2", "b"), call("call_2"), output("call_1", "a")],
        [user(), output("call_1", "a"), call("call_1")],
    ],
    ids=["output-between-two-calls", "output-before-its-only-call"],
)
def test_an_output_listed_before_its_later_call_ends_up_right_after_that_call(items: list[dict[str, Any]]) -> None:
    result = messages(input=items)
    assert_valid_tool_sequence(result)
    calls = [c for m in result for c in m.get("tool_calls") or ()]
    assert sorted(c["id"] for c in calls) == sorted(i["call_id"] for i in items if i.get("type") == "function_call")
    assert all(c["function"]["name"] == "lookup" for c in calls), "the real call, not a synthetic one"


def test_duplicate_outputs_for_one_call_keep_one() -> None:
    result = messages(input=[user(), call("call_1"), output("call_1", "first"), output("call_1", "second")])
    tools = [m for m in result if m["role"] == "tool"]
    assert len(tools) == 1
    assert tools[0]["content"] == "first"
    assert_valid_tool_sequence(result)


def test_an_output_whose_call_is_absent_gets_a_synthetic_call_before_it() -> None:
    result = messages(input=[user(), output("call_gone", "late result")])
    assert result[0] == {"role": "user", "content": "question"}
    assert result[1]["role"] == "assistant"
    assert [c["id"] for c in result[1]["tool_calls"]] == ["call_gone"]
    assert result[2] == {"role": "tool", "tool_call_id": "call_gone", "content": "late result"}
    assert len(result) == 3
    assert_valid_tool_sequence(result)


def test_an_output_given_as_text_parts_becomes_one_string() -> None:
    parts = [{"type": "input_text", "text": "line one"}, {"type": "output_text", "text": "line two"}]
    result = messages(input=[user(), call("call_1"), output("call_1", parts)])
    assert result[2] == {"role": "tool", "tool_call_id": "call_1", "content": "line one\nline two"}


def test_an_output_given_with_an_image_part_keeps_its_parts() -> None:
    parts = [{"type": "input_text", "text": "see"}, {"type": "input_image", "image_url": "data:image/png;base64,AA"}]
    result = messages(input=[user(), call("call_1"), output("call_1", parts)])
    assert result[2]["role"] == "tool"
    assert result[2]["content"] == [
        {"type": "text", "text": "see"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}},
    ]


# A history a client may replay: each output after its call, anything between.
@st.composite
def _histories(draw: st.DrawFn) -> list[dict[str, Any]]:
    count = draw(st.integers(min_value=1, max_value=4))
    events: list[tuple[str, int]] = []
    for number in range(count):
        events.append(("call", number))
    for number in range(count):
        position = draw(st.integers(min_value=events.index(("call", number)) + 1, max_value=len(events)))
        events.insert(position, ("output", number))
    fillers = draw(st.lists(st.sampled_from(["user", "assistant", "reasoning"]), max_size=4))
    for filler in fillers:
        events.insert(draw(st.integers(min_value=0, max_value=len(events))), (filler, -1))
    items: list[dict[str, Any]] = [user()]
    for kind, number in events:
        if kind == "call":
            items.append(call(f"call_{number}"))
        elif kind == "output":
            items.append(output(f"call_{number}", f"result {number}"))
        elif kind == "user":
            items.append(user("more"))
        elif kind == "assistant":
            items.append({"role": "assistant", "content": "thinking aloud"})
        else:
            items.append({"type": "reasoning", "summary": [{"type": "summary_text", "text": "hmm"}]})
    return items


@settings(max_examples=200, deadline=None)
@given(_histories())
def test_any_history_with_outputs_after_their_calls_gives_a_valid_tool_sequence(items: list[dict[str, Any]]) -> None:
    result = messages(input=items)
    assert_valid_tool_sequence(result)
    calls = [c["id"] for m in result for c in m.get("tool_calls") or ()]
    assert sorted(calls) == sorted(i["call_id"] for i in items if i.get("type") == "function_call")
    assert [m["content"] for m in result if m["role"] == "user"] == [i["content"] for i in items if i.get("role") == "user"]


# --- call ids reused across turns ------------------------------------------------------
# Backends that number call ids per response (llama.cpp, some vLLM tool parsers, Mistral-style
# templates) call `call_0` in every turn: results are matched to calls by position, not by id alone.


def turn_call(turn: int, number: int = 0) -> dict[str, Any]:
    """The `number`th call of response `turn`, from a backend that numbers ids per response."""
    return call(f"call_{number}", arguments=orjson.dumps({"turn": turn, "n": number}).decode())


def turn_output(turn: int, number: int = 0) -> dict[str, Any]:
    return output(f"call_{number}", f"result {turn}.{number}")


def assert_each_result_follows_its_own_call(chat_messages: list[dict[str, Any]]) -> None:
    """A valid tool sequence in which each `result t.n` follows the call made in turn t as number n."""
    assert_valid_tool_sequence(chat_messages)
    owner: dict[str, Any] = {}
    for message in chat_messages:
        if message["role"] == "tool":
            assert message["tool_call_id"] in owner, message
            call_of = owner[message["tool_call_id"]]
            assert message["content"] == f"result {call_of['turn']}.{call_of['n']}", (message, call_of)
        elif message.get("tool_calls"):
            owner = {c["id"]: orjson.loads(c["function"]["arguments"]) for c in message["tool_calls"]}


def test_results_for_a_call_id_reused_in_every_turn_each_follow_their_own_call() -> None:
    result = messages(
        input=[user(), turn_call(0), turn_output(0), user("more"), turn_call(1), turn_output(1), turn_call(2), turn_output(2)]
    )
    assert result == [
        {"role": "user", "content": "question"},
        {"role": "assistant", "content": None, "tool_calls": [tool_call("call_0", arguments='{"turn":0,"n":0}')]},
        {"role": "tool", "tool_call_id": "call_0", "content": "result 0.0"},
        {"role": "user", "content": "more"},
        {"role": "assistant", "content": None, "tool_calls": [tool_call("call_0", arguments='{"turn":1,"n":0}')]},
        {"role": "tool", "tool_call_id": "call_0", "content": "result 1.0"},
        {"role": "assistant", "content": None, "tool_calls": [tool_call("call_0", arguments='{"turn":2,"n":0}')]},
        {"role": "tool", "tool_call_id": "call_0", "content": "result 2.0"},
    ]


def test_reused_ids_with_results_out_of_order_and_messages_between_still_pair_by_turn() -> None:
    items = [
        user(),
        turn_call(0, 0), turn_call(0, 1), turn_output(0, 1), user("meanwhile"), turn_output(0, 0),
        turn_call(1, 0), turn_call(1, 1), {"role": "assistant", "content": "still working"}, turn_output(1, 0), turn_output(1, 1),
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "once more"}]},
        turn_call(2, 1), turn_call(2, 0), user("and?"), turn_output(2, 0), turn_output(2, 1),
    ]
    result = messages(input=items)
    assert_each_result_follows_its_own_call(result)
    assert sum(1 for m in result if m["role"] == "tool") == 6
    assert [m["content"] for m in result if m["role"] == "user"] == ["question", "meanwhile", "and?"]


def test_an_output_listed_before_its_call_in_a_later_turn_answers_that_call() -> None:
    result = messages(input=[user(), turn_call(0), turn_output(0), user("next"), turn_output(1), turn_call(1)])
    assert_each_result_follows_its_own_call(result)
    assert [m["content"] for m in result if m["role"] == "tool"] == ["result 0.0", "result 1.0"]


@pytest.mark.parametrize(
    "items",
    [
        [user(), turn_call(0), turn_output(0), turn_call(1), turn_output(1), turn_output(1)],
        [user(), turn_call(0), turn_output(0), turn_call(1), turn_output(1), user("again"), turn_output(1)],
        [user(), turn_call(0), turn_output(0), turn_output(0), turn_call(1), turn_output(1)],
    ],
    ids=["resent-at-once", "resent-after-a-message", "resent-before-the-next-turn"],
)
def test_a_resent_result_is_dropped_and_not_given_to_another_call_with_its_id(items: list[dict[str, Any]]) -> None:
    result = messages(input=items)
    assert_each_result_follows_its_own_call(result)
    assert [m["content"] for m in result if m["role"] == "tool"] == ["result 0.0", "result 1.0"]
    assert len([m for m in result if m.get("tool_calls")]) == 2, "no synthetic call for a duplicate"


def test_a_result_whose_own_call_is_missing_gets_a_synthetic_call_though_its_id_was_used_before() -> None:
    # The call of turn 1 is gone (an unstored turn); turn 0's call_0 is answered already.
    result = messages(input=[user(), turn_call(0), turn_output(0), user("go on"), output("call_0", "late result")])
    assert_valid_tool_sequence(result)
    assert [m["role"] for m in result] == ["user", "assistant", "tool", "user", "assistant", "tool"]
    assert result[4]["tool_calls"] == [{"id": "call_0", "type": "function", "function": {"name": "function", "arguments": "{}"}}]
    assert result[5] == {"role": "tool", "tool_call_id": "call_0", "content": "late result"}


def test_where_the_stored_history_ends_does_not_change_the_pairing() -> None:
    """`previous_response_id` (and a WebSocket's cache) give the planner history and input apart."""
    from gateway.turn.conversation import to_wire

    items = [user(), turn_call(0), turn_output(0), turn_call(1), turn_output(1), turn_call(2), turn_output(2)]
    whole = messages(input=items)
    assert_each_result_follows_its_own_call(whole)
    req = parse_create_request(orjson.dumps({"model": "test-model", "input": "unused"}))
    for split in range(1, len(items)):
        planned = plan_chat_request(
            req, response_id=RESPONSE_ID, created_at=CREATED_AT, history=to_wire(items[:split]), items=to_wire(items[split:])
        )
        assert planned.body["messages"] == whole, split


# A history from a backend that numbers ids per response: each turn calls call_0..call_k, its
# results follow in any order, anything may come between, and a result may be resent at once
# or at the very end.
@st.composite
def _numbered_histories(draw: st.DrawFn) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [user()]
    resent: list[dict[str, Any]] = []
    fillers = st.sampled_from([None, None, None, "user", "assistant", "reasoning"])
    for turn in range(draw(st.integers(min_value=1, max_value=4))):
        count = draw(st.integers(min_value=1, max_value=3))
        events = [turn_call(turn, n) for n in draw(st.permutations(range(count)))]
        for number in draw(st.permutations(range(count))):
            events.append(turn_output(turn, number))
            if draw(st.booleans()) and draw(st.booleans()):
                (events if draw(st.booleans()) else resent).append(turn_output(turn, number))
        for event in events:
            filler = draw(fillers)
            if filler == "user":
                items.append(user("more"))
            elif filler == "assistant":
                items.append({"role": "assistant", "content": "thinking aloud"})
            elif filler == "reasoning":
                items.append({"type": "reasoning", "summary": [{"type": "summary_text", "text": "hmm"}]})
            items.append(event)
    return items + resent


@settings(max_examples=300, deadline=None)
@given(_numbered_histories())
def test_any_history_with_ids_numbered_per_response_pairs_every_result_with_its_own_call(items: list[dict[str, Any]]) -> None:
    result = messages(input=items)
    assert_each_result_follows_its_own_call(result)
    calls = [(c["id"], c["function"]["arguments"]) for m in result for c in m.get("tool_calls") or ()]
    assert calls == [(i["call_id"], i["arguments"]) for i in items if i.get("type") == "function_call"], "no synthetic call"
    assert len([m for m in result if m["role"] == "tool"]) == len(calls), "each call answered once"


# --- reasoning items -----------------------------------------------------------------


def test_reasoning_content_parts_go_to_the_next_assistant_message() -> None:
    reasoning = {
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": "a summary"}],
        "content": [{"type": "reasoning_text", "text": "step one, "}, {"type": "reasoning_text", "text": "step two"}],
    }
    result = messages(input=[user(), reasoning, {"role": "assistant", "content": "answer"}, user("thanks")])
    assert result == [
        {"role": "user", "content": "question"},
        {"role": "assistant", "content": "answer", "reasoning_content": "step one, step two"},
        {"role": "user", "content": "thanks"},
    ]


def test_a_reasoning_summary_is_used_when_there_is_no_reasoning_text() -> None:
    reasoning = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "summarised"}]}
    result = messages(input=[user(), reasoning, {"role": "assistant", "content": "answer"}])
    assert result[1] == {"role": "assistant", "content": "answer", "reasoning_content": "summarised"}


def test_reasoning_goes_to_the_assistant_message_carrying_the_next_calls() -> None:
    reasoning = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "must look it up"}]}
    result = messages(input=[user(), reasoning, call("call_1"), output("call_1")])
    assert result[1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [tool_call("call_1")],
        "reasoning_content": "must look it up",
    }
    assert_valid_tool_sequence(result)


def test_reasoning_is_dropped_when_the_backend_does_not_take_reasoning_content() -> None:
    reasoning = {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "private"}]}
    result = plan(
        TranslateOptions(forward_reasoning_content=False),
        input=[user(), reasoning, {"role": "assistant", "content": "answer"}, reasoning, call("call_1"), output("call_1")],
    ).body["messages"]
    assert all("reasoning_content" not in m for m in result)
    assert result[1] == {"role": "assistant", "content": "answer"}
    assert_valid_tool_sequence(result)


def test_a_reasoning_item_with_only_encrypted_content_adds_nothing() -> None:
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAAB..."}
    result = messages(input=[user(), reasoning, {"role": "assistant", "content": "answer"}])
    assert result == [{"role": "user", "content": "question"}, {"role": "assistant", "content": "answer"}]


# --- tools ---------------------------------------------------------------------------


def skipped(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The tools the planner said it skipped (its one warning), in order."""
    said = [r.getMessage() for r in caplog.records if r.name == "gateway.plan" and "skipped tools" in r.getMessage()]
    return [name for message in said for name in message.rpartition(": ")[2].split(", ")]


def test_function_tools_become_chat_tools_with_default_parameters(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logging.getLogger("gateway"), "propagate", True)
    caplog.set_level(logging.WARNING, logger="gateway.plan")
    result = plan(tools=[function_tool("lookup")])
    assert result.body["tools"] == [
        {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}
    ]
    assert skipped(caplog) == []


def test_description_parameters_and_strict_are_sent_when_given() -> None:
    parameters = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    result = plan(tools=[function_tool("weather", description="Weather now.", parameters=parameters, strict=False)])
    assert result.body["tools"] == [
        {
            "type": "function",
            "function": {"name": "weather", "parameters": parameters, "description": "Weather now.", "strict": False},
        }
    ]


def test_strict_is_not_sent_when_the_client_does_not_set_it() -> None:
    (tool,) = plan(tools=[function_tool("weather", description="Weather now.")]).body["tools"]
    assert "strict" not in tool["function"]


def test_chat_style_function_tools_are_accepted() -> None:
    parameters = {"type": "object", "properties": {"q": {"type": "string"}}}
    chat_style = {"type": "function", "function": {"name": "lookup", "description": "Find.", "parameters": parameters, "strict": True}}
    result = plan(tools=[chat_style])
    assert result.body["tools"] == [
        {"type": "function", "function": {"name": "lookup", "parameters": parameters, "description": "Find.", "strict": True}}
    ]
    validate_response(result.response)


def test_hosted_tools_are_skipped_listed_and_logged_once(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    # configure_logging() stops "gateway" records at its own handlers; caplog listens at the root.
    monkeypatch.setattr(logging.getLogger("gateway"), "propagate", True)
    caplog.set_level(logging.WARNING, logger="gateway.plan")
    hosted = [{"type": "web_search"}, {"type": "file_search", "vector_store_ids": ["vs_1"]}, {"type": "mcp", "server_label": "x"}]
    result = plan(tools=[hosted[0], function_tool("lookup"), *hosted[1:]])
    assert [t["function"]["name"] for t in result.body["tools"]] == ["lookup"]
    # mcp and web_search are not skipped: the gateway serves them (gateway.turn.tools, gateway.builtins),
    # so translation leaves them out of the chat tools silently; web_search's options are planned.
    assert skipped(caplog) == ["file_search"] and result.web_search is not None
    warnings = [r for r in caplog.records if r.name == "gateway.plan" and r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert [t["name"] for t in result.response["tools"]] == ["lookup"]
    validate_response(result.response)


def test_a_request_with_only_hosted_tools_sends_no_tools(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logging.getLogger("gateway"), "propagate", True)
    caplog.set_level(logging.WARNING, logger="gateway.plan")
    result = plan(tools=[{"type": "web_search"}], tool_choice="auto", parallel_tool_calls=True)
    assert skipped(caplog) == [] and result.web_search is not None  # (offered as the gateway's own, when it has an engine)
    assert not {"tools", "tool_choice", "parallel_tool_calls"} & result.body.keys()


def test_a_function_tool_without_a_name_is_rejected_naming_its_index() -> None:
    error = rejection(tools=[{"type": "web_search"}, {"type": "function", "parameters": {"type": "object"}}])
    assert error.param == "tools[1].name"


# --- tool_choice -----------------------------------------------------------------------


def test_tool_choice_none_is_sent_and_allows_no_calls() -> None:
    result = plan(tools=TWO_TOOLS, tool_choice="none")
    assert result.body["tool_choice"] == "none"
    assert result.allowed_tools == frozenset()
    assert result.response["tool_choice"] == "none"


@pytest.mark.parametrize("choice", ["auto", "required"])
def test_tool_choice_auto_and_required_are_sent_as_given(choice: str) -> None:
    result = plan(tools=TWO_TOOLS, tool_choice=choice)
    assert result.body["tool_choice"] == choice
    assert result.allowed_tools is None
    assert result.response["tool_choice"] == choice


def test_no_tool_choice_sends_none_and_allows_every_tool() -> None:
    result = plan(tools=TWO_TOOLS)
    assert "tool_choice" not in result.body
    assert result.allowed_tools is None
    assert result.response["tool_choice"] == "auto"


def test_tool_choice_naming_a_function_is_sent_in_chat_form_and_allows_only_it() -> None:
    result = plan(tools=TWO_TOOLS, tool_choice={"type": "function", "name": "weather"})
    assert result.body["tool_choice"] == {"type": "function", "function": {"name": "weather"}}
    assert result.allowed_tools == frozenset({"weather"})
    assert len(result.body["tools"]) == 2
    assert result.response["tool_choice"] == {"type": "function", "name": "weather"}
    validate_response(result.response)


def test_tool_choice_naming_an_unknown_function_is_rejected() -> None:
    error = rejection(tools=TWO_TOOLS, tool_choice={"type": "function", "name": "missing"})
    assert error.param == "tool_choice"


@pytest.mark.parametrize("tools", [None, [{"type": "web_search"}]], ids=["no-tools", "only-hosted-tools"])
def test_tool_choice_naming_a_function_is_rejected_when_no_function_tools_are_given(tools: Any) -> None:
    error = rejection(tools=tools, tool_choice={"type": "function", "name": "missing"})
    assert error.param == "tool_choice"


def test_allowed_tools_sends_only_the_subset_with_its_mode() -> None:
    choice = {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "weather"}]}
    result = plan(tools=TWO_TOOLS, tool_choice=choice)
    assert [t["function"]["name"] for t in result.body["tools"]] == ["weather"]
    assert result.body["tool_choice"] == "required"
    assert result.allowed_tools == frozenset({"weather"})
    assert result.response["tool_choice"] == choice
    validate_response(result.response)


def test_allowed_tools_with_mode_none_allows_no_calls() -> None:
    choice = {"type": "allowed_tools", "mode": "none", "tools": [{"type": "function", "name": "lookup"}]}
    result = plan(tools=TWO_TOOLS, tool_choice=choice)
    assert result.body["tool_choice"] == "none"
    assert result.allowed_tools == frozenset()
    validate_response(result.response)


def test_allowed_tools_naming_an_unknown_tool_is_rejected() -> None:
    choice = {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "lookup"}, {"type": "function", "name": "nope"}]}
    error = rejection(tools=TWO_TOOLS, tool_choice=choice)
    assert error.param == "tool_choice.tools[1]"


@pytest.mark.parametrize("tools", [TWO_TOOLS, None], ids=["with-tools", "without-tools"])
def test_an_unknown_tool_choice_string_is_rejected(tools: Any) -> None:
    error = rejection(tools=tools, tool_choice="sometimes")
    assert error.code == "invalid_value"
    assert error.param == "tool_choice"


def test_an_unknown_tool_choice_type_is_rejected() -> None:
    error = rejection(tools=TWO_TOOLS, tool_choice={"type": "telepathy"})
    assert error.param is not None and error.param.startswith("tool_choice")


@pytest.mark.parametrize("choice", ["none", "auto", "required"])
def test_tool_choice_and_parallel_tool_calls_are_not_sent_without_tools(choice: str) -> None:
    body = plan(tool_choice=choice, parallel_tool_calls=False).body
    assert not {"tools", "tool_choice", "parallel_tool_calls"} & body.keys()


@pytest.mark.parametrize("parallel", [True, False])
def test_parallel_tool_calls_is_forwarded_with_tools(parallel: bool) -> None:
    result = plan(tools=TWO_TOOLS, parallel_tool_calls=parallel)
    assert result.body["parallel_tool_calls"] is parallel
    assert result.response["parallel_tool_calls"] is parallel


def test_parallel_tool_calls_is_not_sent_when_unset() -> None:
    assert "parallel_tool_calls" not in plan(tools=TWO_TOOLS).body


# --- text.format ---------------------------------------------------------------------

ANSWER_SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}


def test_a_json_schema_format_becomes_a_json_schema_response_format() -> None:
    result = plan(text={"format": {"type": "json_schema", "name": "answer", "schema": ANSWER_SCHEMA, "strict": True}})
    assert result.body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA, "strict": True},
    }
    assert result.response["text"]["format"]["name"] == "answer"
    assert result.response["text"]["format"]["strict"] is True
    validate_response(result.response)


def test_a_json_schema_format_is_kept_when_tools_are_present() -> None:
    result = plan(tools=TWO_TOOLS, text={"format": {"type": "json_schema", "name": "answer", "schema": ANSWER_SCHEMA}})
    assert result.body["response_format"]["type"] == "json_schema"
    assert result.body["response_format"]["json_schema"]["schema"] == ANSWER_SCHEMA
    assert len(result.body["tools"]) == 2


def test_a_json_object_format_becomes_a_json_object_response_format() -> None:
    result = plan(text={"format": {"type": "json_object"}})
    assert result.body["response_format"] == {"type": "json_object"}
    assert result.response["text"]["format"] == {"type": "json_object"}
    validate_response(result.response)


@pytest.mark.parametrize("text", [{"format": {"type": "text"}}, {"format": None}, {"verbosity": "high"}, None])
def test_a_text_format_sends_no_response_format(text: Any) -> None:
    result = plan(text=text)
    assert "response_format" not in result.body
    assert result.response["text"]["format"] == {"type": "text"}
    validate_response(result.response)


def test_a_json_schema_format_without_a_schema_is_rejected() -> None:
    error = rejection(text={"format": {"type": "json_schema", "name": "answer"}})
    assert error.param == "text.format.schema"


def test_an_unknown_text_format_type_is_rejected() -> None:
    error = rejection(text={"format": {"type": "yaml"}})
    assert error.param == "text.format.type"


# --- sampling and limits -------------------------------------------------------------


def test_max_output_tokens_becomes_max_tokens() -> None:
    result = plan(max_output_tokens=16)
    assert result.body["max_tokens"] == 16
    assert "max_output_tokens" not in result.body
    assert result.response["max_output_tokens"] == 16


def test_max_output_tokens_below_16_is_rejected() -> None:
    error = rejection(max_output_tokens=15)
    assert error.code == "invalid_value"
    assert error.param == "max_output_tokens"


@pytest.mark.parametrize(
    ("name", "value"),
    [("temperature", 0), ("temperature", 2), ("top_p", 0.1), ("presence_penalty", -2), ("frequency_penalty", 1.5)],
)
def test_sampling_parameters_are_forwarded_and_echoed_when_set(name: str, value: float) -> None:
    result = plan(**{name: value})
    assert result.body[name] == value
    assert result.response[name] == value


def test_sampling_parameters_are_not_sent_when_unset() -> None:
    body = plan().body
    assert not {"temperature", "top_p", "presence_penalty", "frequency_penalty", "max_tokens"} & body.keys()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("temperature", -0.1),
        ("temperature", 2.1),
        ("top_p", -0.1),
        ("top_p", 1.1),
        ("presence_penalty", -2.1),
        ("presence_penalty", 2.1),
        ("frequency_penalty", -2.1),
        ("frequency_penalty", 2.1),
        ("top_logprobs", 21),
        ("max_tool_calls", 0),
    ],
)
def test_out_of_range_values_are_rejected_naming_the_parameter(name: str, value: float) -> None:
    error = rejection(**{name: value})
    assert error.code == "invalid_value"
    assert error.param == name


def test_reasoning_effort_becomes_reasoning_effort() -> None:
    result = plan(reasoning={"effort": "low"})
    assert result.body["reasoning_effort"] == "low"
    assert "reasoning" not in result.body
    assert result.response["reasoning"] == {"effort": "low", "summary": None}
    validate_response(result.response)


@pytest.mark.parametrize("reasoning", [{"effort": None, "summary": None}, {}, None])
def test_reasoning_with_only_null_values_sends_nothing_and_echoes_null(reasoning: Any) -> None:
    result = plan(reasoning=reasoning)
    assert "reasoning_effort" not in result.body
    assert "reasoning" not in result.body
    assert result.response["reasoning"] is None
    validate_response(result.response)


def test_a_reasoning_summary_alone_sends_no_effort_but_is_echoed() -> None:
    result = plan(reasoning={"summary": "auto"})
    assert "reasoning_effort" not in result.body
    assert result.response["reasoning"] == {"effort": None, "summary": "auto"}
    validate_response(result.response)


# --- what is echoed but not forwarded, and what is always sent -------------------------


def test_fields_without_a_chat_equivalent_are_echoed_not_forwarded() -> None:
    echoed = {
        "metadata": {"team": "search"},
        "store": False,
        "truncation": "disabled",
        "background": True,
        "previous_response_id": "resp_before",
        "max_tool_calls": 2,
    }
    result = plan(**echoed)
    assert set(result.body) == {"model", "messages", "stream", "stream_options"}
    for name, value in echoed.items():
        assert result.response[name] == value, name
    validate_response(result.response)


def test_fields_with_a_chat_counterpart_are_forwarded_and_echoed() -> None:
    both = {"safety_identifier": "user-1", "prompt_cache_key": "key-1", "service_tier": "priority"}
    result = plan(**both, user="end-user-7")
    for name, value in both.items():
        assert result.body[name] == value, name
        assert result.response[name] == value, name
    assert result.body["user"] == "end-user-7"
    validate_response(result.response)


def test_logprobs_asked_in_include_are_asked_of_the_backend_with_the_number_of_alternatives() -> None:
    result = plan(include=["message.output_text.logprobs"], top_logprobs=3)
    assert (result.body["logprobs"], result.body["top_logprobs"]) == (True, 3)
    assert result.response["top_logprobs"] == 3


def test_logprobs_without_alternatives_send_no_top_logprobs() -> None:
    # llama.cpp answers `top_logprobs: 0` with no log probabilities at all.
    for fields in ({}, {"top_logprobs": 0}):
        body = plan(include=["message.output_text.logprobs"], **fields).body
        assert body["logprobs"] is True and "top_logprobs" not in body


def test_a_number_of_alternatives_alone_asks_for_logprobs() -> None:
    body = plan(top_logprobs=2).body
    assert (body["logprobs"], body["top_logprobs"]) == (True, 2)
    assert "logprobs" not in plan(top_logprobs=0).body


@pytest.mark.parametrize("value", [-1, 21, 100])
def test_top_logprobs_outside_0_to_20_is_rejected_naming_it(value: int) -> None:
    error = rejection(top_logprobs=value)
    assert (error.param, error.code) == ("top_logprobs", "invalid_value")


def test_an_include_value_no_response_can_carry_is_rejected_naming_its_index() -> None:
    error = rejection(include=["reasoning.encrypted_content", "message.output_text.everything"])
    assert (error.param, error.code) == ("include[1]", "invalid_value")


def test_unset_echo_only_fields_take_their_documented_defaults() -> None:
    response = plan().response
    assert response["metadata"] == {}
    assert response["store"] is True
    assert response["background"] is False
    assert response["truncation"] == "disabled"
    assert response["top_logprobs"] == 0
    assert response["parallel_tool_calls"] is True
    assert response["tools"] == []
    assert response["previous_response_id"] is None


@pytest.mark.parametrize(
    "stream_fields",
    [{}, {"stream": True}, {"stream": False}, {"stream": True, "stream_options": {"include_obfuscation": False}}, {"stream_options": None}],
)
def test_the_chat_body_always_streams_with_usage(stream_fields: dict[str, Any]) -> None:
    body = plan(**stream_fields).body
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize(
    "request_fields",
    [
        {},
        {k: v for k, v in EVERY_FIELD.items() if k != "model"},
        {name: None for name in ("previous_response_id", "include", "tools", "tool_choice", "metadata", "text", "temperature", "top_p", "presence_penalty", "frequency_penalty", "parallel_tool_calls", "stream", "stream_options", "background", "max_output_tokens", "max_tool_calls", "reasoning", "safety_identifier", "prompt_cache_key", "truncation", "instructions", "store", "service_tier", "top_logprobs")},
        {"tools": TWO_TOOLS, "reasoning": {"effort": None, "summary": "auto"}, "text": {"format": None, "verbosity": None}},
    ],
    ids=["minimal", "every-field", "every-field-null", "tools-and-null-parts"],
)
def test_the_chat_body_never_carries_a_null_value(request_fields: dict[str, Any]) -> None:
    result = plan(**request_fields)
    assert_no_nulls_forwarded(result.body)


# --- malformed requests ----------------------------------------------------------------


@pytest.mark.parametrize("body", [b"", b"{", b'{"model": "m",}', b"\xff\xfe", b"{'model': 'm'}"])
def test_malformed_json_is_rejected_as_invalid_json(body: bytes) -> None:
    assert raw_rejection(body).code == "invalid_json"


@pytest.mark.parametrize("body", [b"[]", b'"hello"', b"42", b"null", b"true"])
def test_a_body_that_is_not_an_object_is_rejected(body: bytes) -> None:
    assert raw_rejection(body).code == "invalid_json"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"input": [user(5)]}, "input[0].content"),
        ({"input": [user([{"type": "input_text", "text": 5}])]}, "input[0].content[0].text"),
        ({"input": [user(), {"role": "robot", "content": "x"}]}, "input[1].role"),
        ({"input": 5}, "input"),
        ({"input": [user(), {"type": "function_call", "name": "f"}]}, "input[1].call_id"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_p": [1]}, "top_p"),
        ({"reasoning": {"effort": 5}}, "reasoning.effort"),
        ({"reasoning": "high"}, "reasoning"),
        ({"metadata": {"team": 1}}, "metadata.team"),
        ({"tools": {"type": "function"}}, "tools"),
        ({"max_output_tokens": "many"}, "max_output_tokens"),
        ({"truncation": "sometimes"}, "truncation"),
        ({"model": 7}, "model"),
    ],
)
def test_wrong_types_are_rejected_naming_the_parameter(fields: dict[str, Any], param: str) -> None:
    error = rejection(**fields)
    assert error.code in ("invalid_type", "invalid_value", "missing_required_parameter")
    assert error.param == param


@pytest.mark.parametrize("body", [{"input": "hi"}, {"model": None, "input": "hi"}, {"model": "", "input": "hi"}])
def test_a_missing_model_is_rejected_naming_model(body: dict[str, Any]) -> None:
    error = raw_rejection(orjson.dumps(body))
    assert error.code == "missing_required_parameter"
    assert error.param == "model"


@pytest.mark.parametrize("body", [{"model": "m"}, {"model": "m", "input": []}, {"model": "m", "input": None}])
def test_a_request_without_input_is_rejected_naming_input(body: dict[str, Any]) -> None:
    assert raw_rejection(orjson.dumps(body)).param == "input"


def test_an_unknown_input_item_type_is_rejected() -> None:
    error = rejection(input=[user(), {"type": "computer_call", "call_id": "c"}])
    assert error.code == "unsupported_item_type"
    assert error.param == "input[1].type"


@pytest.mark.parametrize(
    "item", [{"type": "item_reference", "id": "msg_1"}, {"id": "msg_1"}], ids=["typed", "untyped"]
)
def test_an_item_reference_is_rejected(item: dict[str, Any]) -> None:
    error = rejection(input=[user(), item])
    assert error.code == "item_not_found"
    assert error.param == "input[1]"


# --- the response skeleton -----------------------------------------------------------


def test_the_skeleton_of_a_minimal_request_is_a_valid_in_progress_response() -> None:
    response = plan().response
    validate_response(response)
    assert response["id"] == RESPONSE_ID
    assert response["created_at"] == CREATED_AT
    assert response["object"] == "response"
    assert response["status"] == "in_progress"
    assert response["output"] == []
    assert response["model"] == "test-model"
    assert response["usage"] is None
    assert response["error"] is None


def test_the_skeleton_of_a_request_setting_every_field_is_valid_and_echoes_it() -> None:
    result = plan_raw(orjson.dumps(EVERY_FIELD))
    response = result.response
    validate_response(response)
    assert response["status"] == "in_progress"
    assert response["output"] == []
    for name in (
        "model", "previous_response_id", "tool_choice", "metadata", "temperature", "top_p", "presence_penalty",
        "frequency_penalty", "parallel_tool_calls", "background", "max_output_tokens", "max_tool_calls",
        "reasoning", "safety_identifier", "prompt_cache_key", "truncation", "instructions", "store",
        "service_tier", "top_logprobs",
    ):
        assert response[name] == EVERY_FIELD[name], name
    assert response["text"] == {
        "format": {"type": "json_schema", "name": "answer", "description": "The answer.", "schema": {"type": "object"}, "strict": True},
        "verbosity": "low",
    }
    assert [t["name"] for t in response["tools"]] == ["lookup", "weather"]

    body = result.body
    assert body["messages"][0] == {"role": "system", "content": "Answer in JSON."}
    assert body["messages"][1] == {"role": "system", "content": "be brief"}
    assert_valid_tool_sequence(body["messages"])
    assert [t["function"]["name"] for t in body["tools"]] == ["lookup"]
    assert body["tool_choice"] == "required"
    assert body["reasoning_effort"] == "high"
    assert body["max_tokens"] == 256
    assert body["parallel_tool_calls"] is False
    assert body["response_format"]["type"] == "json_schema"
    assert body["verbosity"] == "low"
    assert (body["logprobs"], body["top_logprobs"]) == (True, 5)
    assert (body["safety_identifier"], body["prompt_cache_key"], body["service_tier"]) == ("user-1234", "cache-key-1", "flex")
    assert result.allowed_tools == frozenset({"lookup"})
    assert_no_nulls_forwarded(body)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
        ({"reasoning": {"summary": "verbose"}}, "reasoning.summary"),
        ({"text": {"verbosity": "extreme"}}, "text.verbosity"),
    ],
)
def test_a_value_outside_the_spec_enums_is_rejected_rather_than_echoed(fields: dict[str, Any], param: str) -> None:
    try:
        result = plan(**fields)
    except InvalidRequest as error:
        assert checked_400(error).param == param
    else:
        validate_response(result.response)


def test_the_skeleton_is_valid_when_every_optional_field_is_null() -> None:
    nulls = dict.fromkeys(
        ("previous_response_id", "tools", "tool_choice", "metadata", "text", "temperature", "top_p",
         "presence_penalty", "frequency_penalty", "parallel_tool_calls", "max_output_tokens", "max_tool_calls",
         "reasoning", "safety_identifier", "prompt_cache_key", "instructions", "top_logprobs")
    )
    response = plan(**nulls).response
    validate_response(response)
    assert response["reasoning"] is None
    assert response["tool_choice"] == "auto"


async def test_a_string_inputs_wire_item_is_what_its_stored_record_reads_back_as():
    from gateway.turn.conversation import prepare, to_wire

    req = parse_create_request(b'{"model": "m", "input": "Say \\u00e9t\\u00e9, \\"quoted\\"\\n."}')
    prepared = await prepare(None, req, lambda prefix: f"{prefix}_1")
    (record,) = prepared.input_records
    assert record == {
        "id": "msg_1", "type": "message", "role": "user", "status": "completed",
        "content": [{"type": "input_text", "text": 'Say été, "quoted"\n.'}],
    }
    assert prepared.input == to_wire([record])  # built directly, equal to the validated form
    assert prepared.input[0].model_dump() == to_wire([record])[0].model_dump()
