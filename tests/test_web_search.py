"""Web search run by the gateway for Responses clients, against a real searx on loopback.

The engine is Debian's searx with one offline engine over fixtures/search
(tests/searx.py); the model is the scripted backend's `searcher` (it calls
`web_search` once, then answers citing the first URL it was given); the
client is the openai SDK, or raw HTTP where events are checked one by one.
"""

from __future__ import annotations

import functools
import pathlib
import shutil
import subprocess
from typing import Any

import openai
import pytest
import trio

import gateway
from conftest import make_settings, parse_sse
from gateway.builtins.search import SearchError, domain_allowed, parse_searxng, results_text, SearchResult
from scripted_backend import SEARCH_QUERY
from searx import CORPUS, SEARX, start_searx

needs_searx = pytest.mark.skipif(SEARX is None, reason="searx is not installed (.ci/run installs Debian's searx)")
SEARCH = [{"type": "web_search"}]


@pytest.fixture
async def searx_url(nursery, tmp_path):
    return await start_searx(nursery, tmp_path)


@pytest.fixture
async def searching(searx_url, start_gateway):
    return await start_gateway(web_search_url=searx_url)


def sdk(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)


def tool_result(backend: Any) -> str:
    return str([m for m in backend.chat_requests[-1]["messages"] if m["role"] == "tool"][-1]["content"])


# --- pure ---------------------------------------------------------------------------------------


def test_searxngs_answer_is_read_and_no_engine_answering_is_an_error_never_an_empty_list():
    body = b'{"results": [{"title": "T", "url": "https://a.example/x", "content": " s "}, {"url": "ftp://b"}], "unresponsive_engines": []}'
    assert parse_searxng(body) == [SearchResult("T", "https://a.example/x", "s")]
    with pytest.raises(SearchError) as failed:
        parse_searxng(b'{"results": [], "unresponsive_engines": [["corpus", "timeout"]]}')
    assert failed.value.kind == "no_engine" and "corpus" in failed.value.message
    with pytest.raises(SearchError) as bad:
        parse_searxng(b"<html>not json</html>")
    assert bad.value.kind == "bad_answer"


def test_domain_filters_cover_subdomains_and_blocked_wins():
    assert domain_allowed("https://docs.python.org/3/", ("python.org",), ())
    assert not domain_allowed("https://notpython.org/", ("python.org",), ())
    assert not domain_allowed("https://a.b.example.com/", (), ("example.com",))
    assert not domain_allowed("https://x.org/", ("x.org",), ("x.org",))


def test_the_model_reads_numbered_results_with_their_urls_and_trimmed_snippets():
    text = results_text("q", [SearchResult("One", "https://one.example/", "a" * 50)], 20)
    assert text.splitlines() == ["Results for 'q':", "", "[1] One", "https://one.example/", "a" * 19 + "…"]


# --- over real sockets, against searx ------------------------------------------------------------


@needs_searx
async def test_a_search_the_model_asks_for_is_run_by_the_gateway_and_shown_as_a_web_search_call(searching, backend):
    with trio.fail_after(30):
        answer = await sdk(searching).responses.create(
            model="searcher", input="What is structured concurrency?", tools=SEARCH, include=["web_search_call.action.sources"]  # type: ignore[list-item]
        )
    assert [item.type for item in answer.output] == ["web_search_call", "message"]
    call = answer.output[0]
    assert call.status == "completed" and call.action.type == "search"  # type: ignore[union-attr]
    assert call.action.query == SEARCH_QUERY and call.action.queries == [SEARCH_QUERY]  # type: ignore[union-attr]
    urls = [source.url for source in call.action.sources]  # type: ignore[union-attr]
    matching = [page["url"] for page in CORPUS if "structured concurrency" in (page["title"] + page["content"]).lower()]
    assert urls == matching[:5]  # the engine's order, `medium` context: five
    assert answer.output_text == f"See {urls[0]} for more."
    # The model got the results as a tool result; the client's web_search tool never reached it as is.
    assert f"[1] {CORPUS[0]['title']}\n{urls[0]}" in tool_result(backend)
    offered = backend.chat_requests[0]["tools"]
    assert [t["function"]["name"] for t in offered] == ["web_search", "open_page", "find_in_page"]
    assert offered[0]["function"]["parameters"]["required"] == ["query"]


