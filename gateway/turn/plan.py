"""Responses request -> Chat Completions request, and the response skeleton.

Pure functions: no I/O, no clock (the caller passes the id and timestamp).
Decides how every field of `CreateResponseBody` reaches a Chat Completions
backend, and what the response object echoes back.  It must not know how
the backend is reached or how events are transported.

`REQUEST_FIELDS` is the one table of what becomes of each field a client
may send (forwarded, done by the gateway, echoed, refused): the planner
refuses and copies fields by it, docs/request-fields.md is
it, and a test walks it over real sockets.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
from pydantic import BaseModel

from ..builtins.search import WEB_SEARCH_TYPES, SearchOptions, responses_search_options
from ..errors import InvalidRequest
from ..wire import (
    CreateResponseRequest,
    FunctionCallItem,
    FunctionCallOutputItem,
    InputFile,
    InputImage,
    InputText,
    ItemReference,
    MessageItem,
    OutputText,
    ReasoningItem,
    Refusal,
)

__all__ = [
    "REQUEST_FIELDS",
    "SUMMARY_HEAD",
    "compaction_asked",
    "ChatPlan",
    "RequestField",
    "ToolKind",
    "TranslateOptions",
    "flat_name",
    "plan_chat_request",
    "results_without_calls",
]

log = logging.getLogger("gateway.plan")

# Items in input that record the gateway's own work and carry nothing for the model.
_CONTEXT_ONLY_ITEMS = frozenset({"mcp_list_tools", "mcp_approval_request", "mcp_approval_response"})
_ROLE_FOR_CHAT = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}


# --- what becomes of each field --------------------------------------------------------

Fate = Literal["forwarded", "done", "echoed", "refused"]


@dataclass(frozen=True, slots=True)
class RequestField:
    """What becomes of one field of a create request: a row of docs/request-fields.md.

    forwarded  the Chat Completions request carries it (`chat`: copied there unchanged)
    done       the gateway itself does what it asks
    echoed     the response object (and the stored record) carries it back; nothing else to do
    refused    400 naming it: the gateway cannot deliver what it asks for.  `allowed`
               values are not refused (they ask for what the gateway does anyway).
    """

    name: str  # its path in the request body: `text.verbosity`
    fate: Fate
    how: str  # one line of Markdown
    value: str | None = None  # the row is about this one value (an `include` entry), else any value
    chat: str | None = None
    allowed: tuple[Any, ...] = ()

    @property
    def label(self) -> str:
        return self.name if self.value is None else f"{self.name}: {self.value}"


_LOGPROBS = "message.output_text.logprobs"


def _skipped_tool(tool: str, item: str) -> str:
    return f"nothing to include: the `{tool}` tool is left out (see `tools`), so no `{item}` item is ever produced"


REQUEST_FIELDS: tuple[RequestField, ...] = (
    RequestField("model", "forwarded", "the chat `model` (with several backends it also picks the route); echoed", chat="model"),
    RequestField("input", "forwarded", "the chat `messages`, item by item (see How requests are translated); stored as the response's input items"),
    RequestField("instructions", "forwarded", "a leading `system` message; echoed (`previous_response_id` does not carry it over)"),
    RequestField("previous_response_id", "done", "the stored chain's input and output go before the new input (404 `previous_response_not_found` if unknown); echoed"),
    RequestField("conversation", "done", "the conversation's items go before the new input, and the response's items are added to it (Conversations API)"),
    RequestField(
        "include", "forwarded",
        "chat `logprobs: true`; each chunk's token log probabilities go into its `response.output_text.delta`, and all of "
        "them into `response.output_text.done`, the `output_text` part and the stored response; a backend that returns "
        "none leaves `logprobs` empty, and the gateway logs that it did",
        value=_LOGPROBS,
    ),
    RequestField("include", "done", "reasoning items carry `encrypted_content`, sealed with `GATEWAY_SECRET_KEY`; sent back, it reaches the backend as `reasoning_content`", value="reasoning.encrypted_content"),
    RequestField("include", "done", "always so: stored input items keep their `image_url` (`GET /v1/responses/{id}/input_items`)", value="message.input_image.image_url"),
    RequestField("include", "done", "nothing to include: `computer_call_output` input items are refused (no chat backend runs a computer)", value="computer_call_output.output.image_url"),
    RequestField("include", "done", _skipped_tool("file_search", "file_search_call"), value="file_search_call.results"),
    RequestField("include", "done", "nothing more to include: the model reads the results, the `web_search_call` item shows the search (its `action`); without `WEB_SEARCH_URL` no such item is produced", value="web_search_call.results"),
    RequestField("include", "done", "`web_search_call` items (the gateway's web search, `WEB_SEARCH_URL`) carry `action.sources`: the URLs of the results the model read", value="web_search_call.action.sources"),
    RequestField("include", "done", _skipped_tool("code_interpreter", "code_interpreter_call"), value="code_interpreter_call.outputs"),
    RequestField(
        "tools", "forwarded",
        "`function` and `custom` tools (`namespace` ones flattened to `namespace__name`) as chat `tools`; `mcp` servers "
        "are run by the gateway (see MCP tools); `web_search` (and its dated and preview names) is run by the gateway "
        "on a SearXNG instance when `WEB_SEARCH_URL` names one (see Web search); types no chat backend can serve "
        "(`file_search`, `code_interpreter`, …, and `web_search` without an engine) are left out, with a warning in "
        "the log; echoed",
    ),
    RequestField("tool_choice", "forwarded", "chat `tool_choice`; `allowed_tools` sends only the allowed subset, and calls outside what it allows are dropped from the output; echoed"),
    RequestField("parallel_tool_calls", "forwarded", "chat `parallel_tool_calls`, when there are tools to call; echoed"),
    RequestField("max_tool_calls", "done", "at most this many tool calls in the response (the client's functions and the gateway's MCP tools together); later calls are dropped, as OpenAI ignores them; echoed"),
    RequestField("text.format", "forwarded", "chat `response_format` (`json_schema`, `json_object`; `text` sends none); echoed"),
    RequestField("text.verbosity", "forwarded", "chat `verbosity`; echoed", chat="verbosity"),
    RequestField("temperature", "forwarded", "chat `temperature`; echoed", chat="temperature"),
    RequestField("top_p", "forwarded", "chat `top_p`; echoed", chat="top_p"),
    RequestField("presence_penalty", "forwarded", "chat `presence_penalty`; echoed", chat="presence_penalty"),
    RequestField("frequency_penalty", "forwarded", "chat `frequency_penalty`; echoed", chat="frequency_penalty"),
    RequestField(
        "top_logprobs", "forwarded",
        "chat `top_logprobs` (from 1), with `logprobs: true`: a number of alternatives asks for log probabilities; "
        "0–20, else 400; alternatives beyond it are cut; echoed",
    ),
    RequestField("max_output_tokens", "forwarded", "chat `max_tokens`; echoed", chat="max_tokens"),
    RequestField("reasoning.effort", "forwarded", "chat `reasoning_effort`; echoed", chat="reasoning_effort"),
    RequestField("reasoning.summary", "echoed", "echoed; the backend's reasoning comes back whole, as `reasoning_text` (no summary is made)"),
    RequestField("reasoning.generate_summary", "echoed", "OpenAI's deprecated name for `summary`: echoed as `reasoning.summary`"),
    RequestField("reasoning.context", "done", "`current_turn`: reasoning items before the last user message are not sent; `all_turns` and `auto`: every reasoning item reaches the backend as `reasoning_content`"),
    RequestField("reasoning.mode", "refused", "anything but `standard`: a chat backend has one execution mode", allowed=("standard",)),
    RequestField("user", "forwarded", "chat `user`", chat="user"),
    RequestField("safety_identifier", "forwarded", "chat `safety_identifier`; echoed", chat="safety_identifier"),
    RequestField("prompt_cache_key", "forwarded", "chat `prompt_cache_key`; echoed", chat="prompt_cache_key"),
    RequestField("prompt_cache_retention", "forwarded", "chat `prompt_cache_retention`", chat="prompt_cache_retention"),
    RequestField("prompt_cache_options", "forwarded", "chat `prompt_cache_options`, its `mode` and `ttl` (backends that cache prefixes on their own, as vLLM and llama.cpp do, ignore it)"),
    RequestField("prompt_cache_options.prewarm", "refused", "`true`: the gateway always generates; it cannot only warm a cache", allowed=(False,)),
    RequestField("prompt_cache_options.comparison_response_id", "refused", "prompt cache diagnostics come from OpenAI's own cache, which no chat backend reports"),
    RequestField("service_tier", "forwarded", "chat `service_tier`; echoed as asked (a chat backend does not say which tier served it)", chat="service_tier"),
    RequestField("metadata", "echoed", "echoed and stored; not sent to the backend"),
    RequestField("store", "done", "`false` keeps nothing (no `GET`, no `previous_response_id` to it); echoed"),
    RequestField("stream", "done", "`true`: server-sent events; otherwise one JSON answer (the backend is always streamed)"),
    RequestField("stream_options.include_obfuscation", "done", "`true`: each streamed delta event (output text, reasoning, reasoning summary, function call arguments) carries an `obfuscation` field of random characters that pads its payload, as OpenAI's do; absent or `false`: none (OpenAI pads by default; the gateway, usually a local hop, pads only when asked)"),
    RequestField("background", "done", "run by the gateway's background runner: `queued` at once, then poll, follow or cancel it; echoed"),
    RequestField("background_options", "done", "a background response starts at once, which meets every `completion_window`; `continuation_id` has nothing to order"),
    RequestField("truncation", "done", "`auto`: when the input does not fit the model's context window (the route's `context_window`, else what the backend says) with room for `max_output_tokens`, the oldest items are dropped — never the instructions, the last user turn, or a tool call without its output — counted exactly by the backend's tokenizer; with no window known, the backend's context-length refusal is fitted once; `disabled` (the default): too long an input gets the backend's 400; echoed"),
    RequestField("context_management", "done", "`[{\"type\": \"compaction\", \"compact_threshold\": N}]`: when the input passes N tokens (counted by the backend; without N, 80% of the context window when it is known), the conversation is summarised first (as `POST /v1/responses/compact` does) and the turn runs on the instructions, the summary and the last user turn; the `compaction` item leads the output, and a later request that carries it starts from it"),
    RequestField("prompt", "refused", "the gateway keeps no reusable prompts: send their text as `instructions` and `input`"),
    RequestField("moderation", "refused", "the gateway runs no moderation model, and cannot tell whether a backend would"),
    RequestField("image.context_compression", "refused", "`enabled`: images reach the backend as they were sent, never compressed; `auto` and `disabled` are accepted", allowed=("auto", "disabled")),
    RequestField("access_programs.cyber", "refused", "anything but `standard`: OpenAI's access programs do not exist on a chat backend", allowed=("standard",)),
    RequestField("gateway_tools", "done", "the gateway's own: `false` (or `\"none\"`) offers none of the gateway's MCP tools, as the header `x-gateway-tools: none` does"),
)

# Each refused field with the top-level request field it sits in (`text.verbosity`: `text`).
_REFUSED = tuple((row.name.partition(".")[0], row) for row in REQUEST_FIELDS if row.fate == "refused" and row.value is None)
# Each field copied to the chat request: its top-level field, its path, its chat name.
_COPIED: tuple[tuple[str, str, str], ...] = tuple(
    (row.name.partition(".")[0], row.name, row.chat) for row in REQUEST_FIELDS if row.chat is not None
)
# The request's fields that are not None when the client leaves them out.
_DEFAULTS_SET = frozenset(
    name for name, info in CreateResponseRequest.model_fields.items() if info.default is not None or info.default_factory
)
_INCLUDES = {row.value: row for row in REQUEST_FIELDS if row.name == "include" and row.value is not None}


def _field_value(req: BaseModel, path: str) -> Any:
    """The value at `path` (`text.verbosity`) of a request, declared or not; None when absent.

    Objects come back as plain dicts, without their null fields.
    """
    value: Any = req
    for part in path.split("."):
        if isinstance(value, BaseModel):
            value = getattr(value, part) if part in type(value).model_fields else (value.model_extra or {}).get(part)
        elif isinstance(value, dict):
            value = value.get(part)
        else:
            return None
    return value.model_dump(exclude_none=True) if isinstance(value, BaseModel) else value


def _refuse_what_cannot_be_served(req: CreateResponseRequest) -> None:
    """Raises `InvalidRequest` naming the first field whose ask the gateway cannot deliver."""
    sent = {*req.model_fields_set, *(req.model_extra or ())}
    for top, row in _REFUSED:
        if top not in sent:
            continue  # a field the request did not send asks for nothing
        value = _field_value(req, row.name)
        if value is None or value == [] or value == {}:
            continue  # asks for nothing
        if any(type(value) is type(ok) and value == ok for ok in row.allowed):
            continue
        why = row.how.replace("`", "'")
        if row.allowed:
            shown = orjson.dumps(value).decode()
            raise InvalidRequest(
                f"Unsupported value for '{row.name}': {shown}. This gateway cannot serve it: {why}.",
                param=row.name,
                code="invalid_value",
            )
        raise InvalidRequest(
            f"'{row.name}' is not supported by this gateway: {why}.", param=row.name, code="unsupported_parameter"
        )
    for index, entry in enumerate(req.include or ()):
        included = _INCLUDES.get(entry)
        if included is None:
            raise InvalidRequest(
                f"Invalid value for 'include[{index}]': '{entry}' is not something a response can include.",
                param=f"include[{index}]",
                code="invalid_value",
            )
        if included.fate == "refused":
            raise InvalidRequest(
                f"'include' value '{entry}' is not supported by this gateway: {included.how.replace('`', chr(39))}.",
                param=f"include[{index}]",
                code="unsupported_parameter",
            )


@dataclass(frozen=True, slots=True)
class TranslateOptions:
    """Backend capabilities the translation depends on."""

    forward_reasoning_content: bool = True
    # Opens content this gateway sealed (kind, token) -> value, or None.
    open_sealed: Callable[[str, str], dict[str, Any] | None] | None = None


@dataclass(frozen=True, slots=True)
class ToolKind:
    """How a chat function maps back to the client's tool."""

    kind: str  # "function" | "custom"
    name: str
    namespace: str | None = None


