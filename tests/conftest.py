"""Shared fixtures: a scripted backend and the gateway, both real servers on loopback."""

from __future__ import annotations

import functools
import itertools
import sys
import pathlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx2
import orjson
import pytest
import trio

sys.path.insert(0, str(pathlib.Path(__file__).parent))

from scripted_backend import ScriptedBackend, serve_backend  # noqa: E402

import gateway  # noqa: E402
from gateway import Settings, create_app  # noqa: E402
from gateway.backends.http1 import Http1Transport  # noqa: E402


class SequentialIds:
    """Deterministic ids: resp_1, msg_2, ... (tests compare whole sequences)."""

    def __init__(self) -> None:
        self._counter = itertools.count(1)

    def __call__(self, prefix: str) -> str:
        return f"{prefix}_{next(self._counter)}"


def make_settings(backend_url: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "openai_base_url_internal": backend_url,
        "api_adapter_host": "127.0.0.1",
        "api_adapter_port": 0,
        "heartbeat_interval": 15.0,
        "log_file_path": "",
        "stream_timeout": 30.0,
        "store_backend": "memory",
    }
    values.update(overrides)
    return Settings(_env_file=None, **values)  # type: ignore[call-arg]


@pytest.fixture(autouse=True, scope="session")
def _own_data_home(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The default SQLite file is the user's (`$XDG_DATA_HOME/responses-gateway/`): a test's
    gateway or `gateway keys`, in this process or a child, never writes to the real one."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_DATA_HOME", str(tmp_path_factory.mktemp("xdg-data")))
        yield


@pytest.fixture
async def backend(nursery: trio.Nursery) -> ScriptedBackend:
    scripted = ScriptedBackend()
    await nursery.start(serve_backend, scripted)
    return scripted


@pytest.fixture
def start_gateway(nursery: trio.Nursery, backend: ScriptedBackend) -> Callable[..., Any]:
    async def start(*, keys: Any = None, **overrides: Any) -> str:
        settings = make_settings(backend.url, **overrides)
        app = create_app(settings, keys=keys, ids=SequentialIds(), clock=lambda: 1_700_000_000.0)
        return await nursery.start(functools.partial(gateway.serve, settings, app=app))  # type: ignore[no-any-return]

    return start


@pytest.fixture
async def gateway_url(start_gateway: Callable[..., Any]) -> str:
    return await start_gateway()  # type: ignore[no-any-return]


@pytest.fixture
def begun(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each turn's first backend request was begun before its round
    (`Http1Transport.send_now`), in order.  The first is made not to be, as when no kept-alive
    connection is free: its round sends it, for a test to compare the others with."""
    seen: list[bool] = []
    send_now = Http1Transport.send_now

    def watched(self: Http1Transport, *args: Any, **kwargs: Any) -> Any:
        sent = send_now(self, *args, **kwargs) if seen else None
        seen.append(sent is not None)
        return sent

    monkeypatch.setattr(Http1Transport, "send_now", watched)
    return seen


@pytest.fixture
async def client() -> AsyncIterator[httpx2.AsyncClient]:
    async with httpx2.AsyncClient(timeout=30) as http:
        yield http


def parse_sse(raw: bytes) -> list[dict[str, Any] | str]:
    """Frames of a Responses stream: event dicts, and the string "[DONE]"."""
    out: list[dict[str, Any] | str] = []
    for frame in raw.split(b"\n\n"):
        if not frame.strip():
            continue
        lines = frame.split(b"\n")
        if all(line.startswith(b":") for line in lines):
            continue
        data = [line[6:] for line in lines if line.startswith(b"data: ")]
        assert len(data) == 1, f"one data line per event: {frame!r}"
        if data[0] == b"[DONE]":
            out.append("[DONE]")
            continue
        event = orjson.loads(data[0])
        names = [line[7:].decode() for line in lines if line.startswith(b"event: ")]
        assert names == [event["type"]], f"event: line must equal data.type: {frame!r}"
        out.append(event)
    return out