@needs_searx
async def test_a_streamed_search_has_its_events_between_the_items_added_and_done(searching, client):
    r = await client.post(
        searching + "/v1/responses",
        json={"model": "searcher", "input": "hi", "tools": SEARCH, "stream": True},
    )
    events = [e for e in parse_sse(r.content) if isinstance(e, dict)]
    mine = [e for e in events if e.get("output_index") == 0 and e["type"] != "response.created"]
    assert [e["type"] for e in mine] == [
        "response.output_item.added",
        "response.web_search_call.in_progress",
        "response.web_search_call.searching",
        "response.web_search_call.completed",
        "response.output_item.done",
    ]
    assert mine[0]["item"] == {"id": mine[0]["item"]["id"], "type": "web_search_call", "status": "in_progress", "action": {"type": "search"}}
    done = mine[-1]["item"]
    assert done["status"] == "completed" and done["action"] == {"type": "search", "query": SEARCH_QUERY, "queries": [SEARCH_QUERY]}
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[-1]["type"] == "response.completed"


@needs_searx
async def test_domain_filters_and_the_context_size_shape_what_the_model_sees(searching, backend):
    tools = [{"type": "web_search", "filters": {"allowed_domains": ["trio.readthedocs.io"]}, "search_context_size": "low"}]
    with trio.fail_after(30):
        answer = await sdk(searching).responses.create(model="searcher", input="q", tools=tools, include=["web_search_call.action.sources"])  # type: ignore[arg-type, list-item]
    urls = [s.url for s in answer.output[0].action.sources]  # type: ignore[union-attr]
    assert urls and all(u.startswith("https://trio.readthedocs.io/") for u in urls)
    assert "vorpus.org" not in tool_result(backend)


@needs_searx
async def test_an_engine_that_is_down_is_a_tool_error_the_model_reads_and_the_response_completes(start_gateway, backend):
    url = await start_gateway(web_search_url="http://127.0.0.1:9")
    with trio.fail_after(30):
        answer = await sdk(url).responses.create(model="searcher", input="q", tools=SEARCH)  # type: ignore[list-item]
    assert answer.status == "completed" and answer.output[0].status == "failed"  # type: ignore[union-attr]
    assert tool_result(backend).startswith("Error: the web search failed: the search engine could not be reached")


async def test_without_an_engine_a_web_search_tool_is_left_out_as_before(gateway_url, backend):
    with trio.fail_after(30):
        answer = await sdk(gateway_url).responses.create(model="text", input="q", tools=SEARCH)  # type: ignore[list-item]
    assert answer.output_text == "Hello, world!" and "tools" not in backend.chat_requests[-1]


@pytest.mark.parametrize(
    "tool, param",
    [
        ({"type": "web_search", "search_context_size": "huge"}, "tools[0].search_context_size"),
        ({"type": "web_search", "filters": {"allowed_domains": "example.com"}}, "tools[0].filters.allowed_domains"),
        ({"type": "web_search", "external_web_access": "no"}, "tools[0].external_web_access"),
    ],
)
async def test_a_web_search_tool_of_the_wrong_shape_is_a_400_naming_the_field(gateway_url, client, backend, tool, param):
    before = len(backend.chat_requests)
    r = await client.post(gateway_url + "/v1/responses", json={"model": "text", "input": "q", "tools": [tool]})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert len(backend.chat_requests) == before


def test_an_engine_url_that_is_not_http_stops_start_up():
    from gateway.config import ConfigError, load_settings

    with pytest.raises(ConfigError) as refused:
        load_settings(web_search_url="searx.local:8888")
    assert "WEB_SEARCH_URL" in str(refused.value) or "web_search_url" in str(refused.value)