def flat_name(namespace: str | None, name: str) -> str:
    """The chat function name for a (namespaced) tool: `ns__name`, at most 64 characters."""
    return name if not namespace else f"{namespace}__{name}"[:64]


@dataclass(slots=True)
class ChatPlan:
    """What to send to the backend, and what the response starts as."""

    body: dict[str, Any]
    response: dict[str, Any]
    allowed_tools: frozenset[str] | None = None
    # Flattened chat function name -> what the client called it (custom tools, namespaces).
    tool_kinds: dict[str, ToolKind] = field(default_factory=dict)
    # What the request's web search tool asks, when it has one (the gateway runs it: `gateway.builtins`).
    web_search: SearchOptions | None = None


def plan_chat_request(
    req: CreateResponseRequest,
    *,
    response_id: str,
    created_at: int,
    options: TranslateOptions = TranslateOptions(),
    history: Sequence[Any] = (),
    items: Sequence[Any] | None = None,
) -> ChatPlan:
    """Translate a validated request.

    `history` holds the wire items of earlier turns (from
    `previous_response_id`); `items`, when given, replaces `req.input` with
    its resolved form (item references looked up).

    Raises:
        InvalidRequest: the request is well-typed but cannot be served
            (no model, a tool_choice naming an unknown function, an input
            item type that needs stored state, ...).
    """
    if not req.model:
        raise InvalidRequest.missing("model")
    _refuse_what_cannot_be_served(req)

    current_turn = req.reasoning is not None and req.reasoning.context == "current_turn"
    if history or items is not None:
        source: Any = list(items) if items is not None else req.input
        current: list[Any] = [MessageItem(role="user", content=source)] if isinstance(source, str) else list(source or [])
        conversation = _input_messages([*history, *current], options, current_turn_only=current_turn)
    else:
        conversation = _input_messages(req.input, options, current_turn_only=current_turn)
    messages = _instructions(req.instructions, options) + conversation
    if not messages:
        raise InvalidRequest("The request has no input.", param="input", code="missing_required_parameter")

    body: dict[str, Any] = {
        "model": req.model,
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    chat_tools, echo_tools, kinds = _tools(req.tools)
    web_search = next(
        (responses_search_options(tool, n) for n, tool in enumerate(req.tools or ()) if tool.get("type") in WEB_SEARCH_TYPES), None
    )
    tool_choice_echo: Any = "auto"
    allowed: frozenset[str] | None = None
    if chat_tools:
        names = [t["function"]["name"] for t in chat_tools]
        choice, tool_choice_echo, allowed, subset = _tool_choice(req.tool_choice, names)
        if subset is not None:
            chat_tools = [t for t in chat_tools if t["function"]["name"] in subset]
        body["tools"] = chat_tools
        if choice is not None:
            body["tool_choice"] = choice
        if req.parallel_tool_calls is not None:
            body["parallel_tool_calls"] = req.parallel_tool_calls
    elif req.tool_choice is not None:
        # Validate the value even when there is nothing to choose from: a
        # named function that is not offered is an error, as with tools.
        _tool_choice(req.tool_choice, [])
        if req.tool_choice == "none" or (isinstance(req.tool_choice, dict) and req.tool_choice.get("mode") == "none"):
            tool_choice_echo = "none"

    text_format = req.text.format if req.text is not None else None
    response_format = _response_format(text_format)
    if response_format is not None:
        body["response_format"] = response_format
    sent = req.model_fields_set
    extra = req.model_extra
    for top, name, chat_name in _COPIED:
        if top not in sent and top not in _DEFAULTS_SET and not (extra and top in extra):
            continue  # not sent, and None unless sent: nothing to copy
        value = _field_value(req, name)
        if value is not None:
            body[chat_name] = value
    if _LOGPROBS in (req.include or ()) or req.top_logprobs:
        body["logprobs"] = True
        if req.top_logprobs:
            # Only from 1: llama.cpp answers `top_logprobs: 0` with no log probabilities at all.
            body["top_logprobs"] = req.top_logprobs
    cache = req.prompt_cache_options
    if cache is not None and (cache.mode is not None or cache.ttl is not None):
        body["prompt_cache_options"] = {k: v for k, v in (("mode", cache.mode), ("ttl", cache.ttl)) if v is not None}

    response = _skeleton(req, response_id, created_at, echo_tools, tool_choice_echo, text_format)
    return ChatPlan(body=body, response=response, allowed_tools=allowed, tool_kinds=kinds, web_search=web_search)


# --- messages --------------------------------------------------------------------


def _instructions(instructions: Any, options: TranslateOptions) -> list[dict[str, Any]]:
    if instructions is None or instructions == "":
        return []
    if isinstance(instructions, str):
        return [{"role": "system", "content": instructions}]
    return _input_messages(instructions, options, where="instructions")


def _input_messages(
    items: Any, options: TranslateOptions, where: str = "input", *, current_turn_only: bool = False
) -> list[dict[str, Any]]:
    """Chat messages for input items.  `current_turn_only` (`reasoning.context: current_turn`)
    leaves out the reasoning items before the last user message."""
    if items is None:
        return []
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    first_reasoning = 0
    if current_turn_only:
        users = [i for i, item in enumerate(items) if isinstance(item, MessageItem) and item.role == "user"]
        first_reasoning = users[-1] if users else 0
    builder = _MessageBuilder(options)
    for index, item in enumerate(items):
        param = f"{where}[{index}]"
        if isinstance(item, MessageItem):
            builder.message(item, param)
        elif isinstance(item, FunctionCallItem):
            builder.function_call(item)
        elif isinstance(item, FunctionCallOutputItem):
            builder.function_call_output(item, param)
        elif isinstance(item, ReasoningItem):
            if index >= first_reasoning:
                builder.reasoning(item)
        elif isinstance(item, ItemReference):
            raise InvalidRequest(
                f"Item '{item.id}' referenced by '{param}' was not found.", param=param, code="item_not_found"
            )
        elif item.type == "mcp_call":
            builder.mcp_call(item)
        elif item.type == "compaction":
            builder.compaction(item, param)
        elif item.type == "custom_tool_call":
            data = item.model_dump()
            builder.function_call(
                FunctionCallItem(
                    type="function_call",
                    call_id=str(data.get("call_id") or data.get("id") or "call"),
                    name=flat_name(data.get("namespace"), str(data.get("name") or "tool")),
                    arguments=orjson.dumps({"input": data.get("input") or ""}).decode(),
                )
            )
        elif item.type == "custom_tool_call_output":
            data = item.model_dump()
            output = data.get("output")
            builder.function_call_output(
                FunctionCallOutputItem(
                    type="function_call_output",
                    call_id=str(data.get("call_id") or "call"),
                    output=output if isinstance(output, str) else orjson.dumps(output).decode(),
                ),
                param,
            )
        elif item.type == "web_search_call":  # (Codex replays them, sometimes without an id)
            call, output = _searched(item.model_dump(), index)
            builder.function_call(call)
            builder.function_call_output(output, param)
        elif item.type in _CONTEXT_ONLY_ITEMS:
            continue  # records of what the gateway did; nothing for the model to read
        else:
            raise InvalidRequest(
                f"Input items of type '{item.type}' are not supported by this gateway.",
                param=f"{param}.type",
                code="unsupported_item_type",
            )
    return builder.finish()


def _searched(data: Mapping[str, Any], index: int) -> tuple[FunctionCallItem, FunctionCallOutputItem]:
    """A `web_search_call` item as the search it was: the model's `web_search` call, and a result
    naming what it found (its `sources`, when the item carries them)."""
    given = data.get("action")
    action: dict[str, Any] = given if isinstance(given, dict) else {}
    call_id = str(data.get("id") or f"ws_input_{index}")
    kind = action.get("type") or "search"
    if kind == "search":
        query = action.get("query") or " ".join(q for q in action.get("queries") or () if isinstance(q, str))
        arguments: dict[str, Any] = {"query": query or ""}
        said = f"Searched the web for {query!r}."
    else:  # open_page, find_in_page: what was looked at
        arguments = {k: v for k, v in action.items() if k != "type"}
        said = f"{kind}: {orjson.dumps(arguments).decode()}."
    urls = [str(s["url"]) for s in action.get("sources") or () if isinstance(s, dict) and isinstance(s.get("url"), str)]
    if urls:
        said += " Sources: " + ", ".join(urls)
    call = FunctionCallItem(type="function_call", call_id=call_id, name="web_search" if kind == "search" else kind, arguments=orjson.dumps(arguments).decode())
    return call, FunctionCallOutputItem(type="function_call_output", call_id=call_id, output=said)


class _MessageBuilder:
    """Accumulates chat messages; keeps tool results next to their calls."""

    def __init__(self, options: TranslateOptions) -> None:
        self.options = options
        self.messages: list[dict[str, Any]] = []
        self.pending_reasoning: list[str] = []
        self.pending_signature: str | None = None

    def _take_reasoning(self, message: dict[str, Any]) -> None:
        if self.pending_reasoning and self.options.forward_reasoning_content:
            message["reasoning_content"] = "\n".join(self.pending_reasoning)
            if self.pending_signature:  # the thinking as the backend signed it (Anthropic)
                message["reasoning_signature"] = self.pending_signature
        self.pending_reasoning = []
        self.pending_signature = None

    def message(self, item: MessageItem, param: str) -> None:
        role = _ROLE_FOR_CHAT[item.role]
        if role == "assistant":
            text, refusal = _assistant_content(item.content)
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if refusal:
                message["refusal"] = refusal
            self._take_reasoning(message)
        else:
            message = {"role": role, "content": _user_content(item.content, param, allow_media=role == "user")}
        self.messages.append(message)

    def function_call(self, item: FunctionCallItem) -> None:
        last = self.messages[-1] if self.messages else None
        namespace = (item.model_extra or {}).get("namespace")
        name = flat_name(namespace if isinstance(namespace, str) else None, item.name)
        call = {"id": item.call_id, "type": "function", "function": {"name": name, "arguments": item.arguments}}
        if last is not None and last["role"] == "assistant" and not self.pending_reasoning:
            last.setdefault("tool_calls", []).append(call)
            if last.get("content") == "":
                last["content"] = None
            target = last
        else:
            target = {"role": "assistant", "content": None, "tool_calls": [call]}
            self._take_reasoning(target)
            self.messages.append(target)

    def function_call_output(self, item: FunctionCallOutputItem, param: str) -> None:
        output = item.output if isinstance(item.output, str) else _text_of_parts(item.output, param)
        message = {"role": "tool", "tool_call_id": item.call_id, "content": output}
        name = getattr(item, "name", None)
        if isinstance(name, str) and name:
            message["_name"] = name  # only used if the call never shows up
        self.messages.append(message)

    def mcp_call(self, item: Any) -> None:
        """A tool call the gateway ran: the model sees its call and its result."""
        data = item.model_dump()
        call_id = data.get("id") or "mcp_call"
        name = data.get("name") or "tool"
        arguments = data.get("arguments") or "{}"
        if not isinstance(arguments, str):
            arguments = orjson.dumps(arguments).decode()
        last = self.messages[-1] if self.messages else None
        if last is not None and last["role"] == "assistant" and not self.pending_reasoning:
            target = last
            if target.get("content") == "":
                target["content"] = None
        else:
            target = {"role": "assistant", "content": None}
            self._take_reasoning(target)
            self.messages.append(target)
        target.setdefault("tool_calls", []).append(
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        )
        error = data.get("error")
        output = data.get("output")
        content = f"Error: {error}" if error else (output if isinstance(output, str) else orjson.dumps(output).decode())
        self.messages.append({"role": "tool", "tool_call_id": call_id, "content": content})

    def reasoning(self, item: ReasoningItem) -> None:
        parts = item.content or item.summary
        text = "".join(p.text for p in parts if isinstance(p, OutputText))
        sealed = None
        if item.encrypted_content and self.options.open_sealed is not None:
            sealed = self.options.open_sealed("reasoning", item.encrypted_content)  # None: not ours
        if not text and sealed:
            text = str(sealed.get("text", ""))
        if text:
            self.pending_reasoning.append(text)
            signature = sealed.get("signature") if sealed else None
            # A signature covers exactly one thinking text: only a lone, signed one is replayed signed.
            self.pending_signature = signature if isinstance(signature, str) and len(self.pending_reasoning) == 1 else None

    def compaction(self, item: Any, param: str) -> None:
        """A compacted stretch of conversation, expanded to its summary."""
        token = item.model_dump().get("encrypted_content")
        sealed = self.options.open_sealed("compaction", token) if self.options.open_sealed and token else None
        if sealed is None:
            raise InvalidRequest(
                "This compaction item was not produced by this gateway (or its key changed).",
                param=f"{param}.encrypted_content",
                code="invalid_encrypted_content",
            )
        if sealed.get("replaces"):  # made by a turn's own compaction: it stands for all before it
            self.messages = [m for m in self.messages if m.get("role") in ("system", "developer")]
        self.messages.append({"role": "system", "content": f"{SUMMARY_HEAD}{sealed.get('summary', '')}"})

    def finish(self) -> list[dict[str, Any]]:
        return _place_tool_results(self.messages)


SUMMARY_HEAD = "Summary of the conversation so far:\n"  # how a compaction's summary reaches the model


def compaction_asked(value: Any) -> tuple[bool, int | None]:
    """What `context_management` asks (pure): whether to compact, and past how many input tokens
    (None: the gateway's default).

    Raises:
        InvalidRequest: not a list of `{"type": "compaction", "compact_threshold": N}` entries with
            N a positive integer; `param` names the field (`context_management[0].compact_threshold`).
    """
    if value is None:
        return False, None
    if not isinstance(value, list):
        raise InvalidRequest("Invalid value for 'context_management': expected a list.", param="context_management", code="invalid_type")
    threshold: int | None = None
    for n, entry in enumerate(value):
        where = f"context_management[{n}]"
        if not isinstance(entry, dict):
            raise InvalidRequest(f"Invalid value for '{where}': expected an object.", param=where, code="invalid_type")
        if entry.get("type") != "compaction":
            raise InvalidRequest(
                f"Invalid value for '{where}.type': only 'compaction' is supported.", param=f"{where}.type", code="invalid_value"
            )
        given = entry.get("compact_threshold")
        if given is None:
            continue
        if not isinstance(given, int) or isinstance(given, bool) or given < 1:
            raise InvalidRequest(
                f"Invalid value for '{where}.compact_threshold': expected a positive integer (tokens), got {given!r}.",
                param=f"{where}.compact_threshold",
                code="invalid_value",
            )
        threshold = given if threshold is None else min(threshold, given)
    return bool(value), threshold


# --- pairing tool results with their calls -------------------------------------------


@dataclass(frozen=True, slots=True)
class _Entry:
    """One step of a conversation as the pairing sees it."""

    kind: str  # "call" | "result" | "other" (anything else that breaks a run of results)
    call_id: str = ""
    content: Any = None


@dataclass(slots=True)
class _Pairs:
    answers: dict[int, int]  # result entry -> the call entry it answers
    missing: list[int]  # results whose call the conversation lacks; any other result is a duplicate


def _pair(entries: Sequence[_Entry]) -> _Pairs:
    """Match tool results to calls by position, since an id alone may name several calls.

    Backends that number ids per response (llama.cpp's `call_0` in every
    turn) reuse one id across turns.  A result answers the nearest earlier
    call with its id that nothing has answered yet.  A result left over is,
    in this order: a duplicate if it repeats word for word a result kept for
    its id (a resent input); the answer to the first unanswered call with
    its id after it (listed before its call); a duplicate if a result for its
    id is already kept in the same run of results (a second answer to one
    call: the first stands); otherwise a result whose call is missing.
    """
    answers: dict[int, int] = {}
    calls: dict[str, list[int]] = {}
    unanswered: dict[str, list[int]] = {}  # calls so far with no result, by id, oldest first
    run_of: dict[int, int] = {}  # result -> where its run of consecutive results starts
    left: list[int] = []
    run = 0
    for index, entry in enumerate(entries):
        if entry.kind != "result":
            run = index + 1
            if entry.kind == "call":
                calls.setdefault(entry.call_id, []).append(index)
                unanswered.setdefault(entry.call_id, []).append(index)
            continue
        run_of[index] = run
        waiting = unanswered.get(entry.call_id)
        if waiting:
            answers[index] = waiting.pop()
        else:
            left.append(index)
    if not left:
        return _Pairs(answers, [])
    answered = set(answers.values())
    kept: dict[str, list[int]] = {}
    for index in answers:
        kept.setdefault(entries[index].call_id, []).append(index)
    missing: list[int] = []
    for index in left:
        entry = entries[index]
        same_id = kept.setdefault(entry.call_id, [])
        if any(entries[other].content == entry.content for other in same_id):
            continue
        later = next((call for call in calls.get(entry.call_id, ()) if call > index and call not in answered), None)
        if later is not None:
            answers[index] = later
            answered.add(later)
        elif any(run_of[other] == run_of[index] for other in same_id):
            continue
        else:
            missing.append(index)
        same_id.append(index)
    return _Pairs(answers, missing)


def _place_tool_results(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Place each tool result right after the call it answers (`_pair`), dropping duplicates.

    Strict backends reject a tool message that does not follow its
    `tool_calls`, and stateless clients replay history in their own order.  A
    result whose call is missing (made in an earlier, unstored turn) gets a
    synthetic call right before it, so that the backend can accept it.
    """
    entries: list[_Entry] = []
    slots: list[tuple[int, int]] = []  # entry -> (message position, index in its tool_calls; -1 for the message)
    names: dict[int, str] = {}  # result message position -> the tool name the client gave
    for position, message in enumerate(messages):
        if message["role"] == "tool":
            name = message.pop("_name", None)
            if name is not None:
                names[position] = name
            entries.append(_Entry("result", message["tool_call_id"], message["content"]))
            slots.append((position, -1))
            continue
        entries.append(_Entry("other"))
        slots.append((position, -1))
        for index, call in enumerate(message.get("tool_calls") or ()):
            entries.append(_Entry("call", call["id"]))
            slots.append((position, index))
    if all(entry.kind != "result" for entry in entries):
        return messages
    pairs = _pair(entries)
    answer_to = {slots[call]: messages[slots[result][0]] for result, call in pairs.answers.items()}
    missing = {slots[result][0] for result in pairs.missing}
    ordered: list[dict[str, Any]] = []
    for position, message in enumerate(messages):
        if message["role"] == "tool":
            if position in missing:
                function = {"name": names.get(position) or "function", "arguments": "{}"}
                call = {"id": message["tool_call_id"], "type": "function", "function": function}
                ordered += [{"role": "assistant", "content": None, "tool_calls": [call]}, message]
            continue
        ordered.append(message)
        for index in range(len(message.get("tool_calls") or ())):
            answer = answer_to.get((position, index))
            if answer is not None:
                ordered.append(answer)
    return ordered


def _item_entries(items: Sequence[Any]) -> tuple[list[_Entry], list[int]]:
    """Wire items as the pairing sees them (ids read as `_input_messages` reads them), and each entry's item."""
    entries: list[_Entry] = []
    origin: list[int] = []
    for position, item in enumerate(items):
        data = item if isinstance(item, dict) else item.model_dump()
        kind = data.get("type") or "message"
        if kind == "function_call":
            found = [_Entry("call", str(data.get("call_id")))]
        elif kind == "custom_tool_call":
            found = [_Entry("call", str(data.get("call_id") or data.get("id") or "call"))]
        elif kind == "function_call_output":
            found = [_Entry("result", str(data.get("call_id")), data.get("output"))]
        elif kind == "custom_tool_call_output":
            found = [_Entry("result", str(data.get("call_id") or "call"), data.get("output"))]
        elif kind == "mcp_call":
            call_id = str(data.get("id") or "mcp_call")
            found = [_Entry("call", call_id), _Entry("result", call_id, (data.get("error"), data.get("output")))]
        elif kind in ("message", "compaction"):
            found = [_Entry("other")]
        else:
            found = []  # reasoning and the gateway's records become no message of their own
        entries += found
        origin += [position] * len(found)
    return entries, origin


def results_without_calls(items: Sequence[Any]) -> list[int]:
    """Positions in `items` (wire items or their dicts) of the tool outputs that answer no call.

    The rule is the planner's (see `_pair`): the planner gives each of these
    a synthetic call; a continuation of a stored conversation refuses them.
    """
    entries, origin = _item_entries(items)
    return [origin[index] for index in _pair(entries).missing]


def _assistant_content(content: Any) -> tuple[str, str | None]:
    if isinstance(content, str):
        return content, None
    texts: list[str] = []
    refusals: list[str] = []
    for part in content:
        if isinstance(part, OutputText):
            texts.append(part.text)
        elif isinstance(part, Refusal):
            refusals.append(part.refusal)
        elif isinstance(part, InputText):
            texts.append(part.text)
    return "".join(texts), ("".join(refusals) or None)


def _user_content(content: Any, param: str, *, allow_media: bool) -> Any:
    if isinstance(content, str):
        return content
    parts: list[dict[str, Any]] = []
    for index, part in enumerate(content):
        where = f"{param}.content[{index}]"
        if isinstance(part, (InputText, OutputText)):
            parts.append({"type": "text", "text": part.text})
        elif isinstance(part, InputImage) and allow_media:
            if not part.image_url:
                raise InvalidRequest(
                    "input_image needs an image_url (file ids are not supported by this gateway).",
                    param=f"{where}.image_url",
                    code="invalid_value",
                )
            image: dict[str, Any] = {"url": part.image_url}
            if part.detail:
                image["detail"] = part.detail
            parts.append({"type": "image_url", "image_url": image})
        elif isinstance(part, InputFile) and allow_media:
            if not part.file_data:
                raise InvalidRequest(
                    "input_file needs file_data: Chat Completions backends cannot fetch file_url or file_id.",
                    param=f"{where}.file_data",
                    code="invalid_value",
                )
            file: dict[str, Any] = {"file_data": part.file_data}
            if part.filename:
                file["filename"] = part.filename
            parts.append({"type": "file", "file": file})
        else:
            kind = getattr(part, "type", "?")
            raise InvalidRequest(
                f"Content parts of type '{kind}' are not allowed here.", param=f"{where}.type", code="invalid_value"
            )
    if all(p["type"] == "text" for p in parts):
        return "\n".join(p["text"] for p in parts)
    return parts


def _text_of_parts(parts: list[Any], param: str) -> Any:
    if all(isinstance(p, (InputText, OutputText)) for p in parts):
        return "\n".join(p.text for p in parts)
    return _user_content(parts, param, allow_media=True)


# --- tools -----------------------------------------------------------------------


def _custom_function(tool: dict[str, Any], name: str) -> dict[str, Any]:
    """A freeform (custom) tool as a chat function taking one string."""
    raw = tool.get("format")
    fmt: dict[str, Any] = raw if isinstance(raw, dict) else {}
    hint = "The raw input for the tool, as free text."
    if fmt.get("type") == "grammar" and isinstance(fmt.get("definition"), str):
        hint += f" It must follow this {fmt.get('syntax') or 'grammar'} grammar:\n{fmt['definition']}"
    function: dict[str, Any] = {
        "name": name,
        "parameters": {
            "type": "object",
            "properties": {"input": {"type": "string", "description": hint}},
            "required": ["input"],
        },
    }
    if isinstance(tool.get("description"), str):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _tools(
    tools: list[dict[str, Any]] | None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, ToolKind]]:
    chat: list[dict[str, Any]] = []
    echo: list[dict[str, Any]] = []
    skipped: list[str] = []
    kinds: dict[str, ToolKind] = {}
    expanded: list[tuple[int, dict[str, Any], str | None]] = []
    for index, tool in enumerate(tools or ()):
        if tool.get("type") == "namespace" and isinstance(tool.get("tools"), list):
            for inner in tool["tools"]:
                if isinstance(inner, dict):
                    expanded.append((index, inner, str(tool.get("name") or "")))
        else:
            expanded.append((index, tool, None))
    for index, tool, namespace in expanded:
        kind = tool.get("type")
        if kind == "mcp":
            continue  # hosted MCP servers are the gateway's to run (gateway.turn.tools)
        if kind == "custom" and isinstance(tool.get("name"), str) and tool["name"]:
            flat = flat_name(namespace, tool["name"])
            chat.append(_custom_function(tool, flat))
            kinds[flat] = ToolKind("custom", tool["name"], namespace)
            continue
        if kind in WEB_SEARCH_TYPES:
            continue  # the gateway's own to run, when it has an engine (`Turn._offer_builtins`)
        if kind != "function":
            skipped.append(str(kind))
            continue
        if namespace:
            inner_name = tool.get("name")
            if isinstance(inner_name, str) and inner_name:
                kinds[flat_name(namespace, inner_name)] = ToolKind("function", inner_name, namespace)
                tool = {**tool, "name": flat_name(namespace, inner_name)}
        spec = tool.get("function")
        if not isinstance(spec, dict):
            spec = tool  # the Responses shape; the chat shape nests under "function"
        name = spec.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidRequest.missing(f"tools[{index}].name")
        parameters = spec.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise InvalidRequest(
                f"Invalid value for 'tools[{index}].parameters': expected an object.",
                param=f"tools[{index}].parameters",
                code="invalid_type",
            )
        function: dict[str, Any] = {
            "name": name,
            "parameters": parameters if parameters is not None else {"type": "object", "properties": {}},
        }
        description = spec.get("description")
        if isinstance(description, str):
            function["description"] = description
        strict = spec.get("strict")
        if isinstance(strict, bool):
            function["strict"] = strict
        chat.append({"type": "function", "function": function})
        echo.append(
            {
                "type": "function",
                "name": name,
                "description": description if isinstance(description, str) else None,
                "parameters": parameters,
                "strict": strict if isinstance(strict, bool) else None,
            }
        )
    if skipped:
        log.warning("skipped tools the backend cannot serve: %s", ", ".join(sorted(set(skipped))))
    return chat, echo, kinds


def _tool_choice(
    choice: Any, names: list[str]
) -> tuple[Any, Any, frozenset[str] | None, frozenset[str] | None]:
    """(chat tool_choice, echoed tool_choice, allowed call names, tool subset to send)."""
    if choice is None:
        return None, "auto", None, None
    if isinstance(choice, str):
        if choice == "none":
            return "none", "none", frozenset(), None
        if choice in ("auto", "required"):
            return choice, choice, None, None
        raise InvalidRequest(
            f"Invalid value for 'tool_choice': '{choice}'. Expected 'none', 'auto', 'required' or an object.",
            param="tool_choice",
            code="invalid_value",
        )
    kind = choice.get("type")
    if kind in WEB_SEARCH_TYPES:  # forced onto the gateway's web search once it is offered
        return None, choice, None, None
    if kind == "function":
        name = choice.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidRequest.missing("tool_choice.name")
        if name not in names:
            raise InvalidRequest(
                f"Tool choice '{name}' not found in 'tools' parameter.", param="tool_choice", code="invalid_value"
            )
        return {"type": "function", "function": {"name": name}}, {"type": "function", "name": name}, frozenset([name]), None
    if kind == "allowed_tools":
        mode = choice.get("mode", "auto")
        if mode not in ("none", "auto", "required"):
            raise InvalidRequest(
                f"Invalid value for 'tool_choice.mode': '{mode}'.", param="tool_choice.mode", code="invalid_value"
            )
        entries = choice.get("tools")
        if not isinstance(entries, list) or not entries:
            raise InvalidRequest(
                "'tool_choice.tools' must list at least one tool.", param="tool_choice.tools", code="invalid_value"
            )
        subset: list[str] = []
        for index, entry in enumerate(entries):
            name = entry.get("name") if isinstance(entry, dict) else None
            if isinstance(entry, dict) and isinstance(entry.get("function"), dict):
                name = entry["function"].get("name")
            if not isinstance(name, str) or name not in names:
                raise InvalidRequest(
                    f"Allowed tool '{name}' not found in 'tools' parameter.",
                    param=f"tool_choice.tools[{index}]",
                    code="invalid_value",
                )
            subset.append(name)
        echo = {"type": "allowed_tools", "mode": mode, "tools": [{"type": "function", "name": n} for n in subset]}
        allowed = frozenset() if mode == "none" else frozenset(subset)
        return mode, echo, allowed, frozenset(subset)
    raise InvalidRequest(
        f"Invalid value for 'tool_choice.type': '{kind}'.", param="tool_choice.type", code="invalid_value"
    )


# --- output format and echo ------------------------------------------------------


def _response_format(fmt: dict[str, Any] | None) -> dict[str, Any] | None:
    if not fmt:
        return None
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema = fmt.get("schema")
        if not isinstance(schema, dict):
            raise InvalidRequest.missing("text.format.schema")
        json_schema: dict[str, Any] = {"name": fmt.get("name") or "response", "schema": schema}
        if isinstance(fmt.get("strict"), bool):
            json_schema["strict"] = fmt["strict"]
        if isinstance(fmt.get("description"), str):
            json_schema["description"] = fmt["description"]
        return {"type": "json_schema", "json_schema": json_schema}
    raise InvalidRequest(f"Invalid value for 'text.format.type': '{kind}'.", param="text.format.type", code="invalid_value")


def _skeleton(
    req: CreateResponseRequest,
    response_id: str,
    created_at: int,
    tools: list[dict[str, Any]],
    tool_choice: Any,
    text_format: dict[str, Any] | None,
) -> dict[str, Any]:
    if text_format and text_format.get("type") == "json_schema":
        fmt: dict[str, Any] = {
            "type": "json_schema",
            "name": text_format.get("name") or "response",
            "description": text_format.get("description"),
            "schema": text_format.get("schema"),
            "strict": bool(text_format.get("strict")),
        }
    elif text_format and text_format.get("type") == "json_object":
        fmt = {"type": "json_object"}
    else:
        fmt = {"type": "text"}
    text: dict[str, Any] = {"format": fmt}
    if req.text is not None and req.text.verbosity:
        text["verbosity"] = req.text.verbosity
    reasoning = None
    if req.reasoning is not None:
        summary = req.reasoning.summary or req.reasoning.generate_summary
        if req.reasoning.effort is not None or summary is not None:
            reasoning = {"effort": req.reasoning.effort, "summary": summary}
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "completed_at": None,
        "status": "in_progress",
        "incomplete_details": None,
        "model": req.model,
        "previous_response_id": req.previous_response_id,
        "instructions": req.instructions if isinstance(req.instructions, str) else None,
        "output": [],
        "error": None,
        "tools": tools,
        "tool_choice": tool_choice,
        "truncation": req.truncation or "disabled",
        "parallel_tool_calls": True if req.parallel_tool_calls is None else req.parallel_tool_calls,
        "text": text,
        "top_p": 1.0 if req.top_p is None else req.top_p,
        "presence_penalty": 0.0 if req.presence_penalty is None else req.presence_penalty,
        "frequency_penalty": 0.0 if req.frequency_penalty is None else req.frequency_penalty,
        "top_logprobs": 0 if req.top_logprobs is None else req.top_logprobs,
        "temperature": 1.0 if req.temperature is None else req.temperature,
        "reasoning": reasoning,
        "usage": None,
        "max_output_tokens": req.max_output_tokens,
        "max_tool_calls": req.max_tool_calls,
        "store": True if req.store is None else req.store,
        "background": bool(req.background),
        "service_tier": req.service_tier or "default",
        "metadata": req.metadata or {},
        "safety_identifier": req.safety_identifier,
        "prompt_cache_key": req.prompt_cache_key,
    }
