"""A compressed request body is bounded by what it inflates to and by how far, before it is parsed.

A 65 KB gzip upload can inflate to the whole 64 MiB body limit: ten of them
held 1.25 GiB.  Past `RATIO_FLOOR`, a body may inflate at most
`MAX_DECOMPRESSION_RATIO` times its size, and decompression stops at the
bound instead of producing everything first.
"""

from __future__ import annotations

import gzip
import tracemalloc
import zlib

import orjson
import pytest
import trio
import zstandard

from gateway.errors import RequestTooLarge
from gateway.app.bodies import RATIO_FLOOR, decode_body as decompress

LIMIT = 64 * 1024 * 1024


def bomb(encoding: str, size: int = LIMIT - 1024, *, stream: bool = False) -> bytes:
    body = b'{"model": "text", "stream": %s, "input": "' % (b"true" if stream else b"false") + b"x" * size + b'"}'
    if encoding == "gzip":
        return gzip.compress(body, compresslevel=9)
    if encoding == "deflate":
        return zlib.compress(body, 9)
    return zstandard.ZstdCompressor(level=19).compress(body)


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "zstd"])
def test_a_bomb_is_refused_holding_no_more_than_the_ratio_allows(encoding):
    packed = bomb(encoding)
    assert len(packed) * 100 < RATIO_FLOOR  # inside the body limit, far past the ratio
    tracemalloc.start()
    try:
        with pytest.raises(RequestTooLarge) as refused:
            decompress(packed, encoding, LIMIT, max_ratio=100)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "MAX_DECOMPRESSION_RATIO" in refused.value.message
    assert peak < RATIO_FLOOR + 2 * 1024 * 1024  # the floor, not the 64 MiB it would become


def test_ordinary_compressed_bodies_pass_and_large_ones_within_the_ratio_too():
    small = orjson.dumps({"model": "text", "input": "squeezed"})
    assert decompress(gzip.compress(small), "gzip", LIMIT, max_ratio=100) == small
    # 12 MiB of varied JSON compresses ~4-10x: well past the floor, well within the ratio.
    varied = orjson.dumps({"input": [{"role": "user", "content": f"message {i} " + str(i * 7919) * 20} for i in range(80_000)]})
    assert len(varied) > RATIO_FLOOR
    assert decompress(zstandard.ZstdCompressor().compress(varied), "zstd", LIMIT, max_ratio=100) == varied
    with pytest.raises(RequestTooLarge) as refused:  # the size limit still holds by itself
        decompress(gzip.compress(varied), "gzip", 1024 * 1024, max_ratio=1000)
    assert "exceeds the limit" in refused.value.message


@pytest.mark.parametrize(
    "path,stream",
    [("/v1/responses", False), ("/v1/responses", True), ("/v1/chat/completions", False), ("/v1/embeddings", False)],
)
async def test_every_route_refuses_a_compression_bomb_with_413(start_gateway, client, backend, path, stream):
    url = await start_gateway()
    packed = bomb("gzip", stream=stream)
    body_headers = {"content-type": "application/json", "content-encoding": "gzip"}
    answers = []

    async def send() -> None:
        answers.append(await client.post(url + path, content=packed, headers=body_headers))

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for _ in range(10):  # at once, as the report's ten uploads
                nursery.start_soon(send)
    assert [r.status_code for r in answers] == [413] * 10
    assert {r.json()["error"]["code"] for r in answers} == {"request_too_large"}
    assert backend.requests == []