async def test_a_web_search_call_replayed_in_input_reaches_the_backend_as_the_search_it_was(gateway_url, client, backend):
    replayed = [
        {"role": "user", "content": "find trio"},
        {"type": "web_search_call", "status": "completed", "action": {"type": "search", "query": "trio docs", "sources": [{"type": "url", "url": "https://trio.readthedocs.io/"}]}},
        {"role": "assistant", "content": "Found it."},
        {"role": "user", "content": "thanks"},
    ]
    r = await client.post(gateway_url + "/v1/responses", json={"model": "text", "input": replayed})
    assert r.status_code == 200, r.text
    messages = backend.chat_requests[-1]["messages"]
    call = messages[1]["tool_calls"][0]
    assert call["function"]["name"] == "web_search" and call["function"]["arguments"] == '{"query":"trio docs"}'
    assert messages[2] == {"role": "tool", "tool_call_id": call["id"], "content": "Searched the web for 'trio docs'. Sources: https://trio.readthedocs.io/"}


@needs_searx
async def test_a_continuation_after_a_search_shows_the_model_the_search(searching, backend):
    client = sdk(searching)
    with trio.fail_after(30):
        first = await client.responses.create(model="searcher", input="q", tools=SEARCH)  # type: ignore[list-item]
        await client.responses.create(model="text", input="and then?", previous_response_id=first.id)
    messages = backend.chat_requests[-1]["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant", "user"]
    assert messages[1]["tool_calls"][0]["function"]["name"] == "web_search"


@needs_searx
async def test_without_live_access_a_search_is_answered_from_the_gateways_cache_or_not_at_all(searching, start_gateway, backend):
    offline = [{"type": "web_search", "external_web_access": False}]
    sources = ["web_search_call.action.sources"]
    with trio.fail_after(30):
        live = await sdk(searching).responses.create(model="searcher", input="q", tools=SEARCH, include=sources)  # type: ignore[list-item]
        cached = await sdk(searching).responses.create(model="searcher", input="q", tools=offline, include=sources)  # type: ignore[arg-type, list-item]
        nothing = await sdk(await start_gateway(web_search_url="http://127.0.0.1:9")).responses.create(
            model="searcher", input="q", tools=offline, include=sources  # type: ignore[arg-type, list-item]
        )
    assert cached.output[0].action.sources == live.output[0].action.sources  # type: ignore[union-attr]
    assert nothing.output[0].status == "completed" and nothing.output[0].action.sources == []  # type: ignore[union-attr]
    assert tool_result(backend).startswith("No cached results for 'structured concurrency'")  # (no engine was asked)


AGENT_SCRIPT = """
import asyncio, json, sys
from openai import AsyncOpenAI
from agents import Agent, OpenAIResponsesModel, Runner, WebSearchTool, set_tracing_disabled

set_tracing_disabled(True)
client = AsyncOpenAI(base_url=sys.argv[1], api_key="sk-test", max_retries=0)
agent = Agent(name="researcher", instructions="Search, then answer.", tools=[WebSearchTool(search_context_size="low")],
              model=OpenAIResponsesModel(model="searcher", openai_client=client))


async def main():
    result = await Runner.run(agent, "What is structured concurrency?")
    calls = [item.raw_item.model_dump() for item in result.new_items if getattr(item.raw_item, "type", None) == "web_search_call"]
    print(json.dumps({"output": result.final_output, "calls": calls}))


asyncio.run(main())
"""


