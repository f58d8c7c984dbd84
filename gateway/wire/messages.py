"""Anthropic Messages requests (`POST /v1/messages`, `/v1/messages/count_tokens`): what a client may send.

Read as leniently as Anthropic's own clients need: every field the API
knows (and any it adds later: `cache_control.scope`, `context_management`,
`output_config`, betas' fields) is accepted, and only a shape the gateway
could not map is refused, with a 400 whose message starts with the field
in Anthropic's dotted form (`messages.1.content.0.type: ...`).  A request
that passes is handed on as the decoded dict: the mapping
(`turn.messages_plan`) reads that, and an Anthropic backend gets it as it
came.  Knows no backend and no transport.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, Union

from pydantic import Discriminator, Field, Tag, TypeAdapter, ValidationError

from ..errors import InvalidRequest
from . import _Open, decode_json_object

__all__ = [
    "BLOCK_TYPES",
    "MessagesRequest",
    "check_tool_results",
    "parse_count_request",
    "parse_messages_request",
]


# --- content blocks ---------------------------------------------------------------------


class _Base64Source(_Open):
    type: Literal["base64"]
    media_type: str
    data: str


class _UrlSource(_Open):
    type: Literal["url"]
    url: str


class _FileSource(_Open):
    type: Literal["file"]
    file_id: str


class _TextSource(_Open):
    type: Literal["text"]
    data: str
    media_type: str | None = None


class TextBlock(_Open):
    type: Literal["text"]
    text: str


class ImageBlock(_Open):
    type: Literal["image"]
    source: Annotated[Union[_Base64Source, _UrlSource, _FileSource], Field(discriminator="type")]


class _ContentSource(_Open):
    type: Literal["content"]
    content: str | list[TextBlock | ImageBlock]


class DocumentBlock(_Open):
    type: Literal["document"]
    source: Annotated[Union[_Base64Source, _UrlSource, _FileSource, _TextSource, _ContentSource], Field(discriminator="type")]
    title: str | None = None
    context: str | None = None


class ToolUseBlock(_Open):
    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: dict[str, Any]


class ThinkingBlock(_Open):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(_Open):
    type: Literal["redacted_thinking"]
    data: str


class ServerBlock(_Open):
    """A block of Anthropic's own server tools, search results or uploads: kept for an Anthropic
    backend, left out for a chat backend (which could not have made or read it)."""

    type: Literal[
        "server_tool_use",
        "web_search_tool_result",
        "web_fetch_tool_result",
        "code_execution_tool_result",
        "bash_code_execution_tool_result",
        "text_editor_code_execution_tool_result",
        "tool_search_tool_result",
        "mcp_tool_use",
        "mcp_tool_result",
        "container_upload",
        "search_result",
        "tool_reference",
    ]


def _tag(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return kind if isinstance(kind, str) and kind in _TAGGED else "server" if kind in _SERVER else str(kind)


_SERVER = frozenset(ServerBlock.model_fields["type"].annotation.__args__)  # type: ignore[union-attr]


class ToolResultBlock(_Open):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: str | list[Annotated[
        Union[
            Annotated[TextBlock, Tag("text")],
            Annotated[ImageBlock, Tag("image")],
            Annotated[DocumentBlock, Tag("document")],
            Annotated[ServerBlock, Tag("server")],
        ],
        Discriminator(_tag),
    ]] | None = None
    is_error: bool | None = None


ContentBlock = Annotated[
    Union[
        Annotated[TextBlock, Tag("text")],
        Annotated[ImageBlock, Tag("image")],
        Annotated[DocumentBlock, Tag("document")],
        Annotated[ToolUseBlock, Tag("tool_use")],
        Annotated[ToolResultBlock, Tag("tool_result")],
        Annotated[ThinkingBlock, Tag("thinking")],
        Annotated[RedactedThinkingBlock, Tag("redacted_thinking")],
        Annotated[ServerBlock, Tag("server")],
    ],
    Discriminator(_tag),
]
_TAGGED = frozenset(("text", "image", "document", "tool_use", "tool_result", "thinking", "redacted_thinking"))
BLOCK_TYPES = _TAGGED | _SERVER  # every content block type a request may carry


# --- the request ------------------------------------------------------------------------


class Message(_Open):
    # Claude Code puts a `system` message among the others for models it does not know.
    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlock]


class Tool(_Open):
    name: str = Field(min_length=1)
    type: str | None = None  # absent or "custom": the client's own tool; else one of Anthropic's
    input_schema: dict[str, Any] | None = None
    description: str | None = None


class _ToolChoiceNamed(_Open):
    type: Literal["tool"]
    name: str = Field(min_length=1)
    disable_parallel_tool_use: bool | None = None


class _ToolChoiceOther(_Open):
    type: Literal["auto", "any", "none"]
    disable_parallel_tool_use: bool | None = None


class Thinking(_Open):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(None, ge=0)


class _ThreadCreate(_Open):
    type: Literal["create"]


class _ThreadContinue(_Open):
    type: Literal["continue"]
    previous_message_id: str = Field(min_length=1)


class MessagesRequest(_Open):
    """A `POST /v1/messages` body (fields not named here are kept and passed on or ignored)."""

    model: str = Field(min_length=1)
    messages: list[Message]
    max_tokens: int = Field(ge=1)
    system: str | list[TextBlock] | None = None
    stream: bool | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, ge=0, le=1)
    top_k: int | None = Field(None, ge=0)
    tools: list[Tool] | None = None
    tool_choice: Annotated[Union[_ToolChoiceNamed, _ToolChoiceOther], Field(discriminator="type")] | None = None
    thinking: Thinking | None = None
    metadata: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None
    # A message thread (`anthropic-beta: message-threads-2026-08-12`): the gateway holds the conversation.
    thread: Annotated[Union[_ThreadCreate, _ThreadContinue], Field(discriminator="type")] | None = None


class CountTokensRequest(MessagesRequest):
    """A `POST /v1/messages/count_tokens` body: a Messages request without the generation's settings."""

    max_tokens: int | None = Field(None, ge=1)  # type: ignore[assignment]


