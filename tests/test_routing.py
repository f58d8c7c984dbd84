"""Many backends: the config file, routes, fallback before the first chunk, circuit breakers, caps.

Two (or three) scripted backends are real HTTP servers; the gateway reads a
real TOML file (`GATEWAY_CONFIG`) or is given a `Router` with a clock the test
moves.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import pytest
import trio

import gateway
from conftest import SequentialIds, make_settings, parse_sse
from gateway.backends.config import parse_config
from gateway.backends.routing import build_router
from gateway.config import ConfigError
from gateway.errors import BackendUnavailable
from gateway.ops.redact import Redactor
from scripted_backend import ScriptedBackend, serve_backend
from spec import validate_event

EXAMPLE = """\
[backends.local]
type = "openai"                      # or "anthropic"
base_url = "{a}/v1"
api_key_env = "LOCAL_API_KEY"        # or api_key = "..."
[backends.spare]
type = "openai"
base_url = "{b}/v1"
[[routes]]
model = "qwen*"                      # exact name or glob
backends = ["local", "spare"]        # in order of preference
"""


@pytest.fixture
async def two(nursery) -> tuple[ScriptedBackend, ScriptedBackend]:
    a, b = ScriptedBackend(), ScriptedBackend()
    await nursery.start(serve_backend, a)
    await nursery.start(serve_backend, b)
    return a, b


def chats(backend: ScriptedBackend) -> list[Any]:
    return backend.chat_requests


def closed_port() -> str:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


async def start_with_config(nursery: trio.Nursery, tmp_path: Any, text: str, monkeypatch: Any, **overrides: Any) -> str:
    path = tmp_path / "gateway.toml"
    path.write_text(text)
    monkeypatch.setenv("LOCAL_API_KEY", "sk-local-secret-123")
    settings = make_settings("http://127.0.0.1:9", gateway_config=str(path), **overrides)
    app = gateway.create_app(settings, ids=SequentialIds(), clock=lambda: 1_700_000_000.0)
    return await nursery.start(functools.partial(gateway.serve, settings, app=app))  # type: ignore[no-any-return]


# --- the file ------------------------------------------------------------------------------------


def test_the_documented_shape_works_as_written():
    config = parse_config(EXAMPLE.format(a="http://127.0.0.1:8000", b="http://gpu-box:8000"), environ={"LOCAL_API_KEY": "k"})
    assert list(config.backends) == ["local", "spare"]
    assert config.backends["local"].api_key == "k" and config.backends["spare"].api_key is None
    route = config.route_for("qwen2.5-7b")
    assert route is not None and [t.backend for t in route.targets] == ["local", "spare"]
    assert config.route_for("llama") is None


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (('type = "openai"                      # or', 'type = "grpc"  # or'), "gateway.toml:2: backends.local.type: must be one of"),
        (('base_url = "http://gpu-box:8000/v1"', 'base_url = "gpu-box"'), "gateway.toml:7: backends.spare.base_url: must be an http"),
        (('backends = ["local", "spare"]', 'backends = ["local", "nowhere"]'), "gateway.toml:10: routes[0].backends: no backend named 'nowhere'"),
        (('api_key_env = "LOCAL_API_KEY"', 'api_key_env = "NOT_SET_ANYWHERE"'), "gateway.toml:4: backends.local.api_key_env: the environment variable NOT_SET_ANYWHERE is not set"),
        (('[backends.spare]', '[backends.spare]\nmax_concurrent_streams = 0'), "gateway.toml:6: backends.spare.max_concurrent_streams: must be at least 1"),
        (('model = "qwen*"', 'modle = "qwen*"'), "gateway.toml:9: routes[0].modle: unknown key"),
        (('[[routes]]', '[[routes'), "gateway.toml: not valid TOML"),
    ],
)
def test_an_invalid_file_names_the_file_the_line_and_the_key(change, expected):
    text = EXAMPLE.format(a="http://127.0.0.1:8000", b="http://gpu-box:8000").replace(*change)
    with pytest.raises(ConfigError) as refused:
        parse_config(text, environ={"LOCAL_API_KEY": "k"})
    assert str(refused.value).startswith(expected), str(refused.value)


async def test_config_check_validates_a_file_and_prints_the_resolved_routes(tmp_path):
    good = tmp_path / "gateway.toml"
    good.write_text(EXAMPLE.format(a="http://127.0.0.1:8000", b="http://gpu-box:8000"))
    env = {"PATH": "/usr/bin:/bin", "LOCAL_API_KEY": "sk-never-printed-123"}
    done = await trio.run_process([sys.executable, "-m", "gateway", "config", "check", str(good)], env=env, capture_stdout=True, capture_stderr=True, check=False)
    out = done.stdout.decode()
    assert done.returncode == 0 and "route qwen* -> local, spare" in out and "backend local: openai" in out
    assert "sk-never-printed-123" not in out + done.stderr.decode()
    bad = tmp_path / "bad.toml"
    bad.write_text(EXAMPLE.format(a="http://127.0.0.1:8000", b="gpu-box"))
    done = await trio.run_process([sys.executable, "-m", "gateway", "config", "check", str(bad)], env=env, capture_stderr=True, check=False)
    assert done.returncode == 2 and f"{bad}:7: backends.spare.base_url" in done.stderr.decode()


async def test_an_invalid_file_stops_start_up_with_one_clear_line(tmp_path, backend):
    bad = tmp_path / "gateway.toml"
    bad.write_text(EXAMPLE.format(a=backend.url, b="gpu-box"))
    env = {"PATH": "/usr/bin:/bin", "GATEWAY_CONFIG": str(bad), "LOCAL_API_KEY": "k", "API_ADAPTER_PORT": "0", "LOG_FILE_PATH": "", "STORE_BACKEND": "memory"}
    with trio.fail_after(30):
        done = await trio.run_process([sys.executable, "-m", "gateway", "serve"], env=env, cwd=tmp_path, capture_stderr=True, check=False)
    err = done.stderr.decode()
    assert done.returncode == 2 and f"{bad}:7: backends.spare.base_url: must be an http" in err and "Traceback" not in err


# --- routing and fallback over real sockets -----------------------------------------------------------


async def test_a_route_sends_each_model_to_its_first_backend_with_its_name_rewritten(nursery, tmp_path, two, client, monkeypatch):
    a, b = two
    text = EXAMPLE.format(a=a.url, b=b.url) + '[[routes]]\nmodel = "reasoner"\nbackends = [{ backend = "spare", model = "reasoning" }]\n'
    url = await start_with_config(nursery, tmp_path, text, monkeypatch)
    r = await client.post(url + "/v1/responses", json={"model": "qwen-small", "input": "hi", "stream": True})
    frames = parse_sse(r.content)
    for frame in frames[:-1]:
        validate_event(frame)
    assert frames[-2]["type"] == "response.completed" and frames[-2]["response"]["model"] == "qwen-small"
    assert [c["model"] for c in chats(a)] == ["qwen-small"] and chats(b) == []
    assert a.requests[-1].headers["authorization"] == "Bearer sk-local-secret-123"
    r = await client.post(url + "/v1/responses", json={"model": "reasoner", "input": "2+2?"})
    assert r.json()["output"][-1]["content"][0]["text"] == "The answer is 4." and r.json()["model"] == "reasoner"
    assert [c["model"] for c in chats(b)] == ["reasoning"]
    unknown = await client.post(url + "/v1/responses", json={"model": "llama", "input": "hi"})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"


@pytest.mark.parametrize("failure", ["http-500", "http-429", "error-first", "connect"])
async def test_a_failure_before_the_first_chunk_moves_on_to_the_next_backend(nursery, tmp_path, two, client, monkeypatch, failure):
    a, b = two
    first = closed_port() if failure == "connect" else a.url
    text = f"""
