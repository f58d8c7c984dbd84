"""The usage ledger: each key's use by the minute and the backends' recent errors.

A real gateway on loopback with keys in a store and the scripted backend: what each key did
(answered, refused, failed mid-stream, failed at the backend) shows in its minute buckets, and
the backend's failures in the error list, with metrics on or off.  The bounds (a day of
minutes, a cap on keys, a cap on errors) are shown on a ledger with its own clock.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import pytest
import trio

import gateway
from conftest import SequentialIds, make_settings, parse_sse
from gateway.keys import ApiKey, KeyLimits, digest
from gateway.keys.stores import MemoryKeys
from gateway.observe.outcome import TurnOutcome
from gateway.observe.usage import KEEP_MINUTES, OTHER, UsageBucket, UsageLedger

ALICE, BOB, CAROL = "sk-test-alice-0123456789", "sk-test-bob-0123456789", "sk-test-carol-0123456789"


def _key(name: str, secret: str, **limits: Any) -> ApiKey:
    return ApiKey(name=name, id=f"key_{name}", digest=digest(secret), created_at=0.0, limits=KeyLimits(**limits))


def _auth(secret: str) -> dict[str, str]:
    return {"authorization": f"Bearer {secret}"}


def _total(buckets: list[UsageBucket]) -> tuple[int, int, int, int]:
    return (
        sum(b.requests for b in buckets),
        sum(b.tokens_in for b in buckets),
        sum(b.tokens_out for b in buckets),
        sum(b.errors for b in buckets),
    )


@pytest.mark.parametrize("metrics_enabled", [True, False], ids=["metrics", "no metrics"])
async def test_each_keys_requests_tokens_and_errors_are_counted_by_the_minute(nursery, backend, client, metrics_enabled):
    keys = MemoryKeys()
    await keys.put(_key("alice", ALICE))
    await keys.put(_key("bob", BOB, rpm=0))  # every request refused (429)
    await keys.put(_key("carol", CAROL))
    settings = make_settings(backend.url, metrics_enabled=metrics_enabled)
    app = gateway.create_app(settings, keys=keys, ids=SequentialIds())
    url = await nursery.start(functools.partial(gateway.serve, settings, app=app))
    began = int(time.time() // 60)

    answered = await client.post(url + "/v1/responses", json={"model": "text", "input": "hi"}, headers=_auth(ALICE))
    assert answered.status_code == 200 and answered.json()["usage"]["input_tokens"] == 11
    streamed = await client.post(
        url + "/v1/responses", json={"model": "error-mid-stream", "input": "hi", "stream": True}, headers=_auth(ALICE)
    )
    assert streamed.status_code == 200 and b"response.failed" in streamed.content  # failed after a 200 head
    backend_down = await client.post(url + "/v1/responses", json={"model": "http-500", "input": "hi"}, headers=_auth(CAROL))
    assert backend_down.status_code == 502
    refused = await client.post(url + "/v1/responses", json={"model": "text", "input": "hi"}, headers=_auth(BOB))
    assert refused.status_code == 429
    assert (await client.post(url + "/v1/responses", json={"model": "text", "input": "hi"})).status_code == 401

    usage = app.shared.usage
    ended = int(time.time() // 60)
    per_key = usage.per_key(minutes=60)
    assert set(per_key) == {"alice", "bob", "carol", "anonymous"}
    assert all(began <= bucket.minute <= ended for buckets in per_key.values() for bucket in buckets)
    failed = next(e for e in parse_sse(streamed.content) if isinstance(e, dict) and e["type"] == "response.failed")
    reported = [answered.json()["usage"], failed["response"]["usage"]]
    # two requests, the tokens their responses reported, and the stream that failed after its 200
    tokens_in, tokens_out = (sum(u[name] for u in reported) for name in ("input_tokens", "output_tokens"))
    assert _total(per_key["alice"]) == (2, tokens_in, tokens_out, 1) and tokens_in > 11
    requests, _, _, errors = _total(per_key["carol"])
    assert (requests, errors) == (1, 1)  # a 502 whose failed turn is not counted again
    assert _total(per_key["bob"]) == (1, 0, 0, 1)
    assert _total(per_key["anonymous"]) == (1, 0, 0, 1)
    assert usage.per_key(minutes=60, now=time.time() + 3600) == {}  # an hour later, the last hour is empty

    errors = usage.recent_backend_errors()
    # (an error the backend reported inside a stream is its answer, not a failed call)
    assert [(e.kind, e.route) for e in errors] == [(backend_down.json()["error"]["code"], "http-500")]
    assert all(abs(e.at - time.time()) < 60 for e in errors)  # wall clock


def test_buckets_older_than_a_day_are_dropped_and_keys_past_the_cap_are_counted_as_other():
    now = [1_700_000_000.0]
    ledger = UsageLedger(clock=lambda: now[0], max_keys=2)
    ledger.http_request(route="/v1/responses", method="POST", status=200, seconds=0.1, key="alice")
    first = int(now[0] // 60)
    now[0] += 60 * 5
    ledger.http_request(route="/v1/responses", method="POST", status=500, seconds=0.1, key="alice")
    assert [(b.minute, b.requests, b.errors) for b in ledger.per_key(minutes=10)["alice"]] == [
        (first, 1, 0),
        (first + 5, 1, 1),
    ]
    assert [b.minute for b in ledger.per_key(minutes=3)["alice"]] == [first + 5]  # only the span asked for

    now[0] += 60 * KEEP_MINUTES  # a day later: the first two minutes are past the day
    ledger.http_request(route="/v1/responses", method="POST", status=200, seconds=0.1, key="alice")
    kept = ledger.per_key(minutes=10**6, now=now[0])["alice"]  # (asking for more than a day gets a day)
    assert [b.minute for b in kept] == [first + 5 + KEEP_MINUTES]
    assert len(ledger._keys["alice"]) == 1  # dropped, not only hidden

    ledger.http_request(route="/v1/responses", method="POST", status=200, seconds=0.1, key=None)
    for name in ("carol", "dave", "erin"):
        ledger.http_request(route="/v1/responses", method="POST", status=200, seconds=0.1, key=name)
    assert set(ledger.per_key()) == {"alice", "anonymous", OTHER}
    assert ledger.per_key()[OTHER][-1].requests == 3


def test_websocket_turns_count_as_requests_and_a_turn_that_failed_after_its_head_as_an_error():
    now = [1_700_000_000.0]
    ledger = UsageLedger(clock=lambda: now[0])
    socket_turn = TurnOutcome("resp_1", "text", "websocket", 0.0, key="alice", status="completed", http_status=None)
    socket_turn.usage = {"input_tokens": 5, "output_tokens": 2}
    ledger.turn_finished(socket_turn)
    ledger.turn_finished(TurnOutcome("resp_2", "text", "sse", 0.0, key="alice", status="failed", http_status=200))
    ledger.turn_finished(TurnOutcome("resp_3", "text", "json", 0.0, key="alice", status="failed", http_status=502))
    chat = TurnOutcome("resp_4", "text", "chat-relay", 0.0, key="alice", status="completed")
    chat.usage = {"prompt_tokens": 3, "completion_tokens": 4}  # a relayed chat completion's names
    ledger.turn_finished(chat)
    (bucket,) = ledger.per_key()["alice"]
    assert (bucket.requests, bucket.tokens_in, bucket.tokens_out, bucket.errors) == (1, 8, 6, 1)


def test_recent_backend_errors_are_newest_first_and_bounded():
    now = [1_700_000_000.0]
    ledger = UsageLedger(clock=lambda: now[0], max_backend_errors=3)
    for n in range(5):
        now[0] += 1
        ledger.backend_error(f"kind_{n}", route="text" if n % 2 else None)
    assert [(e.kind, e.route, e.at) for e in ledger.recent_backend_errors()] == [
        ("kind_4", None, 1_700_000_005.0),
        ("kind_3", "text", 1_700_000_004.0),
        ("kind_2", None, 1_700_000_003.0),
    ]
    assert [e.kind for e in ledger.recent_backend_errors(limit=1)] == ["kind_4"]
    assert ledger.recent_backend_errors(limit=0) == []


async def test_a_telemetry_hook_that_fails_does_not_stop_the_ledger_counting():
    from gateway.observe import Telemetries, Telemetry

    class Broken(Telemetry):
        def http_request(self, **kwargs: Any) -> None:
            raise RuntimeError("broken")

    ledger = UsageLedger()
    both = Telemetries([Broken(), ledger])
    both.http_request(route="/", method="GET", status=200, seconds=0.0, key="alice")
    both.backend_error("backend_timeout", route="text")
    assert _total(ledger.per_key()["alice"]) == (1, 0, 0, 0)
    assert [e.kind for e in ledger.recent_backend_errors()] == ["backend_timeout"]
    with trio.fail_after(1):
        await both.aclose()
