"""End-to-end check of the llama.cpp lab backend (xllamacpp + SmolLM2-135M, no network)."""

from __future__ import annotations

import json
import os
import threading

import httpx2
import pytest
import trio

from gateway.lab.llamacpp import run_llama_server

pytestmark = pytest.mark.e2e


async def _stream_chat(base_url: str) -> tuple[list[str], list[dict], bool]:
    """POST a streaming chat completion; return (content deltas, usage chunks, saw [DONE])."""
    body = {
        "model": "SmolLM2-135M-Instruct",
        "messages": [{"role": "user", "content": "Say hello in one short sentence."}],
        "max_tokens": 16,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    deltas: list[str] = []
    usage_chunks: list[dict] = []
    done = False
    async with httpx2.AsyncClient(timeout=60.0, trust_env=False) as client:
        async with client.stream("POST", f"{base_url}/v1/chat/completions", json=body) as resp:
            assert resp.status_code == 200
            assert resp.headers["content-type"].startswith("text/event-stream")
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[len("data:") :].strip()
                if data == "[DONE]":
                    done = True
                    continue
                assert not done, "data after [DONE]"
                chunk = json.loads(data)
                assert "error" not in chunk, chunk
                assert chunk["object"] == "chat.completion.chunk"
                for choice in chunk["choices"]:
                    content = choice.get("delta", {}).get("content")
                    if content:
                        deltas.append(content)
                if chunk.get("usage"):
                    usage_chunks.append(chunk)
    return deltas, usage_chunks, done


async def test_llama_server_streams_chat_completion_and_stops_on_cancel() -> None:
    non_daemon_before = {t for t in threading.enumerate() if not t.daemon}

    with trio.fail_after(180):
        async with trio.open_nursery() as nursery:
            base_url = await nursery.start(run_llama_server)
            assert base_url.startswith("http://127.0.0.1:")
            assert not base_url.endswith("/v1")
            pid = base_url.pid
            os.kill(pid, 0)  # the child is alive while the task runs

            deltas, usage_chunks, done = await _stream_chat(base_url)

            nursery.cancel_scope.cancel()

    assert deltas, "expected at least one content delta"
    assert "".join(deltas).strip()
    assert len(usage_chunks) == 1
    (final,) = usage_chunks
    assert final["choices"] == []
    usage = final["usage"]
    assert 0 < usage["completion_tokens"] <= 16
    assert usage["prompt_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert done, "llama.cpp terminates streams with data: [DONE]"

    # The nursery only exits after run_llama_server has reaped its child: it no longer exists,
    # nothing listens on its port, and no non-daemon thread was left behind to keep the
    # interpreter alive.
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    async with httpx2.AsyncClient(timeout=5.0, trust_env=False) as client:
        with pytest.raises(httpx2.ConnectError):
            await client.get(f"{base_url}/health")
    assert {t for t in threading.enumerate() if not t.daemon} <= non_daemon_before
