"""The doctor's checks, as data and verdicts: what is asked of a backend, what each row needs, and
the verdict and fix each observation earns.

Pure: the probes (`probes.py`) fill an `Observed` with what the backend answered or a `Failure`;
`judge` turns it into one `Row` per check.  A check no client needs never fails (its worst is
`warn`), so the exit status follows from the rows alone.  This module knows no HTTP, no clock and
no configuration file; the figures it compares a context window with are the constants below,
and docs/backends.md says where they come from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import jsonschema
import orjson

from ...streams.chunks import DONE

__all__ = [
    "CHECKS",
    "CLAUDE_CODE_FIRST_REQUEST",
    "CLAUDE_CODE_FIRST_REQUEST_WITH_TOOLS",
    "CLIENTS",
    "CODEX_FIRST_REQUEST",
    "Answer",
    "Call",
    "Check",
    "Failure",
    "Observed",
    "Row",
    "Server",
    "Verdict",
    "judge",
    "parallel_request",
    "prefix_requests",
    "stream_request",
    "tool_request",
    "tool_result_request",
]

Verdict = Literal["ok", "warn", "fail", "n/a"]

CLIENTS = ("Claude Code", "Codex", "opencode")

# The prompt tokens of each client's first request, measured earlier in this project
# (docs/backends.md#doctor): what a context window must hold before a session even starts.
CLAUDE_CODE_FIRST_REQUEST = 4_100  # a plain prompt, its tools not rendered by the template
CLAUDE_CODE_FIRST_REQUEST_WITH_TOOLS = 13_000  # its full tool set, rendered
CODEX_FIRST_REQUEST = 4_500
# What the fixes suggest: room for a session to grow past its first request.
SUGGESTED_CONTEXT = 32_768


@dataclass(frozen=True)
class Check:
    name: str
    needed_by: tuple[str, ...]  # the clients that fail without it; none: nice to have
    what: str  # one line, for `--help` and the docs


CHECKS: tuple[Check, ...] = (
    Check("reachable", CLIENTS, "a connection and an HTTP answer, with the backend's key"),
    Check("models listed", (), "GET /v1/models lists the route's model"),
    Check("streaming", CLIENTS, "a streamed chat completion brings text and ends properly"),
    Check("forced tool call", CLIENTS, "a named tool_choice gets a call whose arguments fit the schema, and its result an answer"),
    Check("parallel tool calls", (), "two calls in one turn"),
    Check("usage in streams", (), "stream_options.include_usage gets a usage chunk, with cached tokens"),
    Check("reasoning", (), "reasoning arrives apart from the text (reasoning_content or reasoning)"),
    Check("context window", CLIENTS, "the window holds Claude Code's and Codex's first requests"),
    Check("tokenizer", (), "exact token counts from a tokenizer endpoint"),
    Check("prefix cache", (), "a second request sharing a long prefix reuses the cached prompt"),
    Check("messages route", ("Claude Code",), "how /v1/messages reaches this backend"),
)
_BY_NAME = {check.name: check for check in CHECKS}


@dataclass(frozen=True)
class Row:
    check: str
    verdict: Verdict
    detail: str
    fix: str
    needed_by: tuple[str, ...]


@dataclass(frozen=True)
class Failure:
    """A probe that got no usable answer."""

    kind: Literal["timeout", "connect", "status", "broken"]
    message: str
    status: int | None = None


@dataclass
class Call:
    id: str | None = None
    name: str = ""
    arguments: str = ""


@dataclass
class Answer:
    """What one streamed chat completion brought, chunk by chunk (`feed`)."""

    text: str = ""
    reasoning: str = ""
    reasoning_field: str | None = None  # "reasoning_content" or "reasoning"
    calls: dict[int, Call] = field(default_factory=dict)
    finish: str | None = None
    done: bool = False  # `[DONE]` came
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None  # llama.cpp's own
    error: str | None = None  # an error event inside the stream
    chunks: int = 0

    def feed(self, chunk: Any) -> None:
        if chunk is DONE:
            self.done = True
            return
        if not isinstance(chunk, dict):
            return
        self.chunks += 1
        if "error" in chunk:
            error = chunk["error"]
            self.error = str(error.get("message") if isinstance(error, dict) else error)
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        if isinstance(chunk.get("timings"), dict):
            self.timings = chunk["timings"]
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return
        choice = choices[0]
        if choice.get("finish_reason"):
            self.finish = str(choice["finish_reason"])
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return
        if isinstance(delta.get("content"), str):
            self.text += delta["content"]
        for name in ("reasoning_content", "reasoning"):
            if isinstance(delta.get(name), str) and delta[name]:
                self.reasoning += delta[name]
                self.reasoning_field = name
        for position, call in enumerate(delta.get("tool_calls") or ()):
            if not isinstance(call, dict):
                continue
            index = call["index"] if isinstance(call.get("index"), int) else position
            seen = self.calls.setdefault(index, Call())
            seen.id = seen.id or call.get("id")
            function: dict[str, Any] = call["function"] if isinstance(call.get("function"), dict) else {}
            if isinstance(function.get("name"), str) and not seen.name:
                seen.name = function["name"]
            if isinstance(function.get("arguments"), str):
                seen.arguments += function["arguments"]

    @property
    def cached(self) -> int | None:
        """The prompt tokens the backend said it had cached; None when it does not say."""
        details = (self.usage or {}).get("prompt_tokens_details")
        if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
            return int(details["cached_tokens"])
        if self.timings is not None and isinstance(self.timings.get("cache_n"), int):
            return int(self.timings["cache_n"])
        return None

    @property
    def prompt_tokens(self) -> int | None:
        value = (self.usage or {}).get("prompt_tokens")
        return value if isinstance(value, int) else None


@dataclass(frozen=True)
class Server:
    """What the backend's own endpoints said of it."""

    flavour: str | None = None  # "llama.cpp", "vLLM", "Ollama"; None: not recognised
    slots: int | None = None  # llama.cpp's total_slots (its n_ctx is each slot's)
    template_tools: bool | None = None  # llama.cpp's chat_template_caps
    template_parallel: bool | None = None
    trained: int | None = None  # the model's training context (llama.cpp's /v1/models meta.n_ctx_train)