@needs_searx
async def test_the_agents_sdks_web_search_tool_runs_its_search_through_the_gateway(searching, backend, tmp_path):
    import os
    import sys

    import orjson

    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI")}
    with trio.fail_after(60):
        done = await trio.run_process(
            [sys.executable, "-c", AGENT_SCRIPT, searching + "/v1"], env=env, cwd=tmp_path, capture_stdout=True, capture_stderr=True, check=False
        )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    result = orjson.loads(done.stdout.decode().strip().splitlines()[-1])
    [call] = result["calls"]
    assert call["status"] == "completed" and call["action"]["query"] == SEARCH_QUERY
    assert result["output"].startswith("See https://") and result["output"].split()[1] in tool_result(backend)
    assert backend.chat_requests[0]["tools"][0]["function"]["name"] == "web_search"


def test_a_url_citation_slices_exactly_the_link_the_text_writes_to_a_source():
    from gateway.streams.translator import url_citations

    sources = {"https://a.example/x": "A", "https://b.example/": "B"}
    text = "See https://a.example/x. Also https://b.example/ and https://a.example/xyz (not a source)."
    cited = url_citations(text, sources)
    assert [(text[c["start_index"] : c["end_index"]], c["title"]) for c in cited] == [("https://a.example/x", "A"), ("https://b.example/", "B")]


@needs_searx
async def test_the_answer_carries_url_citations_for_the_sources_it_links_streamed_and_not(searching, client):
    with trio.fail_after(30):
        answer = await sdk(searching).responses.create(model="searcher", input="q", tools=SEARCH)  # type: ignore[list-item]
    part = answer.output[-1].content[0]  # type: ignore[union-attr]
    [citation] = part.annotations  # type: ignore[union-attr]
    assert citation.type == "url_citation" and part.text[citation.start_index : citation.end_index] == citation.url  # type: ignore[union-attr]
    assert citation.title == CORPUS[0]["title"]  # type: ignore[union-attr]
    r = await client.post(searching + "/v1/responses", json={"model": "searcher", "input": "q", "tools": SEARCH, "stream": True})
    events = [e for e in parse_sse(r.content) if isinstance(e, dict)]
    added = [e for e in events if e["type"] == "response.output_text.annotation.added"]
    assert len(added) == 1 and added[0]["annotation"]["url"] == citation.url and added[0]["annotation_index"] == 0
    kinds = [e["type"] for e in events]
    assert kinds.index("response.output_text.annotation.added") < kinds.index("response.output_text.done")
    assert events[-1]["response"]["output"][-1]["content"][0]["annotations"] == [added[0]["annotation"]]


# --- the Messages front: Anthropic's web search server tool ---------------------------------------


def claude(url: str) -> Any:
    import anthropic

    return anthropic.AsyncAnthropic(base_url=url, api_key="sk-test", max_retries=0)


ANTHROPIC_SEARCH = [{"type": "web_search_20250305", "name": "web_search", "max_uses": 8}]


@needs_searx
@pytest.mark.parametrize("streamed", [False, True])
async def test_a_messages_search_is_a_server_tool_use_and_its_result_block_before_the_answer(searching, backend, streamed):
    ask: dict[str, Any] = dict(model="searcher", max_tokens=64, tools=ANTHROPIC_SEARCH, messages=[{"role": "user", "content": "Perform a web search for the query: structured concurrency"}])
    with trio.fail_after(30):
        if streamed:
            async with claude(searching).messages.stream(**ask) as stream:
                message = await stream.get_final_message()
        else:
            message = await claude(searching).messages.create(**ask)
    assert [block.type for block in message.content] == ["server_tool_use", "web_search_tool_result", "text"]
    use, result, text = message.content
    assert use.name == "web_search" and use.input == {"query": SEARCH_QUERY} and use.id.startswith("srvtoolu_")  # type: ignore[union-attr]
    assert result.tool_use_id == use.id  # type: ignore[union-attr]
    urls = [r.url for r in result.content]  # type: ignore[union-attr]
    assert urls[0] == CORPUS[0]["url"] and all(r.encrypted_content for r in result.content)  # type: ignore[union-attr]
    assert text.text == f"See {urls[0]} for more."  # type: ignore[union-attr]
    [citation] = text.citations  # type: ignore[union-attr]  # (the text writes the first result's URL)
    assert citation.type == "web_search_result_location" and citation.url == urls[0] and citation.title == CORPUS[0]["title"]
    assert citation.cited_text == CORPUS[0]["content"][:150] and citation.encrypted_index
    assert message.stop_reason == "end_turn" and message.usage.server_tool_use.web_search_requests == 1  # type: ignore[union-attr]
    assert backend.chat_requests[0]["tools"][0]["function"]["name"] == "web_search"


