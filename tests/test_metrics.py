"""Prometheus metrics at /metrics, over real sockets: what each hook counts, with which labels.

Every value is read back from the page itself (parsed with prometheus-client's
own parser): requests by route, method, status and key; responses by model,
status, key and transport; tokens; latency histograms; live gauges; heartbeats;
backend errors; MCP calls; store latency; the page's token; and the sum over
`--workers N` processes.
"""

from __future__ import annotations

import functools
import json
import pathlib
import signal
import sys
from typing import Any

import httpx2
import pytest
import trio
import trio.testing
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from conftest import make_settings, parse_sse
from gateway.observe.metrics import OTHER, PrometheusTelemetry
from gateway.turn.engine import TurnOutcome
from scripted_backend import USAGE
from test_drain import served
from test_multi_instance_and_crash import STARTUP_SECONDS
from test_websocket import aconnect_ws, turn, ws_url

ALICE = "sk-alice-0123456789"
EXAMPLE_MCP = pathlib.Path(__file__).parent.parent / "examples" / "mcp_server.py"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def samples_of(page: str) -> Samples:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(page)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def label_values(samples: Samples) -> set[str]:
    return {v for _, labels in samples for _, v in labels}


async def scrape(client: httpx2.AsyncClient, url: str, *, token: str | None = None) -> Samples:
    """The page, once every task of the test's gateway has settled.

    The edge counts a request after its last byte has gone: waiting until
    every task is blocked lets it finish counting the requests before.
    """
    with trio.fail_after(10):
        await trio.testing.wait_all_tasks_blocked()
        headers = {"authorization": f"Bearer {token}"} if token else {}
        page = await client.get(url + "/metrics", headers=headers)
    assert page.status_code == 200, page.text
    return samples_of(page.text)


def comments_in(body: bytes) -> int:
    """SSE comment frames (the heartbeats) in a stream."""
    return sum(1 for frame in body.split(b"\n\n") if frame and all(line.startswith(b":") for line in frame.split(b"\n")))


# --- responses and requests ------------------------------------------------------------------


async def test_a_streamed_and_a_json_response_are_counted_with_their_labels_tokens_and_timings(start_gateway, client):
    url = await start_gateway(gateway_api_keys=f"alice={ALICE}")
    auth = {"authorization": f"Bearer {ALICE}"}
    streamed = await client.post(url + "/v1/responses", headers=auth, json={"model": "text", "input": "hi", "stream": True})
    plain = await client.post(url + "/v1/responses", headers=auth, json={"model": "text", "input": "hi"})
    refused = await client.post(url + "/v1/responses", json={"model": "text", "input": "hi"})
    assert (streamed.status_code, plain.status_code, refused.status_code) == (200, 200, 401)
    usages = [parse_sse(streamed.content)[-2]["response"]["usage"], plain.json()["usage"]]  # type: ignore[index]

    await trio.testing.wait_all_tasks_blocked()
    page = await client.get(url + "/metrics", headers=auth)  # keys are configured: the page needs one too
    assert page.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    m = samples_of(page.text)

    requests = "gateway_http_requests_total"
    assert value(m, requests, route="/v1/responses", method="POST", status="200", key="alice") == 2
    assert value(m, requests, route="/v1/responses", method="POST", status="401", key="anonymous") == 1
    assert value(m, "gateway_http_request_duration_seconds_count", route="/v1/responses") == 3
    responses = "gateway_responses_total"
    assert value(m, responses, model="text", status="completed", key="alice", transport="sse") == 1
    assert value(m, responses, model="text", status="completed", key="alice", transport="json") == 1
    # The tokens are the responses' usage, which is the backend's.
    assert [u["input_tokens"] for u in usages] == [USAGE["prompt_tokens"]] * 2
    assert value(m, "gateway_tokens_total", model="text", key="alice", direction="in") == sum(u["input_tokens"] for u in usages)
    assert value(m, "gateway_tokens_total", model="text", key="alice", direction="out") == sum(u["output_tokens"] for u in usages)
    assert value(m, "gateway_time_to_first_token_seconds_count", model="text") == 2
    for transport in ("sse", "json"):
        assert value(m, "gateway_time_to_first_event_seconds_count", model="text", transport=transport) == 1
        assert value(m, "gateway_response_duration_seconds_count", model="text", transport=transport) == 1
    first_token = value(m, "gateway_time_to_first_token_seconds_sum", model="text")
    durations = sum(value(m, "gateway_response_duration_seconds_sum", model="text", transport=t) or 0 for t in ("sse", "json"))
    assert first_token is not None and 0 < first_token <= durations
    assert value(m, "gateway_active_streams") == 0
    # Both responses were stored, each with one timed save.
    assert value(m, "gateway_store_operation_duration_seconds_count", operation="save", ok="true") == 2


