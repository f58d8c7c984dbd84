"""Pages a model opens through the gateway (`open_page`, `find_in_page`, Anthropic's `web_fetch`).

A small site on loopback (tests/pages_server.py) that the gateway may reach
only because the tests allow-list 127.0.0.1 (`WEB_FETCH_ALLOWED_HOSTS`); the
address guard's refusals are checked without it.  The model is the scripted
backend's `opener` / `finder` (it opens the URL the user gave).
"""

from __future__ import annotations

from typing import Any

import httpx2
import pytest
import trio

from gateway.builtins.fetch import FetchError, PageFetcher, find
from pages_server import Pages, serve_pages
from searx import SEARX, start_searx

SEARCH = [{"type": "web_search"}]


@pytest.fixture
async def site(nursery) -> Pages:
    pages = Pages()
    await nursery.start(serve_pages, pages)
    return pages


async def fetch(url: str, allow: tuple[str, ...] = ("127.0.0.1",), **options: Any) -> Any:
    async with httpx2.AsyncClient(follow_redirects=False) as client:
        with trio.fail_after(20):
            return await PageFetcher(client, allow=allow, **options).fetch(url)


# --- the fetcher ----------------------------------------------------------------------------------


async def test_an_html_page_is_read_as_its_article_text_without_navigation_scripts_or_footer(site):
    page = await fetch(site.url + "/article")
    assert page.title == "Nurseries in Trio" and page.url == site.url + "/article"
    assert "the block that opens it does not exit" in page.text
    assert "tracker" not in page.text and "Cookie settings" not in page.text and "Home" not in page.text


async def test_redirects_are_followed_and_checked_again(site):
    page = await fetch(site.url + "/moved")
    assert page.url == site.url + "/article" and site.hits[-2:] == ["/moved", "/article"]
    with pytest.raises(FetchError) as refused:
        await fetch(site.url + "/to-private")
    assert refused.value.kind == "url_not_allowed" and "10.0.0.7" in refused.value.message


@pytest.mark.parametrize(
    "url, reason",
    [
        ("http://127.0.0.1:9/x", "loopback"),
        ("http://10.1.2.3/", "private"),
        ("http://169.254.169.254/latest/meta-data/", "link-local"),
        ("http://[::ffff:127.0.0.1]/", "loopback"),
        ("http://localhost/", "loopback"),
        ("file:///etc/passwd", "must use http or https"),
    ],
)
async def test_non_public_addresses_are_never_fetched_without_the_allow_list(url, reason):
    with pytest.raises(FetchError) as refused:
        await fetch(url, allow=())
    assert refused.value.kind == "url_not_allowed" and reason in refused.value.message


async def test_the_loopback_site_itself_is_refused_without_the_allow_list(site):
    with pytest.raises(FetchError) as refused:
        await fetch(site.url + "/article", allow=())
    assert refused.value.kind == "url_not_allowed" and site.hits == []  # not even connected to


async def test_only_text_is_read_and_at_most_max_bytes(site):
    with pytest.raises(FetchError) as refused:
        await fetch(site.url + "/image.png")
    assert refused.value.kind == "unsupported_content_type"
    page = await fetch(site.url + "/huge", max_bytes=100_000)
    assert page.truncated and len(page.text) <= 100_000
    plain = await fetch(site.url + "/plain.txt")
    assert plain.text.splitlines()[1] == "nurseries own tasks"


def test_find_gives_the_passages_around_each_match():
    text = "a\nb nurseries\nc\nd\ne Nurseries again\nf"
    assert find(text, "nurseries") == ["a\nb nurseries\nc", "d\ne Nurseries again\nf"]
    assert find(text, "  ") == []


# --- through the gateway -------------------------------------------------------------------------


needs_searx = pytest.mark.skipif(SEARX is None, reason="searx is not installed (.ci/run installs Debian's searx)")


@pytest.fixture
async def opening(nursery, tmp_path, start_gateway):
    engine = await start_searx(nursery, tmp_path)
    return await start_gateway(web_search_url=engine, web_fetch_allowed_hosts="127.0.0.1")


def tool_result(backend: Any) -> str:
    return str([m for m in backend.chat_requests[-1]["messages"] if m["role"] == "tool"][-1]["content"])


