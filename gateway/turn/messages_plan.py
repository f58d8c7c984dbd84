"""An Anthropic Messages request as the turn engine's chat request: the mirror of `backends/anthropic.py`.

    chat_request(body)   the Chat Completions request a chat backend gets for a
                         checked `POST /v1/messages` body (`wire.messages`)
    native_body(body)    the body an Anthropic backend gets: the client's own,
                         as it came (`cache_control`, betas' fields, thinking
                         signatures untouched), but for what Anthropic would
                         refuse (a `system` message among the others)
    unmapped(body)       the fields a chat backend does not get, for a DEBUG line

What Chat Completions cannot hold is left out of the chat request without
changing what the model is asked: `cache_control`, tool schemas' `$schema`,
Anthropic's own server tools and their blocks, redacted thinking.  So is
what changes from one request to the next and means nothing to the model:
Claude Code's `x-anthropic-billing-header` system block (its suffix changes
between requests of one session), which at the head of the prompt made every
prefix-caching backend (llama.cpp, vLLM, SGLang, Ollama) compute the whole
prompt again each time.  An Anthropic backend gets it untouched (it bills
with it).  What it
can hold keeps its place: system prompts (also in the middle of the
conversation), tool results right after their calls with `is_error` shown
to the model, images, text and PDF documents.

Pure: no I/O, no clock; knows the two wire shapes and nothing of backends.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import orjson

from ..errors import InvalidRequest

__all__ = ["chat_request", "native_body", "reasoning_effort", "restore_searches", "unmapped"]

# What becomes of each top-level field in the chat request (anything else: `unmapped`).
_MAPPED = frozenset(
    (
        "model", "messages", "max_tokens", "system", "stream", "stop_sequences", "temperature", "top_p", "top_k",
        "tools", "tool_choice", "thinking", "output_config",
    )
)
_CLIENT_TOOL_TYPES = (None, "custom")
_PDF = "application/pdf"


def chat_request(body: Mapping[str, Any]) -> dict[str, Any]:
    """The Chat Completions request (without `stream`) for a checked Messages request."""
    messages: list[dict[str, Any]] = []
    system = _text(body.get("system"))
    if system:
        messages.append({"role": "system", "content": system})
    for message in body["messages"]:
        role, content = message["role"], message["content"]
        if role == "assistant":
            messages.append(_assistant(content))
        elif role == "system":
            messages.append({"role": "system", "content": _text(content)})
        else:
            messages += _user(content)
    chat: dict[str, Any] = {"model": body["model"], "messages": messages}
    if body.get("max_tokens") is not None:
        chat["max_tokens"] = body["max_tokens"]
    if body.get("stop_sequences"):
        chat["stop"] = list(body["stop_sequences"])
    for name in ("temperature", "top_p", "top_k"):
        if body.get(name) is not None:
            chat[name] = body[name]
    tools = [_function(tool) for tool in body.get("tools") or () if tool.get("type") in _CLIENT_TOOL_TYPES]
    choice = body.get("tool_choice")
    if tools:
        chat["tools"] = tools
        if choice is not None:
            chat["tool_choice"] = _tool_choice(choice)
            if choice.get("disable_parallel_tool_use") and choice["type"] != "none":
                chat["parallel_tool_calls"] = False
    effort = reasoning_effort(body)
    if effort is not None:
        chat["reasoning_effort"] = effort
    output = body.get("output_config") or {}
    fmt = output.get("format") if isinstance(output, dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema" and isinstance(fmt.get("schema"), dict):
        chat["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}
    return chat


def reasoning_effort(body: Mapping[str, Any]) -> str | None:
    """The chat backend's reasoning switch for `thinking`: a budget as an effort (the inverse of
    the Anthropic adapter's budgets); `adaptive` as `output_config.effort` says, if it does."""
    thinking = body.get("thinking") or {}
    kind = thinking.get("type")
    if kind == "enabled":
        budget = thinking.get("budget_tokens") or 0
        return "low" if budget < 4096 else "medium" if budget < 16384 else "high"
    if kind == "adaptive":
        output = body.get("output_config")
        effort = output.get("effort") if isinstance(output, dict) else None
        return {"low": "low", "medium": "medium", "high": "high", "max": "high"}.get(str(effort))
    return None


