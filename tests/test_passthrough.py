"""Every other /v1/{path} goes to the backend's /v1/{path}, as it is."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("suffix", ["", "/v1", "/v1/"])
async def test_models_are_passed_through_without_doubling_v1(start_gateway, backend, client, suffix):
    url = await start_gateway(openai_base_url_internal=backend.url + suffix)
    r = await client.get(url + "/v1/models")
    assert r.status_code == 200
    assert r.json()["data"][0]["id"] == "text"
    assert backend.requests[-1].path == "/v1/models"


async def test_post_body_query_and_headers_are_forwarded(gateway_url, backend, client):
    r = await client.post(
        gateway_url + "/v1/embeddings?encoding=float&x=1",
        json={"model": "e", "input": "hi"},
        headers={"authorization": "Bearer client-key", "x-request-id": "abc", "connection": "keep-alive"},
    )
    assert r.status_code == 200
    assert r.json()["echo_query"] == "encoding=float&x=1"
    seen = backend.requests[-1]
    assert (seen.method, seen.body) == ("POST", {"model": "e", "input": "hi"})
    assert seen.headers["x-request-id"] == "abc"
    # The backend gets the gateway's configured key, never the client's.
    assert seen.headers["authorization"] == "Bearer dummy-key"


async def test_backend_error_statuses_are_kept(gateway_url, client):
    r = await client.get(gateway_url + "/v1/teapot")
    assert r.status_code == 418 and r.json()["error"]["code"] == "teapot"
    r = await client.get(gateway_url + "/v1/does-not-exist")
    assert r.status_code == 404


async def test_streamed_backend_bodies_are_streamed_through(gateway_url, client):
    async with client.stream("GET", gateway_url + "/v1/stream-numbers") as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        body = b"".join([part async for part in r.aiter_bytes()])
    assert body == b"".join(f"data: {n}\n\n".encode() for n in range(20))


async def test_unreachable_backend_gives_502_on_passthrough(start_gateway, client):
    url = await start_gateway(openai_base_url_internal="http://127.0.0.1:9")
    r = await client.get(url + "/v1/models")
    assert r.status_code == 502 and r.json()["error"]["code"] == "backend_unavailable"


async def test_a_relayed_request_with_a_body_carries_its_own_headers_on_a_head_built_once(gateway_url, backend, client):
    for request_id in ("first", "second"):
        r = await client.post(
            gateway_url + "/v1/embeddings?x=1",
            json={"model": "e", "input": request_id},
            headers={"x-request-id": request_id, "user-agent": f"agent-{request_id}"},
        )
        assert r.status_code == 200 and r.json()["echo_query"] == "x=1"
        seen = backend.requests[-1]
        assert seen.body == {"model": "e", "input": request_id}
        assert (seen.headers["x-request-id"], seen.headers["user-agent"]) == (request_id, f"agent-{request_id}")
        assert seen.headers["authorization"] == "Bearer dummy-key"
        # Relayed as read: the backend is asked not to compress it.
        assert seen.headers["accept-encoding"] == "identity"
        assert int(seen.headers["content-length"]) == len(r.request.content)


async def test_an_answer_the_backend_compressed_anyway_is_relayed_decoded(gateway_url, client):
    r = await client.post(gateway_url + "/v1/gzipped", content=b"x" * 100, headers={"content-type": "text/plain"})
    assert r.status_code == 200
    assert "content-encoding" not in r.headers
    assert r.json() == {"unpacked": True, "size": 100}