[backends.first]
base_url = "{first}"
[backends.second]
base_url = "{b.url}"
[[routes]]
model = "m"
backends = [{{ backend = "first", model = "{failure}" }}, {{ backend = "second", model = "text" }}]
"""
    url = await start_with_config(nursery, tmp_path, text, monkeypatch)
    for stream in (False, True):
        r = await client.post(url + "/v1/responses", json={"model": "m", "input": "hi", "stream": stream})
        final = parse_sse(r.content)[-2]["response"] if stream else r.json()
        assert final["status"] == "completed" and final["output"][0]["content"][0]["text"] == "Hello, world!"
    assert len(chats(b)) == 2
    if failure != "connect":
        assert [c["model"] for c in chats(a)] == [failure, failure]


async def test_no_retry_once_a_chunk_has_gone_out_and_none_for_the_clients_own_mistakes(nursery, tmp_path, two, client, monkeypatch):
    a, b = two
    text = f"""
[backends.first]
base_url = "{a.url}"
[backends.second]
base_url = "{b.url}"
[[routes]]
model = "cut"
backends = [{{ backend = "first", model = "eof-abrupt" }}, "second"]
[[routes]]
model = "too-long"
backends = [{{ backend = "first", model = "http-400" }}, "second"]
"""
    url = await start_with_config(nursery, tmp_path, text, monkeypatch)
    r = await client.post(url + "/v1/responses", json={"model": "cut", "input": "hi", "stream": True})
    frames = parse_sse(r.content)
    assert "Cut off" in r.text and frames[-2]["type"] in ("response.failed", "response.incomplete")
    r = await client.post(url + "/v1/responses", json={"model": "too-long", "input": "hi"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert chats(b) == []  # never asked


async def test_the_circuit_opens_after_repeated_failures_and_closes_after_a_good_probe(nursery, two, client):
    a, b = two
    config = parse_config(
        f"""
