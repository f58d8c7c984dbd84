import orjson

from conftest import parse_sse


async def test_text_stream_end_to_end(gateway_url, client):
    r = await client.post(gateway_url + "/v1/responses", json={"model": "text", "input": "hi", "stream": True})
    assert r.status_code == 200
    frames = parse_sse(r.content)
    print([f if isinstance(f, str) else f["type"] for f in frames])
    assert frames[-1] == "[DONE]"
    assert frames[-2]["type"] == "response.completed"
