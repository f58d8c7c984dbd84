"""Nothing a client asks for is silently dropped: every field of a create request has one fate.

`REQUEST_FIELDS` (gateway/turn/plan.py) decides, for every field of the Open
Responses `CreateResponseBody` and of OpenAI's `ResponseCreateParams`, and for
every `include` value: forwarded to the backend, done by the gateway, echoed,
or refused with a 400 naming it.  This file checks that the table covers
every field the spec and the SDK know, that the docs' request fields page
(docs/request-fields.md) is the table, and walks the table over real
sockets (the gateway on hypercorn, the scripted backend recording the chat
request it got): each row's field is sent, and its fate must be what happens.
"""

from __future__ import annotations

import functools
import json
import pathlib
import re
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx2
import pytest
import trio
from openai.types.responses.response_create_params import (
    AccessPrograms,
    Image,
    ResponseCreateParamsBase,
    StreamOptions,
)
from openai.types.responses.response_includable import ResponseIncludable
from openai.types.responses.response_text_config_param import ResponseTextConfigParam
from openai.types.shared_params.reasoning import Reasoning

import gateway
from conftest import SequentialIds, make_settings, parse_sse
from gateway.turn.plan import REQUEST_FIELDS, RequestField
from scripted_backend import ScriptedBackend
from spec import check_events, spec_path, validate_response

ROOT = pathlib.Path(__file__).parent.parent
FATES = ("forwarded", "done", "echoed", "refused")
GATEWAY_OWN = {"gateway_tools"}  # the gateway's own fields, beyond the spec and OpenAI's


# --- the table covers every field, and the docs page is the table ------------------------------


def spec_schemas() -> dict[str, Any]:
    return json.loads(spec_path().read_text())["components"]["schemas"]  # type: ignore[no-any-return]


# Objects whose fields may have fates of their own: (spec schema, OpenAI TypedDict).
NESTED: dict[str, tuple[str | None, Any]] = {
    "text": ("TextParam", ResponseTextConfigParam),
    "reasoning": ("ReasoningParam", Reasoning),
    "stream_options": ("StreamOptionsParam", StreamOptions),
    "image": (None, Image),
    "access_programs": (None, AccessPrograms),
}


def known_fields() -> set[str]:
    """Every top-level field the spec's `CreateResponseBody` and OpenAI's SDK name."""
    return set(spec_schemas()["CreateResponseBody"]["properties"]) | set(ResponseCreateParamsBase.__annotations__) | {"stream"}


def test_every_field_of_the_spec_and_of_openais_create_params_has_a_fate():
    schemas = spec_schemas()
    named = {row.name for row in REQUEST_FIELDS}
    missing = []
    for name in sorted(known_fields()):
        if name == "include" or name in named:
            continue
        if name not in NESTED:
            missing.append(name)
            continue
        schema, typed = NESTED[name]
        inner = set(typed.__annotations__) | (set(schemas[schema]["properties"]) if schema else set())
        missing += [f"{name}.{key}" for key in sorted(inner) if f"{name}.{key}" not in named]
    assert missing == []


def test_every_include_value_of_the_spec_and_of_openai_has_a_fate():
    values = set(spec_schemas()["IncludeEnum"]["enum"]) | set(typing.get_args(ResponseIncludable))
    rows = {row.value for row in REQUEST_FIELDS if row.name == "include"}
    assert sorted(values - rows) == []


def test_every_row_names_a_known_field_with_one_of_the_four_fates():
    known = known_fields() | GATEWAY_OWN
    for row in REQUEST_FIELDS:
        assert row.name.split(".")[0] in known, row.label
        assert row.fate in FATES, row.label
        assert "|" not in row.how and row.how.strip() == row.how, row.label
        assert not row.allowed or row.fate == "refused", row.label
    labels = [row.label for row in REQUEST_FIELDS]
    assert len(labels) == len(set(labels))


def test_the_docs_request_fields_page_is_the_table():
    text = (ROOT / "docs" / "request-fields.md").read_text()
    section = re.search(r"^# Request fields\n(.*?)(?=^#{1,2} |\Z)", text, re.S | re.M)
    assert section, "docs/request-fields.md has no '# Request fields' section"
    assert text.index("# Request fields") < text.index("| field | fate | how |")  # the table is in the section
    rows = [line for line in section.group(1).splitlines() if line.startswith("| `")]
    assert rows == [f"| `{row.label}` | {row.fate} | {row.how} |" for row in REQUEST_FIELDS]


