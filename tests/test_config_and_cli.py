"""Settings from the environment and .env; the command line."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

import httpx2
import pytest
import trio

from gateway import ConfigError, load_settings


def test_defaults_follow_the_open_responses_server_table(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    for name in list(os.environ):
        if name.startswith(("OPENAI_", "API_ADAPTER_", "HEARTBEAT", "STREAM_", "LOG_", "MAX_", "MCP_")):
            monkeypatch.delenv(name)
    s = load_settings()
    assert (s.openai_base_url_internal, s.openai_api_key) == ("http://localhost:8000", "dummy-key")
    assert (s.api_adapter_host, s.api_adapter_port) == ("127.0.0.1", 8080)  # loopback unless told otherwise
    assert (s.stream_timeout, s.heartbeat_interval) == (120.0, 15.0)
    assert (s.max_conversation_history, s.max_tool_call_iterations, s.mcp_tool_refresh_interval) == (100, 25, 10.0)
    assert (s.log_level, s.log_file_path) == ("INFO", "./log/api_adapter.log")


@pytest.mark.parametrize(
    "value,expected",
    [
        ("http://h:1", "http://h:1/v1"),
        ("http://h:1/", "http://h:1/v1"),
        ("http://h:1/v1", "http://h:1/v1"),
        ("http://h:1/v1/", "http://h:1/v1"),
        ("https://h/api/v1", "https://h/api/v1"),
    ],
)
def test_backend_url_is_accepted_with_or_without_v1(monkeypatch, value, expected):
    monkeypatch.setenv("OPENAI_BASE_URL_INTERNAL", value)
    assert load_settings(_env_file=None).backend_v1 == expected


def test_environment_and_dotenv_are_read(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_text("HEARTBEAT_INTERVAL=2.5\nLOG_LEVEL=debug\n")
    monkeypatch.setenv("API_ADAPTER_PORT", "9999")
    s = load_settings()
    assert (s.heartbeat_interval, s.log_level, s.api_adapter_port) == (2.5, "DEBUG", 9999)


@pytest.mark.parametrize(
    "name,value",
    [("HEARTBEAT_INTERVAL", "soon"), ("API_ADAPTER_PORT", "70000"), ("LOG_LEVEL", "LOUD"), ("OPENAI_BASE_URL_INTERNAL", "ftp://x")],
)
def test_an_invalid_value_names_the_variable(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as caught:
        load_settings(_env_file=None)
    assert name in str(caught.value)


def test_the_api_key_is_not_in_the_settings_repr(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-very-secret")
    assert "sk-very-secret" not in repr(load_settings(_env_file=None))


async def test_cli_help_and_invalid_configuration_exit_cleanly(tmp_path):
    help_run = await trio.run_process([sys.executable, "-m", "gateway", "--help"], capture_stdout=True)
    assert b"serve" in help_run.stdout
    serve_help = await trio.run_process([sys.executable, "-m", "gateway", "serve", "--help"], capture_stdout=True)
    assert b"--workers" in serve_help.stdout and b"--port" in serve_help.stdout
    env = dict(os.environ, HEARTBEAT_INTERVAL="never")
    bad = await trio.run_process(
        [sys.executable, "-m", "gateway", "serve"], env=env, cwd=tmp_path, capture_stderr=True, check=False
    )
    assert bad.returncode == 2
    assert b"HEARTBEAT_INTERVAL" in bad.stderr and b"Traceback" not in bad.stderr


async def test_gateway_serve_answers_health_checks(tmp_path, backend):
    env = dict(os.environ, OPENAI_BASE_URL_INTERNAL=backend.url, API_ADAPTER_HOST="127.0.0.1", API_ADAPTER_PORT="0",
               LOG_FILE_PATH=str(tmp_path / "gw.log"))
    async with trio.open_nursery() as nursery:
        proc = await nursery.start(
            functools.partial(trio.run_process, [sys.executable, "-m", "gateway", "serve"], env=env, cwd=tmp_path,
                              stderr=subprocess.PIPE, check=False)
        )
        url = None
        buffer = b""
        with trio.fail_after(30):
            async for data in proc.stderr:
                buffer += data
                if b"serving the Responses gateway on " in buffer:
                    line = buffer.split(b"serving the Responses gateway on ", 1)[1].split(b" ", 1)[0]
                    url = line.decode()
                    break
        assert url is not None
        async with httpx2.AsyncClient() as http:
            r = await http.get(url + "/health")
            assert r.json()["status"] == "ok"
            r = await http.post(url + "/v1/responses", json={"model": "text", "input": "hi"})
            assert r.json()["output"][0]["content"][0]["text"] == "Hello, world!"
        proc.terminate()
    assert "status=completed" in (tmp_path / "gw.log").read_text()


def test_a_misspelt_setting_in_dotenv_is_refused_naming_it(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_text("STREAM_TIMOUT=5\nHEARTBEAT_INTERVAL=2\n")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert "STREAM_TIMOUT is not a setting (did you mean STREAM_TIMEOUT?)" in str(caught.value)


def test_an_invalid_value_read_from_dotenv_says_it_came_from_there(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("STREAM_TIMEOUT", raising=False)
    (tmp_path / ".env").write_text("STREAM_TIMEOUT=soon\n")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert "STREAM_TIMEOUT (read from .env):" in str(caught.value)
    monkeypatch.setenv("STREAM_TIMEOUT", "later")  # the environment's value wins, and is the one named
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert "STREAM_TIMEOUT:" in str(caught.value) and ".env" not in str(caught.value)


def test_names_in_dotenv_that_are_nothing_like_a_setting_are_left_for_other_tools(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_text("DATABASE_URL=postgres://x\nHEARTBEAT_INTERVAL=2\n")
    assert load_settings().heartbeat_interval == 2


async def test_a_misspelt_environment_variable_is_warned_about_at_start_up(tmp_path, backend):
    from test_multi_instance_and_crash import run_gateway_process

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            gateway = await nursery.start(
                run_gateway_process, tmp_path, {"OPENAI_BASE_URL_INTERNAL": backend.url, "STREAM_TIMOUT": "5", "LOG_FILE_PATH": ""}
            )
            nursery.cancel_scope.cancel()
    assert b"STREAM_TIMOUT is not a setting (did you mean STREAM_TIMEOUT?)" in bytes(gateway.stderr)


async def test_gateway_version_prints_the_installed_packages_version():
    from importlib.metadata import version

    done = await trio.run_process([sys.executable, "-m", "gateway", "--version"], capture_stdout=True, capture_stderr=True)
    assert done.stdout.decode() == f"gateway {version('trio-responses-gateway')}\n"
    assert done.stderr == b""


async def test_gateway_mcp_list_exits_1_when_a_server_failed_and_still_lists_every_server(tmp_path):
    from test_mcp_manager import EXAMPLE, EXAMPLE_TOOLS

    servers = {
        "example": {"command": sys.executable, "args": [str(EXAMPLE)]},
        "broken": {"command": sys.executable, "args": ["-c", "import sys; sys.exit(1)"]},  # exits at once
    }
    path = tmp_path / "servers.json"
    path.write_text(json.dumps({"mcpServers": servers}))
    with trio.fail_after(30):
        done = await trio.run_process(
            [sys.executable, "-m", "gateway", "mcp", "list", "--config", str(path), "--wait", "15"],
            cwd=tmp_path, capture_stdout=True, capture_stderr=True, check=False,
        )
    assert done.returncode == 1, done.stderr.decode()
    rows = [line.split(None, 3) for line in done.stdout.decode().splitlines()]
    assert rows[1] == ["example", "stdio", "ready", ", ".join(EXAMPLE_TOOLS)]
    assert rows[2][:3] in (["broken", "stdio", "failed"], ["broken", "stdio", "reconnecting"])


async def test_gateway_mcp_list_exits_0_when_every_server_is_ready(tmp_path):
    from test_mcp_manager import EXAMPLE

    path = tmp_path / "servers.json"
    path.write_text(json.dumps({"mcpServers": {"example": {"command": sys.executable, "args": [str(EXAMPLE)]}}}))
    with trio.fail_after(30):
        done = await trio.run_process(
            [sys.executable, "-m", "gateway", "mcp", "list", "--config", str(path), "--wait", "15"],
            cwd=tmp_path, capture_stdout=True, capture_stderr=True, check=False,
        )
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().splitlines()[1].split()[:3] == ["example", "stdio", "ready"]


def test_the_default_store_is_the_users_unless_the_directory_holds_an_earlier_versions_store(tmp_path, monkeypatch):
    """An upgrade keeps its keys: a `./data/responses.sqlite3` left by the earlier default is used,
    rather than an empty store that would turn authentication off."""
    from gateway.config import LEGACY_SQLITE_PATH, default_sqlite_path

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_sqlite_path() == str(tmp_path / "xdg" / "responses-gateway" / "responses.sqlite3")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "responses.sqlite3").write_bytes(b"")
    assert default_sqlite_path() == LEGACY_SQLITE_PATH
