"""Authentication fails closed, and `gateway keys` says what it does and where.

Once an operator has configured a key (stored, or static in the
environment), every request needs one until the operator turns
authentication off explicitly: revoking keys, even the last, never opens
the gateway, on any instance, across restarts.  Revocation and rotation
take effect at the next request (keys are read from the store on every
request); the auth state reaches every instance within
`REVOCATION_BOUND`.  Real gateways on loopback, the real CLI, a real
SQLite file and a real redis-server.
"""

from __future__ import annotations

import functools
from typing import Any

import httpx2
import orjson
import pytest
import trio
from httpx2.websockets import AsyncWebSocketClient, WebSocketUpgradeError

import gateway
from conftest import SequentialIds, make_settings
from gateway.keys import REVOCATION_BOUND, ApiKey, KeyLimits, digest
from gateway.keys.stores import RedisKeys, SQLiteKeys
from test_keys import assert_invalid_key, auth, keys_cli
from test_multi_instance_and_crash import STARTUP_SECONDS
from test_store_contract import REDIS, start_redis

BODY = {"model": "text", "input": "hi"}
DOORS = [
    ("POST", "/v1/responses", BODY),
    ("POST", "/v1/responses", {**BODY, "stream": True}),
    ("POST", "/v1/chat/completions", {"model": "text", "messages": [{"role": "user", "content": "hi"}]}),
    ("POST", "/v1/completions", {"model": "text", "prompt": "hi"}),  # the passthrough
    ("GET", "/v1/models", None),
]


async def assert_nobody_gets_in(http: httpx2.AsyncClient, url: str, *secrets: str) -> None:
    """Every door, with no key and with each of `secrets`, answers 401; the WebSocket handshake too."""
    for headers in ({}, *(auth(secret) for secret in secrets)):
        for method, path, body in DOORS:
            assert_invalid_key(await http.request(method, url + path, json=body, headers=headers))
        with pytest.raises(WebSocketUpgradeError) as refused:
            async with AsyncWebSocketClient(http).connect(url.replace("http", "ws") + "/v1/responses", headers=headers):
                pass
        assert refused.value.response.status_code == 401


def sqlite_env(tmp_path: Any) -> dict[str, str]:
    return {"STORE_BACKEND": "sqlite", "SQLITE_PATH": str(tmp_path / "gw.sqlite3"), "LOG_FILE_PATH": ""}


async def test_revoking_the_last_stored_key_leaves_nobody_able_to_call_even_after_a_restart(
    tmp_path, start_gateway, client, backend
):
    env = sqlite_env(tmp_path)
    with trio.fail_after(STARTUP_SECONDS * 2):
        code, secret, err = await keys_cli(env, "create", "only", cwd=tmp_path)
    secret = secret.strip()
    assert code == 0 and "SQLite file " + str(tmp_path / "gw.keys.sqlite3") in err  # it names the store it wrote to
    url = await start_gateway(store_backend="sqlite", sqlite_path=str(tmp_path / "gw.sqlite3"))
    assert (await client.post(url + "/v1/responses", json=BODY, headers=auth(secret))).status_code == 200

    with trio.fail_after(STARTUP_SECONDS):
        code, _, err = await keys_cli(env, "revoke", "only", cwd=tmp_path)
    assert code == 0 and "no active key left: nobody can call the gateway" in err
    sent = len(backend.requests)
    await assert_nobody_gets_in(client, url, secret)  # at once: the key is read from the store each time
    with trio.fail_after(REVOCATION_BOUND * 5):
        await trio.sleep(REVOCATION_BOUND * 1.5)  # past the bound the auth state is cached for
    await assert_nobody_gets_in(client, url, secret)
    restarted = await start_gateway(store_backend="sqlite", sqlite_path=str(tmp_path / "gw.sqlite3"))
    await assert_nobody_gets_in(client, restarted, secret)
    assert len(backend.requests) == sent  # nothing reached the backend


@pytest.mark.skipif(REDIS is None, reason="redis-server is not installed")
async def test_every_instance_on_one_redis_refuses_once_the_last_key_is_revoked(tmp_path, nursery, backend, client):
    redis_url = await start_redis(nursery, tmp_path / "redis")
    keys = RedisKeys(redis_url)
    secret = "sk-test-team-0123456789"
    await keys.put(ApiKey(name="team", id="key_team", digest=digest(secret), created_at=0.0))
    await keys.set_auth("on")
    urls = []
    for _ in range(2):
        settings = make_settings(backend.url, store_backend="redis", redis_url=redis_url)
        app = gateway.create_app(settings, ids=SequentialIds())
        urls.append(await nursery.start(functools.partial(gateway.serve, settings, app=app)))
    for url in urls:
        assert (await client.post(url + "/v1/responses", json=BODY, headers=auth(secret))).status_code == 200
    team = await keys.by_name("team")
    assert team is not None
    await keys.put(ApiKey(**{**team.__dict__, "revoked_at": 1.0}))
    for url in urls:
        await assert_nobody_gets_in(client, url, secret)
    await keys.aclose()