# --- walking the table over real sockets ------------------------------------------------------


@dataclass
class Ctx:
    """One probe's world: the gateway, its backend, and the client."""

    client: httpx2.AsyncClient
    url: str
    backend: ScriptedBackend
    nursery: trio.Nursery

    async def post(self, **fields: Any) -> httpx2.Response:
        body = {"model": "text", "input": "hi", **fields}
        with trio.fail_after(20):
            return await self.client.post(self.url + "/v1/responses", json=body)

    async def create(self, **fields: Any) -> dict[str, Any]:
        r = await self.post(**fields)
        assert r.status_code == 200, r.text
        if r.headers["content-type"].startswith("text/event-stream"):
            return check_events(parse_sse(r.content)[:-1])
        answer = r.json()
        validate_response(answer)
        return answer  # type: ignore[no-any-return]

    @property
    def sent(self) -> dict[str, Any]:
        """The chat request the backend got last."""
        return self.backend.chat_requests[-1]  # type: ignore[no-any-return]


Check = Callable[[Ctx, dict[str, Any]], Awaitable[None]]


@dataclass(frozen=True)
class Probe:
    """How to see one row's fate: what to send, and what must follow beyond the fate's own rule."""

    fields: dict[str, Any]
    check: Check | None = None  # given the answer to `fields`
    echo: str | None = None  # the echoed value is at this path of the response (default: the field's)
    accepted: tuple[dict[str, Any], ...] = ()  # refused rows: requests with an allowed value, served


def at(data: Any, path: str) -> Any:
    for part in path.split("."):
        data = data.get(part) if isinstance(data, dict) else None
    return data


LOOKUP = {"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}
WEATHER = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}
TIME = {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {}}}


async def sends_the_input_as_messages(ctx: Ctx, answer: dict[str, Any]) -> None:
    assert ctx.sent["messages"] == [{"role": "user", "content": "hello there"}]


async def sends_instructions_first(ctx: Ctx, answer: dict[str, Any]) -> None:
    assert ctx.sent["messages"][0] == {"role": "system", "content": "Be brief."}
    assert answer["instructions"] == "Be brief."


async def continues_the_stored_chain(ctx: Ctx, first: dict[str, Any]) -> None:
    second = await ctx.create(previous_response_id=first["id"], input="again")
    assert ctx.sent["messages"] == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hello, world!"},
        {"role": "user", "content": "again"},
    ]
    assert second["previous_response_id"] == first["id"]


async def continues_the_conversation(ctx: Ctx, _: dict[str, Any]) -> None:
    made = await ctx.client.post(ctx.url + "/v1/conversations", json={})
    if made.status_code in (404, 405):
        pytest.skip("the Conversations API is not served yet (its engineers are adding it)")
    conversation = made.json()["id"]
    await ctx.create(conversation=conversation, input="first")
    await ctx.create(conversation=conversation, input="second")
    contents = [m["content"] for m in ctx.sent["messages"]]
    assert contents[-3:] == ["first", "Hello, world!", "second"]


async def returns_logprobs(ctx: Ctx, answer: dict[str, Any]) -> None:
    assert ctx.sent["logprobs"] is True
    logprobs = answer["output"][0]["content"][0]["logprobs"]
    assert "".join(entry["token"] for entry in logprobs) == "Hello, world!"


async def seals_reasoning(ctx: Ctx, answer: dict[str, Any]) -> None:
    reasoning = answer["output"][0]
    assert reasoning["type"] == "reasoning" and isinstance(reasoning["encrypted_content"], str)
    assert reasoning["encrypted_content"]


IMAGE = "data:image/png;base64,iVBORw0KGgo="


async def keeps_input_image_urls(ctx: Ctx, answer: dict[str, Any]) -> None:
    items = (await ctx.client.get(f"{ctx.url}/v1/responses/{answer['id']}/input_items")).json()["data"]
    parts = [part for item in items for part in item.get("content") or ()]
    assert [part["image_url"] for part in parts if part["type"] == "input_image"] == [IMAGE]