def restore_searches(messages: list[dict[str, Any]], open_result: Any) -> list[dict[str, Any]]:
    """`messages` with the gateway's own earlier web searches made readable for a chat backend
    (pure, but for `open_result`): in an assistant message, a `server_tool_use` (web_search) and
    its `web_search_tool_result` become a `tool_use` and, in a user turn after it, a
    `tool_result` listing what was found (each result's `encrypted_content` opened by
    `open_result(token)`: the result's `url`, `title` and `snippet`, or None when it does not
    open).  Other server blocks are left as they are (a chat backend does not get them).

    Raises:
        InvalidRequest: a result's `encrypted_content` does not open (named by its place).
    """
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        content = message.get("content")
        if message.get("role") != "assistant" or not isinstance(content, list) or not any(
            isinstance(b, dict) and b.get("type") == "web_search_tool_result" for b in content
        ):
            out.append(message)
            continue
        uses = {b.get("id"): b for b in content if isinstance(b, dict) and b.get("type") == "server_tool_use"}
        head: list[Any] = []
        for j, block in enumerate(content):
            if isinstance(block, dict) and block.get("type") == "server_tool_use" and block.get("name") == "web_search":
                head.append({"type": "tool_use", "id": block["id"], "name": "web_search", "input": block.get("input") or {}})
            elif isinstance(block, dict) and block.get("type") == "web_search_tool_result" and block.get("tool_use_id") in uses:
                text = _found_text(block, open_result, f"messages.{i}.content.{j}.content")
                out.append({**message, "content": head})
                out.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": block["tool_use_id"], "content": text}]})
                head = []
            else:
                head.append(block)
        if head:
            out.append({**message, "content": head})
    return out


def _found_text(block: Mapping[str, Any], open_result: Any, where: str) -> str:
    results = block.get("content")
    if not isinstance(results, list):  # an error block
        code = results.get("error_code") if isinstance(results, dict) else None
        return f"Error: the web search failed ({code or 'unavailable'})."
    lines = []
    for k, result in enumerate(results):
        token = result.get("encrypted_content") if isinstance(result, dict) else None
        found = open_result(token) if isinstance(token, str) else None
        if found is None:
            raise InvalidRequest(
                f"{where}.{k}.encrypted_content: this search result was not produced by this gateway (or its key changed).",
                param=f"{where}.{k}.encrypted_content",
                code="invalid_encrypted_content",
            )
        lines.append(f"[{k + 1}] {found.get('title', '')}\n{found.get('url', '')}\n{found.get('snippet', '')}".rstrip())
    return "\n\n".join(lines) or "No results."


def unmapped(body: Mapping[str, Any]) -> list[str]:
    """Top-level fields a chat backend does not get (names only: for a DEBUG line)."""
    return sorted(name for name in body if name not in _MAPPED)


def native_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """The Messages body for an Anthropic backend: the client's, but for `stream` (the adapter's)
    and `system` messages among the others, which Anthropic refuses: their text becomes a
    user turn in their place (joined to a user turn beside it)."""
    if all(message["role"] != "system" for message in body["messages"]):
        return {k: v for k, v in body.items() if k != "stream"}
    messages: list[dict[str, Any]] = []
    for message in body["messages"]:
        if message["role"] == "system":
            message = {"role": "user", "content": [{"type": "text", "text": _text(message["content"])}]}
        if messages and messages[-1]["role"] == message["role"] == "user":
            messages[-1] = {**messages[-1], "content": _blocks(messages[-1]["content"]) + _blocks(message["content"])}
        else:
            messages.append(message)
    return {**{k: v for k, v in body.items() if k != "stream"}, "messages": messages}


# --- messages ---------------------------------------------------------------------------


def _assistant(content: Any) -> dict[str, Any]:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    texts: list[str] = []
    thinking: list[str] = []
    signature: str | None = None
    calls: list[dict[str, Any]] = []
    for block in content:
        kind = block["type"]
        if kind == "text":
            texts.append(block["text"])
        elif kind == "thinking":
            thinking.append(block["thinking"])
            signature = block.get("signature") or signature
        elif kind == "tool_use":
            arguments = orjson.dumps(block["input"]).decode()
            calls.append({"id": block["id"], "type": "function", "function": {"name": block["name"], "arguments": arguments}})
        # redacted thinking and server tools' blocks: nothing a chat backend could read
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts or not calls else None}
    if thinking:
        message["reasoning_content"] = "\n".join(thinking)
        if signature:
            message["reasoning_signature"] = signature
    if calls:
        message["tool_calls"] = calls
    return message


