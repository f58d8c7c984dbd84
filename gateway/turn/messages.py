"""An Anthropic message: `/v1/messages` as a chat-shaped turn over the same engine.

    prepare_messages   before anything is sent: the Messages request mapped to
                       the engine's chat request (`messages_plan`), admitted as
                       a chat completion is (`chat.admit_chat`: the one tool
                       offering rule, the key's model and limits, tokens
                       reserved), with the client's own request beside it for a
                       backend that speaks Messages (`NativeRequest`: it goes
                       only while the gateway adds no tools of its own)
    count_message_tokens   `POST /v1/messages/count_tokens`: the same request,
                       counted by the backend its model routes to

The turn is a `ChatTurn` whose session is a `MessagesSession`: its events
are Anthropic's, its failures one `error` event; slots, token counts, drain
and the outcome (`transport=messages`) are the chat turn's.  Nothing here
knows HTTP or bytes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from ..backends import NativeRequest
from ..builtins.search import FUNCTION as WEB_SEARCH_FUNCTION
from ..builtins.search import (
    Found,
    SearchOptions,
    is_messages_web_search,
    messages_search_options,
)
from ..errors import InvalidRequest
from ..keys import Caller
from ..streams.messages import MessagesSession
from .chat import ChatTurn, admit_chat
from .context import RequestContext
from .context_edits import apply_edits
from .engine import Resources, counted, timed_web
from .messages_plan import chat_request, native_body, restore_searches, unmapped
from .threads import THREADS_BETA, open_thread
from .tools import RequestTools, ToolOutcome

__all__ = ["count_message_tokens", "prepare_messages"]

log = logging.getLogger("gateway.turn")


def _native(body: dict[str, Any], headers: Mapping[str, str]) -> NativeRequest:
    # The gateway holds the thread: the backend gets the whole conversation, without the threads beta.
    betas = ",".join(b for b in (headers.get("anthropic-beta") or "").split(",") if b.strip() and b.strip() != THREADS_BETA)
    return NativeRequest("anthropic-messages", native_body(body), {"anthropic-beta": betas} if betas else {})


def _mapped(body: dict[str, Any], headers: Mapping[str, str]) -> dict[str, Any]:
    chat = chat_request(body)
    if log.isEnabledFor(logging.DEBUG):
        left = unmapped(body)
        if left or headers.get("anthropic-beta"):
            log.debug(
                "messages request: %s not given to chat backends; betas: %s",
                ", ".join(left) or "nothing",
                headers.get("anthropic-beta") or "none",
            )
    return chat


async def prepare_messages(
    resources: Resources, body: dict[str, Any], ctx: RequestContext, headers: Mapping[str, str]
) -> ChatTurn:
    """A checked Messages request (`wire.messages`) as a turn ready to run.

    A `thread` is opened first (`threads.open_thread`): a continue's conversation put back, its
    answer claimed, and let go again should the turn not be admitted.

    Raises:
        ThreadRefused: the thread cannot be used.
        InvalidRequest: a continue's `tool_result` answers no `tool_use` of the conversation.
        NotFound: the key may not use the model.
        RateLimited: a limit of the key is reached.
        StoreUnavailable: the key store or the conversation store failed.
    """
    message_id = resources.ids("msg")
    threading = await open_thread(
        resources.store,
        body,
        owner=ctx.caller.owner,
        answer_id=message_id,
        clock=resources.clock,
        enabled=resources.settings.message_threads,
    )
    try:
        search = _web_search(resources, body) if ctx.caller.limits.web_search else None
        fetching = _web_fetch(resources, body) if ctx.caller.limits.web_search else None
        edited, applied = await _edited(resources, body)
        edited = _searches_restored(resources, edited, ctx.caller.owner)
        chat = _mapped(edited, headers)
        admitted = await admit_chat(resources, chat, ctx, "msg", ctx.gateway_tools(), turn_id=message_id)
        if search is not None:
            _offer_search(resources, admitted.tools, chat, search, ctx.caller, body.get("tool_choice"))
        if fetching is not None:
            _offer_fetch(resources, admitted.tools, chat, fetching, body.get("tool_choice"))
    except BaseException:
        if threading is not None:
            await threading.release()
        raise
    admitted.outcome.transport = "messages"
    native = None if admitted.tools.routes else _native(body, headers)
    session = MessagesSession(
        chat,
        set(admitted.tools.routes),
        max_rounds=resources.settings.max_tool_call_iterations,
        message_id=admitted.outcome.response_id,
        model=str(body["model"]),
        ids=resources.ids,
        native=native,
        collect=threading is not None,
        server_tools=set(admitted.tools.builtins),
    )
    session.events.applied_edits = applied
    turn = ChatTurn(resources, session, admitted, relayed=False, streamed=bool(body.get("stream")))
    turn.threading = threading
    return turn


def _web_search(resources: Resources, body: dict[str, Any]) -> SearchOptions | None:
    """What the request's web search server tool asks, when the gateway is to run it: it has an
    engine, and the model's backend does not run Anthropic's own (an Anthropic backend).

    Raises:
        InvalidRequest: the tool is of a shape Anthropic would refuse (`messages_search_options`).
    """
    for index, tool in enumerate(body.get("tools") or ()):
        if isinstance(tool, dict) and is_messages_web_search(tool):
            options = messages_search_options(tool, index)
            speaks = getattr(resources.backend, "speaks_messages", None)
            if resources.web_search is None or (speaks is not None and speaks(str(body["model"]))):
                return None
            return options
    return None


def _offer_search(
    resources: Resources, tools: RequestTools, chat: dict[str, Any], options: SearchOptions, caller: Caller, choice: Any
) -> None:
    """The gateway's web search offered to the chat model; its calls shown as Anthropic's
    `server_tool_use` and `web_search_tool_result` blocks (results sealed for the caller); each
    search counts as one of the key's requests."""
    engine = resources.web_search
    assert engine is not None
    used = [0]

    async def search(arguments: dict[str, Any]) -> ToolOutcome:
        used[0] += 1
        if options.max_uses is not None and used[0] > options.max_uses:
            block = _search_error("max_uses_exceeded")
            return ToolOutcome(error=f"the web search may be used at most {options.max_uses} times", detail={"block": block})
        refused = await counted(resources, caller)
        if refused is not None:
            return ToolOutcome(error=refused, detail={"block": _search_error("too_many_requests")})
        text, found = await timed_web(resources, "web_search", engine.run(arguments, options))
        block = {"block": _search_block(resources, found, caller.owner), "cite": _citable(resources, found, caller.owner)}
        if found.error is not None:  # (counted as the tool call's error in the metrics)
            return ToolOutcome(error=text.removeprefix("Error: "), detail=block)
        return ToolOutcome(output=text, detail=block)

    tools.add_builtin(WEB_SEARCH_FUNCTION, "web_search_tool_result", search)
    chat.setdefault("tools", []).append({"type": "function", "function": WEB_SEARCH_FUNCTION})
    if isinstance(choice, dict) and choice.get("type") == "tool" and choice.get("name") == WEB_SEARCH_FUNCTION["name"]:
        chat["tool_choice"] = {"type": "function", "function": {"name": WEB_SEARCH_FUNCTION["name"]}}  # (older Claude Codes force it)
    elif isinstance(choice, dict) and choice.get("type") == "any":
        chat["tool_choice"] = "required"