[backends.first]
base_url = "{a.url}"
[backends.second]
base_url = "{b.url}"
[[routes]]
model = "text"
backends = ["first", "second"]
[fallback]
failures_to_open = 2
cooldown = 30
"""
    )
    now = [1000.0]
    settings = make_settings(a.url)
    router = build_router(config, settings, Redactor(()))
    router._clock = lambda: now[0]
    app = gateway.create_app(settings, backend=router, ids=SequentialIds())
    url = await nursery.start(functools.partial(gateway.serve, settings, app=app))

    async def ask() -> None:
        r = await client.post(url + "/v1/responses", json={"model": "text", "input": "hi"})
        assert r.json()["status"] == "completed"

    a.fail_with = 503
    await ask()
    await ask()  # two failures in a row: first's circuit opens
    assert (len(chats(a)), len(chats(b))) == (2, 2)
    await ask()
    assert (len(chats(a)), len(chats(b))) == (2, 3)  # skipped while open
    now[0] += 31
    await ask()  # the cool-down is over: one probe, which fails, and the circuit opens again
    assert (len(chats(a)), len(chats(b))) == (3, 4)
    await ask()
    assert len(chats(a)) == 3
    now[0] += 31
    a.fail_with = None
    await ask()  # a good probe closes it
    await ask()
    assert (len(chats(a)), len(chats(b))) == (5, 5)
    await router.aclose()


async def test_a_capped_backend_queues_requests_and_passes_them_on_when_the_wait_is_too_long(nursery, tmp_path, two, client, monkeypatch):
    a, b = two
    text = f"""