async def test_a_stream_in_flight_is_an_active_stream_until_it_ends(gateway_url, client, backend):
    async with client.stream(
        "POST", gateway_url + "/v1/responses", json={"model": "text-then-wait", "input": "hi", "stream": True}
    ) as streamed:
        chunks = streamed.aiter_bytes()
        body = b""
        with trio.fail_after(10):
            while b'"delta":"Hello"' not in body:
                body += await anext(chunks)
        assert value(await scrape(client, gateway_url), "gateway_active_streams") == 1
        backend.release.set()
        with trio.fail_after(10):
            async for data in chunks:
                body += data
    assert body.endswith(b"data: [DONE]\n\n")
    m = await scrape(client, gateway_url)
    assert value(m, "gateway_active_streams") == 0
    assert value(m, "gateway_responses_total", model="text-then-wait", status="completed", key="anonymous", transport="sse") == 1


async def test_a_client_leaving_mid_stream_ends_its_active_stream_as_client_left(gateway_url, client, backend):
    async with client.stream("POST", gateway_url + "/v1/responses", json={"model": "hang", "input": "hi", "stream": True}):
        with trio.fail_after(10):
            await backend.stream_started.wait()
        assert value(await scrape(client, gateway_url), "gateway_active_streams") == 1
    with trio.fail_after(10):
        await backend.client_left.wait()  # the gateway hung up on the backend: the turn is over
    m = await scrape(client, gateway_url)
    assert value(m, "gateway_active_streams") == 0
    assert value(m, "gateway_responses_total", model="hang", status="client_left", key="anonymous", transport="sse") == 1


async def test_a_websocket_client_leaving_mid_turn_ends_its_active_stream_as_client_left(gateway_url, client, backend):
    async with aconnect_ws(ws_url(gateway_url)) as ws:
        await ws.send_text('{"type": "response.create", "model": "hang", "input": "hi"}')
        with trio.fail_after(10):
            await backend.stream_started.wait()
        assert value(await scrape(client, gateway_url), "gateway_active_streams") == 1
    with trio.fail_after(10):
        await backend.client_left.wait()
    m = await scrape(client, gateway_url)
    assert value(m, "gateway_active_streams") == 0
    assert value(m, "gateway_responses_total", model="hang", status="client_left", key="anonymous", transport="websocket") == 1


async def test_chat_completions_through_the_tool_loop_are_counted_as_responses(start_gateway, client, backend, tmp_path):
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"example": {"command": sys.executable, "args": [str(EXAMPLE_MCP)]}}}))
    url = await start_gateway(mcp_servers_config_path=str(config))
    messages = [{"role": "user", "content": "2+3?"}]
    plain = await client.post(url + "/v1/chat/completions", json={"model": "mcp-add", "messages": messages})
    assert plain.status_code == 200
    streamed = await client.post(url + "/v1/chat/completions", json={"model": "mcp-add", "messages": messages, "stream": True})
    assert streamed.content.endswith(b"data: [DONE]\n\n")
    m = await scrape(client, url)
    for transport in ("chat-json", "chat-sse"):
        assert value(m, "gateway_responses_total", model="mcp-add", status="completed", key="anonymous", transport=transport) == 1
        assert value(m, "gateway_time_to_first_event_seconds_count", model="mcp-add", transport=transport) == 1
    # Two rounds each (the tool call, then the answer): the usage of both is counted.
    assert value(m, "gateway_tokens_total", model="mcp-add", key="anonymous", direction="in") == 4 * USAGE["prompt_tokens"]
    assert value(m, "gateway_active_streams") == 0


