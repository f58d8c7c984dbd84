"""`gateway launch`: each real coding agent started on a gateway of its own, and the pure core.

End to end, `python -m gateway launch CLIENT -- ARGS` runs as a user would run it, with HOME a
fresh directory and the client from npm on PATH (`.venv/<client>/node_modules/.bin`, where
`.ci/run` installs it; skipped where it is not): the launcher starts `gateway serve` in the
background in front of the scripted backend (`shell-agent`: it answers text, or calls the
client's own shell tool once when asked to "use the shell"), makes a session key because keys
are on, writes the client's files into its own directory and runs it.  A shim ahead of the real
program on PATH records the environment the client was given, so that the test knows the
session key it must find revoked afterwards.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import tomllib
from typing import Any

import httpx2
import pytest
import trio

from gateway.launch import clients
from gateway.launch.clients import CLIENTS, Model, Session, choose_model, output_tokens, plan, render, tiers
from scripted_backend import SHELL_COMMAND
from test_multi_instance_and_crash import _SETTINGS_VARIABLES

ROOT = pathlib.Path(__file__).resolve().parent.parent
NPM = {"claude": "claude-code", "codex": "codex", "opencode": "opencode"}
# Each client's own program, where the strings it reads can be looked for.
PROGRAMS = {
    "claude": ROOT / ".venv/claude-code/node_modules/@anthropic-ai/claude-code/bin/claude.exe",
    "codex": ROOT / ".venv/codex/node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex",
    "opencode": ROOT / ".venv/opencode/node_modules/opencode-linux-x64/bin/opencode",
}
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
RUN_BOUND = 180  # seconds one launch (a gateway started, a client's turn or two) may take


def npm_bin(client: str) -> pathlib.Path:
    return ROOT / ".venv" / NPM[client] / "node_modules" / ".bin"


def installed(client: str) -> bool:
    return (npm_bin(client) / CLIENTS[client].program).exists()


def needs(client: str) -> Any:
    return pytest.mark.skipif(not installed(client), reason=f"{CLIENTS[client].title} is not installed (npm {CLIENTS[client].package}; .ci/run installs it into .venv/{NPM[client]})")


EACH_CLIENT = pytest.mark.parametrize("client", [pytest.param(name, marks=needs(name)) for name in CLIENTS])

# What each client is told to do, non-interactively: a text turn, and a turn that runs its shell tool.
TEXT_TURN = {
    "claude": ["-p", "Say hello."],
    "codex": ["exec", "--skip-git-repo-check", "Say hello."],
    "opencode": ["run", "Say hello."],
}
TOOL_TURN = {
    "claude": ["-p", "Please use the shell to write the file.", "--allowedTools", "Bash"],
    "codex": ["exec", "--skip-git-repo-check", "-s", "workspace-write", "Please use the shell to write the file."],
    "opencode": ["run", "Please use the shell to write the file."],
}


def user_env(home: pathlib.Path, path: str = SYSTEM_PATH, **settings: str) -> dict[str, str]:
    """A user's environment: a fresh HOME, none of the developer's settings or XDG directories."""
    env = {
        name: value
        for name, value in os.environ.items()
        if name.upper() not in _SETTINGS_VARIABLES and not name.startswith(("XDG_", "ANTHROPIC_", "CLAUDE_", "CODEX_", "OPENCODE_", "GATEWAY_"))
    }
    env.update(HOME=str(home), PATH=path, TERM="dumb", GATEWAY_SECRET_KEY="launch tests", **settings)
    return env


async def gateway_command(env: dict[str, str], cwd: pathlib.Path, *args: str, timeout: float = RUN_BOUND) -> subprocess.CompletedProcess[bytes]:
    with trio.fail_after(timeout):
        return await trio.run_process(
            [sys.executable, "-m", "gateway", *args], env=env, cwd=cwd, stdin=subprocess.DEVNULL, capture_stdout=True, capture_stderr=True, check=False
        )


def recording_shim(directory: pathlib.Path, client: str) -> pathlib.Path:
    """`directory/PROGRAM`: writes its environment to `directory/env.json`, then runs the real program."""
    directory.mkdir(parents=True, exist_ok=True)
    real = npm_bin(client) / CLIENTS[client].program
    shim = directory / CLIENTS[client].program
    record = directory / "env.json"
    shim.write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        f"open({str(record)!r}, 'w').write(json.dumps(dict(os.environ)))\n"
        f"os.execv({str(real)!r}, [{str(real)!r}, *sys.argv[1:]])\n"
    )
    shim.chmod(0o755)
    return record


def one_line(done: subprocess.CompletedProcess[bytes]) -> str:
    lines = done.stderr.decode().strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, (done.returncode, done.stderr.decode()[-2000:])
    return lines[0]


def everything_under(home: pathlib.Path) -> list[str]:
    return sorted(str(path.relative_to(home)) for path in home.rglob("*"))


# --- end to end, each real client ------------------------------------------------------------------


@EACH_CLIENT
async def test_launch_runs_the_client_on_a_gateway_of_its_own_with_a_session_key_revoked_when_it_ends(client, backend, tmp_path, start_gateway):
    backend.listed = ("shell-agent", "text")
    home, work, shims = tmp_path / "home", tmp_path / "work", tmp_path / "shims"
    home.mkdir()
    work.mkdir()
    record = recording_shim(shims, client)
    env = user_env(home, f"{shims}:{SYSTEM_PATH}", OPENAI_BASE_URL_INTERNAL=backend.url, STORE_BACKEND="sqlite")
    made = await gateway_command(env, work, "keys", "create", "owner")  # keys on, in the default store (under HOME)
    assert made.returncode == 0, made.stderr
    owner = made.stdout.decode().strip()

    # (a) a text turn: the scripted reply reaches the client's stdout.
    done = await gateway_command(env, work, "launch", client, "--", *TEXT_TURN[client])
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    assert "Hello from the gateway." in done.stdout.decode()
    said = done.stderr.decode()
    assert re.search(rf"gateway launch: {re.escape(CLIENTS[client].title)} on gateway http://127\.0\.0\.1:\d+ .*model shell-agent, session key launch-{client}-[0-9a-f]{{8}}", said), said
    first = json.loads(record.read_text())

    # (b) a tool turn: the client runs its own shell tool, and its result goes back to the model.
    done = await gateway_command(env, work, "launch", client, "--", *TOOL_TURN[client])
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    assert (work / "launched.txt").read_text().strip() == "launched-through-the-gateway"
    last = backend.chat_requests[-1]["messages"]
    calls = [call["id"] for message in last if message["role"] == "assistant" for call in message.get("tool_calls") or ()]
    results = [message for message in last if message["role"] == "tool"]
    assert results and results[-1]["tool_call_id"] in calls
    assert any(SHELL_COMMAND in json.dumps(message.get("tool_calls")) for message in last if message["role"] == "assistant")
    second = json.loads(record.read_text())

    # (c) the user's own configuration was left alone: everything went to the launcher's directories.
    own = home / ".local/state/responses-gateway/launch" / client
    assert own.is_dir() and any(own.iterdir())
    strays = [path for path in everything_under(home) if not path.startswith((".local/state/responses-gateway", ".local/share/responses-gateway"))]
    assert strays == [".local", ".local/share", ".local/state"], strays  # no ~/.claude, ~/.codex, ~/.config/opencode, ~/.npm
    for name in ("CLAUDE_CONFIG_DIR", "CODEX_HOME", "OPENCODE_CONFIG"):
        if name in first:
            assert pathlib.Path(first[name]).is_relative_to(own)

    # (d) each session had its own key, revoked once it ended; the owner's key still works.
    keys = [record_env.get("ANTHROPIC_AUTH_TOKEN") or record_env["GATEWAY_API_KEY"] for record_env in (first, second)]
    assert keys[0] != keys[1] and all(key.startswith("sk-gw-") for key in keys)
    listed = await gateway_command(env, work, "keys", "list")
    assert len(re.findall(rf"launch-{client}-[0-9a-f]{{8}}\trevoked", listed.stdout.decode())) == 2, listed.stdout
    url = await start_gateway(store_backend="sqlite", sqlite_path=str(home / ".local/share/responses-gateway/responses.sqlite3"))
    async with httpx2.AsyncClient(timeout=30) as http:
        for key in keys:
            assert (await http.get(url + "/v1/models", headers={"authorization": f"Bearer {key}"})).status_code == 401
        assert (await http.get(url + "/v1/models", headers={"authorization": f"Bearer {owner}"})).status_code == 200


@needs("claude")
async def test_launch_passes_the_clients_exit_status_through_and_stops_its_gateway(backend, tmp_path):
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    env = user_env(home, f"{npm_bin('claude')}:{SYSTEM_PATH}", OPENAI_BASE_URL_INTERNAL=backend.url, STORE_BACKEND="memory")
    done = await gateway_command(env, work, "launch", "claude", "--", "--no-such-option")
    assert done.returncode == 1, done.stderr  # Claude Code's own status for an unknown option
    port = re.search(rb"on gateway http://127\.0\.0\.1:(\d+)", done.stderr)
    assert port is not None
    with pytest.raises(OSError):  # the gateway started for the session is gone with it
        await trio.open_tcp_stream("127.0.0.1", int(port.group(1)))


@needs("claude")
@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"], ids=["Ctrl-C to the terminal's job", "SIGTERM to the launcher"])
async def test_a_signal_ends_the_client_and_the_session_still_stops_its_gateway_and_revokes_its_key(how, backend, tmp_path):
    backend.listed = ("hang-before-headers",)  # the model never answers: Claude Code is waiting when the signal comes
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    env = user_env(home, f"{npm_bin('claude')}:{SYSTEM_PATH}", OPENAI_BASE_URL_INTERNAL=backend.url, STORE_BACKEND="sqlite")
    assert (await gateway_command(env, work, "keys", "create", "owner")).returncode == 0
    command = [sys.executable, "-m", "gateway", "launch", "claude", "--", "-p", "Say hello."]
    # Its own process group, as a terminal's foreground job is: Ctrl-C is SIGINT to the whole group
    # (the launcher passes it on to nobody: the client has it already); SIGTERM to the launcher alone
    # is passed on to the client.
    launcher = await trio.lowlevel.open_process(command, env=env, cwd=work, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        with trio.fail_after(RUN_BOUND):
            await backend.wait_for(lambda: bool(backend.chat_requests))
            if how == "ctrl-c":
                os.killpg(launcher.pid, signal.SIGINT)
            else:
                launcher.send_signal(signal.SIGTERM)
            await backend.client_left.wait()  # Claude Code gave up its request, so the gateway its backend call
            code = await launcher.wait()
    finally:
        if launcher.returncode is None:
            launcher.kill()
            await launcher.wait()
    if how == "sigterm":
        assert code == 128 + signal.SIGTERM  # the client's end, as a shell reports it
    listed = (await gateway_command(env, work, "keys", "list")).stdout.decode()
    assert re.search(r"launch-claude-[0-9a-f]{8}\trevoked", listed), listed
    assert launcher.stderr is not None
    said = await launcher.stderr.receive_some(65536)
    port = re.search(rb"on gateway http://127\.0\.0\.1:(\d+)", said)
    assert port is not None, said
    with pytest.raises(OSError):
        await trio.open_tcp_stream("127.0.0.1", int(port.group(1)))


# --- --print ------------------------------------------------------------------------------------


async def test_print_shows_the_environment_and_files_without_a_gateway_and_writes_nothing(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    done = await gateway_command(user_env(home), tmp_path, "launch", "--print", "--model", "qwen3-coder", "codex", "--", "exec", "hi")
    assert done.returncode == 0, done.stderr
    out = done.stdout.decode()
    own = home / ".local/state/responses-gateway/launch/codex"
    assert f"export CODEX_HOME={own}" in out and "export GATEWAY_API_KEY=unused" in out
    toml = out.split(f"# --- {own}/config.toml\n", 1)[1].split("# --- ", 1)[0]
    config = tomllib.loads(toml)
    assert config["model"] == "qwen3-coder" and config["model_provider"] == "gateway"
    assert config["model_providers"]["gateway"] == {
        "name": "Responses gateway", "base_url": "http://127.0.0.1:8080/v1", "env_key": "GATEWAY_API_KEY", "wire_api": "responses",
    }
    assert out.rstrip().endswith("# --- then run: codex exec hi")
    assert everything_under(home) == []  # nothing written, not even the store


async def test_print_with_keys_on_makes_no_key_and_says_how_to_make_one(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = user_env(home, STORE_BACKEND="sqlite")
    assert (await gateway_command(env, tmp_path, "keys", "create", "owner")).returncode == 0
    done = await gateway_command(env, tmp_path, "launch", "--print", "--model", "m", "claude")
    assert done.returncode == 0, done.stderr
    out = done.stdout.decode()
    assert "# keys are on: make one (`gateway keys create NAME` prints it) and `export GATEWAY_API_KEY=` it first" in out
    assert 'export ANTHROPIC_AUTH_TOKEN="$GATEWAY_API_KEY"' in out and "sk-gw-" not in out
    listed = (await gateway_command(env, tmp_path, "keys", "list")).stdout.decode()
    assert "launch-" not in listed


# --- bad input: one line, exit 2 ----------------------------------------------------------------


def fake_program(tmp_path: pathlib.Path, name: str) -> str:
    """A PATH on which `name` exists (never run: each of these fails before the client would)."""
    directory = tmp_path / "bin"
    directory.mkdir(exist_ok=True)
    (directory / name).write_text("#!/bin/sh\nexit 99\n")
    (directory / name).chmod(0o755)
    return f"{directory}:{SYSTEM_PATH}"


async def test_an_unknown_client_is_one_line_naming_the_clients(tmp_path):
    line = one_line(await gateway_command(user_env(tmp_path), tmp_path, "launch", "claud"))
    assert "invalid choice: 'claud' (choose from 'claude', 'codex', 'opencode')" in line


async def test_a_client_that_is_not_installed_is_one_line_saying_how_to_install_it(tmp_path):
    line = one_line(await gateway_command(user_env(tmp_path), tmp_path, "launch", "codex"))
    assert line == "gateway launch: Codex CLI is not installed (codex is not on PATH): npm install -g @openai/codex"


async def test_a_url_where_nothing_answers_is_one_line_naming_it(tmp_path):
    with trio.socket.socket() as unused:
        await unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]  # bound, not listening: refused
        line = one_line(await gateway_command(user_env(tmp_path, fake_program(tmp_path, "claude")), tmp_path, "launch", "claude", "--url", f"http://127.0.0.1:{port}/v1"))
    assert line.startswith(f"gateway launch: no gateway answers at http://127.0.0.1:{port} (ConnectError")


async def test_a_url_whose_gateway_wants_a_key_is_one_line_saying_how_to_give_it(tmp_path, start_gateway):
    url = await start_gateway(gateway_api_keys="team=a-long-team-secret")
    env = user_env(tmp_path, fake_program(tmp_path, "opencode"))
    line = one_line(await gateway_command(env, tmp_path, "launch", "opencode", "--url", url))
    assert line == f"gateway launch: the gateway at {url} needs a key: pass --key KEY or set GATEWAY_API_KEY"
    line = one_line(await gateway_command(env, tmp_path, "launch", "opencode", "--url", url, "--key", "sk-wrong-key-0000"))
    assert line.startswith(f"gateway launch: the gateway at {url} refused the key (401)")


async def test_an_unknown_model_is_one_line_listing_the_known(tmp_path, backend, start_gateway):
    backend.listed = ("qwen3-coder", "qwen3-coder-small")
    url = await start_gateway()
    line = one_line(await gateway_command(user_env(tmp_path, fake_program(tmp_path, "claude")), tmp_path, "launch", "claude", "--url", url, "--model", "gpt-5"))
    assert line == "gateway launch: the gateway has no model 'gpt-5'; it has: qwen3-coder, qwen3-coder-small"


async def test_a_gateway_that_cannot_start_in_the_background_is_its_own_one_line_reason(tmp_path):
    bad = tmp_path / "mcp.json"
    bad.write_text("{not json")
    env = user_env(tmp_path, fake_program(tmp_path, "claude"), STORE_BACKEND="memory", MCP_SERVERS_CONFIG_PATH=str(bad))
    line = one_line(await gateway_command(env, tmp_path, "launch", "claude"))
    assert line.startswith("gateway launch: the gateway did not start: cannot start: ") and "mcp.json" in line
    assert everything_under(tmp_path / ".local/state/responses-gateway/launch") == ["gateway.log"]  # no client's files


# --- the pure core ------------------------------------------------------------------------------

HOME = pathlib.Path("/home/u/.local/state/responses-gateway/launch")
ROUTES = (Model("qwen3-coder", 16384), Model("qwen3-coder-small", 8192), Model("claude-*"))


def session(client: str, **changes: Any) -> Session:
    values: dict[str, Any] = {"client": client, "url": "http://127.0.0.1:9000", "key": "sk-gw-k", "model": "qwen3-coder", "models": ROUTES, "home": HOME / client}
    values.update(changes)
    return Session(**values)


def test_claude_codes_environment_points_every_tier_at_a_route_and_keeps_it_on_this_machine():
    built = plan(session("claude"))
    assert {name: built.env[name] for name in ("ANTHROPIC_BASE_URL", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CONFIG_DIR")} == {
        "ANTHROPIC_BASE_URL": "http://127.0.0.1:9000", "ANTHROPIC_AUTH_TOKEN": "sk-gw-k", "CLAUDE_CONFIG_DIR": str(HOME / "claude"),
    }
    tiers_set = [built.env[f"ANTHROPIC_{name}"] for name in ("MODEL", "DEFAULT_OPUS_MODEL", "DEFAULT_SONNET_MODEL", "DEFAULT_HAIKU_MODEL", "SMALL_FAST_MODEL")]
    assert tiers_set == ["qwen3-coder", "qwen3-coder", "qwen3-coder", "qwen3-coder-small", "qwen3-coder-small"]
    assert built.env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "4096"  # a quarter of the route's 16,384, not Claude Code's 32,000
    assert built.env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == built.env["DISABLE_TELEMETRY"] == built.env["DISABLE_AUTOUPDATER"] == "1"
    assert "ANTHROPIC_API_KEY" in built.unset  # a real Anthropic key never rides along
    assert json.loads(built.files[HOME / "claude/.claude.json"]) == {"hasCompletedOnboarding": True}


def test_claude_codes_own_state_and_the_users_output_limit_are_kept():
    path = HOME / "claude/.claude.json"
    built = plan(session("claude", environ={"CLAUDE_CODE_MAX_OUTPUT_TOKENS": "1000"}), {path: json.dumps({"projects": {"/w": {}}})})
    assert "CLAUDE_CODE_MAX_OUTPUT_TOKENS" not in built.env  # the user's own stays in force
    assert json.loads(built.files[path]) == {"projects": {"/w": {}}, "hasCompletedOnboarding": True}
    assert plan(session("claude"), {path: json.dumps({"hasCompletedOnboarding": True})}).files == {}  # nothing to change


def test_tiers_take_routes_named_like_them_or_else_the_chosen_model():
    assert tiers("m", ["m", "haiku", "big-opus"]) == {"opus": "big-opus", "sonnet": "m", "haiku": "haiku"}
    assert tiers("m", ["m", "gpt-4o-mini"])["haiku"] == "gpt-4o-mini"
    assert tiers("m", ["m", "smallish"]) == {"opus": "m", "sonnet": "m", "haiku": "m"}  # a word, not a substring


def test_codexs_config_names_the_gateway_as_a_responses_provider_with_its_key_from_the_environment():
    built = plan(session("codex"))
    assert built.env == {"CODEX_HOME": str(HOME / "codex"), "GATEWAY_API_KEY": "sk-gw-k"}
    config = tomllib.loads(built.files[HOME / "codex/config.toml"])
    assert config["model_providers"]["gateway"] == {
        "name": "Responses gateway", "base_url": "http://127.0.0.1:9000/v1", "env_key": "GATEWAY_API_KEY", "wire_api": "responses",
    }
    assert (config["model"], config["model_provider"], config["check_for_update_on_startup"]) == ("qwen3-coder", "gateway", False)
    assert config["analytics"] == {"enabled": False} and config["feedback"] == {"enabled": False}
    catalog = json.loads(built.files[pathlib.Path(config["model_catalog_json"])])
    assert [(m["slug"], m["context_window"]) for m in catalog["models"]] == [("qwen3-coder", 16384), ("qwen3-coder-small", 8192)]  # no glob
    assert "sk-gw-k" not in "".join(built.files.values())  # the key stays in the environment


def test_codexs_own_settings_in_its_config_survive_the_next_launch():
    path = HOME / "codex/config.toml"
    first = plan(session("codex")).files[path]
    mine = first + '\n[projects."/work"]\ntrust_level = "trusted"\n'
    again = tomllib.loads(plan(session("codex", url="http://127.0.0.1:9001", model="qwen3-coder-small"), {path: mine}).files[path])
    assert again["projects"] == {"/work": {"trust_level": "trusted"}}
    assert (again["model"], again["model_providers"]["gateway"]["base_url"]) == ("qwen3-coder-small", "http://127.0.0.1:9001/v1")


def test_opencodes_config_lists_the_routes_for_a_bundled_provider_and_isolates_its_directories():
    built = plan(session("opencode"))
    config = json.loads(built.files[HOME / "opencode/opencode.json"])
    provider = config["provider"]["gateway"]
    assert provider["npm"] == "@ai-sdk/openai" and provider["options"] == {"baseURL": "http://127.0.0.1:9000/v1", "apiKey": "{env:GATEWAY_API_KEY}"}
    assert provider["models"]["qwen3-coder"]["limit"] == {"context": 16384, "output": 4096}
    assert list(provider["models"]) == ["qwen3-coder", "qwen3-coder-small"]
    assert (config["model"], config["small_model"], config["enabled_providers"]) == ("gateway/qwen3-coder", "gateway/qwen3-coder-small", ["gateway"])
    assert {built.env[f"XDG_{kind}_HOME"] for kind in ("CONFIG", "DATA", "CACHE", "STATE")} == {str(HOME / "opencode" / d) for d in ("config", "data", "cache", "state")}
    assert built.env["OPENCODE_DISABLE_MODELS_FETCH"] == built.env["OPENCODE_DISABLE_AUTOUPDATE"] == "1"
    assert built.env["GATEWAY_API_KEY"] == "sk-gw-k"


def test_choosing_a_model_takes_the_first_unless_one_is_named_and_refuses_an_unknown_one():
    assert choose_model(ROUTES, None) == "qwen3-coder"
    assert choose_model(ROUTES, "qwen3-coder-small") == "qwen3-coder-small"
    assert choose_model((), "anything") == "anything"  # a gateway that lists none takes the name given
    with pytest.raises(ValueError, match="no model 'gpt'; it has: qwen3-coder, qwen3-coder-small, claude-"):
        choose_model(ROUTES, "gpt")
    with pytest.raises(ValueError, match="lists no models"):
        choose_model((), None)
    assert [output_tokens(None), output_tokens(2048), output_tokens(1_000_000)] == [8192, 512, 8192]


def test_print_output_never_shows_a_key_it_was_not_given():
    text = render(plan(session("claude", key=None)), ["claude"])
    assert 'export ANTHROPIC_AUTH_TOKEN="$GATEWAY_API_KEY"' in text and "sk-gw" not in text
    assert "GATEWAY_API_KEY=" not in render(plan(session("opencode", key=None)), ["opencode"])


@pytest.mark.parametrize("client", [pytest.param(name, marks=pytest.mark.skipif(not PROGRAMS[name].exists(), reason=f"{CLIENTS[name].title} is not installed")) for name in CLIENTS])
def test_every_variable_and_setting_the_launcher_sets_is_one_the_installed_client_reads(client):
    """Names a client stopped reading would be silently ignored: each is looked for in the
    client's own program (its bundled JavaScript, or Codex's binary)."""
    built = plan(session(client))
    names = set(built.env) | set(built.unset)
    names -= {"GATEWAY_API_KEY", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME"}  # the launcher's own, and XDG's
    if client == "codex":
        names |= set(tomllib.loads(built.files[HOME / "codex/config.toml"])) | {"env_key", "wire_api", "base_url"}
    if client == "opencode":
        config = json.loads(built.files[HOME / "opencode/opencode.json"])
        names |= set(config) - {"$schema"} | {"baseURL", "apiKey"}
    if client == "claude":
        names.add("hasCompletedOnboarding")
    program = PROGRAMS[client].read_bytes()
    assert sorted(name for name in names if name.encode() not in program) == []


def test_each_clients_files_live_in_its_own_directory_under_the_state_home():
    assert clients.client_home("codex", {"XDG_STATE_HOME": "/s", "HOME": "/h"}) == pathlib.Path("/s/responses-gateway/launch/codex")
    assert clients.client_home("claude", {"HOME": "/h"}) == pathlib.Path("/h/.local/state/responses-gateway/launch/claude")
    assert clients.client_home("claude", {"HOME": "/h", "XDG_STATE_HOME": "relative"}) == pathlib.Path("/h/.local/state/responses-gateway/launch/claude")
    for client in CLIENTS:
        built = plan(session(client))
        assert all(path.is_relative_to(HOME / client) for path in built.files)


def test_the_key_variable_the_clients_read_is_not_taken_for_a_misspelt_setting():
    from gateway.config import misspelt_settings

    # One letter from GATEWAY_API_KEYS: the gateway started with it in the environment must not warn.
    assert misspelt_settings([clients.KEY_VARIABLE]) == []
    assert misspelt_settings(["GATEWAY_API_KEYZ"]) == [("GATEWAY_API_KEYZ", "GATEWAY_API_KEYS")]