async def refuses_computer_call_outputs(ctx: Ctx, answer: dict[str, Any]) -> None:
    item = {"type": "computer_call_output", "call_id": "c1", "output": {"type": "computer_screenshot", "image_url": IMAGE}}
    r = await ctx.post(input=[{"role": "user", "content": "hi"}, item], include=["computer_call_output.output.image_url"])
    assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_item_type"


def produces_no(item_type: str) -> Check:
    async def check(ctx: Ctx, answer: dict[str, Any]) -> None:
        assert "tools" not in ctx.sent  # the tool is left out: nothing can produce such an item
        assert item_type not in {item["type"] for item in answer["output"]}
        assert answer["status"] == "completed"

    return check


async def sends_the_functions(ctx: Ctx, answer: dict[str, Any]) -> None:
    assert ctx.sent["tools"] == [{"type": "function", "function": {"name": "lookup", "parameters": LOOKUP["parameters"]}}]
    assert [tool["name"] for tool in answer["tools"]] == ["lookup"]


async def sends_the_tool_choice(ctx: Ctx, answer: dict[str, Any]) -> None:
    assert ctx.sent["tool_choice"] == {"type": "function", "function": {"name": "lookup"}}
    assert answer["tool_choice"] == {"type": "function", "name": "lookup"}


async def sends_parallel_tool_calls(ctx: Ctx, answer: dict[str, Any]) -> None:
    assert ctx.sent["parallel_tool_calls"] is False and answer["parallel_tool_calls"] is False


async def keeps_to_max_tool_calls(ctx: Ctx, answer: dict[str, Any]) -> None:
    calls = [item for item in answer["output"] if item["type"] == "function_call"]
    assert [call["name"] for call in calls] == ["get_weather"]  # the backend made two
    assert answer["max_tool_calls"] == 1
    unbounded = await ctx.create(model="parallel-tools", tools=[WEATHER, TIME])
    assert len([item for item in unbounded["output"] if item["type"] == "function_call"]) == 2


async def sends_the_response_format(ctx: Ctx, answer: dict[str, Any]) -> None:
    assert ctx.sent["response_format"] == {"type": "json_object"}
    assert answer["text"]["format"] == {"type": "json_object"}


async def asks_for_alternatives(ctx: Ctx, answer: dict[str, Any]) -> None:
    assert (ctx.sent["logprobs"], ctx.sent["top_logprobs"]) == (True, 3)
    assert answer["top_logprobs"] == 3
    assert [len(entry["top_logprobs"]) for entry in answer["output"][0]["content"][0]["logprobs"]] == [3, 3, 3, 3]


async def sends_cache_options(ctx: Ctx, answer: dict[str, Any]) -> None:
    assert ctx.sent["prompt_cache_options"] == {"mode": "explicit", "ttl": "30m"}


REASONED_HISTORY = [
    {"role": "user", "content": "q1"},
    {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "thought one"}]},
    {"role": "assistant", "content": "a1"},
    {"role": "user", "content": "q2"},
]


async def keeps_reasoning_of_the_current_turn_only(ctx: Ctx, answer: dict[str, Any]) -> None:
    assert not [m for m in ctx.sent["messages"] if "reasoning_content" in m]
    for context in ("all_turns", "auto"):
        await ctx.create(input=REASONED_HISTORY, reasoning={"context": context})
        assert [m.get("reasoning_content") for m in ctx.sent["messages"] if m["role"] == "assistant"] == ["thought one"]


async def keeps_nothing_when_not_stored(ctx: Ctx, answer: dict[str, Any]) -> None:
    assert answer["store"] is False
    assert (await ctx.client.get(f"{ctx.url}/v1/responses/{answer['id']}")).status_code == 404
    stored = await ctx.create()
    assert (await ctx.client.get(f"{ctx.url}/v1/responses/{stored['id']}")).status_code == 200


async def streams_or_answers_once(ctx: Ctx, _: dict[str, Any]) -> None:
    r = await ctx.post(stream=True)
    assert r.headers["content-type"].startswith("text/event-stream")
    assert check_events(parse_sse(r.content)[:-1])["status"] == "completed"
    assert ctx.sent["stream"] is True
    answer = await ctx.create(stream=False)
    assert answer["object"] == "response" and ctx.sent["stream"] is True