@needs_searx
async def test_a_messages_searchs_blocked_domains_are_left_out_and_both_lists_are_a_400(searching, backend, client):
    tools = [{**ANTHROPIC_SEARCH[0], "blocked_domains": ["trio.readthedocs.io"]}]
    with trio.fail_after(30):
        message = await claude(searching).messages.create(model="searcher", max_tokens=64, tools=tools, messages=[{"role": "user", "content": "q"}])  # type: ignore[arg-type]
    urls = [r.url for r in message.content[1].content]  # type: ignore[union-attr]
    assert urls and not any("trio.readthedocs.io" in u for u in urls)
    both = [{**ANTHROPIC_SEARCH[0], "allowed_domains": ["a.example"], "blocked_domains": ["b.example"]}]
    r = await client.post(searching + "/v1/messages", json={"model": "searcher", "max_tokens": 64, "tools": both, "messages": [{"role": "user", "content": "q"}]}, headers={"anthropic-version": "2023-06-01"})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("tools.0.blocked_domains:")


@needs_searx
async def test_an_engine_that_is_down_is_anthropics_unavailable_error_block_and_the_message_completes(start_gateway):
    url = await start_gateway(web_search_url="http://127.0.0.1:9")
    with trio.fail_after(30):
        message = await claude(url).messages.create(model="searcher", max_tokens=64, tools=ANTHROPIC_SEARCH, messages=[{"role": "user", "content": "q"}])  # type: ignore[arg-type]
    result = message.content[1]
    assert result.type == "web_search_tool_result" and result.content.error_code == "unavailable"  # type: ignore[union-attr]
    assert message.stop_reason == "end_turn"


@needs_searx
async def test_a_key_made_without_web_search_gets_its_tools_left_out_on_both_fronts(nursery, backend, searx_url, client):
    from gateway.keys.stores import MemoryKeys
    from test_keys import ALICE, BOB, key

    keys = MemoryKeys(clock=lambda: 1_700_000_000.0)
    await keys.put(key("alice", ALICE))
    await keys.put(key("bob", BOB, web_search=False))
    settings = make_settings(backend.url, web_search_url=searx_url)
    url = await nursery.start(functools.partial(gateway.serve, settings, app=gateway.create_app(settings, keys=keys)))
    body = {"model": "searcher", "input": "q", "tools": SEARCH}
    searched = await client.post(url + "/v1/responses", json=body, headers={"authorization": f"Bearer {ALICE}"})
    assert [i["type"] for i in searched.json()["output"]] == ["web_search_call", "message"]
    plain = await client.post(url + "/v1/responses", json=body, headers={"authorization": f"Bearer {BOB}"})
    assert plain.status_code == 200 and "web_search_call" not in [i["type"] for i in plain.json()["output"]]
    assert "tools" not in backend.chat_requests[-1]  # (nothing offered: no search was run for bob)
    message = {"model": "searcher", "max_tokens": 32, "tools": ANTHROPIC_SEARCH, "messages": [{"role": "user", "content": "q"}]}
    r = await client.post(url + "/v1/messages", json=message, headers={"x-api-key": BOB, "anthropic-version": "2023-06-01"})
    assert r.status_code == 200 and "tools" not in backend.chat_requests[-1]
    assert not any(b["type"] in ("server_tool_use", "web_search_tool_result") for b in r.json()["content"])


