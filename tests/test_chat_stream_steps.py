"""A backend read that brings hundreds of chunks at once is decoded in growing steps."""

from __future__ import annotations

import httpx2
import orjson

from gateway.backends.openai import ChatStream
from gateway.ops.redact import Redactor
from scripted_backend import chunk


class OneRead(httpx2.AsyncByteStream):
    def __init__(self, data: bytes) -> None:
        self.data = data

    async def __aiter__(self):  # type: ignore[override]
        yield self.data


async def test_a_burst_of_chunks_is_delivered_first_in_small_batches_then_whole():
    texts = [f"t{n} " for n in range(300)]
    body = b"".join(b"data: " + orjson.dumps(chunk({"content": t})) + b"\n\n" for t in texts) + b"data: [DONE]\n\n"
    stream = ChatStream(httpx2.Response(200, stream=OneRead(body)), data_timeout=30, redactor=Redactor([]))
    sizes, seen = [], []
    async for batch in stream:
        sizes.append(len(batch))
        seen += [c for c in batch if isinstance(c, dict)]
    assert sizes[0] <= 8 < sizes[1] < sizes[2]  # the first tokens leave before the rest is decoded
    assert len(sizes) <= 5  # and only the first steps are cut
    assert [c["choices"][0]["delta"]["content"] for c in seen] == texts
    assert stream.saw_done