@dataclass
class Observed:
    """Everything the probes saw of one backend of one route; None: not asked."""

    backend: str
    kind: str  # the backend's type: "openai" or "anthropic"
    model: str
    timeout: float
    where: str  # where its URL and key are set: "GATEWAY_CONFIG (path)" or "OPENAI_BASE_URL_INTERNAL"
    in_file: bool = False
    tried: set[str] = field(default_factory=set)  # the checks whose probes ran
    skipped: str = ""  # why the others did not
    reached: int | Failure | None = None  # the status GET /v1/models answered
    listed: list[str] | Failure | None = None
    picked: bool = False  # the model was picked from the list (a glob route)
    server: Server = Server()
    stream: Answer | Failure | None = None
    tool_call: Answer | Failure | None = None
    tool_result: Answer | Failure | None = None
    parallel: Answer | Failure | None = None
    window: int | Failure | None = None
    route_window: int | None = None  # the routes file's context_window
    counted: str | Failure | None = None  # how the backend counts tokens: "vllm", "llamacpp", "completion"
    prefix: tuple[Answer, Answer] | Failure | None = None


# --- what is asked ------------------------------------------------------------------------------

WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city, now.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city's name"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
TIME: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The local time in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
# A system prompt of some nine hundred tokens: long enough for a prefix cache to show, short
# enough for a small context.
_PREFIX = " ".join(f"Rule {n}: answer plainly, briefly and politely." for n in range(1, 81))


def stream_request(model: str) -> dict[str, Any]:
    """A plain streamed turn, asking for usage as the gateway does."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": "Say hello in one short sentence."}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 16,
        "temperature": 0,
    }


def tool_request(model: str) -> dict[str, Any]:
    """A turn whose tool_choice names the function, as Claude Code and the gateway's own tools force one."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": "What is the weather in Paris? Use the tool."}],
        "tools": [WEATHER],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "stream": True,
        "max_tokens": 64,
        "temperature": 0,
    }