@needs_searx
@pytest.mark.parametrize("model, action", [("opener", {"type": "open_page"}), ("finder", {"type": "find_in_page", "pattern": "nurseries"})])
async def test_open_page_and_find_in_page_are_web_search_calls_whose_text_the_model_reads(opening, site, backend, client, model, action):
    url = site.url + "/article"
    r = await client.post(opening + "/v1/responses", json={"model": model, "input": f"Read {url}", "tools": SEARCH})
    answer = r.json()
    call = answer["output"][0]
    assert call["type"] == "web_search_call" and call["status"] == "completed"
    assert call["action"] == {**action, "url": url}
    offered = [t["function"]["name"] for t in backend.chat_requests[0]["tools"]]
    assert offered == ["web_search", "open_page", "find_in_page"]
    if model == "opener":
        assert tool_result(backend).startswith(f"Nurseries in Trio\n{url}\n\n")
    else:
        said = tool_result(backend)
        assert said.startswith(f"1 passages of {url} with 'nurseries':") or said.startswith("'nurseries' is not on")


@needs_searx
async def test_a_page_the_guard_refuses_is_a_failed_call_the_model_reads(opening, backend, client):
    r = await client.post(opening + "/v1/responses", json={"model": "opener", "input": "Read http://10.0.0.7/notes/trio.html", "tools": SEARCH})
    call = r.json()["output"][0]
    assert call["status"] == "failed" and call["action"] == {"type": "open_page", "url": "http://10.0.0.7/notes/trio.html"}
    assert tool_result(backend).startswith("Error: the page could not be opened: the page URL 'http://10.0.0.7/notes/trio.html' points to a private address")


# --- Anthropic's web_fetch server tool -------------------------------------------------------------


FETCH = [{"type": "web_fetch_20250910", "name": "web_fetch", "max_uses": 3}]


@pytest.fixture
async def fetching(start_gateway):
    return await start_gateway(web_fetch_allowed_hosts="127.0.0.1")


def claude(url: str) -> Any:
    import anthropic

    return anthropic.AsyncAnthropic(base_url=url, api_key="sk-test", max_retries=0)


@pytest.mark.parametrize("streamed", [False, True])
async def test_web_fetch_is_a_server_tool_use_and_a_web_fetch_result_with_the_pages_text(fetching, site, backend, streamed):
    url = site.url + "/article"
    ask: dict[str, Any] = dict(model="opener", max_tokens=64, tools=FETCH, messages=[{"role": "user", "content": f"Read {url}"}])
    with trio.fail_after(30):
        if streamed:
            async with claude(fetching).beta.messages.stream(**ask) as stream:
                message = await stream.get_final_message()
        else:
            message = await claude(fetching).beta.messages.create(**ask)
    assert [b.type for b in message.content] == ["server_tool_use", "web_fetch_tool_result", "text"]
    use, result, text = message.content
    assert use.name == "web_fetch" and use.input == {"url": url}  # type: ignore[union-attr]
    assert result.tool_use_id == use.id and result.content.type == "web_fetch_result"  # type: ignore[union-attr]
    document = result.content.content  # type: ignore[union-attr]
    assert result.content.url == url and document.title == "Nurseries in Trio"  # type: ignore[union-attr]
    assert "the block that opens it does not exit" in document.source.data  # type: ignore[union-attr]
    assert message.usage.server_tool_use.web_fetch_requests == 1  # type: ignore[union-attr]
    assert text.text.startswith("Read: Nurseries in Trio")  # type: ignore[union-attr]


async def test_a_web_fetch_of_a_private_address_is_an_error_block_and_nothing_is_fetched(start_gateway):
    url = await start_gateway()  # (nothing allow-listed)
    with trio.fail_after(30):
        message = await claude(url).beta.messages.create(
            model="opener", max_tokens=64, tools=FETCH, messages=[{"role": "user", "content": "Read http://169.254.169.254/latest/meta-data/"}]  # type: ignore[arg-type]
        )
    result = message.content[1]
    assert result.type == "web_fetch_tool_result" and result.content.error_code == "url_not_allowed"  # type: ignore[union-attr]
    assert message.stop_reason == "end_turn"
