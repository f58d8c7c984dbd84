"""Every other /v1/{path} goes to the backend's /v1/{path}, as it is."""

from __future__ import annotations

import pytest
import trio


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


async def test_a_long_burst_of_events_read_in_large_pieces_is_relayed_whole_and_in_order(gateway_url, client):
    # 3,000 events of ~100 bytes sent at once: the relay reads them in pieces of several
    # kilobytes, and waits a moment after each (`GATHER`); nothing is lost or reordered.
    pad = "." * 90
    with trio.fail_after(30):
        async with client.stream("GET", gateway_url + "/v1/stream-numbers?count=3000&pad=90") as r:
            body = b"".join([part async for part in r.aiter_bytes()])
    assert body == b"".join(f"data: {n}{pad}\n\n".encode() for n in range(3000))


async def test_a_relayed_event_stream_that_is_ahead_is_read_again_a_moment_later_and_one_read_as_written_at_once(
    autojump_clock,
):
    from gateway.observe.outcome import TurnOutcome
    from gateway.transport.passthrough import GATHER, GATHER_AFTER, PassthroughBody

    small, large = b"data: 1\n\n", b"data: " + b"x" * GATHER_AFTER + b"\n\n"
    asked: list[float] = []  # when each read was asked for (the test's clock)

    class Upstream:
        status, data_timeout = 200, None

        def __init__(self, content_type: str, parts: list[bytes]) -> None:
            self.headers, self.parts = {"content-type": content_type}, list(parts)

        def __aiter__(self):
            return self

        async def __anext__(self) -> bytes:
            asked.append(trio.current_time())
            if not self.parts:
                raise StopAsyncIteration
            return self.parts.pop(0)

    class Backend:
        def __init__(self, upstream: Upstream) -> None:
            self.upstream = upstream

        def open_passthrough(self, *request):
            upstream = self.upstream

            class Opened:
                async def __aenter__(self):
                    return upstream

                async def __aexit__(self, *exc):
                    pass

            return Opened()

    class Relay:
        method, path, query, headers, body = "POST", "chat/completions", b"", {}, b"{}"

        def __init__(self) -> None:
            self.outcome = TurnOutcome("chatcmpl_1", "m", "chatcmpl", trio.current_time())

        async def finish(self, **ended):
            self.ended = ended

    relay = Relay()

    async def relayed(content_type: str, parts: list[bytes]) -> list[bytes]:
        asked.clear()
        relay.outcome.waited = 0.0
        got = []
        async with PassthroughBody(Backend(Upstream(content_type, parts)), relay, heartbeats=None) as body:  # type: ignore[arg-type]
            async for data in body:
                got.append(data)
        return got

    parts = [small, large, small, small, large, large, small]
    with trio.fail_after(5):
        assert await relayed("text/event-stream", parts) == parts
    gaps = [round(later - earlier, 9) for earlier, later in zip(asked, asked[1:])]
    # The read after each large piece waits GATHER; after a small one, nothing.
    assert gaps == [0, GATHER, 0, 0, GATHER, GATHER, 0]
    # Those waits are the backend's in the response's outcome, not time the gateway added.
    assert round(relay.outcome.waited, 9) == round(3 * GATHER, 9)
    # A body that is not an event stream (an embedding, a JSON answer) is read as fast as it comes.
    with trio.fail_after(5):
        assert await relayed("application/json", [large, large, small]) == [large, large, small]
    assert [round(later - earlier, 9) for earlier, later in zip(asked, asked[1:])] == [0, 0, 0]


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


async def test_the_last_bytes_of_a_relayed_body_come_marked_as_its_end_with_what_the_redactor_held_back(nursery):
    from conftest import make_settings
    from gateway.backends import OpenAICompatibleBackend
    from test_http1 import HEAD, Server

    # The body ends with the start of the backend's key: the redactor holds it back until it
    # knows whether the key follows, then it goes with the last bytes, not after them.
    server = Server(lambda n: [HEAD + b"9\r\ndata: 1\n\n\r\n", b"c\r\ndata: sk-the\r\n0\r\n\r\n"])
    url = await nursery.start(server.serve)
    adapter = OpenAICompatibleBackend(make_settings(url, openai_api_key="sk-the-secret-key"))
    steps = []
    with trio.fail_after(10):
        async with adapter.open_passthrough("POST", "chat/completions", b"", {}, b'{"stream": true}') as upstream:
            async for data in upstream:
                steps.append((data, upstream.finished))
    await adapter.aclose()
    assert b"".join(data for data, _ in steps) == b"data: 1\n\ndata: sk-the"
    assert [finished for _, finished in steps] == [False] * (len(steps) - 1) + [True]
    assert steps[-1][0].endswith(b"data: sk-the")


async def test_a_body_that_knows_its_last_bytes_sends_them_with_its_end_in_one_message():
    from gateway.transport.asgi import send_body
    from gateway.transport.body import DeferredHeadBody

    class Body(DeferredHeadBody):
        def __init__(self, parts: list[bytes], knows: bool) -> None:
            self.parts, self.knows = list(parts), knows

        async def head(self):
            return 200, {"content-type": "text/event-stream"}

        def __aiter__(self):
            return self

        async def __anext__(self) -> bytes:
            if not self.parts:
                raise StopAsyncIteration
            data = self.parts.pop(0)
            self.finished = self.knows and not self.parts
            return data

    for knows, ends in ((True, [(b"a", True), (b"b", False)]), (False, [(b"a", True), (b"b", True), (b"", False)])):
        sent = []

        async def send(message):
            sent.append(message)

        with trio.fail_after(5):
            await send_body(Body([b"a", b"b"], knows), send)
        assert sent[0]["type"] == "http.response.start"
        assert [(m["body"], m["more_body"]) for m in sent[1:]] == ends
