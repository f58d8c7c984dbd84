"""background: true: the response runs after the request returns, can be followed and cancelled."""

from __future__ import annotations

import functools

import openai
import trio

import gateway
from conftest import SequentialIds, make_settings, parse_sse
from gateway.store import MemoryStore


async def test_a_background_response_is_queued_then_completes_and_can_be_polled(gateway_url, client, backend):
    r = await client.post(gateway_url + "/v1/responses", json={"model": "slow-first-token", "input": "hi", "background": True})
    made = r.json()
    assert r.status_code == 200 and made["status"] == "queued" and made["background"] is True
    with trio.fail_after(5):
        await backend.stream_started.wait()
    running = (await client.get(f"{gateway_url}/v1/responses/{made['id']}")).json()
    assert running["status"] == "in_progress"
    backend.release.set()
    with trio.fail_after(5):
        while True:
            got = (await client.get(f"{gateway_url}/v1/responses/{made['id']}")).json()
            if got["status"] == "completed":
                break
            await trio.sleep(0.01)  # polling is what a background client does
    assert got["output"][0]["content"][0]["text"] == "Finally"


async def test_a_running_background_response_streams_live_to_a_follower(gateway_url, client, backend):
    made = (
        await client.post(gateway_url + "/v1/responses", json={"model": "slow-first-token", "input": "hi", "background": True})
    ).json()
    with trio.fail_after(5):
        await backend.stream_started.wait()
    raw = b""
    async with client.stream("GET", f"{gateway_url}/v1/responses/{made['id']}", params={"stream": "true"}) as r:
        async for data in r.aiter_raw():
            raw += data
            if b"response.in_progress" in raw and not backend.release.is_set():
                backend.release.set()  # the follower is attached before the text exists
    frames = parse_sse(raw)
    assert frames[-1] == "[DONE]" and frames[-2]["type"] == "response.completed"
    assert any(f["type"] == "response.output_text.delta" for f in frames[:-1])


async def test_cancel_stops_the_backend_call_and_marks_the_response(gateway_url, client, backend):
    made = (await client.post(gateway_url + "/v1/responses", json={"model": "hang", "input": "hi", "background": True})).json()
    with trio.fail_after(5):
        await backend.stream_started.wait()
    asked_at = trio.current_time()
    r = await client.post(f"{gateway_url}/v1/responses/{made['id']}/cancel")
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    with trio.fail_after(2):
        await backend.client_left.wait()
    print(f"cancel -> backend call closed: {(backend.client_left_at - asked_at) * 1000:.1f} ms")
    assert (await client.get(f"{gateway_url}/v1/responses/{made['id']}")).json()["status"] == "cancelled"


async def test_only_background_responses_can_be_cancelled(gateway_url, client):
    made = (await client.post(gateway_url + "/v1/responses", json={"model": "text", "input": "hi"})).json()
    r = await client.post(f"{gateway_url}/v1/responses/{made['id']}/cancel")
    assert r.status_code == 400
    assert (await client.post(f"{gateway_url}/v1/responses/resp_nope/cancel")).status_code == 404
    r = await client.post(gateway_url + "/v1/responses", json={"model": "text", "input": "hi", "background": True, "store": False})
    assert r.status_code == 400 and r.json()["error"]["param"] == "store"


async def test_shutdown_cancels_background_work_and_records_it(backend, client):
    store = MemoryStore()
    settings = make_settings(backend.url)
    app = gateway.create_app(settings, store=store, ids=SequentialIds())
    async with trio.open_nursery() as nursery:
        url = await nursery.start(functools.partial(gateway.serve, settings, app=app))
        made = (await client.post(url + "/v1/responses", json={"model": "hang", "input": "hi", "background": True})).json()
        with trio.fail_after(5):
            await backend.stream_started.wait()
        nursery.cancel_scope.cancel()
    record = await store.load(made["id"])
    assert record is not None and record.response["status"] == "cancelled"


async def test_the_openai_sdk_runs_and_cancels_background_responses(gateway_url, backend):
    sdk = openai.AsyncOpenAI(base_url=gateway_url + "/v1", api_key="x", max_retries=0)
    made = await sdk.responses.create(model="hang", input="hi", background=True)
    assert made.status == "queued"
    with trio.fail_after(5):
        await backend.stream_started.wait()
    cancelled = await sdk.responses.cancel(made.id)
    assert cancelled.status == "cancelled"