def tool_result_request(model: str, call: Call) -> dict[str, Any]:
    """The next turn: the call and its result sent back, the model to answer."""
    asked = tool_request(model)
    called = {"id": call.id or "call_0", "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
    return {
        **asked,
        "messages": [
            *asked["messages"],
            {"role": "assistant", "content": None, "tool_calls": [called]},
            {"role": "tool", "tool_call_id": called["id"], "content": '{"temperature_c": 18, "sky": "clear"}'},
        ],
        "tool_choice": "auto",
        "max_tokens": 32,
    }


def parallel_request(model: str) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "Call get_weather and get_time for Paris, both at once."}],
        "tools": [WEATHER, TIME],
        "tool_choice": "required",
        "parallel_tool_calls": True,
        "stream": True,
        "max_tokens": 96,
        "temperature": 0,
    }


def prefix_requests(model: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Two turns sharing a long system prompt, as every turn of an agent's session shares its own."""

    def asking(question: str) -> dict[str, Any]:
        return {
            "model": model,
            "messages": [{"role": "system", "content": _PREFIX}, {"role": "user", "content": question}],
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": 4,
            "temperature": 0,
        }

    return asking("Say yes."), asking("Say no.")


# --- verdicts -----------------------------------------------------------------------------------


def _row(name: str, verdict: Verdict, detail: str, fix: str = "") -> Row:
    check = _BY_NAME[name]
    if verdict == "fail" and not check.needed_by:
        verdict = "warn"  # a nice-to-have never fails the run
    return Row(name, verdict, detail, "" if verdict == "ok" else fix, check.needed_by)


_NOT_FOR_ANTHROPIC = frozenset({"parallel tool calls", "usage in streams", "reasoning", "context window", "tokenizer", "prefix cache"})
_ALWAYS = frozenset({"reachable", "messages route"})  # judged from what is always known


def judge(seen: Observed) -> list[Row]:
    """One row per check, in `CHECKS` order, from what the probes saw."""
    rows = []
    for check in CHECKS:
        if seen.kind == "anthropic" and check.name in _NOT_FOR_ANTHROPIC:
            rows.append(_row(check.name, "n/a", "does not apply to an Anthropic backend"))
        elif check.name in _ALWAYS or check.name in seen.tried:
            rows.append(_JUDGES[check.name](seen))
        else:
            rows.append(_row(check.name, "n/a", f"not tried: {seen.skipped or 'not asked'}"))
    return rows


def _flavour(seen: Observed, fixes: dict[str | None, str]) -> str:
    """The fix for this server's flavour, else the general one (under None)."""
    return fixes.get(seen.server.flavour, fixes[None])


def _failed(failure: Failure, seen: Observed) -> str:
    if failure.kind == "timeout" and "within" not in failure.message:
        return f"no answer within {seen.timeout:g} s ({failure.message})"
    if failure.kind == "status":
        return f"refused with HTTP {failure.status}: {failure.message}"
    return failure.message


def _key_fix(seen: Observed) -> str:
    if seen.in_file:
        return f"give backend {seen.backend!r} its key: api_key_env = \"VARIABLE\" (or api_key) in {seen.where}"
    return "set OPENAI_API_KEY to the backend's key"


def _url_fix(seen: Observed) -> str:
    if seen.in_file:
        return f"start the backend, or fix backends.{seen.backend}.base_url in {seen.where}"
    return "start the backend, or point OPENAI_BASE_URL_INTERNAL at it"


def _reachable(seen: Observed) -> Row:
    reached = seen.reached
    if isinstance(reached, Failure):
        if reached.kind == "timeout":
            return _row(
                "reachable", "fail", _failed(reached, seen),
                "the server takes connections but answers nothing: is it still loading the model, or stuck? "
                "See its log (or give it longer with --timeout)",
            )  # fmt: skip
        return _row("reachable", "fail", reached.message, _url_fix(seen))
    if reached == 503:  # (llama.cpp's while it loads the model)
        return _row("reachable", "fail", "HTTP 503: the backend is not ready (still loading its model?)", "wait for it to load, then run this again")
    if reached in (401, 403):
        return _row("reachable", "fail", f"HTTP {reached}: the backend refuses the key", _key_fix(seen))
    return _row("reachable", "ok", f"GET /v1/models answered HTTP {reached}")


def _models(seen: Observed) -> Row:
    listed = seen.listed
    if isinstance(listed, Failure) or listed is None:
        said = _failed(listed, seen) if isinstance(listed, Failure) else "no answer"
        return _row(
            "models listed", "warn", f"GET /v1/models: {said}",
            "clients that list models (Codex's picker, opencode) see only the routes file's names; "
            "check that base_url is the server's OpenAI-compatible root (…/v1)",
        )  # fmt: skip
    if seen.model in listed:
        how = " (picked from the list for the probes)" if seen.picked else ""
        return _row("models listed", "ok", f"{seen.model} listed, among {len(listed)}{how}")
    some = ", ".join(listed[:5]) + (", …" if len(listed) > 5 else "") or "nothing"
    if seen.server.flavour == "llama.cpp" and len(listed) == 1:
        return _row("models listed", "ok", f"{seen.model} asked, {some} listed: llama.cpp serves its one model whatever name is asked")
    target = f'backends = [{{ backend = "{seen.backend}", model = "{listed[0]}" }}] on the route in {seen.where}' if listed and seen.in_file else "a model name the backend lists (--model to try one)"
    return _row("models listed", "fail", f"{seen.model} is not among the models listed ({some})", f"send {target}")


def _stream_trouble(answer: Answer | Failure | None, seen: Observed) -> str | None:
    """What is wrong with a streamed answer, or None when it came whole."""
    if answer is None:
        return "not tried"
    if isinstance(answer, Failure):
        return _failed(answer, seen)
    if answer.error is not None:
        return f"the stream failed: {answer.error}"
    if answer.finish is None and not answer.done:
        return "the stream was cut: no finish_reason and no [DONE]"
    return None


def _status_fix(failure: Failure, seen: Observed) -> str:
    if failure.status in (401, 403):
        return _key_fix(seen)
    if failure.status == 404:
        return "check base_url (the server's OpenAI-compatible root) and that the backend serves this model"
    if failure.kind == "connect":
        return _url_fix(seen)
    if failure.kind == "timeout":
        return "the backend is slow to start answering: give it longer (--timeout) or see its log"
    return "see the backend's log for why"


def _streaming(seen: Observed) -> Row:
    answer = seen.stream
    trouble = _stream_trouble(answer, seen)
    if trouble is not None:
        fix = _status_fix(answer, seen) if isinstance(answer, Failure) else (
            "something between the gateway and the backend (a proxy) may buffer or cut server-sent events; "
            "see the backend's log"
        )  # fmt: skip
        return _row("streaming", "fail", trouble, fix)
    assert isinstance(answer, Answer)
    if not answer.text.strip() and not answer.reasoning:
        return _row("streaming", "fail", f"the stream ended ({answer.finish}) with no text", "check the model's chat template; see the backend's log")
    ending = f"finish_reason {answer.finish}" if answer.finish else "no finish_reason"
    ending += ", then [DONE]" if answer.done else ", no [DONE]"
    return _row("streaming", "ok", f"{len(answer.text)} characters of text in {answer.chunks} chunks, {ending}")


_TOOL_FIXES: dict[str | None, str] = {
    "llama.cpp": "start llama-server with --jinja and a chat template that renders tools (--chat-template-file), or serve a model made for tool calls",
    "vLLM": "start vLLM with --enable-auto-tool-choice --tool-call-parser PARSER (the parser of your model: hermes, llama3_json, mistral, qwen3_coder, …)",
    "Ollama": "use a model whose template supports tools (`ollama show MODEL` lists tools among its capabilities)",
    None: "the server must honour tools and tool_choice (OpenAI's Chat Completions function calling)",
}


def _tool_fix(seen: Observed, said: str = "") -> str:
    if seen.server.flavour == "llama.cpp" and "--jinja" in said:
        return "start llama-server with --jinja"
    if seen.server.flavour == "llama.cpp" and seen.server.template_tools is False:
        return (
            "the model's chat template renders no tools (llama.cpp's /props chat_template_caps): start llama-server "
            "with --jinja and --chat-template-file FILE, a template that renders tools, or serve a model made for tool calls"
        )
    if seen.server.flavour == "llama.cpp" and seen.server.template_tools:
        return (
            "llama.cpp may take tool_choice only as \"auto\", \"required\" or \"none\" (its log: \"Wrong type supplied for "
            "parameter 'tool_choice'\"): a newer llama.cpp, or a model that calls the one tool it is offered"
        )
    return _flavour(seen, _TOOL_FIXES)


def _tool_call(seen: Observed) -> Row:
    answer = seen.tool_call
    trouble = _stream_trouble(answer, seen)
    if trouble is not None:
        said = answer.message if isinstance(answer, Failure) else trouble
        fix = _tool_fix(seen, said) if isinstance(answer, Failure) and answer.kind == "status" and answer.status == 400 else (
            _status_fix(answer, seen) if isinstance(answer, Failure) else _tool_fix(seen)
        )  # fmt: skip
        return _row("forced tool call", "fail", f"a request forcing get_weather: {trouble}", fix)
    assert isinstance(answer, Answer)
    calls = list(answer.calls.values())
    if not calls:
        said = f"{answer.text.strip()[:60]!r}" if answer.text.strip() else "nothing"
        return _row("forced tool call", "fail", f"tool_choice named get_weather, and the backend answered {said} without a call", _tool_fix(seen))
    call = calls[0]
    if call.name != "get_weather":
        return _row("forced tool call", "fail", f"tool_choice named get_weather, and the backend called {call.name!r}", _tool_fix(seen))
    problem = _arguments_problem(call.arguments, WEATHER["function"]["parameters"])
    if problem is not None:
        return _row(
            "forced tool call", "fail", f"get_weather's arguments {call.arguments[:80]!r}: {problem}",
            _flavour(seen, {
                "vLLM": "a --tool-call-parser that matches the model (and --enable-auto-tool-choice)",
                "llama.cpp": "start llama-server with --jinja and the model's own chat template (its tool-call format)",
                None: "a server whose tool-call parser matches the model",
            }),
        )  # fmt: skip
    result = seen.tool_result
    trouble = _stream_trouble(result, seen)
    if trouble is not None:
        fix = _tool_fix(seen, result.message) if isinstance(result, Failure) else "see the backend's log"
        return _row("forced tool call", "fail", f"get_weather({call.arguments}) came, and the turn with its result: {trouble}", fix)
    assert isinstance(result, Answer)
    if not result.text.strip() and not result.calls:
        return _row("forced tool call", "fail", f"get_weather({call.arguments}) came, and its result got no answer", _tool_fix(seen))
    return _row("forced tool call", "ok", f"get_weather({call.arguments}), and an answer to its result")


def _arguments_problem(arguments: str, schema: dict[str, Any]) -> str | None:
    try:
        parsed = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError:
        return "not JSON"
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(parsed))
    return None if error is None else f"do not fit the schema ({error.message})"


