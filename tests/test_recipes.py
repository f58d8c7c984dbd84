"""The recipes a new user pastes, run as they are written.

Each snippet is taken from the README's or docs/clients.md's own text, so that a test fails when
the page drifts: Codex's `config.toml`, Claude Code's `export` block and opencode's
`opencode.json`, each run with the real client against a gateway whose keys are on; the
justfile's `llama` recipe and the context it really serves; and the default store, the same
file whichever directory `gateway keys` and `gateway serve` run in.
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
from typing import Any

import httpx2
import pytest
import trio

from test_launch import RUN_BOUND, SYSTEM_PATH, installed, npm_bin, user_env
from test_multi_instance_and_crash import run_gateway_process

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
CLIENTS_PAGE = (ROOT / "docs" / "clients.md").read_text()
SECRET = "sk-recipes-0123456789abcdef"
JUST = ROOT / ".venv" / "bin" / "just"


def snippet(text: str, after: str, language: str) -> str:
    """The first ```language block after the line `after` in `text`."""
    start = text.index(after)
    found = re.compile(rf"^```{language}\n(.*?)^```", re.S | re.M).search(text, start)
    assert found is not None, f"no {language} block after {after!r}"
    return found.group(1)


def section(text: str, heading: str) -> str:
    start = text.index(heading + "\n")
    end = text.find("\n## ", start + len(heading))
    return text[start : end if end != -1 else None]


async def run(command: list[str], env: dict[str, str], cwd: pathlib.Path) -> subprocess.CompletedProcess[bytes]:
    with trio.fail_after(RUN_BOUND):
        return await trio.run_process(command, env=env, cwd=cwd, stdin=subprocess.DEVNULL, capture_stdout=True, capture_stderr=True, check=False)


def dirs(tmp_path: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    return home, work


CODEX_SNIPPETS = {
    "README": snippet(README, "**Codex CLI**", "toml"),
    "docs/clients.md": snippet(section(CLIENTS_PAGE, "## Codex CLI"), "## Codex CLI", "toml"),
}


@pytest.mark.skipif(not installed("codex"), reason="Codex CLI is not installed (npm @openai/codex)")
@pytest.mark.parametrize("page", list(CODEX_SNIPPETS))
async def test_the_codex_config_of_the_docs_reaches_a_gateway_whose_keys_are_on(page, start_gateway, backend, tmp_path):
    url = await start_gateway(gateway_api_keys=f"codex={SECRET}")
    home, work = dirs(tmp_path)
    (home / ".codex").mkdir()
    text = CODEX_SNIPPETS[page]
    assert "http://localhost:8080/v1" in text
    (home / ".codex" / "config.toml").write_text(text.replace("http://localhost:8080", url))
    env = user_env(home, f"{npm_bin('codex')}:{SYSTEM_PATH}", GATEWAY_API_KEY=SECRET, PWD=str(work))
    done = await run(["codex", "exec", "--skip-git-repo-check", "Say hello."], env, work)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    assert "Hello, world!" in done.stdout.decode()
    assert backend.chat_requests[-1]["model"] == "qwen3-coder"


CLAUDE_SNIPPETS = {
    "README": snippet(README, "**Claude Code**", "sh"),
    "docs/clients.md": snippet(section(CLIENTS_PAGE, "## Claude Code"), "## Claude Code", "sh"),
}


def exports(block: str) -> dict[str, str]:
    """The variables a block of `export A=B C=D` lines sets (comments and other commands skipped)."""
    found: dict[str, str] = {}
    for line in block.splitlines():
        words = shlex.split(line, comments=True)
        if words[:1] == ["export"]:
            found.update(word.split("=", 1) for word in words[1:])  # type: ignore[misc]
    return found


@pytest.mark.skipif(not installed("claude"), reason="Claude Code is not installed (npm @anthropic-ai/claude-code)")
@pytest.mark.parametrize("page", list(CLAUDE_SNIPPETS))
async def test_the_claude_code_environment_of_the_docs_reaches_a_gateway_whose_keys_are_on_with_its_output_bound(page, start_gateway, backend, tmp_path):
    url = await start_gateway(gateway_api_keys=f"claude={SECRET}")
    home, work = dirs(tmp_path)
    variables = exports(CLAUDE_SNIPPETS[page])
    assert variables["ANTHROPIC_BASE_URL"] == "http://localhost:8080" and variables["ANTHROPIC_API_KEY"] == "sk-your-gateway-key"
    variables.update(ANTHROPIC_BASE_URL=url, ANTHROPIC_API_KEY=SECRET)
    env = user_env(home, f"{npm_bin('claude')}:{SYSTEM_PATH}", **variables)
    done = await run(["claude", "-p", "Say hello."], env, work)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    assert "Hello, world!" in done.stdout.decode()
    turn = backend.chat_requests[-1]
    assert turn["model"] == "qwen3-coder" and turn["max_tokens"] == int(variables["CLAUDE_CODE_MAX_OUTPUT_TOKENS"]) < 32000


@pytest.mark.skipif(not installed("opencode"), reason="opencode is not installed (npm opencode-ai)")
async def test_the_opencode_config_of_the_docs_reaches_a_gateway_whose_keys_are_on(start_gateway, backend, tmp_path):
    url = await start_gateway(gateway_api_keys=f"opencode={SECRET}")
    home, work = dirs(tmp_path)
    config = json.loads(snippet(section(CLIENTS_PAGE, "## opencode"), "## opencode", "json"))
    options = config["provider"]["gateway"]["options"]
    assert options["baseURL"] == "http://localhost:8080/v1" and options["apiKey"] == "{env:GATEWAY_API_KEY}"
    options["baseURL"] = url + "/v1"
    (work / "opencode.json").write_text(json.dumps(config))  # the project's opencode.json
    # Offline: no models.dev index, and the plugin types opencode would install from npm named as
    # installed already (what `gateway launch opencode` does too).
    own = home / ".config" / "opencode"
    (own / "node_modules").mkdir(parents=True)
    (own / "package-lock.json").write_text(json.dumps({"packages": {"": {"dependencies": {"@opencode-ai/plugin": "*"}}}}))
    env = user_env(home, f"{npm_bin('opencode')}:{SYSTEM_PATH}", GATEWAY_API_KEY=SECRET, OPENCODE_DISABLE_MODELS_FETCH="1", PWD=str(work))
    done = await run(["opencode", "run", "Say hello."], env, work)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    assert "Hello, world!" in done.stdout.decode()
    assert backend.chat_requests[-1]["model"] == "qwen3-coder"


# --- just llama ---------------------------------------------------------------------------------


def llama_command(*args: str) -> str:
    done = subprocess.run([JUST, "--justfile", ROOT / "justfile", "--dry-run", "llama", *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stderr.strip().splitlines()[-1]  # just prints what it would run on stderr


@pytest.mark.skipif(not JUST.exists(), reason="just is not installed beside this Python (./dev installs it into .venv)")
def test_the_llama_recipe_takes_a_port_and_a_context_size():
    assert llama_command().endswith("-m gateway.lab.llamacpp --host 127.0.0.1 --port 8000 --n-ctx 8192")
    assert llama_command("8001", "4096").endswith("--port 8001 --n-ctx 4096")


@pytest.mark.skipif(not JUST.exists(), reason="just is not installed beside this Python (./dev installs it into .venv)")
async def test_the_llama_recipes_default_context_is_served_whole_and_holds_claude_codes_and_codexs_first_requests(nursery):
    from gateway.backends.doctor.checks import CLAUDE_CODE_FIRST_REQUEST, CODEX_FIRST_REQUEST
    from gateway.lab.llamacpp import run_llama_server

    context = int(llama_command().rsplit(" ", 1)[1])
    with trio.fail_after(120):
        url = await nursery.start(functools.partial(run_llama_server, n_ctx=context))
        async with httpx2.AsyncClient(timeout=30) as http:
            served = (await http.get(url + "/props")).json()["default_generation_settings"]["n_ctx"]
    assert served == context  # not capped to less by the model's training context
    assert served > max(CLAUDE_CODE_FIRST_REQUEST, CODEX_FIRST_REQUEST) + 2048  # with room for an answer
    text = (ROOT / "examples" / "gateway.toml").read_text()
    assert f"context_window = {context} " in text  # the example route says what the recipe serves


# --- the default store --------------------------------------------------------------------------


async def test_a_key_made_in_one_directory_is_accepted_by_a_gateway_started_in_another(tmp_path, backend, nursery):
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    here = tmp_path / "project"
    for directory in (home, here, elsewhere):
        directory.mkdir()
    # The same (default) settings in both: no SQLITE_PATH, no XDG_DATA_HOME, only HOME.
    settings = {"HOME": str(home), "XDG_DATA_HOME": "", "STORE_BACKEND": "sqlite", "LOG_FILE_PATH": "", "OPENAI_BASE_URL_INTERNAL": backend.url}
    env = user_env(home, **{name: value for name, value in settings.items() if name != "HOME"})
    made = await run([sys.executable, "-m", "gateway", "keys", "create", "alice"], env, here)
    assert made.returncode == 0, made.stderr
    secret = made.stdout.decode().strip()
    store = home / ".local/share/responses-gateway/responses.keys.sqlite3"
    assert f"(keys in SQLite file {store})" in made.stderr.decode()
    gateway: Any = await nursery.start(run_gateway_process, elsewhere, settings)
    async with httpx2.AsyncClient(timeout=30) as http:
        assert (await http.get(gateway.url + "/v1/models", headers={"authorization": f"Bearer {secret}"})).status_code == 200
        assert (await http.get(gateway.url + "/v1/models")).status_code == 401  # keys are on there too
    assert sorted(os.listdir(here)) == sorted(os.listdir(elsewhere)) == []  # no ./data anywhere
