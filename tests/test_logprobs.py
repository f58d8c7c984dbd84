"""Log probabilities: `include: ["message.output_text.logprobs"]` and `top_logprobs`.

The planner asks the backend (`logprobs: true`, `top_logprobs: N`); the pure
translator maps each chunk's `choices[0].logprobs.content` into the
`response.output_text.delta` of its text, and all of a part's into
`response.output_text.done`, the `output_text` part and the final response;
a backend that sends none leaves `logprobs` empty, and the session says so
for the shell to log.  First the pure core, then over real sockets with the
scripted backend (`logprobs-if-asked` answers with log probabilities only
when asked, as real backends do).
"""

from __future__ import annotations

import itertools
import logging
from typing import Any

import httpx2
import orjson
import pytest
import trio

from conftest import parse_sse
from gateway.streams import ResponseTranslator
from gateway.streams.chunks import DONE as END_OF_ROUND
from gateway.streams.session import ResponseSession
from gateway.turn.plan import plan_chat_request
from gateway.wire import parse_create_request
from scripted_backend import LOGPROB_TOKENS, SCENARIOS, call_delta, chunk, logprobs_chunk, token_logprob
from spec import check_events, validate_event, validate_response

Event = dict[str, Any]

LOGPROBS = ["message.output_text.logprobs"]
DONE = b"[DONE]"


# --- the pure core ------------------------------------------------------------------------------


def planned(**fields: Any) -> Any:
    request = {"model": "m", "input": "hi", **fields}
    return plan_chat_request(parse_create_request(orjson.dumps(request)), response_id="resp_1", created_at=1)


def translate(script: list[Any], **fields: Any) -> tuple[ResponseSession, list[Event]]:
    """Feed a scripted stream through a session, as a turn does; every event is checked against the spec."""
    plan = planned(**fields)
    counter = itertools.count(1)
    translator = ResponseTranslator(plan.response, ids=lambda prefix: f"{prefix}_{next(counter)}", clock=lambda: 1.0)
    session = ResponseSession(translator, plan.body)
    events = session.start()
    for step in script:
        events += session.feed(END_OF_ROUND if step == DONE else step)
    events += session.end_of_stream()
    check_events(events)
    assert events[-1]["type"] == "response.completed"
    return session, events


def of_type(events: list[Event], kind: str) -> list[Event]:
    return [e for e in events if e["type"] == kind]


def expected(count: int) -> list[dict[str, Any]]:
    """What the client should see for `LOGPROB_TOKENS`, with `count` alternatives each."""
    return [
        {
            "token": token,
            "logprob": logprob,
            "bytes": list(token.encode()),
            "top_logprobs": [{"token": t, "logprob": lp, "bytes": list(t.encode())} for t, lp in alternatives[:count]],
        }
        for token, logprob, alternatives in LOGPROB_TOKENS
    ]


def test_each_text_delta_carries_the_log_probabilities_of_its_own_tokens() -> None:
    _, events = translate(SCENARIOS["logprobs"], include=LOGPROBS, top_logprobs=2)
    deltas = of_type(events, "response.output_text.delta")
    assert [d["delta"] for d in deltas] == [token for token, _, _ in LOGPROB_TOKENS]
    assert [d["logprobs"] for d in deltas] == [[entry] for entry in expected(2)]


def test_the_done_event_the_part_the_item_and_the_final_response_carry_every_token_in_order() -> None:
    session, events = translate(SCENARIOS["logprobs"], include=LOGPROBS, top_logprobs=2)
    everything = expected(2)
    assert of_type(events, "response.output_text.done")[0]["logprobs"] == everything
    assert of_type(events, "response.content_part.added")[0]["part"]["logprobs"] == []
    assert of_type(events, "response.content_part.done")[0]["part"]["logprobs"] == everything
    assert of_type(events, "response.output_item.done")[0]["item"]["content"][0]["logprobs"] == everything
    final = events[-1]["response"]
    assert final["output"][0]["content"][0]["logprobs"] == everything
    assert session.translator.response["output"][0]["content"][0]["logprobs"] == everything
    assert "".join(entry["token"] for entry in everything) == final["output"][0]["content"][0]["text"]
    assert not session.logprobs_missing


@pytest.mark.parametrize("top", [0, 1, 2])
def test_each_tokens_alternatives_are_cut_to_top_logprobs(top: int) -> None:
    five = [chunk({"role": "assistant", "content": ""})]
    five += [logprobs_chunk(t, token_logprob(t, lp, alts)) for t, lp, alts in LOGPROB_TOKENS]
    _, events = translate([*five, chunk(finish="stop"), DONE], include=LOGPROBS, top_logprobs=top)
    assert of_type(events, "response.output_text.done")[0]["logprobs"] == expected(top)