def _parallel(seen: Observed) -> Row:
    answer = seen.parallel
    trouble = _stream_trouble(answer, seen)
    if trouble is not None:
        return _row("parallel tool calls", "warn", f"a request for two calls: {trouble}", _tool_fix(seen, answer.message if isinstance(answer, Failure) else ""))
    assert isinstance(answer, Answer)
    names = [call.name for call in answer.calls.values()]
    if len(names) >= 2:
        return _row("parallel tool calls", "ok", f"{len(names)} calls in one turn ({', '.join(names)})")
    if seen.server.flavour == "llama.cpp" and seen.server.template_parallel is False:
        fix = "the chat template does no parallel calls (llama.cpp's /props chat_template_caps): a template or model that does"
    else:
        fix = _flavour(seen, {
            "vLLM": "a --tool-call-parser that parses several calls for your model",
            None: "a model and server that make several calls in a turn",
        })  # fmt: skip
    fix += "; without, agents run their tools one round at a time (slower, still correct)"
    said = "one call" if len(names) == 1 else "no call"
    return _row("parallel tool calls", "warn", f"{said} in a turn that asked for two", fix)


def _usage(seen: Observed) -> Row:
    answer = seen.stream
    if not isinstance(answer, Answer):
        return _row("usage in streams", "n/a", "not tried: no streamed answer")
    if answer.usage is None:
        return _row(
            "usage in streams", "warn", "no usage chunk, though stream_options.include_usage asked for one",
            "a server that honours stream_options.include_usage; until then the gateway estimates usage "
            "and the clients' context meters are estimates",
        )  # fmt: skip
    said = f"prompt {answer.usage.get('prompt_tokens')}, completion {answer.usage.get('completion_tokens')} tokens"
    if answer.cached is None:
        return _row(
            "usage in streams", "warn", f"{said}; no cached tokens reported",
            _flavour(seen, {"vLLM": "start vLLM with --enable-prompt-tokens-details", None: "clients will see no prompt cache hits"}),
        )  # fmt: skip
    details = answer.usage.get("prompt_tokens_details")
    where = "prompt_tokens_details.cached_tokens" if isinstance(details, dict) and "cached_tokens" in details else "timings.cache_n"
    return _row("usage in streams", "ok", f"{said}, cached tokens in {where}")


