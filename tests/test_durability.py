"""Nothing reported done is lost: stores that fail, Redis restarted mid-load, gateways that die.

A response is `completed` only once it is stored; when the store cannot
take it, the stream ends with `error` (`store_unavailable`) and
`response.failed` instead, the generated output still in the stream.
Background responses hold a lease, so the death of their gateway process
ends them as `failed` for everyone who reads or follows them.
"""

from __future__ import annotations

import signal
import socket
from typing import Any

import httpx2
import orjson
import pytest
import trio

from conftest import parse_sse
from test_http_responses import check_stream, stream
from test_multi_instance_and_crash import STARTUP_SECONDS, gateway_env, start_gateways
from test_store_contract import REDIS, start_redis_process
from test_websocket import aconnect_ws, turn, ws_url

needs_redis = pytest.mark.skipif(REDIS is None, reason="redis-server is not installed (.ci/run installs it)")


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
async def storeless_url(start_gateway: Any) -> str:
    """A gateway whose Redis store is not there at all (a closed port)."""
    from gateway.keys.stores import MemoryKeys

    return await start_gateway(  # type: ignore[no-any-return]
        keys=MemoryKeys(),  # the keys are elsewhere: only the conversation store is down
        store_backend="redis",
        redis_url=f"redis://127.0.0.1:{closed_port()}/0",
        store_retry_seconds=0.3,
    )


async def test_a_stream_that_cannot_be_stored_ends_failed_with_its_output_still_in_it(storeless_url, client):
    status, frames = await stream(client, storeless_url, {"model": "text", "input": "hi"})
    assert status == 200
    final = check_stream(frames)  # spec-valid, one terminal event, [DONE]
    assert final["status"] == "failed" and final["error"]["code"] == "store_unavailable"
    types = [f["type"] for f in frames if isinstance(f, dict)]
    assert "response.completed" not in types
    assert types[-2:] == ["error", "response.failed"]
    assert frames[-3]["code"] == "store_unavailable"
    deltas = "".join(f["delta"] for f in frames if isinstance(f, dict) and f["type"] == "response.output_text.delta")
    assert deltas == "Hello, world!"
    assert final["output"][0]["content"][0]["text"] == "Hello, world!"
    assert final["usage"]["total_tokens"] == 18


async def test_a_json_response_that_cannot_be_stored_is_a_503_and_store_false_is_unaffected(storeless_url, client):
    r = await client.post(storeless_url + "/v1/responses", json={"model": "text", "input": "hi"})
    assert r.status_code == 503 and r.json()["error"]["code"] == "store_unavailable"
    r = await client.post(storeless_url + "/v1/responses", json={"model": "text", "input": "hi", "store": False})
    assert r.status_code == 200 and r.json()["status"] == "completed"
    r = await client.get(storeless_url + "/v1/responses/resp_1")
    assert r.status_code == 503 and r.json()["error"]["code"] == "store_unavailable"
    r = await client.post(storeless_url + "/v1/responses", json={"model": "text", "input": "hi", "background": True})
    assert r.status_code == 503 and r.json()["error"]["code"] == "store_unavailable"


async def test_a_websocket_turn_is_stored_before_its_terminal_event_or_fails(storeless_url):
    async with aconnect_ws(ws_url(storeless_url)) as ws:
        events = await turn(ws, model="text", input="hi")
        assert [e["type"] for e in events][-2:] == ["error", "response.failed"]
        assert events[-1]["response"]["error"]["code"] == "store_unavailable"
        events = await turn(ws, model="text", input="hi", store=False)
        assert events[-1]["type"] == "response.completed"


async def follow(client: httpx2.AsyncClient, url: str, response_id: str) -> list[Any]:
    r = await client.get(f"{url}/v1/responses/{response_id}", params={"stream": "true"})
    assert r.status_code == 200
    return parse_sse(r.content)


@needs_redis
async def test_redis_killed_and_restarted_mid_load_loses_no_completed_response(tmp_path, start_gateway, client, nursery):
    port = closed_port()
    directory = tmp_path / "redis"
    redis_url, redis_process = await start_redis_process(nursery, directory, appendonly=True, port=port)
    url = await start_gateway(store_backend="redis", redis_url=redis_url, store_retry_seconds=5.0)
    completed: list[str] = []
    failed: list[str] = []
    done = trio.Event()
    enough_before_restart = trio.Event()

    async def worker() -> None:
        async with httpx2.AsyncClient(timeout=30) as http:
            while not done.is_set():
                status, frames = await stream(http, url, {"model": "text", "input": "hi"})
                final = check_stream(frames)
                (completed if final["status"] == "completed" else failed).append(final["id"])
                if final["status"] != "completed":
                    assert final["error"]["code"] == "store_unavailable"
                if len(completed) >= 40:
                    enough_before_restart.set()
                if len(completed) + len(failed) >= 240:
                    done.set()

    with trio.fail_after(120):
        async with trio.open_nursery() as load:
            for _ in range(6):
                load.start_soon(worker)
            await enough_before_restart.wait()
            redis_process.send_signal(signal.SIGKILL)  # mid-load, no chance to save anything more
            await redis_process.wait()
            await start_redis_process(nursery, directory, appendonly=True, port=port)
    assert len(completed) >= 200
    assert len(set(completed)) == len(completed)
    # Every response a client saw completed is there after the restart.
    lost = []
    for response_id in completed:
        r = await client.get(f"{url}/v1/responses/{response_id}")
        if r.status_code != 200 or r.json()["status"] != "completed":
            lost.append((response_id, r.status_code))
    assert lost == []


