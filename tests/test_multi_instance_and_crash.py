"""Gateway processes sharing one store, and a gateway killed mid-stream.

Each gateway here is a real `python -m gateway serve` process with its own
socket, talking to the scripted backend of the test and to a real store: a
redis-server, or one SQLite file.  The processes belong to the test's own
nursery, so none outlives its test: leaving the nursery terminates them.
"""

from __future__ import annotations

import functools
import os
import sqlite3
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

import httpx2
import openai
import orjson
import pytest
import trio

from gateway import Settings
from test_store_contract import REDIS, start_redis

STARTUP_SECONDS = 20
# Every variable the gateway reads; the developer's own values must not leak in.
_SETTINGS_VARIABLES = {name.upper() for name in Settings.model_fields}


@dataclass
class GatewayProcess:
    url: str
    process: trio.Process
    stderr: bytearray = field(default_factory=bytearray)  # all it has logged so far, for diagnosis

    def sdk(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.url + "/v1", api_key="x", max_retries=0)


class LineReader:
    """Lines from a process's pipe, as they arrive."""

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self._stream = stream
        self.buffer = bytearray()

    async def readline(self) -> str:
        """The next line, without its newline.  Raises EOFError when the pipe closes first."""
        while b"\n" not in self.buffer:
            data = await self._stream.receive_some()
            if not data:
                raise EOFError(self.buffer.decode(errors="replace"))
            self.buffer += data
        line, _, rest = bytes(self.buffer).partition(b"\n")
        self.buffer = bytearray(rest)
        return line.decode(errors="replace")


async def run_gateway_process(
    cwd: Any, env: dict[str, str], *, task_status: trio.TaskStatus[GatewayProcess] = trio.TASK_STATUS_IGNORED
) -> None:
    """Run one gateway process; report it once it serves, then keep draining its stderr.

    Cancelling the task terminates the process (trio's `run_process`).
    """
    environ = {k: v for k, v in os.environ.items() if k.upper() not in _SETTINGS_VARIABLES}
    environ.update({"API_ADAPTER_HOST": "127.0.0.1", "API_ADAPTER_PORT": "0", **env})
    marker = "serving the Responses gateway on "
    async with trio.open_nursery() as nursery:
        process: trio.Process = await nursery.start(
            functools.partial(
                trio.run_process,
                [sys.executable, "-m", "gateway", "serve"],
                env=environ,
                cwd=cwd,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                check=False,
            )
        )
        assert process.stderr is not None
        reader = LineReader(process.stderr)
        seen: list[str] = []
        with trio.fail_after(STARTUP_SECONDS):
            while marker not in (line := await reader.readline()):
                seen.append(line)
        url = line.split(marker, 1)[1].split(" ", 1)[0]
        gateway = GatewayProcess(url, process, bytearray("\n".join([*seen, line, ""]).encode()) + reader.buffer)
        task_status.started(gateway)
        # A full pipe would block the gateway's logging, and with it the gateway.
        async for data in process.stderr:
            gateway.stderr += data


async def start_gateways(nursery: trio.Nursery, cwd: Any, *envs: dict[str, str]) -> list[GatewayProcess]:
    """Start one gateway process per env, concurrently; `nursery` owns them all."""
    started: list[Any] = [None] * len(envs)

    async def start_one(index: int, env: dict[str, str]) -> None:
        started[index] = await nursery.start(run_gateway_process, cwd, env)

    async with trio.open_nursery() as starting:
        for index, env in enumerate(envs):
            starting.start_soon(start_one, index, env)
    return started


def gateway_env(backend_url: str, log_file: Any, **store: str) -> dict[str, str]:
    return {"OPENAI_BASE_URL_INTERNAL": backend_url, "LOG_FILE_PATH": str(log_file), **store}


def integrity_check(path: Any) -> str:
    conn = sqlite3.connect(path)
    try:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])
    finally:
        conn.close()


def user_and_assistant_texts(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in messages if m["role"] in ("user", "assistant")]


async def create(http: httpx2.AsyncClient, url: str, **body: Any) -> dict[str, Any]:
    r = await http.post(url + "/v1/responses", json={"model": "text", **body})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.skipif(REDIS is None, reason="redis-server is not installed (.ci/run installs it)")