async def runs_in_the_background(ctx: Ctx, answer: dict[str, Any]) -> None:
    assert answer["background"] is True and answer["status"] in ("queued", "in_progress", "completed")
    with trio.fail_after(20):
        followed = await ctx.client.get(f"{ctx.url}/v1/responses/{answer['id']}?stream=true")
    frames = parse_sse(followed.content)
    assert frames[-2]["type"] == "response.completed"
    final = (await ctx.client.get(f"{ctx.url}/v1/responses/{answer['id']}")).json()
    assert final["status"] == "completed" and final["output"][0]["content"][0]["text"] == "Hello, world!"


@dataclass(frozen=True)
class _Tool:
    server: str
    name: str
    description: str | None
    input_schema: dict[str, Any]


@dataclass
class _OneTool:
    """A gateway tool source with one tool, `add`."""

    calls: list[str] = field(default_factory=list)

    def tools(self) -> list[_Tool]:
        return [_Tool("calc", "add", "adds", {"type": "object", "properties": {}})]

    async def call(self, name: str, arguments: dict[str, Any]) -> Any:
        self.calls.append(name)
        return None


async def compacts_past_its_threshold(ctx: Ctx, answer: dict[str, Any]) -> None:
    """Under the threshold nothing happens; past it the compaction item leads the output
    (tests/test_server_compaction.py for the rest)."""
    assert [item["type"] for item in answer["output"]] == ["message"]
    ctx.backend.tokenizer = "vllm"
    try:
        long = [{"role": "user", "content": "lorem ipsum " * 30}, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "hi"}]
        compacted = await ctx.create(input=long, context_management=[{"type": "compaction", "compact_threshold": 20}])
        assert [item["type"] for item in compacted["output"]] == ["compaction", "message"]
        assert ctx.sent["messages"][-1] == {"role": "user", "content": "hi"} and len(ctx.sent["messages"]) == 2
    finally:
        ctx.backend.tokenizer = None


async def fits_the_context_window(ctx: Ctx, _: dict[str, Any]) -> None:
    """`auto` drops the oldest items to fit the window the backend says (tests/test_context_window.py
    for the rest); `disabled` leaves the backend's refusal."""
    ctx.backend.window, ctx.backend.tokenizer = ("vllm", 400), "vllm"
    try:
        long = [{"role": "user" if n % 2 == 0 else "assistant", "content": f"turn {n}: " + "lorem ipsum " * 30} for n in range(9)]
        r = await ctx.post(model="window-probe", input=long, truncation="disabled", max_output_tokens=50)
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
        fitted = await ctx.create(model="window-probe", input=long, truncation="auto", max_output_tokens=50)
        assert fitted["status"] == "completed" and fitted["truncation"] == "auto"
        sent = ctx.sent["messages"]
        assert 1 < len(sent) < len(long) and sent[-1]["content"] == long[-1]["content"]
    finally:
        ctx.backend.window, ctx.backend.tokenizer = None, None


async def pads_its_deltas_with_obfuscation(ctx: Ctx, _: dict[str, Any]) -> None:
    # The streamed deltas carry random padding (every event still the spec's); without the option,
    # and in what is stored and replayed, none.
    padded = parse_sse((await ctx.post(stream=True, stream_options={"include_obfuscation": True})).content)[:-1]
    deltas = [e for e in padded if e["type"].endswith(".delta")]
    assert deltas and all(e["type"] != "response.output_text.delta" or "obfuscation" in e for e in deltas)
    for event in deltas:
        pad = event["obfuscation"]
        assert pad.isalnum() and 1 <= len(pad) <= 32 and (len(event["delta"]) + len(pad)) % 32 == 0
    assert len({e["obfuscation"] for e in deltas}) == len(deltas)  # (random: never twice the same)
    check_events(padded)  # (the spec names `obfuscation` on these events)
    plain = parse_sse((await ctx.post(stream=True)).content)[:-1]
    assert not any("obfuscation" in e for e in plain)
    replayed = parse_sse((await ctx.client.get(f"{ctx.url}/v1/responses/{padded[0]['response']['id']}?stream=true")).content)
    assert not any(isinstance(e, dict) and "obfuscation" in e for e in replayed)