[backends.first]
base_url = "{a.url}"
max_concurrent_streams = 1
queue_timeout = 30
[backends.small]
base_url = "{a.url}"
max_concurrent_streams = 1
queue_timeout = 0.2
[backends.second]
base_url = "{b.url}"
[[routes]]
model = "queued"
backends = [{{ backend = "first", model = "text-then-wait" }}]
[[routes]]
model = "overflow"
backends = [{{ backend = "small", model = "text-then-wait" }}, {{ backend = "second", model = "text" }}]
"""
    url = await start_with_config(nursery, tmp_path, text, monkeypatch)
    results: list[str] = []

    async def ask(model: str) -> None:
        r = await client.post(url + "/v1/responses", json={"model": model, "input": "hi"})
        results.append(r.json()["status"])

    async with trio.open_nursery() as asking:
        asking.start_soon(ask, "queued")
        await a.wait_for(lambda: len(chats(a)) == 1)
        asking.start_soon(ask, "queued")  # waits for the slot, not refused
        asking.start_soon(ask, "overflow")
        await a.wait_for(lambda: len(chats(a)) == 2)  # overflow's own first choice is free
        asking.start_soon(ask, "overflow")  # small is taken: after 0.2 s it goes to second
        await b.wait_for(lambda: len(chats(b)) == 1)
        assert len(chats(a)) == 2  # the queued request is still waiting for first's slot
        a.release.set()
    assert sorted(results) == ["completed"] * 4
    assert len(chats(a)) == 3


async def test_models_lists_the_configured_names_and_each_backends_own(nursery, tmp_path, two, client, monkeypatch):
    a, b = two
    url = await start_with_config(nursery, tmp_path, EXAMPLE.format(a=a.url, b=b.url) + '[[routes]]\nmodel = "gpt-local"\nbackends = ["spare"]\n', monkeypatch)
    r = await client.get(url + "/v1/models")
    assert r.status_code == 200 and r.json()["object"] == "list"
    ids = [m["id"] for m in r.json()["data"]]
    assert ids == ["gpt-local", "text"]  # the glob route is not a model; the backends' lists merged
    assert all(m["object"] == "model" for m in r.json()["data"])


def test_the_docs_example_file_is_valid():
    import pathlib
    import re

    page = (pathlib.Path(__file__).parent.parent / "docs" / "backends.md").read_text()
    section = page.split("## Several backends", 1)[1].split("\n## ", 1)[0]
    (example,) = re.findall(r"```toml\n(.*?)```", section, re.S)
    config = parse_config(example, environ={"LOCAL_API_KEY": "k"})
    assert [t.model for t in config.route_for("reasoner").targets] == ["qwen3-32b"]  # type: ignore[union-attr]
    assert config.backends["local"].max_concurrent_streams == 8 and config.backends["spare"].read_timeout == 300
    assert config.route_for("reasoner").context_window == 32768  # type: ignore[union-attr]


async def test_a_codex_model_catalog_lists_the_routed_models_with_their_context_windows(tmp_path, nursery, two, client, monkeypatch):
    import json

    a, b = two
    text = EXAMPLE.format(a=a.url, b=b.url) + '[[routes]]\nmodel = "qwen3-coder"\nbackends = ["local"]\ncontext_window = 131072\n'
    path = tmp_path / "gateway.toml"
    path.write_text(text)
    env = {"PATH": "/usr/bin:/bin", "LOCAL_API_KEY": "k"}
    done = await trio.run_process(
        [sys.executable, "-m", "gateway", "config", "codex-catalog", str(path), "--model", "smollm2"],
        env=env, capture_stdout=True, capture_stderr=True, check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    catalog = json.loads(done.stdout)
    # The fields Codex CLI requires of every entry (checked with `codex debug models`, Codex 0.169).
    required = {
        "slug", "display_name", "context_window", "supported_reasoning_levels", "shell_type", "visibility",
        "supported_in_api", "priority", "support_verbosity", "truncation_policy", "experimental_supported_tools",
        "base_instructions",
    }
    assert [(m["slug"], m["context_window"]) for m in catalog["models"]] == [("qwen3-coder", 131072), ("smollm2", 32768)]
    assert all(required <= set(m) for m in catalog["models"])
    url = await start_with_config(nursery, tmp_path, text, monkeypatch)
    listed = {m["id"]: m for m in (await client.get(url + "/v1/models")).json()["data"]}
    assert listed["qwen3-coder"]["context_window"] == 131072


async def test_a_request_begun_early_is_answered_by_the_first_backend_or_let_go_when_it_is_not_tried(nursery, two):
    # `begin_chat` sends the first round's request before the round starts (the gateway sets up
    # the client's stream meanwhile); the round reads its answer.  When the first backend is no
    # longer the one tried (its circuit opened in between), the begun request is let go (its
    # connection closed) and the route goes on as ever.
    a, b = two
    config = parse_config(
        f"""
[backends.first]
base_url = "{a.url}"
[backends.second]
base_url = "{b.url}"
[[routes]]
model = "text"
backends = ["first", "second"]
[fallback]
failures_to_open = 1
cooldown = 30
"""
    )
    router = build_router(config, make_settings(a.url), Redactor(()))
    body = {"model": "text", "messages": [{"role": "user", "content": "hi"}], "stream": True}

    async def answer(opening: Any = None) -> str:
        async with router.open_chat_stream(body, opening=opening) as stream:
            chunks = [chunk async for batch in stream for chunk in batch]
        return "".join((c["choices"][0]["delta"].get("content") or "") for c in chunks if isinstance(c, dict) and c.get("choices"))

    with trio.fail_after(10):
        assert router.begin_chat(body) is None  # no kept-alive connection yet: sent by the round
        assert await answer() == "Hello, world!"
        opening = router.begin_chat(body)
        assert opening is not None
        await a.wait_for(lambda: len(chats(a)) == 2)  # it arrived before the round began
        assert await answer(opening) == "Hello, world!"
        assert (len(chats(a)), len(chats(b))) == (2, 0)

        opening = router.begin_chat(body)
        assert opening is not None
        await a.wait_for(lambda: len(chats(a)) == 3)
        first = router.backends["first"]
        router._failed(first, BackendUnavailable("down"))  # meanwhile its circuit opened
        assert await answer(opening) == "Hello, world!"
        assert (len(chats(a)), len(chats(b))) == (3, 1)
        assert first.adapter._transport.connections == 0  # the begun request's connection was closed
    await router.aclose()
