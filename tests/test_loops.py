"""A backend URL that leads back to the gateway never recurses.

Two gateways that are each other's backend (a loop no start-up check can
see): the request that comes back is refused with 508 `loop_detected`, so
the client gets an answer at once instead of thousands of nested streams.
"""

from __future__ import annotations

import functools
import socket

import trio

import gateway
from conftest import SequentialIds, make_settings, parse_sse
from gateway.ops.loops import HOP_HEADER, INSTANCE, MAX_HOPS, self_references


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_two_gateways_that_are_each_others_backend_answer_at_once(nursery, backend, client, caplog):
    first, second = free_port(), free_port()
    urls = []
    for port, other in ((first, second), (second, first)):
        settings = make_settings(f"http://127.0.0.1:{other}", api_adapter_port=port, readiness_interval=60)
        app = gateway.create_app(settings, ids=SequentialIds())
        urls.append(await nursery.start(functools.partial(gateway.serve, settings, app=app)))
    with trio.fail_after(10):
        r = await client.post(urls[0] + "/v1/responses", json={"model": "text", "input": "hi"})
        relayed = await client.post(urls[0] + "/v1/completions", json={"model": "text", "prompt": "hi"})
        streamed = await client.post(urls[0] + "/v1/responses", json={"model": "text", "input": "hi", "stream": True})
    assert r.status_code == 502 and "HTTP 508" in r.json()["error"]["message"]
    assert relayed.status_code == 508 and relayed.json()["error"]["code"] == "loop_detected"
    final = parse_sse(streamed.content)[-2]
    assert final["type"] == "response.failed" and "HTTP 508" in final["response"]["error"]["message"]
    assert "came back" in caplog.text  # the refusal is logged with its cause
    assert backend.requests == []


async def test_a_request_naming_this_instance_or_too_many_hops_is_refused(start_gateway, client, backend):
    url = await start_gateway()
    for hops in (f"gw-elsewhere,{INSTANCE}", ",".join(f"gw-{n}" for n in range(MAX_HOPS))):
        r = await client.post(url + "/v1/responses", json={"model": "text", "input": "hi"}, headers={HOP_HEADER: hops})
        assert r.status_code == 508 and r.json()["error"]["code"] == "loop_detected"
    passed = await client.post(url + "/v1/responses", json={"model": "text", "input": "hi"}, headers={HOP_HEADER: "gw-elsewhere"})
    assert passed.status_code == 200
    assert backend.chat_requests and backend.requests[-1].headers[HOP_HEADER] == f"gw-elsewhere,{INSTANCE}"


def test_a_backend_url_that_is_the_gateways_own_address_is_found():
    assert self_references(["http://127.0.0.1:8080/v1"], ["http://127.0.0.1:8080"]) == ["http://127.0.0.1:8080/v1"]
    assert self_references(["http://localhost:8080"], ["http://0.0.0.0:8080"]) == ["http://localhost:8080"]
    assert self_references(["http://127.0.0.1:8081/v1"], ["http://127.0.0.1:8080"]) == []
    assert self_references(["https://api.openai.com/v1"], ["http://0.0.0.0:443"]) == []


async def test_a_backend_url_that_is_the_gateway_itself_is_refused_at_start_up(tmp_path):
    import os
    import sys

    from test_multi_instance_and_crash import _SETTINGS_VARIABLES, STARTUP_SECONDS

    port = free_port()
    config = tmp_path / "gateway.toml"
    config.write_text(f'[backends.me]\ntype = "openai"\nbase_url = "http://localhost:{port}/v1"\n')
    base = {k: v for k, v in os.environ.items() if k.upper() not in _SETTINGS_VARIABLES}
    cases = [
        ({"OPENAI_BASE_URL_INTERNAL": f"http://127.0.0.1:{port}/v1"}, "OPENAI_BASE_URL_INTERNAL: the backend"),
        ({"GATEWAY_CONFIG": str(config)}, f"{config}: the backend http://localhost:{port}/v1 is this gateway itself"),
    ]
    for workers in ("1", "2"):
        for env, said in cases:
            environ = {**base, "API_ADAPTER_HOST": "0.0.0.0", "API_ADAPTER_PORT": str(port), "LOG_FILE_PATH": "",
                       "STORE_BACKEND": "memory", **env}
            with trio.fail_after(STARTUP_SECONDS):
                done = await trio.run_process(
                    [sys.executable, "-m", "gateway", "serve", "--workers", workers],
                    env=environ, cwd=tmp_path, capture_stdout=True, capture_stderr=True, check=False,
                )
            err = done.stderr.decode()
            assert done.returncode == 2 and said in err and "Traceback" not in err, err
            assert "serving the Responses gateway" not in err


async def test_two_gateway_processes_that_are_each_others_backend_answer_at_once_and_stay_up(tmp_path, backend):
    import httpx2

    from test_multi_instance_and_crash import STARTUP_SECONDS, start_gateways

    first, second = free_port(), free_port()
    envs = [
        {"API_ADAPTER_PORT": str(port), "OPENAI_BASE_URL_INTERNAL": f"http://127.0.0.1:{other}/v1",
         "LOG_FILE_PATH": "", "STORE_BACKEND": "memory", "READINESS_INTERVAL": "60"}
        for port, other in ((first, second), (second, first))
    ]
    with trio.fail_after(STARTUP_SECONDS * 2 + 20):
        async with trio.open_nursery() as nursery:
            a, b = await start_gateways(nursery, tmp_path, *envs)
            async with httpx2.AsyncClient(timeout=10) as http:
                with trio.fail_after(10):  # one round trip through each, not thousands of nested streams
                    r = await http.post(a.url + "/v1/responses", json={"model": "text", "input": "hi"})
                    relayed = await http.post(a.url + "/v1/completions", json={"model": "text", "prompt": "hi"})
                assert r.status_code == 502 and "HTTP 508" in r.json()["error"]["message"]
                assert relayed.status_code == 508 and relayed.json()["error"]["code"] == "loop_detected"
                for process in (a, b):
                    assert (await http.get(process.url + "/health")).status_code == 200
            assert b"came back" in a.stderr + b.stderr
            nursery.cancel_scope.cancel()
    assert backend.requests == []