@needs_searx
async def test_ready_names_the_engines_state_without_making_the_gateway_unready(searching, start_gateway, client):
    with trio.fail_after(30):
        while (body := (await client.get(searching + "/ready")).json())["web_search"]["state"] == "unknown":
            await trio.sleep(0.05)  # (the first check runs in the background)
    assert body["web_search"] == {"state": "reachable"} and body["status"] == "ready"
    down = await start_gateway(web_search_url="http://127.0.0.1:9")
    with trio.fail_after(30):
        while (body := (await client.get(down + "/ready")).json())["web_search"]["state"] == "unknown":
            await trio.sleep(0.05)
    assert body["web_search"] == {"state": "unreachable"} and body["status"] == "ready"


@needs_searx
async def test_config_check_tries_the_engine(searx_url, tmp_path, backend):
    import sys

    config = tmp_path / "gateway.toml"
    config.write_text(f'[backends.local]\ntype = "openai"\nbase_url = "{backend.url}"\n[[routes]]\nmodel = "*"\nbackends = ["local"]\n')
    results = {}
    for name, engine in (("up", searx_url), ("down", "http://127.0.0.1:9")):
        with trio.fail_after(60):
            done = await trio.run_process(
                [sys.executable, "-m", "gateway", "config", "check", str(config)],
                env={"PATH": "/usr/bin:/bin", "WEB_SEARCH_URL": engine}, capture_stdout=True, capture_stderr=True, check=False,
            )
        assert done.returncode == 0, done.stderr.decode()
        results[name] = done.stdout.decode()
    assert f"web search: {searx_url} answers" in results["up"]
    assert "web search: http://127.0.0.1:9 does not answer a search (the search engine could not be reached)" in results["down"]


@needs_searx
async def test_searches_are_gateway_tool_calls_in_the_metrics_and_the_log_line_has_no_query(searching, start_gateway, client, caplog):
    import logging

    from test_metrics import samples_of, value

    caplog.set_level(logging.INFO, logger="gateway.tools")
    down = await start_gateway(web_search_url="http://127.0.0.1:9")
    for url in (searching, down):
        with trio.fail_after(30):
            await sdk(url).responses.create(model="searcher", input="q", tools=SEARCH)  # type: ignore[list-item]
    ok = samples_of((await client.get(searching + "/metrics")).text)
    failed = samples_of((await client.get(down + "/metrics")).text)
    assert value(ok, "gateway_mcp_calls_total", server="web_search", tool="web_search", outcome="ok") == 1
    assert value(failed, "gateway_mcp_calls_total", server="web_search", tool="web_search", outcome="error") == 1
    assert value(ok, "gateway_web_tool_calls_total", tool="web_search", outcome="ok") == 1
    assert value(failed, "gateway_web_tool_calls_total", tool="web_search", outcome="unreachable") == 1  # (failures by kind)
    assert value(ok, "gateway_web_tool_duration_seconds_count", tool="web_search") == 1
    lines = [r.getMessage() for r in caplog.records if r.name == "gateway.tools" and "web search" in r.getMessage()]
    assert any(f"a query of {len(SEARCH_QUERY)} characters" in line for line in lines)
    assert not any(SEARCH_QUERY in line for line in lines)


@needs_searx
async def test_a_follow_up_turn_sends_the_sealed_results_back_and_the_model_reads_what_was_found(searching, backend, client):
    first_ask: dict[str, Any] = dict(model="searcher", max_tokens=64, tools=ANTHROPIC_SEARCH, messages=[{"role": "user", "content": "q"}])
    with trio.fail_after(30):
        first = await claude(searching).messages.create(**first_ask)
        history = [*first_ask["messages"], {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]}, {"role": "user", "content": "thanks"}]
        await claude(searching).messages.create(model="text", max_tokens=32, tools=ANTHROPIC_SEARCH, messages=history)
    messages = backend.chat_requests[-1]["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant", "user"]
    assert messages[1]["tool_calls"][0]["function"]["name"] == "web_search"
    assert messages[2]["content"].startswith(f"[1] {CORPUS[0]['title']}\n{CORPUS[0]['url']}\n")
    # A result that this gateway did not seal is a 400 naming it.
    forged = [dict(b) for b in history[1]["content"]]
    forged[1] = {**forged[1], "content": [{**forged[1]["content"][0], "encrypted_content": "not-ours"}]}
    r = await client.post(
        searching + "/v1/messages",
        json={"model": "text", "max_tokens": 32, "messages": [history[0], {"role": "assistant", "content": forged}, history[2]]},
        headers={"anthropic-version": "2023-06-01"},
    )
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("messages.1.content.1.content.0.encrypted_content:")


