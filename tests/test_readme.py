"""The README's commands and the docs' examples run as written; `./dev` and its recipes behave."""

from __future__ import annotations

import functools
import os
import pathlib
import re
import subprocess
import sys

from typing import Any

import pytest
import trio

ROOT = pathlib.Path(__file__).parent.parent
README = ROOT / "README.md"
EMBEDDING = ROOT / "docs" / "embedding.md"  # the embedding and translator examples
CONFIGURATION = ROOT / "docs" / "configuration.md"  # the settings table


def example(marker: str) -> str:
    match = re.search(rf"<!-- {marker} -->\n```python\n(.*?)```", EMBEDDING.read_text(), re.S)
    assert match, f"docs/embedding.md has no {marker}"
    return match.group(1)


async def test_the_embedding_example_serves_the_gateway_in_a_trio_program(backend, tmp_path):
    env = dict(os.environ, BACKEND_URL=backend.url + "/v1")
    with trio.fail_after(60):
        done = await trio.run_process(
            [sys.executable, "-c", example("embedding-example")],
            env=env,
            cwd=tmp_path,
            capture_stdout=True,
            stderr=subprocess.DEVNULL,
        )
    assert done.stdout.decode().strip().splitlines()[-1] == "Hello, world!"
    assert backend.chat_requests[-1]["messages"] == [{"role": "user", "content": "Hello!"}]


def test_the_translator_example_runs_without_io(capsys):
    exec(compile(example("translator-example"), "docs/embedding.md", "exec"), {})
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("['response.created', 'response.in_progress', 'response.output_item.added'")
    assert out[0].endswith("'response.completed']")
    assert out[1] == "Hello"


def command(marker: str) -> str:
    match = re.search(rf"<!-- {marker} -->\n```sh\n(.*?)```", README.read_text(), re.S)
    assert match, f"README has no {marker}"
    return match.group(1).strip()


def test_the_quick_start_runs_the_demo_and_test_recipes_through_dev():
    assert command("demo-command") == "./dev demo"
    assert command("test-command") == "./dev test"
    assert os.access(ROOT / "dev", os.X_OK)
    justfile = (ROOT / "justfile").read_text()
    for recipe in ("demo", "test"):
        assert re.search(rf"^{recipe}\b", justfile, re.M)


@pytest.mark.e2e
async def test_the_demo_streams_a_reply_from_the_small_model_and_shows_the_mcp_server_it_connected():
    """What `./dev demo` runs (`examples/demo.py`), end to end: llama.cpp with SmolLM2, the gateway,
    the example MCP server, the openai SDK."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with trio.fail_after(300):
        done = await trio.run_process(
            [sys.executable, str(ROOT / "examples" / "demo.py"), "Say hello."],
            env=env,
            cwd=ROOT,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert re.search(r"^status=(completed|incomplete) id=resp_\w+ usage: in=\d+ out=\d+", out, re.M), out
    assert "response.output_text.delta x" in out
    assert "response.completed x1" in out or "response.incomplete x1" in out
    assert re.search(r"^MCP server 'example' \(stdio\): ready; tools offered: .*\badd\b", out, re.M), out


@pytest.mark.e2e
async def test_the_demo_shows_a_reply_cut_at_its_token_limit_as_incomplete_and_exits_cleanly():
    """A reply that reaches `max_output_tokens` ends `response.incomplete`: the SDK's
    `get_final_response()` would raise on it; the demo reads the terminal event instead."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), DEMO_MAX_OUTPUT_TOKENS="16")
    with trio.fail_after(300):
        done = await trio.run_process(
            [sys.executable, str(ROOT / "examples" / "demo.py"), "Write a long story about the sea."],
            env=env, cwd=ROOT, capture_stdout=True, capture_stderr=True, check=False,
        )
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert re.search(r"^status=incomplete id=resp_\w+ usage: in=\d+ out=16 ", out, re.M), out
    assert "response.incomplete x1" in out