WEB_FETCH: dict[str, Any] = {
    "name": "web_fetch",
    "description": "Fetch a web page (a URL the user gave or a search found) and read its text.",
    "parameters": {"type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"]},
}
_FETCH_ERRORS = {"url_not_allowed", "url_not_accessible", "unsupported_content_type", "invalid_tool_input", "max_uses_exceeded"}


def _web_fetch(resources: Resources, body: dict[str, Any]) -> SearchOptions | None:
    """What the request's web fetch server tool (`web_fetch_…`) asks, when the gateway is to run
    it (the model's backend does not run Anthropic's own).

    Raises:
        InvalidRequest: both domain lists, or a `max_uses` or `max_content_tokens` that is not a
            positive integer.
    """
    for index, tool in enumerate(body.get("tools") or ()):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if isinstance(kind, str) and kind.startswith("web_fetch_") and tool.get("name", "web_fetch") == "web_fetch":
            options = messages_search_options(tool, index)
            most = tool.get("max_content_tokens")
            if most is not None and (not isinstance(most, int) or isinstance(most, bool) or most < 1):
                raise InvalidRequest(
                    f"tools.{index}.max_content_tokens: must be a positive integer.", param=f"tools.{index}.max_content_tokens", code="invalid_value"
                )
            speaks = getattr(resources.backend, "speaks_messages", None)
            if resources.pages is None or (speaks is not None and speaks(str(body["model"]))):
                return None
            chars = most * 4 if most is not None else 40_000  # (about four characters a token)
            return SearchOptions(options.allowed_domains, options.blocked_domains, "medium", None, True, options.max_uses, chars)
    return None


def _offer_fetch(resources: Resources, tools: RequestTools, chat: dict[str, Any], options: SearchOptions, choice: Any) -> None:
    """The gateway's page fetcher offered as `web_fetch`; its calls shown as `server_tool_use` and
    `web_fetch_tool_result` blocks."""
    pages = resources.pages
    assert pages is not None
    used = [0]

    async def fetch(arguments: dict[str, Any]) -> ToolOutcome:
        used[0] += 1
        if options.max_uses is not None and used[0] > options.max_uses:
            error = {"type": "web_fetch_tool_result", "content": {"type": "web_fetch_tool_result_error", "error_code": "max_uses_exceeded"}}
            return ToolOutcome(error=f"web_fetch may be used at most {options.max_uses} times", detail={"block": error})
        opening = pages.open(arguments.get("url"), allowed=options.allowed_domains, blocked=options.blocked_domains, chars=options.page_chars)
        text, opened = await timed_web(resources, "web_fetch", opening)
        page = opened.page
        if page is None:
            code = opened.error_kind if opened.error_kind in _FETCH_ERRORS else "url_not_accessible"
            error = {"type": "web_fetch_tool_result", "content": {"type": "web_fetch_tool_result_error", "error_code": code}}
            return ToolOutcome(error=text.removeprefix("Error: "), detail={"block": error})
        shown = page.text if len(page.text) <= options.page_chars else page.text[: options.page_chars]
        document = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": shown}, "title": page.title}
        retrieved = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(resources.clock()))
        block = {"type": "web_fetch_tool_result", "content": {"type": "web_fetch_result", "url": page.url, "retrieved_at": retrieved, "content": document}}
        return ToolOutcome(output=text, detail={"block": block})

    tools.add_builtin(WEB_FETCH, "web_fetch_tool_result", fetch)
    chat.setdefault("tools", []).append({"type": "function", "function": WEB_FETCH})
    if isinstance(choice, dict) and choice.get("type") == "tool" and choice.get("name") == "web_fetch":
        chat["tool_choice"] = {"type": "function", "function": {"name": "web_fetch"}}