@needs_searx
async def test_each_search_counts_as_one_of_the_keys_requests_and_past_the_limit_is_a_tool_error(nursery, backend, searx_url, client):
    from gateway.keys.stores import MemoryKeys
    from test_keys import ALICE, key

    keys = MemoryKeys(clock=lambda: 1_700_000_000.0)
    await keys.put(key("alice", ALICE, rpm=1))  # the request itself is the one; its search is one too many
    settings = make_settings(backend.url, web_search_url=searx_url)
    app = gateway.create_app(settings, keys=keys, clock=lambda: 1_700_000_000.0)
    url = await nursery.start(functools.partial(gateway.serve, settings, app=app))
    r = await client.post(url + "/v1/responses", json={"model": "searcher", "input": "q", "tools": SEARCH}, headers={"authorization": f"Bearer {ALICE}"})
    assert r.status_code == 200 and r.json()["status"] == "completed"
    call = r.json()["output"][0]
    assert call["type"] == "web_search_call" and call["status"] == "failed"
    assert tool_result(backend).startswith("Error: the key's rate limit is reached (Rate limit reached for requests")


AI_SDK = pathlib.Path(__file__).parent.parent / ".venv" / "ai-sdk"


@needs_searx
@pytest.mark.skipif(shutil.which("node") is None or not (AI_SDK / "node_modules" / "@ai-sdk" / "openai").is_dir(),
                    reason="node or the Vercel AI SDK is not installed (.ci/run installs ai and @ai-sdk/openai where npm is)")
async def test_the_vercel_ai_sdks_web_search_tool_gets_the_search_and_its_sources(searching, backend):
    import orjson

    with trio.fail_after(60):
        done = await trio.run_process(
            ["node", str(pathlib.Path(__file__).parent / "js" / "ai_sdk_web_search.mjs"), searching, str(AI_SDK)],
            capture_stdout=True, capture_stderr=True, check=False,
        )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    result = orjson.loads(done.stdout.decode().strip().splitlines()[-1])
    assert result["text"].startswith("See https://") and result["calls"][0]["name"] == "web_search"
    cited = result["text"].split()[1]
    assert {"url": cited, "title": CORPUS[0]["title"]} in result["sources"]  # from the url_citation annotation


CODEX = pathlib.Path(__file__).parent.parent / ".venv" / "codex" / "node_modules" / ".bin" / "codex"


