"""The README's examples run as written."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import trio

README = pathlib.Path(__file__).parent.parent / "README.md"


def example(marker: str) -> str:
    match = re.search(rf"<!-- {marker} -->\n```python\n(.*?)```", README.read_text(), re.S)
    assert match, f"README has no {marker}"
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
    exec(compile(example("translator-example"), "README.md", "exec"), {})
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("['response.created', 'response.in_progress', 'response.output_item.added'")
    assert out[0].endswith("'response.completed']")
    assert out[1] == "Hello"


def test_the_readme_commands_exist_in_the_justfile():
    justfile = (README.parent / "justfile").read_text()
    text = README.read_text()
    for recipe in ("demo", "test"):
        assert f"just {recipe}" in text
        assert re.search(rf"^{recipe}\b", justfile, re.M)
    ci = (README.parent / ".ci" / "run").read_text()
    assert '"$JUST" test' in ci


def test_every_setting_is_in_the_configuration_table():
    from gateway import Settings

    text = README.read_text()
    missing = [name.upper() for name in Settings.model_fields if f"`{name.upper()}`" not in text]
    assert missing == []
