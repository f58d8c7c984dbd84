"""A background response's stored event log ends with its terminal event whenever its status is terminal.

The report: when a turn ended while the runner's progress save ran, the
record said `completed` but its log stopped before `response.completed`, so
every follower and replay ended with `[DONE]` and no terminal event.  The
race is forced here, on every store: the progress save runs after the turn
has ended and before its end is stored.  Cancels (here and from another
instance) end the log too.
"""

from __future__ import annotations

import functools
from typing import Any

import httpx2
import pytest
import trio
import trio.testing

import gateway
from conftest import SequentialIds, make_settings, parse_sse
from gateway.streams.translator import ends_with_terminal
from test_store_contract import store  # noqa: F401  (the fixture: every store, real)


class RacingStore:
    """A real store; before the runner stores a job's end, a progress save of that job runs first."""

    def __init__(self, inner: Any, app: Any) -> None:
        self.inner = inner
        self.app = app
        self.raced: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def update(self, response_id: str, change: Any) -> Any:
        if change.__qualname__.endswith("_store_end.<locals>.finish") and response_id not in self.raced:
            job = self.app.shared.runner.job(response_id)
            if job is not None and job.turn.translator.done:  # the turn has ended; its end is not stored yet
                self.raced.append(response_id)
                ended, written = await self.app.shared.runner.save_progress(job)
                assert (ended, written) == (False, True)
        return await self.inner.update(response_id, change)


async def start(nursery: trio.Nursery, backend: Any, store: Any) -> tuple[str, RacingStore]:
    settings = make_settings(backend.url)
    racing = RacingStore(store, None)
    app = gateway.create_app(settings, store=racing, ids=SequentialIds())
    racing.app = app
    return await nursery.start(functools.partial(gateway.serve, settings, app=app)), racing


async def test_a_progress_save_between_a_turns_end_and_its_stored_end_loses_no_terminal_event(
    nursery, backend, client, store
):
    url, racing = await start(nursery, backend, store)
    ids = []
    for stream in (False, True):
        r = await client.post(url + "/v1/responses", json={"model": "text", "input": "hi", "background": True, "stream": stream})
        ids.append(parse_sse(r.content)[0]["response"]["id"] if stream else r.json()["id"])
    with trio.fail_after(10):
        for response_id in ids:
            while (await client.get(f"{url}/v1/responses/{response_id}")).json()["status"] != "completed":
                await trio.sleep(0.01)  # polling is what a background client does
    assert sorted(racing.raced) == sorted(ids)  # the race happened, for each of them
    for response_id in ids:
        record = await store.load(response_id)
        assert record.response["status"] == "completed" and ends_with_terminal(record.events)
        assert record.events[-1]["type"] == "response.completed"
        replay = parse_sse((await client.get(f"{url}/v1/responses/{response_id}", params={"stream": "true"})).content)
        assert replay[-2]["type"] == "response.completed" and replay[-1] == "[DONE]"


async def test_a_cancelled_background_response_ends_its_log_and_its_followers_streams(nursery, backend, client, store):
    url, _ = await start(nursery, backend, store)
    made = (await client.post(url + "/v1/responses", json={"model": "hang", "input": "hi", "background": True})).json()
    with trio.fail_after(5):
        await backend.stream_started.wait()
    followed: list[Any] = []

    async def follow() -> None:
        async with httpx2.AsyncClient(timeout=10) as http:
            r = await http.get(f"{url}/v1/responses/{made['id']}", params={"stream": "true"})
            followed.extend(parse_sse(r.content))

    async with trio.open_nursery() as inner:
        inner.start_soon(follow)
        await trio.testing.wait_all_tasks_blocked()
        cancelled = await client.post(f"{url}/v1/responses/{made['id']}/cancel")
    assert cancelled.json()["status"] == "cancelled"
    assert [f["type"] for f in followed[-3:-1]] == ["error", "response.failed"] and followed[-1] == "[DONE]"
    assert followed[-3]["code"] == "response_cancelled" and followed[-2]["response"]["status"] == "cancelled"
    record = await store.load(made["id"])
    assert record.response["status"] == "cancelled" and ends_with_terminal(record.events)
    replay = parse_sse((await client.get(f"{url}/v1/responses/{made['id']}", params={"stream": "true"})).content)
    assert replay[-2]["type"] == "response.failed" and replay[-2]["response"]["status"] == "cancelled"


async def test_a_cancel_recorded_for_another_instance_ends_the_log_at_once(nursery, backend, client, store):
    from gateway.store.base import StoredResponse
    from gateway.transport.background import BackgroundRunner

    running = StoredResponse(
        id="resp_elsewhere",
        response={"id": "resp_elsewhere", "object": "response", "status": "in_progress", "background": True, "output": []},
        events=[{"type": "response.created", "sequence_number": 0, "response": {"id": "resp_elsewhere", "status": "queued"}}],
        lease_until=4_000_000_000.0,
    )
    await store.save(running)
    record = await BackgroundRunner(store).cancel_stored("resp_elsewhere")
    assert record is not None and record.response["status"] == "cancelled"
    assert [e["type"] for e in record.events] == ["response.created", "error", "response.failed"]
    assert ends_with_terminal((await store.load("resp_elsewhere")).events)