async def test_static_keys_turn_authentication_on_and_removing_them_does_not_turn_it_off(tmp_path, start_gateway, client):
    path = str(tmp_path / "gw.sqlite3")
    static = "sk-test-ops-0123456789"
    url = await start_gateway(store_backend="sqlite", sqlite_path=path, gateway_api_keys=f"ops={static}")
    assert (await client.post(url + "/v1/responses", json=BODY, headers=auth(static))).status_code == 200
    without = await start_gateway(store_backend="sqlite", sqlite_path=path)  # GATEWAY_API_KEYS taken away
    await assert_nobody_gets_in(client, without, static)


async def test_authentication_is_turned_off_only_explicitly_and_then_within_the_bound(tmp_path, start_gateway, client):
    env = sqlite_env(tmp_path)
    with trio.fail_after(STARTUP_SECONDS * 4):
        code, secret, _ = await keys_cli(env, "create", "ci", cwd=tmp_path)
        url = await start_gateway(store_backend="sqlite", sqlite_path=str(tmp_path / "gw.sqlite3"))
        code, _, err = await keys_cli(env, "auth", "off", cwd=tmp_path)
        assert code == 2 and "stays on while keys are active (ci)" in err
        await keys_cli(env, "revoke", "ci", cwd=tmp_path)
        code, out, _ = await keys_cli(env, "auth", cwd=tmp_path)
        assert code == 0 and out.strip() == "authentication on"
        code, _, err = await keys_cli(env, "auth", "off", cwd=tmp_path)
        assert code == 0 and "authentication off" in err
    with trio.fail_after(REVOCATION_BOUND + 5):  # the documented bound, plus a loaded machine's slack
        while (await client.post(url + "/v1/responses", json=BODY)).status_code != 200:
            await trio.sleep(0.05)
    # A new key turns it on again.
    with trio.fail_after(STARTUP_SECONDS):
        code, _, _ = await keys_cli(env, "create", "ci2", cwd=tmp_path)
    with trio.fail_after(REVOCATION_BOUND + 5):
        while (await client.post(url + "/v1/responses", json=BODY)).status_code != 401:
            await trio.sleep(0.05)


async def test_a_store_with_keys_from_before_the_auth_state_counts_as_on(tmp_path, start_gateway, client):
    keys = SQLiteKeys(str(tmp_path / "gw.keys.sqlite3"))
    secret = "sk-test-old-0123456789"
    await keys.put(ApiKey(name="old", id="key_old", digest=digest(secret), created_at=0.0, revoked_at=1.0))
    assert await keys.auth_state() is None  # as a store written by an earlier version
    url = await start_gateway(store_backend="sqlite", sqlite_path=str(tmp_path / "gw.sqlite3"))
    await assert_nobody_gets_in(client, url, secret)
    assert await keys.auth_state() == "on"
    await keys.aclose()


async def test_the_start_up_line_says_whether_authentication_is_on_and_where_keys_live(tmp_path, backend):
    import signal

    from test_drain import served

    env = sqlite_env(tmp_path)
    keys_file = str(tmp_path / "gw.keys.sqlite3")
    async with served(tmp_path, backend.url, SQLITE_PATH=env["SQLITE_PATH"]) as first:
        line = await first.until_logged("authentication ")
        assert f"authentication off (keys in SQLite file {keys_file})" in line
        first.process.send_signal(signal.SIGTERM)
        assert await first.process.wait() == 0
    with trio.fail_after(STARTUP_SECONDS):
        await keys_cli(env, "create", "ci", cwd=tmp_path)
    async with served(tmp_path, backend.url, SQLITE_PATH=env["SQLITE_PATH"], GATEWAY_API_KEYS="ops=sk-test-ops-0123456789") as second:
        line = await second.until_logged("authentication ")
        assert f"authentication on (keys in SQLite file {keys_file}, and 1 from GATEWAY_API_KEYS)" in line
        second.process.send_signal(signal.SIGTERM)
        assert await second.process.wait() == 0


# --- gateway keys: names, the store it uses, update, rotate ------------------------------------------


