"""`gateway doctor`: each backend tried the way the clients will use it, a verdict and a fix per row.

Run as users run it (`gateway.cli.main(["doctor", ...])`, in a worker thread since it calls
`trio.run` itself; once as `python -m gateway doctor`), against the scripted backend's "capable"
model with one capability taken away at a time, a socket that never answers, a scripted
Anthropic server, and real llama.cpp with SmolLM2.
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
import socket
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio

from anthropic_server import AnthropicServer, serve_anthropic
from gateway import cli
from gateway.backends.doctor.checks import CHECKS
from gateway.lab.llamacpp import DEFAULT_ALIAS, run_llama_server
from scripted_backend import ScriptedBackend

Doctor = Callable[..., Awaitable[tuple[int, str, str]]]
NAMES = [check.name for check in CHECKS]


@pytest.fixture
def doctor(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> Doctor:
    """`gateway doctor ARGS` with the routes file `routes` (TOML text): its exit status, stdout, stderr."""
    monkeypatch.chdir(tmp_path)  # (no .env of the checkout's)

    async def run(*args: str, routes: str | None = None) -> tuple[int, str, str]:
        if routes is not None:
            (tmp_path / "gateway.toml").write_text(routes)
            monkeypatch.setenv("GATEWAY_CONFIG", str(tmp_path / "gateway.toml"))
        capsys.readouterr()
        code = await trio.to_thread.run_sync(cli.main, ["doctor", *args])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def routes_to(url: str, model: str = "capable", *, kind: str = "openai", key: str | None = None) -> str:
    key_line = f'api_key = "{key}"\n' if key else ""
    return (
        f'[backends.here]\ntype = "{kind}"\nbase_url = "{url}/v1"\n{key_line}'
        f'[[routes]]\nmodel = "{model}"\nbackends = ["here"]\n'
    )


def capable(backend: ScriptedBackend, **changes: Any) -> ScriptedBackend:
    """The scripted backend as a server that does it all: a tokenizer, a 32k context, the model listed."""
    backend.tokenizer, backend.window, backend.listed = "llamacpp", ("llamacpp", 32768), ("capable",)
    for name, value in changes.items():
        setattr(backend, name, value)
    return backend


def rows_of(out: str, route: int = 0) -> dict[str, dict[str, Any]]:
    document = json.loads(out)
    return {row["name"]: row for row in document["routes"][route]["rows"]}


async def test_a_backend_that_does_everything_a_client_needs_gets_ok_on_every_row_and_exit_0(backend, doctor):
    capable(backend)
    with trio.fail_after(30):
        code, out, err = await doctor("--json", routes=routes_to(backend.url))
    rows = rows_of(out)
    assert list(rows) == NAMES
    assert {name: row["verdict"] for name, row in rows.items()} == dict.fromkeys(NAMES, "ok")
    assert all(row["fix"] is None for row in rows.values())
    assert "reused" in rows["prefix cache"]["detail"] and "llama.cpp" in rows["tokenizer"]["detail"]
    assert rows["streaming"]["needed_by"] == ["Claude Code", "Codex", "opencode"] and rows["prefix cache"]["needed_by"] == []
    assert (code, err) == (0, "")
    # The forced call was answered, and its result went back with it.
    second = [r for r in backend.chat_requests if any(m.get("role") == "tool" for m in r["messages"])]
    assert len(second) == 1 and json.loads(second[0]["messages"][1]["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}


# (what the backend is made to be, the rows it spoils and the verdict of the first, what its fix names)
BROKEN = [
    ({"lacks": frozenset({"tool-call"})}, {"forced tool call": "fail", "parallel tool calls": "warn"}, "--jinja"),
    ({"lacks": frozenset({"tool-json"})}, {"forced tool call": "fail"}, "--jinja"),
    ({"lacks": frozenset({"tool-result"})}, {"forced tool call": "fail"}, "llama-server"),
    (
        {"lacks": frozenset({"stream-end"})},
        {"streaming": "fail", "forced tool call": "fail", "usage in streams": "warn", "prefix cache": "warn"},
        "proxy",
    ),
    ({"window": ("llamacpp", 2048)}, {"context window": "fail"}, "--ctx-size"),
    ({"window": ("vllm", 2048)}, {"context window": "fail"}, "--max-model-len"),
    ({"window": ("llamacpp", 8192)}, {"context window": "warn"}, "--ctx-size"),
    ({"window": None}, {"context window": "warn"}, "context_window"),
    ({"lacks": frozenset({"parallel"})}, {"parallel tool calls": "warn"}, "one round at a time"),
    ({"lacks": frozenset({"usage"})}, {"usage in streams": "warn", "prefix cache": "warn"}, "include_usage"),
    ({"lacks": frozenset({"cached-field"})}, {"usage in streams": "warn", "prefix cache": "warn"}, "cache hits"),
    ({"lacks": frozenset({"prefix-cache"})}, {"prefix cache": "warn"}, "--cache-reuse"),
    ({"lacks": frozenset({"reasoning"})}, {"reasoning": "n/a"}, "--reasoning-format"),
    ({"tokenizer": None}, {"tokenizer": "warn"}, "/tokenize"),
    ({"listed": ("some-other-model", "another")}, {"models listed": "warn"}, 'model = "some-other-model"'),
]
IDS = [
    "no tool call", "arguments not JSON", "tool result refused", "stream cut", "2k llama.cpp context", "2k vLLM context",
    "8k context", "context unknown", "no parallel calls", "no usage", "no cached tokens", "no prefix cache", "no reasoning",
    "no tokenizer", "model not listed",
]


@pytest.mark.parametrize(("changes", "spoiled", "fix"), BROKEN, ids=IDS)
async def test_each_row_a_backend_fails_gets_its_verdict_and_a_fix_and_exit_1_only_when_a_client_needs_it(backend, doctor, changes, spoiled, fix):
    capable(backend, **changes)
    with trio.fail_after(30):
        code, out, _ = await doctor("--json", routes=routes_to(backend.url))
    rows = rows_of(out)
    assert {name: row["verdict"] for name, row in rows.items()} == {name: spoiled.get(name, "ok") for name in NAMES}
    first = rows[next(iter(spoiled))]
    assert fix in first["fix"], first
    assert all(rows[name]["fix"] for name in spoiled)  # every row that is not ok says what to do
    assert code == (1 if "fail" in spoiled.values() else 0)
    assert code == (1 if any(rows[name]["needed_by"] for name, verdict in spoiled.items() if verdict == "fail") else 0)


async def test_a_backend_that_refuses_the_key_fails_reachable_naming_the_setting_and_never_prints_the_key(backend, doctor):
    capable(backend, key="sk-the-right-one")
    with trio.fail_after(30):
        code, out, err = await doctor(routes=routes_to(backend.url, key="sk-wrong-key-0123456789"))
    assert code == 1
    line = next(line for line in out.splitlines() if line.lstrip().startswith("reachable"))
    assert "FAIL" in line and "401" in line
    assert "api_key_env" in out and "not tried: the backend refuses the key" in out
    assert "sk-wrong-key-0123456789" not in out + err
    assert backend.requests[0].headers["authorization"] == "Bearer sk-wrong-key-0123456789"  # sent as the gateway sends it


async def test_a_backend_that_takes_the_connection_and_never_answers_fails_reachable_and_the_run_still_ends(doctor):
    with socket.socket() as silent:  # listening, never accepting: the kernel completes the handshake
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        with trio.fail_after(20):
            code, out, _ = await doctor("--json", "--timeout", "0.5", routes=routes_to(url))
    rows = rows_of(out)
    assert rows["reachable"]["verdict"] == "fail" and "no answer within 0.5 s" in rows["reachable"]["detail"]
    assert rows["reachable"]["fix"]
    assert all(rows[name]["verdict"] == "n/a" for name in NAMES[1:-1])
    assert code == 1


async def test_a_backend_still_loading_its_model_fails_reachable_and_nothing_else_is_tried(nursery, doctor):
    async def loading(stream: trio.SocketStream) -> None:  # llama.cpp's answer while it loads
        body = b'{"error":{"message":"Loading model","type":"unavailable_error","code":503}}'
        await stream.receive_some(65536)
        await stream.send_all(b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
        await stream.aclose()

    listeners = await nursery.start(functools.partial(trio.serve_tcp, loading, 0, host="127.0.0.1"))
    url = f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"
    with trio.fail_after(20):
        code, out, _ = await doctor("--json", "--timeout", "5", routes=routes_to(url))
    rows = rows_of(out)
    assert rows["reachable"]["verdict"] == "fail" and "503" in rows["reachable"]["detail"] and "load" in rows["reachable"]["fix"]
    assert [rows[name]["detail"] for name in NAMES[1:-1]] == ["not tried: the backend is not ready"] * (len(NAMES) - 2)
    assert code == 1


async def test_a_backend_nobody_listens_on_fails_reachable_with_the_setting_to_fix(doctor):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"  # bound, not listening: refused
        with trio.fail_after(20):
            code, out, _ = await doctor("--json", "--timeout", "5", routes=routes_to(url))
    rows = rows_of(out)
    assert rows["reachable"]["verdict"] == "fail" and "cannot connect" in rows["reachable"]["detail"]
    assert "backends.here.base_url" in rows["reachable"]["fix"]
    assert code == 1


async def test_the_json_document_carries_the_verdicts_the_table_shows(backend, doctor):
    capable(backend, window=("llamacpp", 2048), lacks=frozenset({"parallel"}))
    routes = routes_to(backend.url)
    with trio.fail_after(30):
        table_code, table, _ = await doctor(routes=routes)
        json_code, document, _ = await doctor("--json", routes=routes)
    shown = {}
    for line in table.splitlines():
        for name in NAMES:
            if line.startswith(f"  {name} "):
                shown[name] = line[len(name) + 2 :].split()[0].lower()
    assert "context window" in table.splitlines()[-1]  # the summary names what failed
    assert shown == {name: row["verdict"] for name, row in rows_of(document).items()}
    assert shown["context window"] == "fail" and shown["parallel tool calls"] == "warn"
    assert table_code == json_code == json.loads(document)["exit_status"] == 1


async def test_an_unknown_route_is_one_line_on_stderr_and_exit_2(backend, doctor):
    with trio.fail_after(30):
        code, out, err = await doctor("--route", "nope", routes=routes_to(backend.url))
    assert code == 2 and out == ""
    assert len(err.splitlines()) == 1 and "no route 'nope'" in err and "capable" in err
    assert backend.requests == []


async def test_a_configuration_that_cannot_be_read_is_one_line_on_stderr_and_exit_2(doctor, monkeypatch, tmp_path):
    monkeypatch.setenv("GATEWAY_CONFIG", str(tmp_path / "missing.toml"))
    code, out, err = await doctor()
    assert code == 2 and out == ""
    assert len(err.splitlines()) == 1 and "missing.toml" in err


async def test_route_picks_one_route_and_a_name_its_glob_matches_is_the_model_tried(backend, doctor):
    capable(backend, listed=("capable", "other"))
    routes = routes_to(backend.url, model="cap*") + '[[routes]]\nmodel = "elsewhere"\nbackends = ["here"]\n'
    with trio.fail_after(30):
        code, out, _ = await doctor("--json", "--route", "capable", routes=routes)
    document = json.loads(out)
    assert [(r["route"], r["model"]) for r in document["routes"]] == [("cap*", "capable")]
    assert {r.body["model"] for r in backend.requests if isinstance(r.body, dict) and "model" in r.body} == {"capable"}
    assert code == 0


async def test_an_anthropic_backend_is_tried_through_messages_and_the_chat_only_rows_are_not_applicable(nursery, doctor):
    server = AnthropicServer()
    await nursery.start(serve_anthropic, server)
    with trio.fail_after(30):
        code, out, _ = await doctor("--json", routes=routes_to(server.url, model="claude-tools", kind="anthropic"))
    rows = rows_of(out)
    assert {name: rows[name]["verdict"] for name in ("reachable", "streaming", "forced tool call", "messages route")} == dict.fromkeys(
        ("reachable", "streaming", "forced tool call", "messages route"), "ok"
    )
    for name in ("parallel tool calls", "usage in streams", "reasoning", "context window", "tokenizer", "prefix cache"):
        assert rows[name]["verdict"] == "n/a", name
    assert rows["messages route"]["detail"].startswith("native")
    assert {"type": "tool", "name": "get_weather"} in [r.get("tool_choice") for r in server.requests]  # forced, in Messages' terms
    assert code == 0


async def test_the_command_with_one_backend_and_no_routes_file_tries_the_model_the_backend_lists(backend, tmp_path):
    """`python -m gateway doctor` as a user runs it, with OPENAI_BASE_URL_INTERNAL only."""
    capable(backend)
    env = {k: v for k, v in os.environ.items() if k not in ("GATEWAY_CONFIG", "OPENAI_API_KEY")}
    env.update(OPENAI_BASE_URL_INTERNAL=backend.url, PYTHONPATH=str(pathlib.Path(__file__).parents[1]))
    with trio.fail_after(60):
        done = await trio.run_process(
            [sys.executable, "-m", "gateway", "doctor", "--json"], cwd=tmp_path, env=env, capture_stdout=True, capture_stderr=True, check=False
        )
    document = json.loads(done.stdout)
    assert [(r["route"], r["backend"], r["model"]) for r in document["routes"]] == [("*", "default", "capable")]
    assert {row["verdict"] for row in document["routes"][0]["rows"]} == {"ok"}
    assert (done.returncode, done.stderr) == (0, b"")


# --- real llama.cpp with SmolLM2 -------------------------------------------------------------------


@pytest.mark.e2e
async def test_smollm2_on_llamacpp_gets_the_verdicts_it_earns(nursery, doctor):
    """SmolLM2's chat template renders no tools, so llama.cpp answers a forced tool call in text:
    the one needed row that fails.  The rest is as llama.cpp is: its `/props` context (the
    model's 8k training context, whatever more is asked), its tokenizer, usage with cached
    tokens, its prompt cache."""
    with trio.fail_after(600):
        base = await nursery.start(functools.partial(run_llama_server, n_ctx=16384))
        code, out, _ = await doctor("--json", "--timeout", "120", routes=routes_to(base, model=DEFAULT_ALIAS))
    rows = rows_of(out)
    verdicts = {name: row["verdict"] for name, row in rows.items()}
    assert verdicts == {
        "reachable": "ok",
        "models listed": "ok",
        "streaming": "ok",
        "forced tool call": "fail",
        "parallel tool calls": "warn",
        "usage in streams": "ok",
        "reasoning": "n/a",
        "context window": "warn",
        "tokenizer": "ok",
        "prefix cache": "ok",
        "messages route": "ok",
    }, rows
    assert json.loads(out)["routes"][0]["server"] == "llama.cpp"
    # Asked for 16k, llama.cpp gives a slot no more than the model's training context.
    assert rows["context window"]["detail"].startswith("8,192 tokens (llama.cpp's /props n_ctx)")
    assert "trained on 8,192 tokens" in rows["context window"]["fix"]
    assert "renders no tools" in rows["forced tool call"]["fix"] and "--chat-template-file" in rows["forced tool call"]["fix"]
    assert code == 1


@pytest.mark.e2e
async def test_llamacpp_on_a_2048_token_context_fails_the_context_row_with_a_fix_naming_ctx_size(nursery, doctor):
    with trio.fail_after(600):
        base = await nursery.start(functools.partial(run_llama_server, n_ctx=2048))
        code, out, _ = await doctor("--timeout", "120", routes=routes_to(base, model=DEFAULT_ALIAS))
    lines = out.splitlines()
    at = next(n for n, line in enumerate(lines) if line.startswith("  context window "))
    assert "FAIL" in lines[at] and "2,048 tokens" in lines[at]
    fix = " ".join(line.strip() for line in lines[at + 1 : at + 6]).split("fix: ", 1)[1]
    assert "--ctx-size 32768" in fix
    assert code == 1