def test_ci_runs_the_readmes_test_command_with_the_system_python_and_a_fresh_home():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "/^<!-- test-command -->$/" in ci  # the command is read from the README, not copied
    assert "env -i" in ci and "PATH=/usr/bin:/bin" in ci and 'HOME="$home"' in ci and "mktemp -d" in ci


def fake_venv(tmp_path: pathlib.Path) -> Any:
    """A project folder whose `.venv` python records each pip run instead of installing, and the
    justfile's `_install` run there: the pip calls it made."""
    just = pathlib.Path(sys.executable).with_name("just")
    if not just.exists():
        pytest.skip("just is not installed beside this Python (./dev installs it into .venv)")
    (tmp_path / "pyproject.toml").write_text("[project]\n")
    venv_bin = tmp_path / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "pip").touch(mode=0o755)
    (venv_bin / "python").write_text('#!/bin/sh\necho "$*" >>calls\n')
    (venv_bin / "python").chmod(0o755)

    def install(*args: str) -> list[str]:
        subprocess.run(
            [just, "--justfile", ROOT / "justfile", "--working-directory", tmp_path, "_install", *args],
            check=True,
            capture_output=True,
        )
        calls = (tmp_path / "calls").read_text().splitlines() if (tmp_path / "calls").exists() else []
        (tmp_path / "calls").unlink(missing_ok=True)
        return calls

    return install


def test_a_recipe_whose_environment_is_up_to_date_does_not_run_pip(tmp_path):
    install = functools.partial(fake_venv(tmp_path), "test", "model==1")
    first = install()
    assert [call.split()[-2:] for call in first] == [["-e", ".[test]"], ["--no-deps", "model==1"]]
    assert install() == []
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'changed'\n")
    assert install() == first
    assert install() == []


def test_every_setting_is_in_the_configuration_table():
    from gateway import Settings

    text = CONFIGURATION.read_text()
    missing = [name.upper() for name in Settings.model_fields if f"`{name.upper()}`" not in text]
    assert missing == []


def test_the_readme_says_where_the_design_card_is_left_and_why():
    text = README.read_text()
    start = text.index("## Where the code departs from the design card")
    end = text.find("\n## ", start + 1)
    section = text[start : end if end != -1 else len(text)]
    # The gateway's own HTTP/1.1 server by default, how to run under hypercorn and what that loses,
    # and the heartbeat wheel, each with its measured reason.
    assert "Plain HTTP/1.1 is the gateway's own server by default" in section
    assert "hypercorn -k trio gateway.asgi:app" in section and "it loses" in section
    assert "Heartbeats come from one timer wheel per process" in section and "gateway.lab.tickers" in section
    assert "ms" in section.split("Heartbeats come from one timer wheel per process", 1)[1][:600]
    # and the card's promises kept: every disconnect at once, with the figure
    assert "let go at once" in section and "0.18" in text


def test_dev_with_no_arguments_lists_the_recipes_instead_of_running_setup():
    if not (ROOT / ".venv" / "bin" / "just").exists() or not (ROOT / ".venv" / ".installed-just").exists():
        pytest.skip("./dev has not installed just into .venv yet (it would fetch it)")
    done = subprocess.run([sys.executable, ROOT / "dev"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "Available recipes" in done.stdout
    for recipe in ("demo", "test", "serve", "docs"):
        assert re.search(rf"^\s+{recipe}\b", done.stdout, re.M), done.stdout
    assert "installing" not in done.stderr  # `setup` did not run


def test_the_base_install_is_satisfied_by_any_extras_up_to_date_stamp(tmp_path):
    install = fake_venv(tmp_path)

    assert [call.split()[-2:] for call in install("test", "model==1")] == [["-e", ".[test]"], ["--no-deps", "model==1"]]
    assert install("") == []  # `serve` after `test`: the test extra includes the base
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'changed'\n")
    assert [call.split()[-2:] for call in install("")] == [["-e", "."]]  # a stale stamp satisfies nothing
    assert install("") == []