async def test_every_heartbeat_sent_is_counted(start_gateway, client, backend):
    url = await start_gateway(heartbeat_interval=0.2)
    async with client.stream("POST", url + "/v1/responses", json={"model": "slow-first-token", "input": "hi", "stream": True}) as streamed:
        chunks = streamed.aiter_bytes()
        body = b""
        with trio.fail_after(10):
            while comments_in(body) == 0:  # the backend is silent until released
                body += await anext(chunks)
        backend.release.set()
        with trio.fail_after(10):
            async for data in chunks:
                body += data
    assert body.endswith(b"data: [DONE]\n\n")
    assert value(await scrape(client, url), "gateway_heartbeats_total") == comments_in(body) >= 1


async def test_backend_errors_are_counted_by_kind_and_unserved_model_names_stay_out_of_the_labels(gateway_url, client):
    failed = await client.post(gateway_url + "/v1/responses", json={"model": "http-500", "input": "hi"})
    unknown = await client.post(gateway_url + "/v1/responses", json={"model": "unknown-model", "input": "hi"})
    assert (failed.status_code, unknown.status_code) == (502, 404)
    assert unknown.json()["error"]["code"] == "model_not_found"
    m = await scrape(client, gateway_url)
    assert value(m, "gateway_backend_errors_total", kind="backend_error") == 1
    assert value(m, "gateway_backend_errors_total", kind="model_not_found") == 1
    # No response of either model ever produced a token: they count as "other".
    assert value(m, "gateway_responses_total", model=OTHER, status="failed", key="anonymous", transport="json") == 2
    assert not {"http-500", "unknown-model"} & label_values(m)
    requests = "gateway_http_requests_total"
    assert value(m, requests, route="/v1/responses", method="POST", status="502", key="anonymous") == 1
    assert value(m, requests, route="/v1/responses", method="POST", status="404", key="anonymous") == 1


async def test_labels_are_route_templates_and_known_methods_whatever_the_client_sends(gateway_url, client):
    missing = await client.get(gateway_url + "/v1/responses/resp_secret123")
    brewed = await client.request("PURGE", gateway_url + "/health")  # a method HTTP knows and the gateway does not
    assert (missing.status_code, brewed.status_code) == (404, 405)
    m = await scrape(client, gateway_url)
    requests = "gateway_http_requests_total"
    assert value(m, requests, route="/v1/responses/{id}", method="GET", status="404", key="anonymous") == 1
    assert value(m, requests, route="/health", method=OTHER, status="405", key="anonymous") == 1
    assert not {"resp_secret123", "/v1/responses/resp_secret123", "PURGE"} & label_values(m)


def test_model_labels_are_capped_and_a_hook_never_raises():
    telemetry = PrometheusTelemetry(make_settings("http://127.0.0.1:9"))
    for n in range(150):
        outcome = TurnOutcome(f"resp_{n}", f"model-{n}", "json", 0.0, status="completed", first_token_at=0.5, finished_at=1.0)
        telemetry.turn_started(outcome)
        telemetry.turn_finished(outcome)
    broken = TurnOutcome("resp_x", "model-0", "json", 0.0, status="completed", usage={"input_tokens": "many"})
    telemetry.turn_finished(broken)  # a malformed usage costs its metric, never the request
    telemetry.turn_finished(broken)  # a turn never started leaves the gauge alone
    page = telemetry.exposition()
    assert page is not None
    m = samples_of(page[0].decode())
    models = {dict(labels)["model"] for name, labels in m if name == "gateway_responses_total"}
    assert len(models) == 101 and OTHER in models  # 100 names, then "other"
    assert value(m, "gateway_responses_total", model=OTHER, status="completed", key="anonymous", transport="json") == 50
    assert value(m, "gateway_active_streams") == 0


# --- WebSockets, MCP ------------------------------------------------------------------------------