async def test_key_names_must_be_printable_tokens_in_the_cli_and_in_the_environment(tmp_path):
    env = sqlite_env(tmp_path)
    with trio.fail_after(STARTUP_SECONDS * 3):
        for bad in ("", "bad name!", "tab\there", ".hidden", "x" * 65):
            code, out, err = await keys_cli(env, "create", bad, cwd=tmp_path)
            assert code == 2 and "not a valid key name" in err and out == ""
        code, out, _ = await keys_cli(env, "list", cwd=tmp_path)
        assert "no keys" in out  # nothing was stored
    for bad in ("bad name!=sk-test-0123456789", "=sk-test-0123456789", "é=sk-test-0123456789"):
        with pytest.raises(gateway.ConfigError) as refused:
            gateway.load_settings(_env_file=None, gateway_api_keys=bad)
        assert "GATEWAY_API_KEYS" in str(refused.value) and "sk-test" not in str(refused.value)


async def test_every_keys_command_names_the_store_it_used(tmp_path):
    env = sqlite_env(tmp_path)
    where = f"SQLite file {tmp_path / 'gw.keys.sqlite3'}"
    with trio.fail_after(STARTUP_SECONDS * 6):
        outputs = [await keys_cli(env, *args, cwd=tmp_path) for args in (
            ("create", "ci"), ("list",), ("update", "ci", "--rpm", "5"), ("rotate", "ci"), ("auth",), ("revoke", "ci"),
        )]
    for code, out, err in outputs:
        assert code == 0 and where in out + err
    assert outputs[1][1].startswith(f"# keys in {where}; authentication on")


async def test_update_changes_a_keys_limits_and_rotate_its_secret_keeping_what_it_owns(tmp_path, start_gateway, client):
    env = sqlite_env(tmp_path)
    with trio.fail_after(STARTUP_SECONDS * 2):
        code, secret, _ = await keys_cli(env, "create", "ci", "--rpm", "100", "--models", "text", cwd=tmp_path)
    secret = secret.strip()
    url = await start_gateway(store_backend="sqlite", sqlite_path=str(tmp_path / "gw.sqlite3"))
    made = await client.post(url + "/v1/responses", json=BODY, headers=auth(secret))
    assert made.status_code == 200
    with trio.fail_after(STARTUP_SECONDS * 3):
        code, _, err = await keys_cli(env, "update", "ci", "--rpm", "1", "--models", "other*", cwd=tmp_path)
        assert code == 0 and "rpm=1" in err and "models=other*" in err
        code, out, _ = await keys_cli(env, "list", cwd=tmp_path)
        assert "rpm=1 models=other*" in out
    refused = await client.post(url + "/v1/responses", json=BODY, headers=auth(secret))  # the next request sees it
    assert refused.status_code in (404, 429)  # the model (or this minute's one request) is no longer allowed
    with trio.fail_after(STARTUP_SECONDS * 2):
        await keys_cli(env, "update", "ci", "--rpm", "none", "--models", "all", cwd=tmp_path)
        code, rotated, err = await keys_cli(env, "rotate", "ci", cwd=tmp_path)
    rotated = rotated.strip()
    assert code == 0 and rotated.startswith("sk-gw-") and rotated != secret and "only time" in err
    assert_invalid_key(await client.post(url + "/v1/responses", json=BODY, headers=auth(secret)))
    again = await client.get(f"{url}/v1/responses/{made.json()['id']}", headers=auth(rotated))
    assert again.status_code == 200  # the rotated key still owns what it made
    assert all(rotated.encode() not in path.read_bytes() for path in tmp_path.iterdir() if path.is_file())


async def test_a_stored_key_may_not_be_named_twice_or_updated_when_revoked(tmp_path):
    env = sqlite_env(tmp_path)
    with trio.fail_after(STARTUP_SECONDS * 4):
        await keys_cli(env, "create", "ci", cwd=tmp_path)
        code, _, err = await keys_cli(env, "create", "ci", cwd=tmp_path)
        assert code == 2 and "exists" in err
        await keys_cli(env, "revoke", "ci", cwd=tmp_path)
        for action in ("update", "rotate", "revoke"):
            code, _, err = await keys_cli(env, action, "ci", cwd=tmp_path)
            assert code == 2 and "no active key named 'ci'" in err


def test_key_limits_survive_the_store_round_trip():
    limits = KeyLimits(rpm=1, tpm=2, concurrency=3, models=("a",), mcp_servers=(), hosted_mcp=False, reserve=64)
    key = ApiKey(name="k", id="key_k", digest="d", created_at=0.0, limits=limits)
    assert ApiKey.from_json(orjson.loads(orjson.dumps(key.to_json()))) == key