async def offers_no_gateway_tools_when_told(ctx: Ctx, _: dict[str, Any]) -> None:
    settings = make_settings(ctx.backend.url)
    app = gateway.create_app(settings, mcp=_OneTool(), ids=SequentialIds(), clock=lambda: 1_700_000_000.0)
    url = await ctx.nursery.start(functools.partial(gateway.serve, settings, app=app))
    with_tools = Ctx(ctx.client, url, ctx.backend, ctx.nursery)
    await with_tools.create()
    assert [tool["function"]["name"] for tool in with_tools.sent["tools"]] == ["add"]
    for flag in (False, "none"):
        await with_tools.create(gateway_tools=flag)
        assert "tools" not in with_tools.sent


PROBES: dict[str, Probe] = {
    "model": Probe({"model": "text"}),
    "input": Probe({"input": "hello there"}, sends_the_input_as_messages),
    "instructions": Probe({"instructions": "Be brief."}, sends_instructions_first),
    "previous_response_id": Probe({}, continues_the_stored_chain),
    "conversation": Probe({}, continues_the_conversation),
    "include: message.output_text.logprobs": Probe({"model": "logprobs-if-asked", "include": ["message.output_text.logprobs"]}, returns_logprobs),
    "include: reasoning.encrypted_content": Probe({"model": "reasoning", "include": ["reasoning.encrypted_content"]}, seals_reasoning),
    "include: message.input_image.image_url": Probe(
        {"include": ["message.input_image.image_url"], "input": [{"role": "user", "content": [{"type": "input_text", "text": "see"}, {"type": "input_image", "image_url": IMAGE}]}]},
        keeps_input_image_urls,
    ),
    "include: computer_call_output.output.image_url": Probe({"include": ["computer_call_output.output.image_url"]}, refuses_computer_call_outputs),
    "include: file_search_call.results": Probe(
        {"include": ["file_search_call.results"], "tools": [{"type": "file_search", "vector_store_ids": ["vs_1"]}]}, produces_no("file_search_call")
    ),
    "include: web_search_call.results": Probe({"include": ["web_search_call.results"], "tools": [{"type": "web_search"}]}, produces_no("web_search_call")),
    "include: web_search_call.action.sources": Probe(
        {"include": ["web_search_call.action.sources"], "tools": [{"type": "web_search"}]}, produces_no("web_search_call")
    ),
    "include: code_interpreter_call.outputs": Probe(
        {"include": ["code_interpreter_call.outputs"], "tools": [{"type": "code_interpreter", "container": {"type": "auto"}}]},
        produces_no("code_interpreter_call"),
    ),
    "tools": Probe({"tools": [LOOKUP]}, sends_the_functions),
    "tool_choice": Probe({"tools": [LOOKUP, WEATHER], "tool_choice": {"type": "function", "name": "lookup"}}, sends_the_tool_choice),
    "parallel_tool_calls": Probe({"tools": [LOOKUP], "parallel_tool_calls": False}, sends_parallel_tool_calls),
    "max_tool_calls": Probe({"model": "parallel-tools", "tools": [WEATHER, TIME], "max_tool_calls": 1}, keeps_to_max_tool_calls),
    "text.format": Probe({"text": {"format": {"type": "json_object"}}}, sends_the_response_format),
    "text.verbosity": Probe({"text": {"verbosity": "low"}}, echo="text.verbosity"),
    "temperature": Probe({"temperature": 0.25}, echo="temperature"),
    "top_p": Probe({"top_p": 0.5}, echo="top_p"),
    "presence_penalty": Probe({"presence_penalty": 0.5}, echo="presence_penalty"),
    "frequency_penalty": Probe({"frequency_penalty": -0.5}, echo="frequency_penalty"),
    "top_logprobs": Probe({"model": "logprobs-if-asked", "top_logprobs": 3}, asks_for_alternatives),
    "max_output_tokens": Probe({"max_output_tokens": 64}, echo="max_output_tokens"),
    "reasoning.effort": Probe({"reasoning": {"effort": "low"}}, echo="reasoning.effort"),
    "reasoning.summary": Probe({"reasoning": {"summary": "concise"}}),
    "reasoning.generate_summary": Probe({"reasoning": {"generate_summary": "detailed"}}, echo="reasoning.summary"),
    "reasoning.context": Probe({"input": REASONED_HISTORY, "reasoning": {"context": "current_turn"}}, keeps_reasoning_of_the_current_turn_only),
    "reasoning.mode": Probe({"reasoning": {"mode": "pro"}}, accepted=({"reasoning": {"mode": "standard"}},)),
    "user": Probe({"user": "end-user-7"}),
    "safety_identifier": Probe({"safety_identifier": "hashed-user-7"}, echo="safety_identifier"),
    "prompt_cache_key": Probe({"prompt_cache_key": "tenant-3"}, echo="prompt_cache_key"),
    "prompt_cache_retention": Probe({"prompt_cache_retention": "24h"}),
    "prompt_cache_options": Probe({"prompt_cache_options": {"mode": "explicit", "ttl": "30m"}}, sends_cache_options),
    "prompt_cache_options.prewarm": Probe({"prompt_cache_options": {"prewarm": True}}, accepted=({"prompt_cache_options": {"prewarm": False}},)),
    "prompt_cache_options.comparison_response_id": Probe({"prompt_cache_options": {"comparison_response_id": "resp_1"}}),
    "service_tier": Probe({"service_tier": "flex"}, echo="service_tier"),
    "metadata": Probe({"metadata": {"team": "search"}}),
    "store": Probe({"store": False}, keeps_nothing_when_not_stored),
    "stream": Probe({}, streams_or_answers_once),
    "stream_options.include_obfuscation": Probe(
        {"stream": True, "stream_options": {"include_obfuscation": True}}, pads_its_deltas_with_obfuscation
    ),
    "background": Probe({"background": True}, runs_in_the_background),
    "background_options": Probe({"background": True, "background_options": {"completion_window": "8h", "continuation_id": "batch-7"}}, runs_in_the_background),
    "truncation": Probe({"truncation": "auto"}, fits_the_context_window, echo="truncation"),
    "context_management": Probe({"context_management": [{"type": "compaction", "compact_threshold": 1000}]}, compacts_past_its_threshold),
    "prompt": Probe({"prompt": {"id": "pmpt_123", "variables": {"city": "Paris"}}}),
    "moderation": Probe({"moderation": {"model": "omni-moderation-latest"}}),
    "image.context_compression": Probe(
        {"image": {"context_compression": "enabled"}},
        accepted=({"image": {"context_compression": "auto"}}, {"image": {"context_compression": "disabled"}}),
    ),
    "access_programs.cyber": Probe({"access_programs": {"cyber": "daybreak_red"}}, accepted=({"access_programs": {"cyber": "standard"}},)),
    "gateway_tools": Probe({}, offers_no_gateway_tools_when_told),
}