_REQUEST = TypeAdapter(MessagesRequest)
_COUNT = TypeAdapter(CountTokensRequest)


def parse_messages_request(body: bytes) -> dict[str, Any]:
    """A `POST /v1/messages` body, decoded and checked (returned as the decoded dict).

    Raises:
        InvalidRequest: not a JSON object, nested too deeply, a field of the wrong
            shape, an unknown content block type, no messages, or a `tool_result`
            that answers no earlier `tool_use`; the message starts with the field
            (`messages.2.content.0.tool_use_id: ...`), as Anthropic's do.
    """
    return _checked(decode_json_object(body), _REQUEST)


def parse_count_request(body: bytes) -> dict[str, Any]:
    """A `POST /v1/messages/count_tokens` body (`max_tokens` not needed).

    Raises:
        InvalidRequest: as `parse_messages_request`.
    """
    return _checked(decode_json_object(body), _COUNT)


def _checked(data: dict[str, Any], adapter: TypeAdapter[Any]) -> dict[str, Any]:
    try:
        adapter.validate_python(data, strict=True)
    except ValidationError as exc:
        raise _invalid(exc) from None
    messages = data["messages"]
    thread = data.get("thread")
    if thread is not None and thread["type"] == "continue":
        return data  # the thread's history comes first: checked once it is in (`check_tool_results`)
    if not messages:
        raise InvalidRequest("messages: at least one message is required.", param="messages", code="invalid_value")
    check_tool_results(messages)
    return data


def check_tool_results(messages: list[dict[str, Any]], earlier: Sequence[Mapping[str, Any]] = ()) -> None:
    """Every `tool_result` answers a `tool_use` some earlier assistant message made (in `messages`,
    or in the `earlier` ones a thread holds: fields are named by their place in `messages`).

    Raises:
        InvalidRequest: one answers no tool_use.
    """
    called: set[str] = {
        block["id"]
        for message in earlier
        if message.get("role") == "assistant" and isinstance(message.get("content"), list)
        for block in message["content"]
        if isinstance(block, dict) and block.get("type") == "tool_use" and isinstance(block.get("id"), str)
    }
    for i, message in enumerate(messages):
        content = message["content"]
        if isinstance(content, str):
            continue
        for j, block in enumerate(content):
            kind = block["type"]
            if kind == "tool_use" and message["role"] == "assistant":
                called.add(block["id"])
            elif kind == "tool_result" and block["tool_use_id"] not in called:
                param = f"messages.{i}.content.{j}.tool_use_id"
                raise InvalidRequest(
                    f"{param}: the tool_result answers '{block['tool_use_id']}', but no earlier assistant "
                    "message has a tool_use block with that id.",
                    param=param,
                    code="invalid_value",
                )


def _invalid(exc: ValidationError) -> InvalidRequest:
    """One clear 400 from pydantic's errors, named as Anthropic names fields."""
    errors = exc.errors()
    err = max(errors, key=lambda e: len(_parts(e["loc"])))  # the deepest names what is wrong
    parts = _parts(err["loc"])
    kind = err["type"]
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        found = (err.get("ctx") or {}).get("tag")
        block = bool(parts) and isinstance(parts[-1], int)
        parts.append("type")
        if found in (None, "None"):
            what = "Field required"
        else:
            what = f"unknown content block type '{found}'" if block else f"unknown type '{found}'"
    elif kind == "missing":
        what = "Field required"
    else:
        what = err["msg"]
    param = ".".join(str(part) for part in parts) or "body"
    code = "missing_required_parameter" if what == "Field required" else "invalid_value"
    return InvalidRequest(f"{param}: {what}.", param=param, code=code)


_BRANCHES = frozenset(("str", "int", "float", "bool", "none", "dict", "list"))
_DISCRIMINATED = frozenset(("source", "tool_choice"))  # fields whose value is a union tagged by its type


def _parts(loc: tuple[Any, ...]) -> list[Any]:
    """A pydantic location as a path through the body: without union branch names
    (`list[...]`, model names) and without the tags of tagged unions (a block's type after
    its index, a source's or a tool choice's type after the field)."""
    parts: list[Any] = []
    tag_next = False
    last = len(loc) - 1
    for k, part in enumerate(loc):
        if isinstance(part, int):
            parts.append(part)
            tag_next = k < last and loc[k + 1] in BLOCK_TAGS
            continue
        if part in _BRANCHES or "[" in part or part[:1] == "_" or part[:1].isupper():
            continue
        if tag_next and k < last:
            tag_next = False
            continue
        parts.append(part)
        tag_next = part in _DISCRIMINATED
    return parts


BLOCK_TAGS = _TAGGED | {"server"}