def _searches_restored(resources: Resources, body: dict[str, Any], owner: str | None) -> dict[str, Any]:
    """The body a chat backend gets, with the gateway's earlier searches in it readable again
    (`messages_plan.restore_searches`: sealed for `owner`, opened here).

    Raises:
        InvalidRequest: a result's `encrypted_content` does not open.
    """
    if not any(
        isinstance(b, dict) and b.get("type") == "web_search_tool_result"
        for m in body["messages"] if m.get("role") == "assistant" and isinstance(m.get("content"), list)
        for b in m["content"]
    ):
        return body

    def open_result(token: str) -> dict[str, Any] | None:
        found = resources.sealer.open("web_search", token)
        return found if found is not None and found.get("owner") == owner else None

    return {**body, "messages": restore_searches(body["messages"], open_result)}


def _citable(resources: Resources, found: Found, owner: str | None) -> list[dict[str, Any]]:
    """The `web_search_result_location` citations the answer may make of what one search found
    (`cited_text`: the start of the result's snippet; `encrypted_index` sealed for `owner`)."""
    return [
        {
            "type": "web_search_result_location",
            "url": result.url,
            "title": result.title,
            "cited_text": result.snippet[:150],
            "encrypted_index": resources.sealer.seal("web_search_index", {"url": result.url, "owner": owner}),
        }
        for result in found.results
    ]


def _search_error(code: str) -> dict[str, Any]:
    return {"type": "web_search_tool_result", "content": {"type": "web_search_tool_result_error", "error_code": code}}


def _search_block(resources: Resources, found: Found, owner: str | None) -> dict[str, Any]:
    """A `web_search_tool_result` block for what one search found (each result's text sealed as
    its `encrypted_content`, so that only this gateway, for this key, reads it back)."""
    if found.error is not None:
        return _search_error("invalid_tool_input" if found.error_kind == "invalid_tool_input" else "unavailable")
    results = []
    for result in found.results:
        sealed = resources.sealer.seal("web_search", {"url": result.url, "title": result.title, "snippet": result.snippet, "owner": owner})
        entry: dict[str, Any] = {"type": "web_search_result", "url": result.url, "title": result.title, "encrypted_content": sealed}
        entry["page_age"] = result.page_age
        results.append(entry)
    return {"type": "web_search_tool_result", "content": results}


async def _edited(resources: Resources, body: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]] | None]:
    """The body a chat backend gets after `context_management.edits` (`context_edits`), and the
    edits applied (None: none were asked).  A backend that speaks Messages gets the client's
    own body and applies them itself."""
    config = body.get("context_management")
    edits = config.get("edits") if isinstance(config, dict) else None
    if not isinstance(edits, list):
        return body, None

    async def count(messages: list[dict[str, Any]]) -> int:
        chat = chat_request({**body, "messages": messages})
        return await resources.backend.count_tokens(chat, headers=resources.telemetry.trace_headers())

    messages, applied, _ = await apply_edits(edits, body["messages"], count)
    return {**body, "messages": messages}, applied


async def count_message_tokens(
    resources: Resources, body: dict[str, Any], ctx: RequestContext, headers: Mapping[str, str]
) -> dict[str, Any]:
    """`{"input_tokens": N}` for a checked `count_tokens` body: the request a create would send
    (the gateway's tools offered by the same rule), counted by the backend (its tokenizer, or a
    completion's usage), never an estimate.  Nothing is reserved; the key's model list holds.

    Raises:
        NotFound: the key may not use the model, or no route names it.
        BackendStatusError: the backend refused the request (its 4xx is the client's).
        BackendError: the backend could not be reached, or cannot count
            (`token_count_unavailable`, 502).
    """
    await open_thread(
        resources.store, body, owner=ctx.caller.owner, answer_id="", clock=resources.clock,
        enabled=resources.settings.message_threads, claim=False,
    )  # (a continue counted whole)
    chat = _mapped(body, headers)
    admitted = await admit_chat(resources, chat, ctx, "msg", ctx.gateway_tools(), admit=False)
    native = None if admitted.tools.routes else _native(body, headers)
    tokens = await resources.backend.count_tokens(chat, headers=resources.telemetry.trace_headers(), native=native)
    return {"input_tokens": tokens}
