"""The bench's other framing (h11 on the gateway's own connections) serves the gateway whole.

`gateway bench --only parsers` compares the gateway's own framing with h11's
on the same shell (`gateway.lab.h11framing`); this keeps the comparison
honest: with h11 framing every plain connection, streams, JSON answers,
keep-alive and refusals work as they do with the gateway's own.
"""

from __future__ import annotations

import pytest

from conftest import parse_sse
from gateway.lab.h11framing import H11_FRAMING
from gateway.server import h1
from test_http_strict import exchange, responses_in


@pytest.fixture
async def h11_gateway(monkeypatch, start_gateway):
    monkeypatch.setattr(h1, "FRAMING", H11_FRAMING)
    return await start_gateway()


async def test_with_h11_framing_streams_json_and_kept_alive_connections_are_served(h11_gateway, client):
    for _ in range(3):  # one kept-alive connection (the client's pool)
        streamed = await client.post(h11_gateway + "/v1/responses", json={"model": "text", "input": "hi", "stream": True})
        frames = parse_sse(streamed.content)
        assert frames[-1] == "[DONE]" and frames[-2]["type"] == "response.completed"
        answered = await client.post(h11_gateway + "/v1/responses", json={"model": "text", "input": "hi"})
        assert answered.status_code == 200 and answered.json()["status"] == "completed"


async def test_with_h11_framing_what_h11_refuses_is_refused_once(h11_gateway):
    found, rest = responses_in(await exchange(h11_gateway, b"GET /health HTTP/1.1\r\n\r\n"))
    assert [status for status, _, _ in found] == [400] and rest == b""