# --- background responses whose gateway died -------------------------------------------------


async def start_background(http: httpx2.AsyncClient, url: str, model: str = "hang") -> str:
    r = await http.post(url + "/v1/responses", json={"model": model, "input": "wait", "background": True})
    assert r.status_code == 200 and r.json()["status"] == "queued"
    return str(r.json()["id"])


def lease_env(backend_url: str, log: Any, database: Any) -> dict[str, str]:
    return gateway_env(
        backend_url, log, STORE_BACKEND="sqlite", SQLITE_PATH=str(database), BACKGROUND_LEASE_SECONDS="3"
    )


async def test_a_background_response_of_a_killed_gateway_ends_failed_when_the_next_one_starts(tmp_path, backend):
    database = tmp_path / "responses.sqlite3"
    with trio.fail_after(2 * STARTUP_SECONDS + 30):
        async with trio.open_nursery() as nursery, httpx2.AsyncClient(timeout=10) as http:
            (first,) = await start_gateways(nursery, tmp_path, lease_env(backend.url, tmp_path / "a.log", database))
            response_id = await start_background(http, first.url)
            await backend.stream_started.wait()
            first.process.kill()
            assert await first.process.wait() == -signal.SIGKILL
            # The lease must have run out before the next gateway starts: time has to pass.
            await trio.sleep(3.2)

            (second,) = await start_gateways(nursery, tmp_path, lease_env(backend.url, tmp_path / "b.log", database))
            r = await http.get(f"{second.url}/v1/responses/{response_id}")
            assert r.status_code == 200
            assert r.json()["status"] == "failed" and r.json()["error"]["code"] == "server_error"
            frames = await follow(http, second.url, response_id)
            assert frames[-1] == "[DONE]"
            assert [f["type"] for f in frames[-3:-1]] == ["error", "response.failed"]
            numbers = [f["sequence_number"] for f in frames[:-1]]
            assert numbers == list(range(len(numbers)))
            assert "ended 1 background responses" in second.stderr.decode()
            nursery.cancel_scope.cancel()


async def test_a_follower_on_another_gateway_hears_the_end_when_the_runner_dies(tmp_path, backend):
    database = tmp_path / "responses.sqlite3"
    with trio.fail_after(STARTUP_SECONDS + 40):
        async with trio.open_nursery() as nursery, httpx2.AsyncClient(timeout=30) as http:
            runner, watcher = await start_gateways(
                nursery,
                tmp_path,
                lease_env(backend.url, tmp_path / "a.log", database),
                lease_env(backend.url, tmp_path / "b.log", database),
            )
            response_id = await start_background(http, runner.url)
            await backend.stream_started.wait()
            frames: list[Any] = []

            async def follow_on_watcher() -> None:
                frames.extend(await follow(http, watcher.url, response_id))

            async with trio.open_nursery() as following:
                following.start_soon(follow_on_watcher)
                runner.process.kill()
            assert frames[-1] == "[DONE]"
            assert frames[-2]["type"] == "response.failed"
            assert frames[-2]["response"]["error"]["code"] == "server_error"
            nursery.cancel_scope.cancel()


async def test_sigterm_past_the_grace_ends_running_background_responses_failed_and_stored(tmp_path, backend):
    database = tmp_path / "responses.sqlite3"
    with trio.fail_after(2 * STARTUP_SECONDS + 30):
        async with trio.open_nursery() as nursery, httpx2.AsyncClient(timeout=10) as http:
            env = {**lease_env(backend.url, tmp_path / "a.log", database), "SHUTDOWN_GRACE": "0.2"}
            (first,) = await start_gateways(nursery, tmp_path, env)
            response_id = await start_background(http, first.url)
            await backend.stream_started.wait()
            first.process.send_signal(signal.SIGTERM)
            assert await first.process.wait() == 0
            (second,) = await start_gateways(nursery, tmp_path, lease_env(backend.url, tmp_path / "b.log", database))
            r = await http.get(f"{second.url}/v1/responses/{response_id}")
            assert r.json()["status"] == "failed"
            assert r.json()["error"]["code"] == "server_shutting_down"
            frames = await follow(http, second.url, response_id)
            assert frames[-1] == "[DONE]"
            assert frames[-2]["type"] == "response.failed"
            nursery.cancel_scope.cancel()