async def test_an_open_websocket_is_counted_until_it_closes(gateway_url, client):
    async with aconnect_ws(ws_url(gateway_url)) as ws:
        events = await turn(ws, model="text", input="hi")
        assert events[-1]["type"] == "response.completed"
        m = await scrape(client, gateway_url)
        assert value(m, "gateway_websocket_connections") == 1
        assert value(m, "gateway_responses_total", model="text", status="completed", key="anonymous", transport="websocket") == 1
        assert value(m, "gateway_tokens_total", model="text", key="anonymous", direction="out") == USAGE["completion_tokens"]
    assert value(await scrape(client, gateway_url), "gateway_websocket_connections") == 0


async def test_mcp_calls_are_counted_by_server_tool_and_outcome(start_gateway, client, backend, tmp_path):
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"example": {"command": sys.executable, "args": [str(EXAMPLE_MCP)]}}}))
    url = await start_gateway(mcp_servers_config_path=str(config))  # serves once the server has connected
    added = (await client.post(url + "/v1/responses", json={"model": "mcp-add", "input": "2+3?"})).json()
    offered = [t["function"]["name"] for t in backend.chat_requests[0].get("tools", [])]
    assert "add" in offered, offered
    failed = (await client.post(url + "/v1/responses", json={"model": "mcp-fail", "input": "x"})).json()
    calls = [item for r in (added, failed) for item in r["output"] if item["type"] == "mcp_call"]
    assert [(c["name"], c["status"]) for c in calls] == [("add", "completed"), ("fail", "failed")]
    m = await scrape(client, url)
    assert value(m, "gateway_mcp_calls_total", server="example", tool="add", outcome="ok") == 1
    assert value(m, "gateway_mcp_calls_total", server="example", tool="fail", outcome="error") == 1
    assert value(m, "gateway_mcp_calls_total", server="example", tool="add", outcome="error") is None
    assert value(m, "gateway_mcp_call_duration_seconds_count", server="example", tool="add") == 1
    assert value(m, "gateway_mcp_call_duration_seconds_count", server="example", tool="fail") == 1


# --- the page itself --------------------------------------------------------------------------------


async def test_the_metrics_token_is_required_once_set(start_gateway, client):
    url = await start_gateway(metrics_token="scrape-secret")
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "scrape-secret"}):
        refused = await client.get(url + "/metrics", headers=headers)
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    m = await scrape(client, url, token="scrape-secret")
    assert value(m, "gateway_http_requests_total", route="/metrics", method="GET", status="401", key="anonymous") == 3


async def test_no_metrics_page_when_metrics_are_off(start_gateway, client):
    url = await start_gateway(metrics_enabled=False)
    page = await client.get(url + "/metrics")
    assert page.status_code == 404 and page.json()["error"]["code"] == "unknown_url"


# --- several worker processes -------------------------------------------------------------------------


def responses_by_worker(directory: pathlib.Path) -> dict[str, float]:
    """Completed JSON responses counted in each worker's own file."""
    counts = {}
    for path in directory.glob("counter_*.db"):
        merged = MultiProcessCollector.merge([str(path)])
        counts[path.stem] = sum(
            s.value for family in merged for s in family.samples if s.name == "gateway_responses_total"
        )
    return counts


