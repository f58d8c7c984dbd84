"""Claude Code (`claude -p`, headless) through the gateway's Messages front end, end to end.

The real program (npm `@anthropic-ai/claude-code`), offline, with a fresh
HOME: a text turn, and a turn in which the model asks for its Bash tool,
Claude Code runs the command for real, and sends the result back.  The
model is the scripted Chat Completions backend (`bash-agent`: it asks for
`Bash` once, then reports what the tool said), so every step is known.

Skipped where the program is not installed: found as `CLAUDE_CODE_BIN`, on
PATH, or in `.venv/claude-code` (where `.ci/run` installs it when npm is
there).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
from typing import Any

import orjson
import pytest
import trio

from scripted_backend import BASH_COMMAND

ROOT = pathlib.Path(__file__).resolve().parent.parent
_KEY = "sk-test-claude-code-0123456789"


def claude_binary() -> str | None:
    candidates = [os.environ.get("CLAUDE_CODE_BIN"), shutil.which("claude"), str(ROOT / ".venv/claude-code/node_modules/.bin/claude")]
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


pytestmark = pytest.mark.skipif(claude_binary() is None, reason="Claude Code is not installed (npm @anthropic-ai/claude-code)")


async def run_claude(
    url: str, prompt: str, workdir: pathlib.Path, home: pathlib.Path, *args: str, model: str = "bash-agent", extra_env: dict[str, str] | None = None
) -> tuple[int, list[dict[str, Any]]]:
    """`claude -p PROMPT` against the gateway; its exit code and its stream-json lines."""
    binary = claude_binary()
    assert binary is not None
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "TERM": "dumb",
        "ANTHROPIC_BASE_URL": url,
        "ANTHROPIC_API_KEY": _KEY,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_MAX_RETRIES": "0",
        **(extra_env or {}),
    }
    command = [binary, "-p", prompt, "--output-format", "stream-json", "--verbose", "--model", model, *args]
    done = await trio.run_process(command, cwd=workdir, env=env, capture_stdout=True, capture_stderr=True, stdin=subprocess.DEVNULL, check=False)
    lines = [orjson.loads(line) for line in done.stdout.splitlines() if line.startswith(b"{")]
    return done.returncode, lines


def result_of(lines: list[dict[str, Any]]) -> dict[str, Any]:
    return next(line for line in lines if line.get("type") == "result")


async def test_claude_code_runs_a_text_turn_and_a_bash_tool_turn_through_the_gateway(start_gateway, backend, tmp_path):
    url = await start_gateway(gateway_api_keys=f"claude={_KEY}")
    home, workdir = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    workdir.mkdir()
    with trio.fail_after(120):
        code, lines = await run_claude(url, "Say hello.", workdir, home)
    assert code == 0, lines
    text = result_of(lines)
    assert text["is_error"] is False and text["result"] == "Hello from the gateway.", text

    with trio.fail_after(120):
        code, lines = await run_claude(url, "Write a file with Bash.", workdir, home, "--allowedTools", "Bash")
    assert code == 0, lines
    assert (workdir / "ran.txt").read_text().strip() == "through-the-gateway"  # Claude Code really ran it
    uses = [block for line in lines if line.get("type") == "assistant" for block in line["message"]["content"] if block["type"] == "tool_use"]
    assert [(use["name"], use["input"]["command"]) for use in uses] == [("Bash", BASH_COMMAND)]
    assert uses[0]["id"].startswith("toolu_")
    final = result_of(lines)
    assert final["is_error"] is False and final["result"].startswith("Done: "), final
    # What Claude Code sent came through the Messages front end, its tool result to the backend.
    asked = [r for r in backend.requests if r.path == "/v1/chat/completions"]
    assert asked[-1].body["messages"][-1]["role"] == "tool" and asked[-1].body["messages"][-1]["tool_call_id"] == uses[0]["id"]
    assert all(r.headers.get("authorization") != f"Bearer {_KEY}" for r in asked)  # the client's key stays with the gateway


async def test_claude_codes_web_search_runs_its_search_on_the_gateways_engine(start_gateway, backend, tmp_path, nursery):
    """Claude Code's `WebSearch` tool makes a request of its own with Anthropic's web search server
    tool; the gateway runs the search on its SearXNG (a real searx on loopback) and Claude Code
    reads the results.  `ENABLE_TOOL_SEARCH=false`: WebSearch is offered at once, not behind ToolSearch."""
    from searx import SEARX, start_searx

    if SEARX is None:
        pytest.skip("searx is not installed (.ci/run installs Debian's searx)")
    engine = await start_searx(nursery, tmp_path)
    url = await start_gateway(gateway_api_keys=f"claude={_KEY}", web_search_url=engine)
    home, workdir = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    workdir.mkdir()
    with trio.fail_after(180):
        code, lines = await run_claude(
            url, "Search the web for structured concurrency.", workdir, home, "--allowedTools", "WebSearch", model="web-agent", extra_env={"ENABLE_TOOL_SEARCH": "false"}
        )
    assert code == 0, lines
    uses = [block for line in lines if line.get("type") == "assistant" for block in line["message"]["content"] if block["type"] == "tool_use"]
    assert [use["name"] for use in uses] == ["WebSearch"]
    final = result_of(lines)
    assert final["is_error"] is False and final["result"].startswith("Searched: https://"), final
    inner = [r.body for r in backend.requests if r.path == "/v1/chat/completions" and any((t.get("function") or {}).get("name") == "web_search" for t in r.body.get("tools") or ())]
    assert inner, "WebSearch's own request never offered the gateway's web_search"