_REASONING_FIX = {
    "llama.cpp": "for a reasoning model: llama-server --jinja --reasoning-format deepseek",
    "vLLM": "for a reasoning model: vLLM's --reasoning-parser NAME (deepseek_r1, qwen3, …)",
    None: "for a reasoning model: the server's reasoning parser, so thoughts come as reasoning_content",
}


def _reasoning(seen: Observed) -> Row:
    answer = seen.stream
    if not isinstance(answer, Answer):
        return _row("reasoning", "n/a", "not tried: no streamed answer")
    if answer.reasoning:
        return _row("reasoning", "ok", f"reasoning arrives as {answer.reasoning_field}")
    if "<think>" in answer.text:
        return _row("reasoning", "warn", "reasoning arrives inside the text (<think>…)", _flavour(seen, _REASONING_FIX))
    return _row("reasoning", "n/a", "no reasoning in a plain answer (a model that does not think, or no reasoning parser)", _flavour(seen, _REASONING_FIX))


def _context_fix(seen: Observed) -> str:
    fix = _flavour(seen, {
        "llama.cpp": f"restart llama-server with -c/--ctx-size {SUGGESTED_CONTEXT} (this project's: `just llama PORT {SUGGESTED_CONTEXT}`)",
        "vLLM": f"start vLLM with --max-model-len {SUGGESTED_CONTEXT} (the model must support it)",
        "Ollama": f"num_ctx {SUGGESTED_CONTEXT}: OLLAMA_CONTEXT_LENGTH={SUGGESTED_CONTEXT}, or PARAMETER num_ctx in a Modelfile",
        None: f"a context of {SUGGESTED_CONTEXT} tokens or more on the backend",
    })  # fmt: skip
    trained = seen.server.trained
    if seen.server.flavour == "llama.cpp" and trained and isinstance(seen.window, int) and seen.window >= trained:
        # llama.cpp caps a slot's context at the training length, whatever --ctx-size asks.
        fix = f"the model was trained on {trained:,} tokens and llama.cpp gives a slot no more: serve a model with a longer context"
    if seen.server.flavour == "llama.cpp" and (seen.server.slots or 1) > 1:
        fix += f"; its context is split among {seen.server.slots} slots (--parallel): fewer slots give each more"
    return fix