async def test_two_gateways_on_one_redis_share_conversations_and_deletions(tmp_path, backend):
    processes: list[trio.Process] = []
    with trio.fail_after(STARTUP_SECONDS + 20):
        async with trio.open_nursery() as nursery, httpx2.AsyncClient(timeout=10) as http:
            redis_url = await start_redis(nursery, tmp_path)
            a, b = await start_gateways(
                nursery,
                tmp_path,
                gateway_env(backend.url, tmp_path / "a.log", STORE_BACKEND="redis", REDIS_URL=redis_url),
                gateway_env(backend.url, tmp_path / "b.log", STORE_BACKEND="redis", REDIS_URL=redis_url),
            )
            processes += [a.process, b.process]
            assert a.url != b.url
            async with a.sdk() as sdk_a, b.sdk() as sdk_b:
                raw = await sdk_a.responses.with_raw_response.create(model="text", input="My name is Ada.")
                first, first_json = raw.parse(), raw.http_response.json()
                second = await sdk_b.responses.create(
                    model="text", input="What is my name?", previous_response_id=first.id
                )
                assert second.status == "completed" and second.previous_response_id == first.id
                assert user_and_assistant_texts(backend.chat_requests[-1]["messages"]) == [
                    ("user", "My name is Ada."),
                    ("assistant", "Hello, world!"),
                    ("user", "What is my name?"),
                ]

                retrieved = await sdk_b.responses.retrieve(first.id)
                assert retrieved.model_dump(mode="json") == first.model_dump(mode="json")
                via_a = await http.get(f"{a.url}/v1/responses/{first.id}")
                via_b = await http.get(f"{b.url}/v1/responses/{first.id}")
                assert via_a.status_code == via_b.status_code == 200
                assert via_b.json() == via_a.json() == first_json
                items = await sdk_b.responses.input_items.list(first.id)
                assert [item.model_dump()["content"][0]["text"] for item in items.data] == ["My name is Ada."]

                await sdk_b.responses.delete(first.id)
                with pytest.raises(openai.NotFoundError) as gone:
                    await sdk_a.responses.retrieve(first.id)
                assert gone.value.code == "response_not_found"
                with pytest.raises(openai.NotFoundError) as gone:
                    await sdk_a.responses.delete(first.id)
                assert gone.value.code == "response_not_found"
                # The later turn survives; its chain now starts where the deleted one was.
                assert (await sdk_a.responses.retrieve(second.id)).id == second.id
            nursery.cancel_scope.cancel()
    assert all(process.returncode is not None for process in processes)


async def test_a_gateway_killed_mid_stream_leaves_the_sqlite_store_intact(tmp_path, backend):
    database = tmp_path / "responses.sqlite3"
    env = functools.partial(gateway_env, backend.url, STORE_BACKEND="sqlite", SQLITE_PATH=str(database))
    processes: list[trio.Process] = []
    with trio.fail_after(2 * STARTUP_SECONDS + 20):
        async with trio.open_nursery() as nursery, httpx2.AsyncClient(timeout=10) as http:
            (first_gateway,) = await start_gateways(nursery, tmp_path, env(tmp_path / "first.log"))
            processes.append(first_gateway.process)
            url = first_gateway.url
            async with first_gateway.sdk() as sdk:
                raw = await sdk.responses.with_raw_response.create(model="text", input="one")
                created = [raw.http_response.json()]
            created.append(await create(http, url, input="two", previous_response_id=created[0]["id"]))
            created.append(await create(http, url, input=[{"role": "user", "content": "three"}]))

            killed_id = None
            async with http.stream(
                "POST", url + "/v1/responses", json={"model": "hang", "input": "wait", "stream": True}
            ) as stream:
                async for line in stream.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    event = orjson.loads(line[len("data: "):])
                    if event["type"] == "response.created":
                        killed_id = event["response"]["id"]
                    if event["type"] == "response.output_text.delta":
                        first_gateway.process.kill()
                        break
            assert killed_id is not None
            assert await first_gateway.process.wait() == -9
            await backend.client_left.wait()  # the dead process's upstream connection closed
            assert await trio.to_thread.run_sync(integrity_check, database) == "ok"

            (second_gateway,) = await start_gateways(nursery, tmp_path, env(tmp_path / "second.log"))
            processes.append(second_gateway.process)
            url = second_gateway.url
            for before in created:
                r = await http.get(f"{url}/v1/responses/{before['id']}")
                assert r.status_code == 200 and r.json() == before
            r = await http.get(f"{url}/v1/responses/{killed_id}")
            assert r.status_code == 404 and r.json()["error"]["code"] == "response_not_found"
            r = await http.get(f"{url}/v1/responses/{killed_id}/input_items")
            assert r.status_code == 404 and r.json()["error"]["code"] == "response_not_found"

            async with second_gateway.sdk() as sdk:
                later = await sdk.responses.create(model="text", input="four", previous_response_id=created[1]["id"])
            assert later.status == "completed"
            assert user_and_assistant_texts(backend.chat_requests[-1]["messages"]) == [
                ("user", "one"),
                ("assistant", "Hello, world!"),
                ("user", "two"),
                ("assistant", "Hello, world!"),
                ("user", "four"),
            ]
            nursery.cancel_scope.cancel()
    assert all(process.returncode is not None for process in processes)
    assert await trio.to_thread.run_sync(integrity_check, database) == "ok"