@pytest.mark.parametrize("operator_dir", [False, True], ids=["a directory of its own", "the operator's directory"])
async def test_workers_show_one_sum_whichever_answers_and_leave_no_files_behind(tmp_path, backend, operator_dir):
    temp = tmp_path / "tmp"  # where the gateway makes its own metrics directory
    temp.mkdir()
    given = tmp_path / "metrics"
    given.mkdir()
    env = {"STORE_BACKEND": "memory", "TMPDIR": str(temp)}
    if operator_dir:
        env["PROMETHEUS_MULTIPROC_DIR"] = str(given)
    with trio.fail_after(STARTUP_SECONDS * 2 + 90):
        async with served(tmp_path, backend.url, "--workers", "2", **env) as gateway:
            await gateway.until_logged("serving the Responses gateway on ", count=2)  # both workers
            url = gateway.url
            [directory] = [given] if operator_dir else list(temp.iterdir())

            # Each request on its own connection, so that the kernel hands it to
            # either worker; more are sent until both have answered some.
            sent = 0
            while sent < 20 or len([n for n in responses_by_worker(directory).values() if n]) < 2:
                assert sent < 200, responses_by_worker(directory)
                async with httpx2.AsyncClient(timeout=10) as http:
                    r = await http.post(url + "/v1/responses", json={"model": "text", "input": "hi", "store": False})
                assert r.json()["status"] == "completed"
                sent += 1
            # A JSON response is counted before its answer is sent: every scrape,
            # whichever worker serves it, shows all of them.
            for _ in range(6):
                async with httpx2.AsyncClient(timeout=10) as http:
                    page = await http.get(url + "/metrics")
                m = samples_of(page.text)
                labels = dict(model="text", status="completed", key="anonymous", transport="json")
                assert value(m, "gateway_responses_total", **labels) == sent
                tokens_in = value(m, "gateway_tokens_total", model="text", key="anonymous", direction="in")
                assert tokens_in == sent * USAGE["prompt_tokens"]
                assert value(m, "gateway_response_duration_seconds_count", model="text", transport="json") == sent
                assert value(m, "gateway_active_streams") == 0

            gateway.process.send_signal(signal.SIGTERM)
            assert await gateway.process.wait() == 0
            log = await gateway.read_rest()
    assert "Traceback" not in log, log
    assert list(temp.iterdir()) == []
    if operator_dir:
        # The operator's directory stays, with the totals; the exited workers' live gauges are gone.
        left = sorted(path.name.split("_")[0] for path in given.iterdir())
        assert left and set(left) <= {"counter", "histogram"}, left


# --- what the gateway adds ---------------------------------------------------------------------

HOLD = 0.4  # how long the backend keeps each request waiting before its first token


async def test_the_time_the_gateway_adds_is_counted_per_transport_without_the_backends_wait(gateway_url, client, backend):
    """`gateway_overhead_seconds`: a response's duration less the time the gateway waited on the
    backend. The backend holds each request HOLD seconds: the durations include that, the time
    the gateway added does not."""

    async def held(send: Any) -> None:
        backend.release, backend.stream_started = trio.Event(), trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(send)
            with trio.fail_after(10):
                await backend.stream_started.wait()
            await trio.sleep(HOLD)  # the backend's latency, which the gateway must not count as its own
            backend.release.set()

    responses = gateway_url + "/v1/responses"
    body = {"model": "slow-first-token", "input": "hi"}
    chat = {"model": "slow-first-token", "messages": [{"role": "user", "content": "hi"}]}
    message = {**chat, "max_tokens": 100}

    async def post(url: str, payload: dict[str, Any], **headers: str) -> None:
        answer = await client.post(url, json=payload, headers=headers)
        assert answer.status_code == 200, answer.text

    async def socket() -> None:
        async with aconnect_ws(ws_url(gateway_url)) as ws:
            events = await turn(ws, **body)
        assert events[-1]["type"] == "response.completed"

    sends = {
        "sse": functools.partial(post, responses, {**body, "stream": True}),
        "json": functools.partial(post, responses, body),
        "websocket": socket,
        "chat-relay": functools.partial(post, gateway_url + "/v1/chat/completions", {**chat, "stream": True}),
        "messages": functools.partial(post, gateway_url + "/v1/messages", {**message, "stream": True}, **{"anthropic-version": "2023-06-01"}),
    }
    warm = {**body, "model": "text"}  # first requests pay for what is set up once (connections, the store)
    await post(responses, warm)
    await post(responses, {**warm, "stream": True})
    before = await scrape(client, gateway_url)
    for send in sends.values():
        await held(send)

    after = await scrape(client, gateway_url)

    def grown(name: str, transport: str) -> float:
        def total(m: Samples) -> float:
            return sum(v for (n, labels), v in m.items() if n == name and ("transport", transport) in labels)

        return total(after) - total(before)

    for transport in sends:
        duration = grown("gateway_response_duration_seconds_sum", transport)
        added = grown("gateway_overhead_seconds_sum", transport)
        assert grown("gateway_overhead_seconds_count", transport) == 1, transport
        assert duration >= HOLD, transport
        assert 0 < added < HOLD / 2, (transport, added, duration)
