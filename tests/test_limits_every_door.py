"""A key's models and limits hold on every door: the passthrough, WebSockets, tool loops, many instances.

- One strict reading of a body wherever a key's model list applies: a
  relayed body the gateway cannot read whole is refused, and what it
  forwards is what it read (re-encoded), so no spelling makes a model
  invisible to the check and visible to the backend.
- Tokens are reserved before a request starts and settled from its usage,
  atomically in the key store, so parallel requests on one or many
  instances exceed a token limit by at most one reservation; relayed
  generation endpoints count their usage; a tool loop's every round is
  admitted; every WebSocket `response.create` is a request; responses carry
  OpenAI's `x-ratelimit-*` headers.
- `STREAM_TIMEOUT` counts data on the byte relay too.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import httpx2
import orjson
import pytest
import trio
from httpx2.websockets import AsyncWebSocketClient

import gateway
from conftest import SequentialIds, make_settings, parse_sse
from gateway.keys import ApiKey, KeyLimits, digest
from gateway.keys.stores import MemoryKeys, RedisKeys
from test_keys import auth
from test_multi_instance_and_crash import STARTUP_SECONDS, start_gateways
from test_store_contract import REDIS, start_redis
from test_tool_loop import LocalTools

SECRET = "sk-test-limited-0123456789"
HI = {"model": "text", "input": "hi"}


def limited(**limits: Any) -> ApiKey:
    return ApiKey(name="limited", id="key_limited", digest=digest(SECRET), created_at=0.0, limits=KeyLimits(**limits))


@pytest.fixture
async def with_key(nursery, backend):
    """Start a gateway whose key store holds one key with the given limits (and the gateway's tools)."""

    async def start(**limits: Any) -> tuple[str, MemoryKeys, LocalTools]:
        keys = MemoryKeys()
        await keys.put(limited(**limits))
        await keys.set_auth("on")
        tools = LocalTools()
        settings = make_settings(backend.url, stream_timeout=5.0)
        app = gateway.create_app(settings, keys=keys, mcp=tools, ids=SequentialIds())
        url = await nursery.start(functools.partial(gateway.serve, settings, app=app))
        return url, keys, tools

    return start


# --- 2. one model check for every door -------------------------------------------------------------


def multipart(*fields: tuple[str, str], boundary: str = "b0undary") -> tuple[bytes, str]:
    body = b"".join(
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode() for name, value in fields
    )
    body += f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\nContent-Type: audio/wav\r\n\r\nRIFF\r\n'.encode()
    return body + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


SIX_SHAPES = [  # each names the forbidden model in a way some parser reads
    ("an escaped key", b'{"\\u006dodel": "forbidden", "prompt": "x"}', "application/json", 404),
    ("NaN", b'{"model": "forbidden", "prompt": "x", "temperature": NaN}', "application/json", 400),
    ("Infinity", b'{"model": "forbidden", "prompt": "x", "temperature": Infinity}', "application/json", 400),
    ("a lone surrogate", b'{"model": "forbidden", "prompt": "\\ud800"}', "application/json", 400),
    ("a byte order mark", b'\xef\xbb\xbf{"model": "forbidden", "prompt": "x"}', "application/json", 400),
    ("trailing data", b'{"model": "text", "prompt": "x"} {"model": "forbidden"}', "application/json", 400),
    ("a field given twice", b'{"model": "text", "model": "forbidden", "prompt": "x"}', "application/json", 404),
    ("no content type", b'{"\\u006dodel": "forbidden"}', "", 404),
    ("text that is not JSON", b"model=forbidden", "text/plain", 400),
]


@pytest.mark.parametrize("name,body,content_type,status", SIX_SHAPES, ids=[shape[0] for shape in SIX_SHAPES])
async def test_a_keys_model_list_holds_on_the_passthrough_however_the_body_is_spelt(
    with_key, client, backend, name, body, content_type, status
):
    url, _, _ = await with_key(models=("text",))
    headers = {**auth(SECRET), **({"content-type": content_type} if content_type else {})}
    r = await client.post(url + "/v1/completions", content=body, headers=headers)
    assert r.status_code == status, (name, r.text)
    assert r.json()["error"]["code"] == ("model_not_found" if status == 404 else "invalid_json")
    assert backend.requests == []


async def test_a_keys_model_list_holds_for_forms_queries_and_paths(with_key, client, backend):
    url, _, _ = await with_key(models=("text", "whisper*"))
    body, kind = multipart(("model", "forbidden"))
    r = await client.post(url + "/v1/audio/transcriptions", content=body, headers={**auth(SECRET), "content-type": kind})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text
    body, kind = multipart(("model", "whisper-1"), ("model", "forbidden"))
    r = await client.post(url + "/v1/audio/transcriptions", content=body, headers={**auth(SECRET), "content-type": kind})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_model_field"
    r = await client.post(url + "/v1/audio/transcriptions", content=b"--x\r\nbroken", headers={**auth(SECRET), "content-type": "multipart/form-data; boundary=x"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_form"
    r = await client.post(
        url + "/v1/audio/translations", content=b"model=whisper-1&model=forbidden", headers={**auth(SECRET), "content-type": "application/x-www-form-urlencoded"}
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_model_field"
    assert (await client.get(url + "/v1/files?model=forbidden", headers=auth(SECRET))).status_code == 404
    assert (await client.get(url + "/v1/models/forbidden", headers=auth(SECRET))).status_code == 404
    assert backend.requests == []


async def test_what_a_limited_key_forwards_is_exactly_what_was_checked(with_key, client, backend):
    url, _, _ = await with_key(models=("text", "whisper*"))
    r = await client.post(url + "/v1/completions", content=b'{"\\u006dodel": "text", "prompt": "hi"}', headers=auth(SECRET))
    assert r.status_code == 200
    assert backend.requests[-1].body == {"model": "text", "prompt": "hi"}  # re-encoded: plain "model"
    body, kind = multipart(("model", "whisper-1"), ("language", 'e"n'))
    r = await client.post(url + "/v1/audio/transcriptions", content=body, headers={**auth(SECRET), "content-type": kind})
    assert r.status_code == 200, r.text
    forwarded = backend.requests[-1].body
    assert r.json()["content_type"].startswith("multipart/form-data; boundary=gateway-")
    assert b'name="model"\r\n\r\nwhisper-1\r\n' in forwarded and b'filename="a.wav"' in forwarded and b"RIFF" in forwarded
    assert b'name="language"\r\n\r\ne"n\r\n' in forwarded


async def test_a_key_without_a_model_list_is_relayed_byte_for_byte(with_key, client, backend):
    url, _, _ = await with_key()
    raw = b'{"model": "anything", "prompt": "x", "weird": NaN}'
    await client.post(url + "/v1/completions", content=raw, headers=auth(SECRET))
    assert backend.requests[-1].body == raw  # not JSON to the backend either: passed on as it came


@pytest.mark.parametrize("path", ["/v1/responses", "/v1/chat/completions"])
async def test_the_gateways_own_routes_read_bodies_with_the_same_strict_parser(with_key, client, backend, path):
    url, _, _ = await with_key(models=("text",))
    rest = b'"input": "hi"' if path == "/v1/responses" else b'"messages": [{"role": "user", "content": "hi"}]'
    for raw in (
        b'\xef\xbb\xbf{"model": "text", %s}' % rest,
        b'{"model": "text", %s, "t": NaN}' % rest,
        b'{"model": "text", %s} {}' % rest,
    ):
        r = await client.post(url + path, content=raw, headers=auth(SECRET))
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json", raw
    r = await client.post(url + path, content=b'{"\\u006dodel": "forbidden", %s}' % rest, headers=auth(SECRET))
    assert r.status_code == 404, r.text
    assert backend.requests == []


# --- 3. token limits that hold ----------------------------------------------------------------------


async def _parallel(http: httpx2.AsyncClient, urls: list[str], count: int, body: dict[str, Any]) -> list[httpx2.Response]:
    answers: list[httpx2.Response] = []

    async def one(index: int) -> None:
        answers.append(await http.post(urls[index % len(urls)] + "/v1/responses", json=body, headers=auth(SECRET)))

    async with trio.open_nursery() as nursery:
        for index in range(count):
            nursery.start_soon(one, index)
    return answers


# The reservation of {"model": "text", "input": "hi"} for a key with `reserve=8`:
# its messages' JSON, a quarter token a byte, plus 8.
RESERVATION = len(orjson.dumps({"messages": [{"role": "user", "content": "hi"}]})) // 4 + 8


async def test_parallel_requests_exceed_a_token_limit_by_at_most_one_reservation(with_key, backend):
    url, keys, _ = await with_key(tpm=100, reserve=8)
    async with httpx2.AsyncClient(timeout=30, limits=httpx2.Limits(max_connections=40)) as http:
        answers = await _parallel(http, [url], 30, HI)
    used = sum(r.json()["usage"]["total_tokens"] for r in answers if r.status_code == 200)
    refused = [r for r in answers if r.status_code == 429]
    assert used <= 100 + RESERVATION, used
    assert refused and all(r.json()["error"]["type"] == "tokens" for r in refused)
    assert backend.chat_requests[-1]["max_tokens"] == 8  # what it reserved bounds what it may generate
    assert len(backend.chat_requests) == len(answers) - len(refused)


@pytest.mark.skipif(REDIS is None, reason="redis-server is not installed")
async def test_parallel_requests_on_two_instances_sharing_redis_exceed_a_token_limit_by_at_most_one_reservation(
    tmp_path, backend
):
    with trio.fail_after(STARTUP_SECONDS * 2 + 60):
        async with trio.open_nursery() as nursery:
            redis_url = await start_redis(nursery, tmp_path / "redis")
            keys = RedisKeys(redis_url)
            await keys.put(limited(tpm=100, reserve=8))
            await keys.set_auth("on")
            env = {"STORE_BACKEND": "redis", "REDIS_URL": redis_url, "LOG_FILE_PATH": "", "OPENAI_BASE_URL_INTERNAL": backend.url}
            first, second = await start_gateways(nursery, tmp_path, env, env)
            async with httpx2.AsyncClient(timeout=30, limits=httpx2.Limits(max_connections=40)) as http:
                answers = await _parallel(http, [first.url, second.url], 30, HI)
            used = sum(r.json()["usage"]["total_tokens"] for r in answers if r.status_code == 200)
            assert used <= 100 + RESERVATION, used
            assert any(r.status_code == 429 for r in answers)
            await keys.aclose()
            nursery.cancel_scope.cancel()


async def test_the_passthroughs_generation_endpoints_count_their_usage(with_key, client, backend):
    url, keys, _ = await with_key(tpm=30, reserve=8)
    limiter = gateway.keys.Limiter(keys)
    plain = await client.post(url + "/v1/completions", json={"model": "text", "prompt": "hi"}, headers=auth(SECRET))
    assert plain.status_code == 200 and plain.json()["usage"]["total_tokens"] == 18
    assert await limiter.tokens_used(limited()) == 18
    streamed = await client.post(url + "/v1/completions", json={"model": "text", "prompt": "hi", "stream": True}, headers=auth(SECRET))
    assert streamed.status_code == 200 and streamed.content.endswith(b"data: [DONE]\n\n")
    assert await limiter.tokens_used(limited()) == 36  # the stream's usage chunk, read as it passed
    over = await client.post(url + "/v1/completions", json={"model": "text", "prompt": "hi"}, headers=auth(SECRET))
    assert over.status_code == 429 and over.json()["error"]["type"] == "tokens"
    assert len([r for r in backend.requests if r.path == "/v1/completions"]) == 2


async def test_each_round_of_a_tool_loop_is_admitted_against_the_token_limit(with_key, client, backend):
    url, _, tools = await with_key(tpm=1, reserve=8)
    r = await client.post(url + "/v1/responses", json={"model": "mcp-add", "input": "2+3?", "stream": True}, headers=auth(SECRET))
    final = parse_sse(r.content)[-2]
    assert final["type"] == "response.failed" and final["response"]["error"]["code"] == "rate_limit_exceeded"
    assert tools.calls == [("add", {"a": 2, "b": 3})] and len(backend.chat_requests) == 1  # the second round never ran


async def test_every_websocket_response_create_counts_against_requests_per_minute(with_key):
    url, _, _ = await with_key(rpm=5)
    outcomes = []
    async with httpx2.AsyncClient(timeout=10) as http:
        async with AsyncWebSocketClient(http).connect(url.replace("http", "ws") + "/v1/responses", headers=auth(SECRET)) as ws:
            for _ in range(20):
                await ws.send_text(orjson.dumps({"type": "response.create", **HI}).decode())
                while True:
                    event = orjson.loads(await ws.receive_text())
                    if event["type"] in ("response.completed", "error"):
                        outcomes.append(event["type"] if event["type"] != "error" else event["error"]["code"])
                        break
    assert outcomes[:5] == ["response.completed"] * 5
    assert outcomes[5:] == ["rate_limit_exceeded"] * 15


_RESET = re.compile(r"(\d+ms|(\d+m)?\d+(\.\d+)?s)")


async def test_responses_carry_openais_rate_limit_headers(with_key, client):
    url, _, _ = await with_key(rpm=3, tpm=1000, reserve=8)
    first = await client.post(url + "/v1/responses", json=HI, headers=auth(SECRET))
    h = first.headers
    assert (h["x-ratelimit-limit-requests"], h["x-ratelimit-remaining-requests"]) == ("3", "2")
    assert (h["x-ratelimit-limit-tokens"], h["x-ratelimit-remaining-tokens"]) == ("1000", str(1000 - RESERVATION))
    assert _RESET.fullmatch(h["x-ratelimit-reset-requests"]) and _RESET.fullmatch(h["x-ratelimit-reset-tokens"])
    streamed = await client.post(url + "/v1/responses", json={**HI, "stream": True}, headers=auth(SECRET))
    assert streamed.headers["x-ratelimit-remaining-requests"] == "1"
    assert int(streamed.headers["x-ratelimit-remaining-tokens"]) == 1000 - 18 - RESERVATION
    await client.post(url + "/v1/responses", json=HI, headers=auth(SECRET))
    refused = await client.post(url + "/v1/responses", json=HI, headers=auth(SECRET))
    assert refused.status_code == 429 and refused.headers["x-ratelimit-remaining-requests"] == "0"
    assert "retry-after" in refused.headers


# --- 5. STREAM_TIMEOUT counts data on the byte relay -------------------------------------------------------


async def test_a_relayed_chat_stream_of_comments_only_ends_after_stream_timeout(start_gateway, client):
    url = await start_gateway(stream_timeout=1.0)
    body = {"model": "comments-forever", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with trio.fail_after(1.0 + 10):  # the timeout, and a loaded machine's slack
        r = await client.post(url + "/v1/chat/completions", json=body)
    assert r.status_code == 200
    frames = [frame for frame in r.content.split(b"\n\n") if frame.startswith(b"data: ")]
    assert frames[-1] == b"data: [DONE]"
    assert orjson.loads(frames[-2][6:])["error"]["code"] == "backend_timeout"


async def test_a_relayed_chat_stream_whose_backend_falls_silent_ends_after_stream_timeout(start_gateway, client):
    # The relay's reads keep no transport timer: its data deadline alone must cut a backend that
    # sent a chunk and then nothing at all (not even a comment).
    url = await start_gateway(stream_timeout=0.5)
    body = {"model": "hang", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with trio.fail_after(0.5 + 10):
        r = await client.post(url + "/v1/chat/completions", json=body)
    assert r.status_code == 200
    frames = [frame for frame in r.content.split(b"\n\n") if frame.startswith(b"data: ")]
    assert orjson.loads(frames[0][6:])["choices"][0]["delta"]["content"] == "Waiting"
    assert orjson.loads(frames[-2][6:])["error"]["code"] == "backend_timeout"
    assert frames[-1] == b"data: [DONE]"