def _context(seen: Observed) -> Row:
    window = seen.window
    if isinstance(window, Failure) or window is None:
        said = f" ({_failed(window, seen)})" if isinstance(window, Failure) else ""
        if seen.route_window:
            return _row("context window", "ok", f"{seen.route_window:,} tokens (the routes file; the backend does not say{said})")
        return _row(
            "context window", "warn", f"unknown: the backend does not say{said}",
            "set context_window = N (tokens) on the route in GATEWAY_CONFIG: truncation and Codex's catalog use it",
        )  # fmt: skip
    source = {"llama.cpp": "llama.cpp's /props n_ctx", "vLLM": "vLLM's max_model_len", "Ollama": "Ollama's num_ctx"}.get(seen.server.flavour or "", "the backend says")
    said = f"{window:,} tokens ({source})"
    short = [f"{client}'s (about {need:,} tokens)" for client, need in (("Claude Code", CLAUDE_CODE_FIRST_REQUEST), ("Codex", CODEX_FIRST_REQUEST)) if window < need]
    if short:
        return _row("context window", "fail", f"{said}: too small for {' and '.join(short)} first request", _context_fix(seen))
    if seen.route_window and seen.route_window > window:
        return _row(
            "context window", "warn", f"{said}, but the routes file says {seen.route_window:,}: requests fitted to that are refused",
            f"set context_window = {window} or less on the route, or give the backend more",
        )  # fmt: skip
    if window < CLAUDE_CODE_FIRST_REQUEST_WITH_TOOLS:
        return _row(
            "context window", "warn",
            f"{said}: holds Claude Code's and Codex's first requests (about {CLAUDE_CODE_FIRST_REQUEST:,} and "
            f"{CODEX_FIRST_REQUEST:,} tokens), not Claude Code's with its full tool set rendered (about "
            f"{CLAUDE_CODE_FIRST_REQUEST_WITH_TOOLS:,})",
            _context_fix(seen),
        )  # fmt: skip
    return _row("context window", "ok", f"{said}: holds Claude Code's first request with its tools (about {CLAUDE_CODE_FIRST_REQUEST_WITH_TOOLS:,} tokens) and Codex's")


