"""Example-based tests of the pure translator: chat chunk dicts in, Responses events out.

No I/O: ids come from a counter (`msg_1`, `fc_2`, ...), the clock is fixed, and
the skeleton is the one the app builds for `{"model": "m", "input": "hi"}`.
Every emitted event and every terminal response is validated against the
Open Responses spec by `run`, so individual tests only state behaviour.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from gateway.streams import ResponseTranslator, usage_from_chat
from gateway.turn.plan import plan_chat_request
from gateway.wire import parse_create_request
from scripted_backend import SCENARIOS, USAGE, call_delta, chunk, usage_chunk
from spec import validate_event, validate_response

Event = dict[str, Any]

CLOCK = 1_700_000_000.0
TERMINAL = {"response.completed", "response.incomplete", "response.failed"}
DONE = b"[DONE]"


class CountingIds:
    """`prefix_1`, `prefix_2`, ...: one counter shared by every prefix."""

    def __init__(self) -> None:
        self._counter = itertools.count(1)

    def __call__(self, prefix: str) -> str:
        return f"{prefix}_{next(self._counter)}"


def skeleton() -> dict[str, Any]:
    request = parse_create_request(b'{"model":"m","input":"hi"}')
    return plan_chat_request(request, response_id="resp_1", created_at=1).response


def make_translator(**options: Any) -> ResponseTranslator:
    return ResponseTranslator(skeleton(), ids=CountingIds(), clock=lambda: CLOCK, **options)


def check(events: list[Event], translator: ResponseTranslator) -> None:
    """Every event and every response in it matches the spec; numbering is contiguous."""
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    for event in events:
        validate_event(event)
        if event["type"] in TERMINAL:
            validate_response(event["response"])
    if translator.done:
        validate_response(translator.response)


def run(script: list[Any], *, end: str = "finish", **options: Any) -> tuple[ResponseTranslator, list[Event]]:
    """Feed a scripted stream (chunk dicts and `[DONE]`) and validate what comes out.

    `end`: "finish" calls finish() after the script (a no-op once `[DONE]` was
    seen), "none" leaves the translator open.
    """
    translator = make_translator(**options)
    events = translator.start()
    for step in script:
        if step == DONE:
            events += translator.finish()
        else:
            events += translator.feed(step)
    if end == "finish":
        events += translator.finish()
    check(events, translator)
    return translator, events


def types(events: list[Event]) -> list[str]:
    return [event["type"] for event in events]


def of_type(events: list[Event], kind: str) -> list[Event]:
    return [event for event in events if event["type"] == kind]


def function_calls(response: dict[str, Any]) -> list[dict[str, Any]]:
    return [item for item in response["output"] if item["type"] == "function_call"]


# --- a plain text reply ---------------------------------------------------------------


def test_a_text_reply_emits_the_whole_event_sequence_in_order():
    translator, events = run(SCENARIOS["text"])

    assert types(events) == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    located = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
    assert events[2]["item"] == {
        "id": "msg_1",
        "type": "message",
        "status": "in_progress",
        "role": "assistant",
        "content": [],
    }
    assert events[3] == {
        "type": "response.content_part.added",
        "sequence_number": 3,
        **located,
        "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []},
    }
    assert [e["delta"] for e in of_type(events, "response.output_text.delta")] == ["Hello", ", world", "!"]
    assert all(e.items() >= located.items() for e in events[4:9])
    assert events[7]["text"] == "Hello, world!"
    assert events[8]["part"] == {"type": "output_text", "text": "Hello, world!", "annotations": [], "logprobs": []}
    assert events[9]["item"]["status"] == "completed"


def test_a_text_reply_ends_with_a_completed_response_holding_the_message_and_usage():
    translator, events = run(SCENARIOS["text"])

    final = events[-1]["response"]
    assert final == translator.response
    assert final["id"] == "resp_1"
    assert final["status"] == "completed"
    assert final["completed_at"] == int(CLOCK)
    assert final["incomplete_details"] is None
    assert final["error"] is None
    assert final["output"] == [
        {
            "id": "msg_1",
            "type": "message",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Hello, world!", "annotations": [], "logprobs": []}],
        }
    ]
    assert final["usage"] == {
        "input_tokens": 11,
        "output_tokens": 7,
        "total_tokens": 18,
        "input_tokens_details": {"cached_tokens": 3},
        "output_tokens_details": {"reasoning_tokens": 2},
    }


def test_created_and_in_progress_carry_an_in_progress_response_with_no_output():
    _, events = run(SCENARIOS["text"])

    for event in events[:2]:
        assert event["response"]["status"] == "in_progress"
        assert event["response"]["output"] == []
        assert event["response"]["usage"] is None
        assert event["response"]["completed_at"] is None


def test_snapshots_already_sent_are_not_changed_by_later_events():
    _, events = run(SCENARIOS["text"])

    assert events[0]["response"]["status"] == "in_progress"
    assert events[0]["response"]["output"] == []
    assert events[2]["item"]["status"] == "in_progress"
    assert events[2]["item"]["content"] == []


# --- reasoning --------------------------------------------------------------------------


def test_reasoning_content_becomes_a_reasoning_item_before_the_message():
    translator, events = run(SCENARIOS["reasoning"])

    assert types(events)[2:10] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
    ]
    assert events[2]["item"] == {"id": "rs_1", "type": "reasoning", "summary": [], "content": []}
    assert [e["delta"] for e in of_type(events, "response.reasoning_text.delta")] == ["Let me ", "think."]
    assert of_type(events, "response.reasoning_text.done")[0]["text"] == "Let me think."
    reasoning, message = translator.response["output"]
    assert reasoning == {
        "id": "rs_1",
        "type": "reasoning",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": "Let me think."}],
    }
    assert message["id"] == "msg_2"
    assert message["content"][0]["text"] == "The answer is 4."
    assert [e["output_index"] for e in of_type(events, "response.output_item.added")] == [0, 1]


def test_the_reasoning_field_is_read_like_reasoning_content():
    translator, events = run(SCENARIOS["reasoning-field"])

    assert [e["delta"] for e in of_type(events, "response.reasoning_text.delta")] == ["Hmm."]
    assert [item["type"] for item in translator.response["output"]] == ["reasoning", "message"]


def test_reasoning_events_spec_uses_the_response_reasoning_event_names():
    _, events = run(SCENARIOS["reasoning"], reasoning_events="spec")

    names = types(events)
    assert names.count("response.reasoning.delta") == 2
    assert names.count("response.reasoning.done") == 1
    assert not [name for name in names if name.startswith("response.reasoning_text.")]
    assert of_type(events, "response.reasoning.done")[0]["text"] == "Let me think."


def test_reasoning_after_text_closes_the_message_and_opens_a_new_item():
    translator, events = run([chunk({"content": "A"}), chunk({"reasoning_content": "B"}), chunk({"content": "C"})])

    assert [(item["type"], item["id"]) for item in translator.response["output"]] == [
        ("message", "msg_1"),
        ("reasoning", "rs_2"),
        ("message", "msg_3"),
    ]


def test_a_failure_during_reasoning_still_delivers_the_reasoning_text():
    translator = make_translator()
    events = translator.start() + translator.feed(chunk({"reasoning_content": "half a thou"}))
    events += translator.fail("backend_stream_ended", "cut")
    check(events, translator)

    assert of_type(events, "response.reasoning_text.done")[0]["text"] == "half a thou"
    assert translator.response["output"][0]["content"] == [{"type": "reasoning_text", "text": "half a thou"}]


# --- refusal ---------------------------------------------------------------------------


def test_refusal_deltas_become_one_refusal_part():
    translator, events = run(SCENARIOS["refusal"])

    assert types(events)[2:9] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.refusal.delta",
        "response.refusal.delta",
        "response.refusal.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    assert events[3]["part"] == {"type": "refusal", "refusal": ""}
    assert of_type(events, "response.refusal.done")[0]["refusal"] == "I can't help with that."
    assert translator.response["output"][0]["content"] == [{"type": "refusal", "refusal": "I can't help with that."}]
    assert translator.response["status"] == "completed"


def test_text_then_refusal_are_two_content_parts_of_one_message():
    translator, events = run([chunk({"content": "Sure. "}), chunk({"refusal": "Actually, no."})])

    assert [e["content_index"] for e in of_type(events, "response.content_part.added")] == [0, 1]
    assert of_type(events, "response.refusal.delta")[0]["content_index"] == 1
    (message,) = translator.response["output"]
    assert message["content"] == [
        {"type": "output_text", "text": "Sure. ", "annotations": [], "logprobs": []},
        {"type": "refusal", "refusal": "Actually, no."},
    ]


# --- tool calls --------------------------------------------------------------------------


def test_parallel_tool_calls_are_keyed_by_index_with_interleaved_argument_deltas():
    translator, events = run(SCENARIOS["parallel-tools"])

    added = of_type(events, "response.output_item.added")
    assert [e["item"] for e in added] == [
        {
            "id": "fc_1",
            "type": "function_call",
            "status": "in_progress",
            "call_id": "call_a",
            "name": "get_weather",
            "arguments": "",
        },
        {
            "id": "fc_2",
            "type": "function_call",
            "status": "in_progress",
            "call_id": "call_b",
            "name": "get_time",
            "arguments": "",
        },
    ]
    argument_deltas = of_type(events, "response.function_call_arguments.delta")
    deltas = [(e["item_id"], e["output_index"], e["delta"]) for e in argument_deltas]
    assert deltas == [("fc_1", 0, '{"city":'), ("fc_1", 0, ' "Paris"}'), ("fc_2", 1, '{"tz": "CET"}')]
    assert [(c["call_id"], c["name"], c["arguments"], c["status"]) for c in function_calls(translator.response)] == [
        ("call_a", "get_weather", '{"city": "Paris"}', "completed"),
        ("call_b", "get_time", '{"tz": "CET"}', "completed"),
    ]
    assert [e["arguments"] for e in of_type(events, "response.function_call_arguments.done")] == [
        '{"city": "Paris"}',
        '{"tz": "CET"}',
    ]


def test_argument_deltas_follow_the_backend_order_when_calls_interleave():
    _, events = run(
        [
            chunk(call_delta(0, id="call_a", name="f", args="[1")),
            chunk(call_delta(1, id="call_b", name="g", args="[2")),
            chunk(call_delta(0, args=",3]")),
            chunk(call_delta(1, args=",4]")),
        ]
    )

    deltas = [(e["item_id"], e["delta"]) for e in of_type(events, "response.function_call_arguments.delta")]
    assert deltas == [("fc_1", "[1"), ("fc_2", "[2"), ("fc_1", ",3]"), ("fc_2", ",4]")]


def test_parallel_tool_calls_at_index_zero_are_told_apart_by_call_id():
    translator, events = run(SCENARIOS["index0-collisions"])

    assert [(c["id"], c["call_id"], c["name"], c["arguments"]) for c in function_calls(translator.response)] == [
        ("fc_1", "call_1", "get_weather", '{"city": "Oslo"}'),
        ("fc_2", "call_2", "get_weather", '{"city": "Rome"}'),
        ("fc_3", "call_3", "get_time", "{}"),
    ]
    assert [e["output_index"] for e in of_type(events, "response.output_item.added")] == [0, 1, 2]


def test_the_legacy_function_call_delta_becomes_a_function_call_item():
    translator, events = run(SCENARIOS["legacy-function-call"])

    (call,) = function_calls(translator.response)
    assert call["id"] == "fc_1"
    assert call["name"] == "get_weather"
    assert call["arguments"] == '{"city": "Lima"}'
    assert call["call_id"].startswith("call_")
    assert call["call_id"] != call["id"]
    assert translator.response["status"] == "completed"
    assert [e["delta"] for e in of_type(events, "response.function_call_arguments.delta")] == ['{"city": ', '"Lima"}']


def test_function_call_item_ids_are_distinct_from_call_ids():
    translator, _ = run(SCENARIOS["index0-collisions"])
    calls = function_calls(translator.response)

    item_ids = {c["id"] for c in calls}
    call_ids = {c["call_id"] for c in calls}
    assert all(item_id.startswith("fc_") for item_id in item_ids)
    assert len(item_ids) == len(call_ids) == len(calls)
    assert not item_ids & call_ids


def test_a_call_without_a_backend_id_gets_a_generated_call_id():
    translator, _ = run([chunk(call_delta(0, name="f", args="{}"))])

    (call,) = function_calls(translator.response)
    assert call["id"] == "fc_1"
    assert call["call_id"] == "call_2"


def test_text_followed_by_a_tool_call_closes_the_message_before_the_call_opens():
    translator, events = run(SCENARIOS["text-then-tool"])

    message_done = next(i for i, e in enumerate(events) if e["type"] == "response.output_item.done")
    call_added = next(
        i
        for i, e in enumerate(events)
        if e["type"] == "response.output_item.added" and e["item"]["type"] == "function_call"
    )
    assert message_done < call_added
    assert events[message_done]["item"]["status"] == "completed"
    assert [(item["type"], item["id"]) for item in translator.response["output"]] == [
        ("message", "msg_1"),
        ("function_call", "fc_2"),
    ]
    assert translator.response["output"][1]["call_id"] == "call_x"


def test_arguments_arriving_before_the_name_are_buffered_until_the_item_opens():
    translator, events = run(
        [
            chunk(call_delta(0, id="call_late", args='{"a":')),
            chunk(call_delta(0, args=" 1}")),
            chunk(call_delta(0, name="f")),
            chunk(call_delta(0, args="")),
        ]
    )

    added = of_type(events, "response.output_item.added")
    first_delta = next(i for i, e in enumerate(events) if e["type"] == "response.function_call_arguments.delta")
    assert events.index(added[0]) < first_delta
    assert added[0]["item"]["name"] == "f"
    assert [e["delta"] for e in of_type(events, "response.function_call_arguments.delta")] == ['{"a": 1}']
    assert function_calls(translator.response)[0]["arguments"] == '{"a": 1}'
    assert function_calls(translator.response)[0]["call_id"] == "call_late"


def test_arguments_given_as_an_object_are_sent_as_json_text():
    translator, _ = run([chunk({"function_call": {"name": "f", "arguments": {"x": 1}}})])

    assert function_calls(translator.response)[0]["arguments"] == '{"x":1}'


def test_allowed_tools_suppresses_calls_to_other_functions():
    translator, events = run(SCENARIOS["parallel-tools"], allowed_tools={"get_time"})

    calls = function_calls(translator.response)
    assert [(c["name"], c["call_id"], c["arguments"]) for c in calls] == [("get_time", "call_b", '{"tz": "CET"}')]
    assert calls[0]["id"] == "fc_1"
    assert translator.suppressed_calls == ["get_weather"]
    assert [e["output_index"] for e in of_type(events, "response.output_item.added")] == [0]
    assert all(e["item_id"] == "fc_1" for e in of_type(events, "response.function_call_arguments.delta"))


def test_an_empty_allowed_tools_set_suppresses_every_call():
    translator, events = run(SCENARIOS["index0-collisions"], allowed_tools=set())

    assert translator.response["output"] == []
    assert translator.suppressed_calls == ["get_weather", "get_weather", "get_time"]
    assert types(events) == ["response.created", "response.in_progress", "response.completed"]


def bounded_translator(max_tool_calls: int) -> ResponseTranslator:
    request = parse_create_request(b'{"model":"m","input":"hi","max_tool_calls":%d}' % max_tool_calls)
    response = plan_chat_request(request, response_id="resp_1", created_at=1).response
    return ResponseTranslator(response, ids=CountingIds(), clock=lambda: CLOCK)


def feed_all(translator: ResponseTranslator, chunks: Any) -> list[dict[str, Any]]:
    """Every chunk of a round fed in turn: the events they make."""
    return [event for chunk in chunks for event in translator.feed(chunk)]


def test_calls_beyond_max_tool_calls_are_dropped_as_openai_ignores_them():
    translator = bounded_translator(2)
    events = translator.start() + feed_all(translator, SCENARIOS["index0-collisions"][:-1]) + translator.finish()
    check(events, translator)

    assert [c["call_id"] for c in function_calls(translator.response)] == ["call_1", "call_2"]
    assert translator.suppressed_calls == ["get_time"]
    assert translator.response["max_tool_calls"] == 2


def test_max_tool_calls_counts_the_calls_of_every_round_of_a_response():
    translator = bounded_translator(1)
    events = translator.start() + feed_all(translator, SCENARIOS["text-then-tool"][:-1])
    more, produced = translator.end_round()
    events += more + feed_all(translator, SCENARIOS["parallel-tools"][:-1]) + translator.finish()
    check(events, translator)

    assert [c.call_id for c in produced.calls] == ["call_x"]
    assert [c["call_id"] for c in function_calls(translator.response)] == ["call_x"]
    assert translator.suppressed_calls == ["get_weather", "get_time"]


def test_allowed_tools_still_lets_text_through():
    translator, _ = run(SCENARIOS["text-then-tool"], allowed_tools=set())

    assert [item["type"] for item in translator.response["output"]] == ["message"]


def test_a_call_id_arriving_after_the_item_opened_does_not_change_the_announced_call_id():
    _, events = run([chunk(call_delta(0, name="f", args="{")), chunk(call_delta(0, id="call_x", args="}"))])

    (added,) = of_type(events, "response.output_item.added")
    (done,) = of_type(events, "response.output_item.done")
    assert done["item"]["call_id"] == added["item"]["call_id"] == "call_2"
    assert done["item"]["arguments"] == "{}"


# --- how a response ends -----------------------------------------------------------------


def test_finish_reason_length_ends_incomplete_with_reason_max_output_tokens():
    translator, events = run(SCENARIOS["length"])

    assert events[-1]["type"] == "response.incomplete"
    final = events[-1]["response"]
    assert final["status"] == "incomplete"
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["completed_at"] is None
    assert final["output"][0]["status"] == "incomplete"
    assert of_type(events, "response.output_item.done")[0]["item"]["status"] == "incomplete"
    assert final["output"][0]["content"][0]["text"] == "This answer is cut"
    assert final["usage"]["total_tokens"] == 18
    assert translator.finish_reason == "length"


def test_finish_reason_length_inside_a_tool_call_leaves_the_call_incomplete():
    translator, events = run(SCENARIOS["length-in-tool"])

    assert events[-1]["type"] == "response.incomplete"
    (call,) = function_calls(translator.response)
    assert call["status"] == "incomplete"
    assert call["arguments"] == '{"city": "Ber'


def test_finish_reason_content_filter_ends_incomplete_with_reason_content_filter():
    translator, events = run(SCENARIOS["content-filter"])

    assert events[-1]["type"] == "response.incomplete"
    assert translator.response["incomplete_details"] == {"reason": "content_filter"}
    assert translator.response["output"][0]["status"] == "incomplete"


@pytest.mark.parametrize("reason", ["stop", "tool_calls", "function_call", "something_new"])
def test_other_finish_reasons_complete_normally(reason):
    translator, events = run([chunk({"content": "x"}), chunk(finish=reason)])

    assert events[-1]["type"] == "response.completed"
    assert translator.response["output"][0]["status"] == "completed"


def test_done_without_a_finish_reason_completes():
    translator, events = run(SCENARIOS["done-no-finish"], end="none")

    assert translator.done
    assert events[-1]["type"] == "response.completed"
    assert translator.finish_reason is None
    assert translator.response["output"][0]["content"][0]["text"] == "No finish reason"


def test_an_error_chunk_emits_error_then_response_failed_and_nothing_after():
    error = {
        "error": {"message": "Context too long.", "type": "invalid_request_error", "code": "context_length_exceeded"}
    }
    script = [chunk({"content": "Partial"}), error, chunk({"content": "more"}), chunk(finish="stop")]
    translator, events = run(script, end="none")

    assert types(events)[-2:] == ["error", "response.failed"]
    assert of_type(events, "response.output_text.delta")[-1]["delta"] == "Partial"
    error_event = events[-2]
    assert error_event["code"] == "context_length_exceeded"
    assert error_event["message"] == "Context too long."
    assert error_event["error"]["code"] == "context_length_exceeded"
    assert error_event["error"]["message"] == "Context too long."
    final = events[-1]["response"]
    assert final["status"] == "failed"
    assert final["error"] == {"code": "context_length_exceeded", "message": "Context too long."}
    assert final["output"][0]["status"] == "incomplete"
    assert translator.done
    assert translator.finish() == []
    assert translator.fail("late", "too late") == []


def test_an_error_chunk_with_an_http_status_as_code_is_reported_as_a_backend_stream_error():
    translator, events = run(SCENARIOS["error-mid-stream"], end="none")

    assert events[-2]["code"] == "backend_stream_error"
    assert events[-2]["message"] == "the model crashed"
    assert translator.response["error"] == {"code": "backend_stream_error", "message": "the model crashed"}


def test_fail_after_partial_text_marks_the_message_incomplete():
    translator = make_translator()
    events = translator.start() + translator.feed(chunk({"content": "Cut"}))
    events += translator.fail("backend_stream_ended", "the backend closed the stream", type="server_error")
    check(events, translator)

    assert types(events)[-5:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "error",
        "response.failed",
    ]
    assert events[-3]["item"]["status"] == "incomplete"
    assert translator.response["output"] == [
        {
            "id": "msg_1",
            "type": "message",
            "status": "incomplete",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Cut", "annotations": [], "logprobs": []}],
        }
    ]
    assert translator.response["error"]["code"] == "backend_stream_ended"
    assert translator.response["completed_at"] is None


def test_fail_during_a_tool_call_marks_the_call_incomplete():
    translator = make_translator()
    events = translator.start() + translator.feed(chunk(call_delta(0, id="call_1", name="f", args='{"a"')))
    events += translator.fail("backend_stream_ended", "cut")
    check(events, translator)

    assert function_calls(translator.response)[0]["status"] == "incomplete"
    assert function_calls(translator.response)[0]["arguments"] == '{"a"'


def test_fail_before_any_chunk_starts_the_response_first():
    translator = make_translator()
    events = translator.fail("backend_unavailable", "no backend")
    check(events, translator)

    assert types(events) == ["response.created", "response.in_progress", "error", "response.failed"]
    assert translator.response["output"] == []


def test_finish_with_no_output_completes_an_empty_response():
    translator = make_translator()
    events = translator.finish()
    check(events, translator)

    assert types(events) == ["response.created", "response.in_progress", "response.completed"]
    assert translator.response["output"] == []
    assert translator.response["usage"]["total_tokens"] == 0


def test_calls_after_the_terminal_event_return_nothing():
    translator, events = run(SCENARIOS["text"])
    final = dict(translator.response)

    assert translator.start() == []
    assert translator.feed(chunk({"content": "late"})) == []
    assert translator.feed({"error": {"message": "late"}}) == []
    assert translator.finish() == []
    assert translator.fail("late", "late") == []
    assert translator.response == final


# --- usage ---------------------------------------------------------------------------------


def test_usage_maps_prompt_completion_total_cached_and_reasoning_tokens():
    translator, _ = run(SCENARIOS["reasoning"])

    assert translator.response["usage"] == {
        "input_tokens": USAGE["prompt_tokens"],
        "output_tokens": USAGE["completion_tokens"],
        "total_tokens": USAGE["total_tokens"],
        "input_tokens_details": {"cached_tokens": 3},
        "output_tokens_details": {"reasoning_tokens": 2},
    }


def test_without_backend_usage_the_response_carries_an_estimate():
    # "No finish reason" is 16 characters: about 4 tokens; the input estimate is the caller's.
    translator, events = run(SCENARIOS["done-no-finish"], input_tokens_estimate=7)

    assert translator.response["usage"] == {
        "input_tokens": 7,
        "output_tokens": 4,
        "total_tokens": 11,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 0},
    }
    assert events[-1]["response"]["usage"] == translator.response["usage"]


def test_usage_without_details_or_total_fills_zeros_and_the_sum():
    assert usage_from_chat({"prompt_tokens": 4, "completion_tokens": 5}) == {
        "input_tokens": 4,
        "output_tokens": 5,
        "total_tokens": 9,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 0},
    }


def test_usage_sent_on_the_last_content_chunk_is_kept():
    usage = {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
    translator, _ = run([chunk({"content": "x"}, finish="stop", usage=usage)])

    assert translator.response["usage"]["total_tokens"] == 3


def test_usage_is_kept_when_the_response_fails():
    translator = make_translator()
    events = translator.start() + translator.feed(usage_chunk())
    events += translator.fail("backend_stream_ended", "cut")
    check(events, translator)

    assert translator.response["usage"]["input_tokens"] == 11


# --- life cycle and the skeleton ------------------------------------------------------------


def test_start_is_idempotent():
    translator = make_translator()
    first = translator.start()

    assert types(first) == ["response.created", "response.in_progress"]
    assert translator.start() == []
    assert translator.feed(chunk({"content": "x"}))[0]["sequence_number"] == 2


def test_feed_without_start_opens_the_response_first():
    translator = make_translator()
    events = translator.feed(chunk({"content": "x"}))

    assert types(events)[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert translator.start() == []


def test_chunks_that_carry_nothing_emit_nothing():
    translator = make_translator()
    translator.start()

    empty_chunks: list[Any] = [
        {},
        {"choices": []},
        {"choices": None, "usage": None},
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": None, "tool_calls": None}),
        chunk(),
        {"choices": [{"index": 0, "delta": None, "finish_reason": None}]},
    ]
    for empty in empty_chunks:
        assert translator.feed(empty) == []
    assert translator.response["output"] == []


@pytest.mark.parametrize(
    ("garbage", "named"),
    [
        (None, "a chunk must be a JSON object, not null"),
        ("text", "a chunk must be a JSON object, not a string"),
        ([], "a chunk must be a JSON object, not a list"),
        ({"choices": "oops"}, "'choices' must be a list, not a string"),
        ({"choices": [None]}, "a choice must be an object, not null"),
        ({"choices": [{"delta": "x"}]}, "'delta' must be an object, not a string"),
        (chunk({"content": 42}), "'delta.content' must be a string, not a number"),
        (chunk({"content": {"text": "x"}}), "'delta.content' must be a string, not an object"),
        (chunk({"refusal": ["no"]}), "'delta.refusal' must be a string, not a list"),
        (chunk({"tool_calls": {"index": 0}}), "'delta.tool_calls' must be a list, not an object"),
        (chunk({"tool_calls": ["call"]}), "'delta.tool_calls[]' must be an object, not a string"),
        (chunk({"tool_calls": [{"index": "0"}]}), "'delta.tool_calls[].index' must be an integer, not a string"),
        (chunk({"tool_calls": [{"index": 0, "function": "f"}]}), "'delta.tool_calls[].function' must be an object"),
        (chunk({"tool_calls": [{"index": 0, "function": {"name": 7}}]}), "'delta.tool_calls[].function.name' must be a string"),
        (chunk({"tool_calls": [{"index": 0, "function": {"arguments": 1}}]}), ".function.arguments' must be a string"),
        (chunk(finish=3), "'finish_reason' must be a string, not a number"),
        ({"choices": [], "usage": [1]}, "'usage' must be an object, not a list"),
    ],
)
def test_a_chunk_the_protocol_does_not_allow_fails_the_response_naming_what_was_wrong(garbage: Any, named: str):
    translator = make_translator()
    translator.start()
    translator.feed(chunk({"content": "Hel"}))
    events = translator.feed(garbage)
    assert [e["type"] for e in events][-2:] == ["error", "response.failed"]
    error = events[-2]
    assert error["code"] == "backend_error" and named in error["message"]
    assert translator.response["status"] == "failed"
    assert translator.response["error"]["code"] == "backend_error"
    # What was generated before the bad chunk is kept, marked incomplete.
    assert translator.response["output"][0]["content"][0]["text"] == "Hel"
    assert translator.response["output"][0]["status"] == "incomplete"
    for event in events:
        validate_event(event)


def test_backend_variations_that_clients_meet_are_accepted():
    translator = make_translator()
    events = translator.start()
    events += translator.feed(chunk({"content": [{"type": "text", "text": "Hi"}, {"type": "thinking", "thinking": "x"}]}))
    events += translator.feed({"choices": [{"index": 0, "message": {"content": " there"}, "finish_reason": None}]})
    events += translator.feed(chunk({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "f", "arguments": {"a": 1}}}]}))
    events += translator.feed(chunk(finish="tool_calls"))
    events += translator.finish()
    assert translator.response["status"] == "completed"
    message, call = translator.response["output"]
    assert message["content"][0]["text"] == "Hi there"
    assert call["arguments"] == '{"a":1}'


def test_the_final_response_echoes_the_skeleton_keys():
    expected = skeleton()
    translator, events = run(SCENARIOS["text"])

    final = events[-1]["response"]
    assert list(final) == list(expected)
    changed = {"status", "output", "usage", "completed_at"}
    assert {key: value for key, value in final.items() if key not in changed} == {
        key: value for key, value in expected.items() if key not in changed
    }
    assert final["model"] == "m"
    assert final["created_at"] == 1


def test_every_event_names_the_same_response_id():
    _, events = run(SCENARIOS["parallel-tools"])

    assert {e["response"]["id"] for e in events if "response" in e} == {"resp_1"}


def test_a_function_name_split_across_deltas_is_joined_before_the_item_opens() -> None:
    translator, events = run(
        [
            chunk(call_delta(0, id="call_s", name="get_")),
            chunk(call_delta(0, name="weather")),
            chunk(call_delta(0, args='{"city": "Oslo"}')),
            chunk(finish="tool_calls"),
            DONE,
        ]
    )
    added = [e for e in events if e["type"] == "response.output_item.added"]
    assert [e["item"]["name"] for e in added] == ["get_weather"]
    assert translator.response["output"][0]["name"] == "get_weather"
    assert translator.response["output"][0]["arguments"] == '{"city": "Oslo"}'


def test_a_call_without_arguments_still_opens_and_closes() -> None:
    translator, events = run([chunk(call_delta(0, id="call_n", name="ping")), chunk(finish="tool_calls"), DONE])
    assert types(events)[2:] == [
        "response.output_item.added",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert translator.response["output"][0]["arguments"] == ""


def test_open_items_are_closed_in_output_order() -> None:
    _, events = run(
        [
            chunk(call_delta(0, id="call_a", name="first", args="{}")),
            chunk({"content": "and some text"}),
            chunk(finish="stop"),
            DONE,
        ]
    )
    done = [e["output_index"] for e in events if e["type"] == "response.output_item.done"]
    assert done == sorted(done) == [0, 1]


def test_an_error_chunk_keeps_the_backends_error_type() -> None:
    translator, events = run(
        [chunk({"content": "x"}), {"error": {"message": "bad grammar", "type": "invalid_request_error", "code": "bad_grammar"}}],
        end="none",
    )
    error = next(e for e in events if e["type"] == "error")
    assert (error["error"]["type"], error["code"]) == ("invalid_request_error", "bad_grammar")
    assert translator.response["error"] == {"code": "bad_grammar", "message": "bad grammar"}


def test_default_ids_are_128_random_bits_never_repeated_not_even_by_a_forked_child():
    import os
    import re

    from gateway.streams.translator import random_id

    ids = [random_id("resp") for _ in range(1000)]
    assert len(set(ids)) == 1000 and all(re.fullmatch(r"resp_[0-9a-f]{44}", i) for i in ids)
    read, write = os.pipe()
    pid = os.fork()  # the rest of the parent's read must not be the child's too
    if pid == 0:
        os.write(write, "".join(random_id("c") for _ in range(20)).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = set(re.findall(r"c_[0-9a-f]{44}", os.read(read, 1 << 16).decode()))
    os.close(read)
    parent = {random_id("c") for _ in range(20)}
    assert len(child) == 20 and not child & parent


def test_default_ids_start_with_the_millisecond_so_ids_made_later_sort_later(monkeypatch):
    """A store's index on ids grows at its right edge only if a later id sorts after an earlier one."""
    import re

    from gateway.streams import translator

    clock = iter([1_700_000_000.0015, 1_700_000_000.0025, 1_700_000_001.0, 1_800_000_000.0])
    monkeypatch.setattr(translator, "_wall_clock", lambda: next(clock))
    ids = [translator.random_id("resp") for _ in range(4)]
    assert ids == sorted(ids) and len(set(ids)) == 4
    assert ids[0].startswith(f"resp_{1_700_000_000_001:012x}") and re.fullmatch(r"resp_[0-9a-f]{44}", ids[0])
    assert ids[1].startswith(f"resp_{1_700_000_000_002:012x}")
