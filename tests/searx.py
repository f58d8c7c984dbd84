"""A real searx (Debian's `searx` package, SearXNG's JSON API) on loopback, for the web search tests.

`start_searx(nursery, tmp_path)` builds the offline corpus (fixtures/search/
corpus.json into a SQLite file, ranked in file order), writes the settings
(fixtures/search/settings.yml: one offline engine, port 0) and runs
`searx-run` until the test's nursery ends; it returns the instance's URL,
read from what searx prints.  Nothing reaches the internet.  `SEARX` is the
program, None where it is not installed (`.ci/run` installs it).
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import sqlite3
import subprocess
from typing import Any

import httpx2
import orjson
import trio

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "search"
SEARX = shutil.which("searx-run")
CORPUS: list[dict[str, str]] = orjson.loads((FIXTURES / "corpus.json").read_bytes())


def build_corpus(path: pathlib.Path) -> None:
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE pages (rank INTEGER, title TEXT, url TEXT, content TEXT)")
        db.executemany(
            "INSERT INTO pages VALUES (?, ?, ?, ?)", [(n, p["title"], p["url"], p["content"]) for n, p in enumerate(CORPUS)]
        )


async def start_searx(nursery: trio.Nursery, tmp_path: pathlib.Path) -> str:
    assert SEARX is not None
    database = tmp_path / "corpus.sqlite3"
    build_corpus(database)
    settings = tmp_path / "searx.yml"
    settings.write_text((FIXTURES / "settings.yml").read_text().replace("{database}", str(database)))
    env = {**os.environ, "SEARX_SETTINGS_PATH": str(settings), "PYTHONUNBUFFERED": "1"}
    env.pop("PYTHONPATH", None)
    process = await trio.lowlevel.open_process(
        [SEARX], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
    )
    assert process.stdout is not None
    url = await _announced(process.stdout)

    async def run() -> None:
        try:
            async for _ in process.stdout:  # type: ignore[union-attr]  # (drained, so it never blocks on a full pipe)
                pass
            await trio.sleep_forever()
        finally:
            process.terminate()
            with trio.CancelScope(shield=True):
                await process.wait()

    nursery.start_soon(run)
    async with httpx2.AsyncClient(timeout=10) as client:
        with trio.fail_after(30):
            while (await client.get(url + "/search", params={"q": "trio", "format": "json"})).status_code != 200:
                await trio.sleep(0.05)  # (a server starting up: nothing to wait on but its answer)
    return url


async def _announced(stdout: Any) -> str:
    """The URL searx says it runs on ("Running on http://127.0.0.1:PORT")."""
    seen = b""
    with trio.fail_after(60):
        async for chunk in stdout:
            seen += chunk
            found = re.search(rb"Running on (http://127\.0\.0\.1:\d+)", seen)
            if found:
                return found.group(1).decode()
    raise RuntimeError(f"searx did not start: {seen.decode(errors='replace')[-2000:]}")