def _user(content: Any) -> list[dict[str, Any]]:
    """A user turn: its tool results first, as `tool` messages (they must follow the calls), then
    the rest as one user message (with the images tool results carried, which a `tool`
    message cannot)."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    results: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for block in content:
        if block["type"] == "tool_result":
            text, media = _tool_result(block)
            results.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": text})
            parts += media
        else:
            parts += _parts(block)
    if parts:
        if all(part["type"] == "text" for part in parts):
            results.append({"role": "user", "content": "\n".join(part["text"] for part in parts)})
        else:
            results.append({"role": "user", "content": parts})
    return results


def _tool_result(block: Mapping[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """A tool result's text for the `tool` message (an error says so), and its images."""
    content = block.get("content")
    texts: list[str] = []
    media: list[dict[str, Any]] = []
    if isinstance(content, str):
        texts.append(content)
    else:
        for part in content or ():
            for mapped in _parts(part):
                if mapped["type"] == "text":
                    texts.append(mapped["text"])
                else:
                    media.append(mapped)
    text = "\n".join(texts)
    if block.get("is_error"):
        text = f"Error: {text}" if text else "Error"
    return text, media


def _parts(block: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A content block as chat content parts (none for what a chat backend cannot read)."""
    kind = block.get("type")
    if kind == "text":
        return [{"type": "text", "text": block["text"]}]
    if kind == "image":
        source = block["source"]
        if source["type"] == "base64":
            return [{"type": "image_url", "image_url": {"url": f"data:{source['media_type']};base64,{source['data']}"}}]
        if source["type"] == "url":
            return [{"type": "image_url", "image_url": {"url": source["url"]}}]
        return [_unreadable("image", source)]
    if kind == "document":
        return _document(block)
    if kind == "search_result":
        texts = [part.get("text", "") for part in block.get("content") or () if isinstance(part, dict)]
        title = block.get("title") or block.get("source") or "search result"
        return [{"type": "text", "text": f"{title}\n" + "\n".join(texts)}]
    return []  # thinking in a user turn, server tools' blocks, uploads: nothing to read


def _document(block: Mapping[str, Any]) -> list[dict[str, Any]]:
    source = block["source"]
    title = block.get("title")
    head = f"{title}\n" if title else ""
    if source["type"] == "text":
        return [{"type": "text", "text": head + source["data"]}]
    if source["type"] == "content":
        inner = source["content"]
        if isinstance(inner, str):
            return [{"type": "text", "text": head + inner}]
        parts = [part for item in inner for part in _parts(item)]
        return ([{"type": "text", "text": title}] if title else []) + parts
    if source["type"] == "base64" and source.get("media_type") == _PDF:
        file = {"file_data": f"data:{_PDF};base64,{source['data']}", "filename": title or "document.pdf"}
        return [{"type": "file", "file": file}]
    return [_unreadable("document", source, title)]


def _unreadable(kind: str, source: Mapping[str, Any], title: str | None = None) -> dict[str, Any]:
    """A file the chat backend cannot be given (by id or URL): the model is told it is there."""
    where = source.get("url") or source.get("file_id") or title or ""
    return {"type": "text", "text": f"[{kind} not available to this model: {where}]"}


def _blocks(content: Any) -> list[dict[str, Any]]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)


def _text(content: Any) -> str:
    """A system prompt's text: a string, or its text blocks joined by a blank line (less what
    only varies per request: `_volatile`)."""
    if isinstance(content, str):
        return _BILLING_LINE.sub("", content, count=1) if content.startswith(_BILLING) else content
    if isinstance(content, list):
        return "\n\n".join(
            block["text"]
            for block in content
            if isinstance(block, dict) and block.get("type") == "text" and not _volatile(block["text"])
        )
    return ""


# Claude Code's first system block: `x-anthropic-billing-header: cc_version=2.1.332.a18;
# cc_entrypoint=sdk-cli;`, its suffix different from request to request.
_BILLING = "x-anthropic-billing-header:"
_BILLING_LINE = re.compile(r"x-anthropic-billing-header:[^\n]*\n*")


def _volatile(text: Any) -> bool:
    """Text that differs per request and says nothing to the model (a client's billing header)."""
    return isinstance(text, str) and text.startswith(_BILLING) and "\n" not in text.strip()


# --- tools ------------------------------------------------------------------------------


def _function(tool: Mapping[str, Any]) -> dict[str, Any]:
    schema = dict(tool.get("input_schema") or {})
    schema.pop("$schema", None)  # JSON Schema's dialect tag: some chat backends refuse it
    schema.setdefault("type", "object")
    if schema["type"] == "object":
        schema.setdefault("properties", {})
    function: dict[str, Any] = {"name": tool["name"], "parameters": schema}
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _tool_choice(choice: Mapping[str, Any]) -> Any:
    kind = choice["type"]
    if kind == "any":
        return "required"
    if kind == "tool":
        return {"type": "function", "function": {"name": choice["name"]}}
    return kind  # auto, none