def test_a_token_without_bytes_gets_the_utf8_bytes_of_its_text() -> None:
    entry = {"token": "é!", "logprob": -1.5, "bytes": None, "top_logprobs": [{"token": "e", "logprob": -2.0}]}
    script = [logprobs_chunk("é!", entry), chunk(finish="stop"), DONE]
    _, events = translate(script, include=LOGPROBS, top_logprobs=1)
    assert of_type(events, "response.output_text.delta")[0]["logprobs"] == [
        {"token": "é!", "logprob": -1.5, "bytes": [195, 169, 33], "top_logprobs": [{"token": "e", "logprob": -2.0, "bytes": [101]}]}
    ]


@pytest.mark.parametrize(
    "logprobs",
    [
        "not an object",
        {"content": "not a list"},
        {"content": [{"token": 7, "logprob": -1.0}]},
        {"content": [{"token": "Hi", "logprob": "low"}]},
        {"content": [{"token": "Hi", "logprob": True}]},
        {"content": [None]},
    ],
    ids=["string", "content-string", "token-number", "logprob-string", "logprob-bool", "entry-null"],
)
def test_unreadable_log_probabilities_are_left_out_without_failing_the_response(logprobs: Any) -> None:
    odd = chunk({"content": "Hi"})
    odd["choices"][0]["logprobs"] = logprobs
    session, events = translate([odd, chunk(finish="stop"), DONE], include=LOGPROBS)
    assert events[-1]["type"] == "response.completed"
    assert of_type(events, "response.output_text.delta")[0]["logprobs"] == []
    assert session.logprobs_missing


def test_log_probabilities_that_come_before_their_text_go_with_the_next_delta() -> None:
    early = logprobs_chunk("", token_logprob("\xf0", -3.0))  # a token whose text is not complete yet
    script = [chunk({"content": "A"}), early, logprobs_chunk("😀", token_logprob("\x9f\x98\x80", -0.5)), chunk(finish="stop"), DONE]
    _, events = translate(script, include=LOGPROBS)
    deltas = of_type(events, "response.output_text.delta")
    assert [d["delta"] for d in deltas] == ["A", "😀"]
    assert [[entry["logprob"] for entry in d["logprobs"]] for d in deltas] == [[], [-3.0, -0.5]]
    assert [entry["logprob"] for entry in of_type(events, "response.output_text.done")[0]["logprobs"]] == [-3.0, -0.5]


def test_refusal_log_probabilities_are_not_shown_since_a_refusal_part_has_none() -> None:
    refusal = chunk({"refusal": "No."})
    refusal["choices"][0]["logprobs"] = {"content": None, "refusal": [token_logprob("No.", -0.1)]}
    _, events = translate([refusal, chunk(finish="stop"), DONE], include=LOGPROBS)
    assert events[-1]["response"]["output"][0]["content"] == [{"type": "refusal", "refusal": "No."}]
    assert all("logprobs" not in e for e in events if e["type"].startswith("response.refusal."))


def test_text_from_a_backend_that_sends_no_log_probabilities_leaves_them_empty_everywhere() -> None:
    session, events = translate(SCENARIOS["text"], include=LOGPROBS, top_logprobs=2)
    assert all(d["logprobs"] == [] for d in of_type(events, "response.output_text.delta"))
    assert of_type(events, "response.output_text.done")[0]["logprobs"] == []
    assert events[-1]["response"]["output"][0]["content"][0]["logprobs"] == []
    assert session.logprobs_missing


@pytest.mark.parametrize(
    ("script", "fields"),
    [
        (SCENARIOS["text"], {}),  # not asked
        (SCENARIOS["logprobs"], {"include": LOGPROBS}),  # asked and sent
        ([chunk(call_delta(0, id="c", name="f", args="{}")), chunk(finish="tool_calls"), DONE], {"include": LOGPROBS}),  # no text
    ],
    ids=["not-asked", "sent", "no-text"],
)
def test_logprobs_are_reported_missing_only_when_asked_for_text_that_came_without_them(script: list[Any], fields: dict[str, Any]) -> None:
    session, _ = translate(script, **fields)
    assert not session.logprobs_missing


def test_log_probabilities_the_backend_sends_unasked_are_passed_on_without_alternatives() -> None:
    _, events = translate(SCENARIOS["logprobs"])
    assert of_type(events, "response.output_text.done")[0]["logprobs"] == expected(0)


# --- over real sockets ----------------------------------------------------------------------------


