"""Readiness tells the truth, and every 5xx says why in the log.

`/ready` answers from a background check of the store and the backends
(never a check per request): 503 with the reasons while the store is
unreachable or no backend is usable, naming each backend's state (circuit,
last error) but never its URL.  Each 5xx answer writes one log line naming
its cause: the store and its URL (no password), the backend's name and URL.
"""

from __future__ import annotations

import functools
import socket
from typing import Any

import pytest
import trio

import gateway
from conftest import SequentialIds, make_settings
from test_keys import keys_cli
from test_multi_instance_and_crash import STARTUP_SECONDS
from test_store_contract import REDIS, run_stoppable_redis

FAST = 0.2  # READINESS_INTERVAL for these tests


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def until_ready(client: Any, url: str, ready: bool) -> dict[str, Any]:
    """Wait (bounded by the caller) until /ready says `ready`; its body."""
    while True:
        r = await client.get(url + "/ready")
        if (r.status_code == 200) is ready:
            return r.json()  # type: ignore[no-any-return]
        await trio.sleep(FAST / 4)


@pytest.mark.skipif(REDIS is None, reason="redis-server is not installed")
async def test_ready_is_503_while_the_store_is_unreachable_and_each_503_names_it(tmp_path, nursery, start_gateway, client, caplog):
    run_redis = functools.partial(run_stoppable_redis, tmp_path / "redis")

    redis_url, process, scope = await nursery.start(run_redis, 0)
    url = await start_gateway(store_backend="redis", redis_url=redis_url, readiness_interval=FAST, store_retry_seconds=0.1)
    body = (await client.get(url + "/ready")).json()
    assert body["status"] == "ready" and body["store"]["state"] == "reachable"
    assert body["backends"] == [{"name": "default", "state": "reachable", "circuit": "closed", "last_error": None}]

    scope.cancel()  # redis-server stops
    with trio.fail_after(10):
        await process.wait()
        body = await until_ready(client, url, False)
    assert body["status"] == "not_ready" and any("store is unreachable" in reason for reason in body["reasons"])
    assert redis_url.split("//")[1].split("/")[0] not in str(body)  # /ready needs no key: no addresses
    caplog.clear()
    r = await client.post(url + "/v1/responses", json={"model": "text", "input": "hi"})
    assert r.status_code == 503 and r.json()["error"]["code"] == "store_unavailable"
    lines = [record.getMessage() for record in caplog.records if "answered 503 store_unavailable" in record.getMessage()]
    assert lines and f"Redis at {redis_url}" in lines[-1], caplog.text
    assert "Traceback" not in caplog.text

    port = int(redis_url.rsplit(":", 1)[1].split("/", 1)[0])
    await nursery.start(run_redis, port)
    with trio.fail_after(10):
        await until_ready(client, url, True)


async def test_ready_is_503_while_no_backend_answers_and_a_502_names_the_backend(start_gateway, client, caplog):
    dead = f"http://127.0.0.1:{free_port()}"
    url = await start_gateway(openai_base_url_internal=dead, readiness_interval=FAST)
    with trio.fail_after(10):
        body = await until_ready(client, url, False)
    assert body["reasons"] == ["no backend is reachable"]
    (backend,) = body["backends"]
    assert backend["name"] == "default" and backend["state"] == "unreachable"
    assert "could not connect to the backend 'default'" in backend["last_error"]
    caplog.clear()
    r = await client.post(url + "/v1/responses", json={"model": "text", "input": "hi"})
    assert r.status_code == 502 and r.json()["error"]["message"] == "could not connect to the backend 'default'"
    lines = [record.getMessage() for record in caplog.records if "answered 502" in record.getMessage()]
    assert lines and f"backend 'default' at {dead}/v1" in lines[-1], caplog.text


async def test_one_usable_backend_of_several_keeps_the_gateway_ready_and_each_is_named(tmp_path, nursery, backend, client):
    dead = f"http://127.0.0.1:{free_port()}"
    config = tmp_path / "gateway.toml"
    config.write_text(
        f'[backends.local]\ntype = "openai"\nbase_url = "{backend.url}/v1"\n'
        f'[backends.gone]\ntype = "openai"\nbase_url = "{dead}/v1"\n'
        '[[routes]]\nmodel = "text"\nbackends = ["gone", "local"]\n'
        "[fallback]\nfailures_to_open = 1\ncooldown = 60\n"
    )
    settings = make_settings(backend.url, gateway_config=str(config), readiness_interval=FAST)
    app = gateway.create_app(settings, ids=SequentialIds())
    url = await nursery.start(functools.partial(gateway.serve, settings, app=app))
    assert (await client.post(url + "/v1/responses", json={"model": "text", "input": "hi"})).status_code == 200
    with trio.fail_after(10):
        while True:
            r = await client.get(url + "/ready")
            states = {b["name"]: b for b in r.json()["backends"]}
            if states["gone"]["state"] == "unreachable":
                break
            await trio.sleep(FAST / 4)
    assert r.status_code == 200
    assert states["local"] == {"name": "local", "state": "reachable", "circuit": "closed", "last_error": None}
    assert states["gone"]["circuit"] == "open"  # the request above failed there and moved on


async def test_ready_never_checks_per_request(start_gateway, client, backend):
    url = await start_gateway(readiness_interval=60)
    before = backend.probes
    for _ in range(20):
        assert (await client.get(url + "/ready")).status_code == 200
    assert backend.probes == before


@pytest.mark.skipif(REDIS is None, reason="redis-server is not installed")
async def test_start_up_and_the_keys_cli_name_redis_and_its_url_when_it_is_down(tmp_path, backend, caplog):
    from test_drain import served

    redis_url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    env = {"STORE_BACKEND": "redis", "REDIS_URL": redis_url}
    async with served(tmp_path, backend.url, READINESS_INTERVAL="0.5", **env) as process:
        with trio.fail_after(STARTUP_SECONDS):
            line = await process.until_logged("could not be reached at start-up")
            assert f"Redis at {redis_url}" in line
            line = await process.until_logged("is unreachable")
            assert f"the store is unreachable: store (Redis at {redis_url})" in line
    with trio.fail_after(STARTUP_SECONDS):
        code, _, err = await keys_cli({**env, "LOG_FILE_PATH": ""}, "list", cwd=tmp_path)
    assert code == 2 and f"key store (Redis at {redis_url})" in err and "ConnectionError" in err
    assert "Traceback" not in err


def test_the_store_and_key_store_are_named_without_their_password():
    from gateway.keys.stores import RedisKeys
    from gateway.store import store_location

    url = "redis://:hunter2-secret@redis.internal:6379/0"
    settings = make_settings("http://127.0.0.1:9", store_backend="redis", redis_url=url)
    assert store_location(settings) == "Redis at redis://[redacted]@redis.internal:6379/0"
    assert RedisKeys(url).location == "Redis at redis://[redacted]@redis.internal:6379/0"
    assert "hunter2" not in store_location(settings)


async def test_a_backend_5xx_relayed_as_it_came_is_logged_with_the_backend_it_came_from(start_gateway, client, backend, caplog):
    url = await start_gateway()
    r = await client.post(url + "/v1/chat/completions", json={"model": "http-500", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 500  # the backend's own answer, passed on
    assert f"relayed /v1/chat/completions: backend 'default' at {backend.url}/v1 answered 500" in caplog.text