def _tokenizer(seen: Observed) -> Row:
    counted = seen.counted
    fix = "a server with a tokenizer endpoint (llama.cpp's and vLLM's POST /tokenize)"
    if isinstance(counted, Failure) or counted is None:
        said = _failed(counted, seen) if isinstance(counted, Failure) else "no count"
        return _row("tokenizer", "warn", f"no exact count: {said}; input_tokens and count_tokens answer 502", fix)
    if counted == "completion":
        return _row("tokenizer", "warn", "no tokenizer endpoint: counts come from one-token completions (exact, a prefill each)", fix)
    how = {"vllm": "vLLM's POST /tokenize with the chat template", "llamacpp": "llama.cpp's POST /apply-template and /tokenize"}.get(counted, counted)
    return _row("tokenizer", "ok", f"exact counts by {how}")


def _prefix(seen: Observed) -> Row:
    pair = seen.prefix
    if pair is None or isinstance(pair, Failure):
        said = _failed(pair, seen) if isinstance(pair, Failure) else "not tried"
        return _row("prefix cache", "warn", f"two requests sharing a prefix: {said}", "see the backend's log")
    first, second = pair
    cached = second.cached
    fix = _flavour(seen, {
        "llama.cpp": "llama-server keeps cache_prompt on by default; --cache-reuse 256 reuses shifted chunks too"
                     + ("; with several slots (--parallel), a request may land on another slot's cache" if (seen.server.slots or 1) > 1 else ""),
        "vLLM": "start vLLM with --enable-prefix-caching",
        None: "turn the backend's prompt (prefix) cache on",
    })  # fmt: skip
    if cached is None:
        return _row("prefix cache", "warn", "cannot tell: the backend reports no cached tokens", fix)
    total = second.prompt_tokens or first.prompt_tokens or 0
    if cached == 0 or (total and cached * 2 < total):
        return _row("prefix cache", "warn", f"the second request reused {cached} of {total} prompt tokens", fix + "; each turn of a session then computes its whole prompt again")
    return _row("prefix cache", "ok", f"the second request reused {cached} of {total} prompt tokens")


def _messages_route(seen: Observed) -> Row:
    if seen.kind == "anthropic":
        return _row("messages route", "ok", "native: /v1/messages goes to this Anthropic backend as the client sent it")
    return _row("messages route", "ok", "translated: the gateway maps /v1/messages to chat completions for this backend")


_JUDGES = {
    "reachable": _reachable,
    "models listed": _models,
    "streaming": _streaming,
    "forced tool call": _tool_call,
    "parallel tool calls": _parallel,
    "usage in streams": _usage,
    "reasoning": _reasoning,
    "context window": _context,
    "tokenizer": _tokenizer,
    "prefix cache": _prefix,
    "messages route": _messages_route,
}