async def create(client: httpx2.AsyncClient, url: str, **fields: Any) -> httpx2.Response:
    with trio.fail_after(20):
        return await client.post(url + "/v1/responses", json={"model": "logprobs-if-asked", "input": "hi", **fields})


async def test_logprobs_asked_for_reach_the_backend_and_come_back_in_every_streamed_shape(gateway_url, client, backend):
    r = await create(client, gateway_url, include=LOGPROBS, top_logprobs=2, stream=True)
    frames = parse_sse(r.content)
    assert frames[-1] == "[DONE]"
    final = check_events(frames[:-1])

    sent = backend.chat_requests[-1]
    assert (sent["logprobs"], sent["top_logprobs"]) == (True, 2)
    deltas = [f for f in frames[:-1] if f["type"] == "response.output_text.delta"]
    assert [d["logprobs"] for d in deltas] == [[entry] for entry in expected(2)]
    assert [f for f in frames[:-1] if f["type"] == "response.output_text.done"][0]["logprobs"] == expected(2)
    part = final["output"][0]["content"][0]
    assert part["logprobs"] == expected(2)
    assert "".join(entry["token"] for entry in part["logprobs"]) == part["text"] == "Hello, world!"
    assert final["top_logprobs"] == 2


async def test_the_json_answer_and_the_stored_response_carry_the_logprobs(gateway_url, client):
    r = await create(client, gateway_url, include=LOGPROBS, top_logprobs=1)
    assert r.status_code == 200
    answer = r.json()
    validate_response(answer)
    assert answer["output"][0]["content"][0]["logprobs"] == expected(1)

    stored = (await client.get(f"{gateway_url}/v1/responses/{answer['id']}")).json()
    assert stored["output"][0]["content"][0]["logprobs"] == expected(1)
    replay = parse_sse((await client.get(f"{gateway_url}/v1/responses/{answer['id']}?stream=true")).content)
    for event in replay[:-1]:
        validate_event(event)
    assert [e["logprobs"] for e in replay[:-1] if e["type"] == "response.output_text.delta"] == [[e] for e in expected(1)]


async def test_without_top_logprobs_the_backends_own_alternatives_are_cut_to_none(gateway_url, client, backend):
    answer = (await create(client, gateway_url, include=LOGPROBS)).json()
    assert backend.chat_requests[-1]["logprobs"] is True and "top_logprobs" not in backend.chat_requests[-1]
    assert answer["output"][0]["content"][0]["logprobs"] == expected(0)
    assert answer["top_logprobs"] == 0


async def test_logprobs_not_asked_for_are_not_asked_of_the_backend(gateway_url, client, backend):
    answer = (await create(client, gateway_url)).json()
    assert "logprobs" not in backend.chat_requests[-1] and "top_logprobs" not in backend.chat_requests[-1]
    assert answer["output"][0]["content"][0]["logprobs"] == []


async def test_a_backend_that_returns_no_logprobs_leaves_them_empty_rather_than_pretending(gateway_url, client, backend):
    r = await create(client, gateway_url, model="text", include=LOGPROBS, top_logprobs=2, stream=True)
    frames = parse_sse(r.content)
    final = check_events(frames[:-1])
    assert backend.chat_requests[-1]["logprobs"] is True
    assert final["status"] == "completed"
    assert all(f["logprobs"] == [] for f in frames[:-1] if f["type"] in ("response.output_text.delta", "response.output_text.done"))
    assert final["output"][0]["content"][0]["logprobs"] == []


async def test_a_backend_that_returns_no_logprobs_is_logged_once_at_info_for_the_response(gateway_url, client, caplog):
    caplog.set_level(logging.INFO, logger="gateway")

    def told(response_id: str) -> list[logging.LogRecord]:
        """INFO lines about the response that speak of logprobs (the model's name aside)."""
        return [
            r for r in caplog.records
            if r.name.startswith("gateway") and r.levelno == logging.INFO and response_id in r.getMessage()
            and "logprobs" in r.getMessage().replace("logprobs-if-asked", "")
        ]

    missing = (await create(client, gateway_url, model="text", include=LOGPROBS)).json()
    assert len(told(missing["id"])) == 1
    sent = (await create(client, gateway_url, include=LOGPROBS)).json()  # a backend that does return them
    assert told(sent["id"]) == []


@pytest.mark.parametrize("top", [-1, 21])
async def test_top_logprobs_outside_openais_range_is_a_400_naming_it(gateway_url, client, backend, top):
    r = await create(client, gateway_url, include=LOGPROBS, top_logprobs=top)
    assert r.status_code == 400
    error = r.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", "invalid_value", "top_logprobs")
    assert backend.chat_requests == []