@needs_searx
@pytest.mark.skipif(not CODEX.exists(), reason="Codex CLI is not installed (.ci/run installs @openai/codex where npm is)")
async def test_codex_with_live_web_search_shows_the_search_the_gateway_ran(searching, backend, tmp_path):
    import orjson

    home, work = tmp_path / "home", tmp_path / "work"
    (home / ".codex").mkdir(parents=True)
    work.mkdir()
    (home / ".codex" / "config.toml").write_text(
        f'model = "web-agent"\nmodel_provider = "gateway"\nweb_search = "live"\n'
        f'[model_providers.gateway]\nname = "gateway"\nbase_url = "{searching}/v1"\nwire_api = "responses"\nenv_key = "GATEWAY_KEY"\n'
    )
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "CODEX_HOME": str(home / ".codex"), "GATEWAY_KEY": "sk-test"}
    with trio.fail_after(120):
        done = await trio.run_process(
            [str(CODEX), "exec", "--skip-git-repo-check", "--json", "Search the web for structured concurrency."],
            cwd=work, env=env, capture_stdout=True, capture_stderr=True, stdin=subprocess.DEVNULL, check=False,
        )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    events = [orjson.loads(line) for line in done.stdout.splitlines() if line.startswith(b"{")]
    searched = [e["item"] for e in events if e.get("type") == "item.completed" and e["item"].get("type") == "web_search"]
    assert [item["query"] for item in searched] == [SEARCH_QUERY]
    said = [e["item"]["text"] for e in events if e.get("type") == "item.completed" and e["item"].get("type") == "agent_message"]
    assert said == [f"See {CORPUS[0]['url']} for more."]
    sent = next(r for r in backend.chat_requests if any((t.get("function") or {}).get("name") == "web_search" for t in r.get("tools") or ()))
    assert "web_search" in [(t.get("function") or {}).get("name") for t in sent["tools"]]


@needs_searx
@pytest.mark.parametrize("kind", ["web_search_2025_08_26", "web_search_preview", "web_search_preview_2025_03_11"])
async def test_the_dated_and_preview_tool_types_are_web_search_too(searching, backend, kind):
    with trio.fail_after(30):
        answer = await sdk(searching).responses.create(model="searcher", input="q", tools=[{"type": kind}])  # type: ignore[list-item]
    assert [item.type for item in answer.output] == ["web_search_call", "message"]


@needs_searx
async def test_past_max_uses_a_messages_search_is_a_max_uses_exceeded_error_block(searching, backend):
    tools = [{**ANTHROPIC_SEARCH[0], "max_uses": 1}]
    with trio.fail_after(30):
        message = await claude(searching).messages.create(model="searcher-twice", max_tokens=64, tools=tools, messages=[{"role": "user", "content": "q"}])  # type: ignore[arg-type]
    kinds = [b.type for b in message.content]
    assert kinds == ["server_tool_use", "web_search_tool_result", "server_tool_use", "web_search_tool_result", "text"]
    assert isinstance(message.content[1].content, list)  # type: ignore[union-attr]
    assert message.content[3].content.error_code == "max_uses_exceeded"  # type: ignore[union-attr]
    assert message.usage.server_tool_use.web_search_requests == 2  # type: ignore[union-attr]


@needs_searx
async def test_on_an_anthropic_backend_the_server_tool_passes_through_untouched(nursery, tmp_path, monkeypatch, client, backend, searx_url):
    from anthropic_server import AnthropicServer, serve_anthropic
    from test_routing import start_with_config

    server = AnthropicServer()
    await nursery.start(serve_anthropic, server)
    text = (
        f'[backends.claude]\ntype = "anthropic"\nbase_url = "{server.url}"\napi_key = "sk-ant-0123456789"\n'
        f'[backends.local]\ntype = "openai"\nbase_url = "{backend.url}"\n'
        '[[routes]]\nmodel = "claude-*"\nbackends = ["claude"]\n[[routes]]\nmodel = "searcher"\nbackends = ["local"]\n'
    )
    url = await start_with_config(nursery, tmp_path, text, monkeypatch, web_search_url=searx_url)
    headers = {"anthropic-version": "2023-06-01"}
    body = {"max_tokens": 32, "tools": ANTHROPIC_SEARCH, "messages": [{"role": "user", "content": "q"}]}
    r = await client.post(url + "/v1/messages", json={"model": "claude-text", **body}, headers=headers)
    assert r.status_code == 200, r.text
    assert server.requests[-1]["tools"] == ANTHROPIC_SEARCH  # Anthropic runs its own search
    local = await client.post(url + "/v1/messages", json={"model": "searcher", **body}, headers=headers)
    assert [b["type"] for b in local.json()["content"]][:2] == ["server_tool_use", "web_search_tool_result"]  # a chat route: the gateway's
