"""`gateway serve` that cannot start: one line on stderr naming the cause, exit 2, never "serving".

Each test runs a real `python -m gateway serve` process with its own
settings (none of the developer's leak in), in one process and with two
workers where the failure can happen in either.  A gateway that serves when
it should not is caught by the bound on the wait, not left running: trio's
`run_process` kills it when the test's deadline cancels the wait.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from typing import Any

import pytest
import trio

from test_multi_instance_and_crash import _SETTINGS_VARIABLES, STARTUP_SECONDS

WORKERS = pytest.mark.parametrize("workers", ["1", "2"], ids=["one process", "two workers"])


async def start_up(tmp_path: Any, *args: str, **env: str) -> trio.CompletedProcess[bytes]:
    """`gateway serve ARGS` with a quiet, self-contained set-up (`env` on top), run until it exits."""
    environ = {k: v for k, v in os.environ.items() if k.upper() not in _SETTINGS_VARIABLES | {"PROMETHEUS_MULTIPROC_DIR"}}
    environ.update(
        API_ADAPTER_HOST="127.0.0.1",
        API_ADAPTER_PORT="0",
        OPENAI_BASE_URL_INTERNAL="http://127.0.0.1:9/v1",  # never reached: these gateways never serve
        GATEWAY_SECRET_KEY="start-up tests",  # or every process warns that it made its own
        LOG_FILE_PATH="",
        STORE_BACKEND="memory",
    )
    environ.update(env)
    with trio.fail_after(STARTUP_SECONDS):
        return await trio.run_process(
            [sys.executable, "-m", "gateway", "serve", *args],
            env=environ,
            cwd=tmp_path,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )


def the_one_line(done: trio.CompletedProcess[bytes]) -> str:
    """The process exited 2 having written exactly one line, and nothing that claims to serve."""
    err = done.stderr.decode(errors="replace")
    lines = [line for line in err.splitlines() if line.strip()]
    assert done.returncode == 2, err
    assert len(lines) == 1, err
    assert "Traceback" not in err and "serving" not in err
    assert done.stdout == b""
    return lines[0]


def cannot_bind(host: str, port: int) -> bool:
    """Whether this test itself is refused the address (the gateway will be, for the same reason)."""
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False


# --- the address --------------------------------------------------------------------------------


@WORKERS
async def test_a_port_in_use_is_one_line_naming_the_address(tmp_path, workers):
    with socket.socket() as occupant:
        occupant.bind(("127.0.0.1", 0))
        occupant.listen()
        port = occupant.getsockname()[1]
        done = await start_up(tmp_path, "--port", str(port), "--workers", workers)
    assert the_one_line(done) == f"gateway: cannot start: cannot listen on 127.0.0.1:{port}: the address is already in use"


NO_SUCH_ADDRESS = "192.0.2.1"  # TEST-NET-1: for documentation only, on no interface


@WORKERS
@pytest.mark.skipif(not cannot_bind(NO_SUCH_ADDRESS, 0), reason=f"this machine has {NO_SUCH_ADDRESS}")
async def test_an_address_this_machine_does_not_have_is_one_line_naming_it(tmp_path, workers):
    done = await start_up(tmp_path, "--host", NO_SUCH_ADDRESS, "--port", "8080", "--workers", workers)
    assert the_one_line(done) == (
        f"gateway: cannot start: cannot listen on {NO_SUCH_ADDRESS}:8080: this machine has no such address"
    )


@WORKERS
async def test_a_host_name_that_does_not_resolve_is_one_line_naming_it(tmp_path, workers):
    done = await start_up(tmp_path, "--host", "no-such-host.invalid", "--port", "8080", "--workers", workers)
    line = the_one_line(done)
    assert line.startswith("gateway: cannot start: cannot listen on no-such-host.invalid:8080: the host name does not resolve")


@WORKERS
@pytest.mark.skipif(not cannot_bind("127.0.0.1", 1), reason="this process may listen on ports below 1024 (root?)")
async def test_a_privileged_port_without_the_privilege_is_one_line_naming_it(tmp_path, workers):
    done = await start_up(tmp_path, "--port", "1", "--workers", workers)
    assert the_one_line(done) == (
        "gateway: cannot start: cannot listen on 127.0.0.1:1: permission denied (ports below 1024 need privileges)"
    )


# --- options and settings -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "option,value", [("--port", "99999"), ("--port", "-1"), ("--port", "http"), ("--workers", "0"), ("--workers", "-1")]
)
async def test_an_invalid_port_or_worker_count_is_refused_naming_the_option(tmp_path, option, value):
    line = the_one_line(await start_up(tmp_path, option, value))
    assert line.startswith(f"gateway serve: argument {option}: ") and value in line


async def test_an_invalid_port_setting_is_one_line_naming_the_variable(tmp_path):
    line = the_one_line(await start_up(tmp_path, API_ADAPTER_PORT="99999"))
    assert line.startswith("gateway: invalid configuration: API_ADAPTER_PORT: ")


# --- files --------------------------------------------------------------------------------------


@WORKERS
@pytest.mark.parametrize("where", ["a directory", "under a file"])
async def test_a_log_file_that_cannot_be_opened_is_one_line_naming_LOG_FILE_PATH(tmp_path, workers, where):
    (tmp_path / "a-file").write_text("")
    path = tmp_path if where == "a directory" else tmp_path / "a-file" / "log" / "gateway.log"
    line = the_one_line(await start_up(tmp_path, "--workers", workers, LOG_FILE_PATH=str(path)))
    assert line.startswith("gateway: cannot start: LOG_FILE_PATH: ") and repr(str(path)) in line


@WORKERS
async def test_a_store_that_cannot_be_opened_is_one_line_naming_SQLITE_PATH(tmp_path, workers):
    line = the_one_line(await start_up(tmp_path, "--workers", workers, STORE_BACKEND="sqlite", SQLITE_PATH=str(tmp_path)))
    assert line.startswith("gateway: cannot start: SQLITE_PATH: ") and repr(str(tmp_path)) in line


@WORKERS
@pytest.mark.parametrize("problem", ["missing", "not JSON", "an invalid server"])
async def test_an_mcp_servers_file_that_cannot_be_used_is_one_line_naming_the_file(tmp_path, workers, problem):
    path = tmp_path / "servers.json"
    if problem == "not JSON":
        path.write_text("{ not json")
    elif problem == "an invalid server":
        path.write_text(json.dumps({"mcpServers": {"broken": {"type": "stdio"}}}))
    line = the_one_line(await start_up(tmp_path, "--workers", workers, MCP_SERVERS_CONFIG_PATH=str(path)))
    assert line.startswith("gateway: cannot start: ") and str(path) in line