async def test_two_gateways_on_one_sqlite_file_read_each_others_responses(tmp_path, backend):
    database = tmp_path / "shared.sqlite3"
    store = {"STORE_BACKEND": "sqlite", "SQLITE_PATH": str(database)}
    processes: list[trio.Process] = []
    with trio.fail_after(STARTUP_SECONDS + 20):
        async with trio.open_nursery() as nursery, httpx2.AsyncClient(timeout=10) as http:
            # Started together: both set up a file that does not exist yet (see the store test below).
            a, b = await start_gateways(
                nursery,
                tmp_path,
                gateway_env(backend.url, tmp_path / "a.log", **store),
                gateway_env(backend.url, tmp_path / "b.log", **store),
            )
            processes += [a.process, b.process]
            made: dict[str, list[dict[str, Any]]] = {a.url: [], b.url: []}

            async def create_some(url: str, count: int) -> None:
                for n in range(count):
                    made[url].append(await create(http, url, input=f"{url} {n}"))

            # Writers on both processes at once: SQLite's locking, not luck, keeps them apart.
            async with trio.open_nursery() as writers:
                for url in made:
                    for _ in range(3):
                        writers.start_soon(create_some, url, 3)

            for writer, reader in ((a.url, b.url), (b.url, a.url)):
                assert len(made[writer]) == 9
                for response in made[writer]:
                    r = await http.get(f"{reader}/v1/responses/{response['id']}")
                    assert r.status_code == 200 and r.json() == response

            later = await create(http, b.url, input="and then?", previous_response_id=made[a.url][0]["id"])
            assert later["status"] == "completed"
            assert user_and_assistant_texts(backend.chat_requests[-1]["messages"])[-1] == ("user", "and then?")
            assert len(backend.chat_requests[-1]["messages"]) == 3
            nursery.cancel_scope.cancel()
    assert all(process.returncode is not None for process in processes)
    assert await trio.to_thread.run_sync(integrity_check, database) == "ok"


# Imports the store, says "opening", opens the file named in argv and says
# "ok" or the error it got.
_OPEN_STORE = """
import sys
from gateway.store.sqlite import SQLiteStore

print("opening", flush=True)
try:
    SQLiteStore(sys.argv[1])
    print("ok", flush=True)
except Exception as error:
    print(f"{type(error).__name__}: {error}", flush=True)
"""


async def test_a_store_opening_a_new_sqlite_file_waits_while_another_process_sets_it_up(tmp_path):
    # PRAGMA journal_mode=WAL on a file not yet in WAL mode fails at once with "database is
    # locked" while another connection holds the write lock: SQLite's busy timeout does not
    # apply to it.  Two gateways starting together on a new SQLITE_PATH meet exactly this.
    path = tmp_path / "new.sqlite3"
    # What the first of two gateways starting together holds while it switches the new file to WAL.
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        async with trio.open_nursery() as nursery:
            process: trio.Process = await nursery.start(
                functools.partial(
                    trio.run_process,
                    [sys.executable, "-c", _OPEN_STORE, str(path)],
                    cwd=tmp_path,
                    stdout=subprocess.PIPE,
                    check=False,
                )
            )
            reader = LineReader(process.stdout)  # type: ignore[arg-type]
            with trio.fail_after(STARTUP_SECONDS):
                assert await reader.readline() == "opening"
            early = None
            # Not synchronisation: a bounded look at a store that must still be waiting for the lock.
            with trio.move_on_after(0.5):
                early = await reader.readline()
            assert early is None, f"the store gave up at once: {early}"
            holder.execute("COMMIT")
            with trio.fail_after(10):
                assert await reader.readline() == "ok"
    finally:
        holder.close()