def test_every_row_of_the_table_has_a_probe():
    assert sorted(PROBES) == sorted(row.label for row in REQUEST_FIELDS)


@pytest.mark.parametrize("row", REQUEST_FIELDS, ids=lambda row: row.label)
async def test_each_field_meets_the_fate_the_table_gives_it(row: RequestField, gateway_url, client, backend, nursery):
    probe = PROBES[row.label]
    ctx = Ctx(client, gateway_url, backend, nursery)
    value = at(probe.fields, row.name)

    if row.fate == "refused":
        before = len(backend.chat_requests)
        r = await ctx.post(**probe.fields)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert (error["type"], error["param"]) == ("invalid_request_error", row.name)
        assert error["code"] == ("invalid_value" if row.allowed else "unsupported_parameter")
        assert len(backend.chat_requests) == before  # nothing reached the backend
        for fields in probe.accepted:
            await ctx.create(**fields)
        return

    answer = await ctx.create(**probe.fields)
    if row.fate == "forwarded" and row.chat is not None:
        assert ctx.sent[row.chat] == value
    if row.fate == "echoed":
        assert row.name.split(".")[0] not in ctx.sent  # echoed only: the backend never sees it
        assert at(answer, probe.echo or row.name) == value
    elif probe.echo is not None:
        assert at(answer, probe.echo) == value
    if row.fate in ("done",) or (row.fate == "forwarded" and row.chat is None):
        assert probe.check is not None, f"{row.label}: a {row.fate} field needs a check of its effect"
    if probe.check is not None:
        await probe.check(ctx, answer)
