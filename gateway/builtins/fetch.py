"""Pages a model asks to read (`open_page`, `find_in_page`, Anthropic's `web_fetch`), fetched safely.

    PageFetcher.fetch   one URL, over the gateway's HTTP client: the address
                        guard first (`gateway.ops.addresses`: no loopback, private,
                        link-local or other non-public address unless the
                        allow-list names it), every redirect checked again, the
                        address the connection reached checked too, at most
                        `max_bytes` read within `timeout`, only text and HTML;
                        HTML's readable text extracted by trafilatura (in a
                        worker thread: it is CPU work), never a hand-written parser
    find                the lines of a page's text around a pattern (pure)

A refusal or failure is a `FetchError` whose `kind` is what the model and the
metrics are told (`url_not_allowed`, `url_not_accessible`,
`unsupported_content_type`, `content_too_large`, `invalid_tool_input`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import aclosing
from dataclasses import dataclass
from urllib.parse import urljoin

import httpx2
import trio

from ..ops.addresses import address_allowed, check_url_allowed_async

__all__ = ["FetchError", "Opened", "Page", "PageFetcher", "PageTools", "find"]

log = logging.getLogger("gateway.tools")

_TEXT_TYPES = ("text/html", "application/xhtml+xml", "text/plain", "text/markdown")
_EXTRACT = trio.CapacityLimiter(2)  # trafilatura runs in worker threads, a few at a time


@dataclass(frozen=True)
class Page:
    url: str  # where it was found, after redirects
    title: str
    text: str
    truncated: bool = False


class FetchError(Exception):
    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind


class PageFetcher:
    """Fetches pages for the gateway's built-in tools (see the module docstring)."""

    def __init__(
        self,
        client: httpx2.AsyncClient,
        *,
        allow: Sequence[str] = (),
        max_bytes: int = 2 * 1024 * 1024,
        timeout: float = 15.0,
        max_redirects: int = 5,
    ) -> None:
        self._client = client
        self._allow = list(allow)
        self._max_bytes = max_bytes
        self._timeout = timeout
        self._max_redirects = max_redirects

    async def fetch(self, url: str) -> Page:
        """The page at `url`, as readable text.

        Raises:
            FetchError: the URL may not be fetched, or the page could not be read.
        """
        if not isinstance(url, str) or not url.strip():
            raise FetchError("a page needs a non-empty string 'url'", "invalid_tool_input")
        with trio.move_on_after(self._timeout) as waited:
            return await self._fetch(url.strip())
        if waited.cancelled_caught:
            raise FetchError(f"the page did not load within {self._timeout:g} s", "url_not_accessible")
        raise AssertionError("unreachable")

    async def _fetch(self, url: str) -> Page:
        for _ in range(self._max_redirects + 1):
            try:
                await check_url_allowed_async(url, self._allow, what="page URL")
            except ValueError as refused:
                raise FetchError(str(refused), "url_not_allowed") from None
            try:
                async with self._client.stream("GET", url, headers={"accept": "text/html, text/plain;q=0.9"}) as response:
                    self._check_peer(response, url)
                    if response.is_redirect and response.headers.get("location"):
                        url = urljoin(url, response.headers["location"])
                        continue  # (checked again, from the top)
                    if response.status_code >= 400:
                        raise FetchError(f"the page answered HTTP {response.status_code}", "url_not_accessible")
                    kind = response.headers.get("content-type", "").split(";", 1)[0].strip().lower()
                    if kind not in _TEXT_TYPES:
                        raise FetchError(f"the page is {kind or 'of no stated type'}, not text or HTML", "unsupported_content_type")
                    body, truncated = await self._read(response)
                    charset = response.charset_encoding or "utf-8"
            except httpx2.HTTPError:
                raise FetchError("the page could not be reached", "url_not_accessible") from None
            text = body.decode(charset, errors="replace")
            if kind in ("text/plain", "text/markdown"):
                return Page(url=url, title=url, text=text, truncated=truncated)
            title, readable = await trio.to_thread.run_sync(_readable, text, url, limiter=_EXTRACT)
            return Page(url=url, title=title or url, text=readable, truncated=truncated)
        raise FetchError(f"more than {self._max_redirects} redirects", "url_not_accessible")

    def _check_peer(self, response: httpx2.Response, url: str) -> None:
        """The address the connection reached must pass the guard too (a name that resolved to a
        public address when checked and to a private one when connected is refused here)."""
        stream = response.extensions.get("network_stream")
        peer = stream.get_extra_info("server_addr") if stream is not None else None
        if isinstance(peer, tuple) and peer and not address_allowed(str(peer[0]), self._allow):
            raise FetchError(f"the page URL {url!r} reached a non-public address ({peer[0]})", "url_not_allowed")

    async def _read(self, response: httpx2.Response) -> tuple[bytes, bool]:
        data = bytearray()
        async with aclosing(response.aiter_bytes()) as chunks:  # (left early: closed at once)
            async for chunk in chunks:
                data += chunk
                if len(data) > self._max_bytes:
                    return bytes(data[: self._max_bytes]), True
        return bytes(data), False


def _readable(html: str, url: str) -> tuple[str, str]:
    """(title, readable text) of an HTML page, by trafilatura."""
    import trafilatura

    document = trafilatura.bare_extraction(html, url=url, with_metadata=True, include_comments=False, as_dict=True)
    if not isinstance(document, dict):
        return "", trafilatura.extract(html, url=url) or ""
    return str(document.get("title") or ""), str(document.get("text") or "")


def find(text: str, pattern: str, *, around: int = 1, most: int = 10) -> list[str]:
    """The passages of `text` that contain `pattern` (case-insensitive), each with `around` lines
    either side, at most `most` (pure)."""
    needle = pattern.strip().lower()
    if not needle:
        return []
    lines = text.splitlines()
    found = []
    for n, line in enumerate(lines):
        if needle in line.lower():
            found.append("\n".join(lines[max(0, n - around) : n + around + 1]).strip())
            if len(found) >= most:
                break
    return found


@dataclass
class Opened:
    """One page call's outcome as the client's item shows it."""

    url: str
    page: Page | None = None
    error: str | None = None
    error_kind: str | None = None


class PageTools:
    """The executor of `open_page`, `find_in_page` and `web_fetch` calls: the fetcher, and the
    domain filters of the client's tool; never raises (a failure is the model's to read)."""

    def __init__(self, fetcher: PageFetcher) -> None:
        self.fetcher = fetcher

    async def open(self, url: object, *, allowed: Sequence[str] = (), blocked: Sequence[str] = (), chars: int = 8000) -> tuple[str, Opened]:
        from .search import domain_allowed

        if not isinstance(url, str) or not url.strip():
            opened = Opened(url="", error="the call needs a non-empty string 'url'", error_kind="invalid_tool_input")
            return f"Error: {opened.error}", opened
        url = url.strip()
        if not domain_allowed(url, allowed, blocked):
            opened = Opened(url=url, error="the page's domain is not allowed by this request's tool", error_kind="url_not_allowed")
            return f"Error: {opened.error}", opened
        try:
            page = await self.fetcher.fetch(url)
        except FetchError as error:
            log.info("page fetch refused or failed (%s)", error.kind)
            return f"Error: the page could not be opened: {error.message}.", Opened(url=url, error=error.message, error_kind=error.kind)
        if not domain_allowed(page.url, allowed, blocked):  # (redirected elsewhere)
            opened = Opened(url=url, error="the page redirected to a domain this request's tool does not allow", error_kind="url_not_allowed")
            return f"Error: {opened.error}", opened
        log.info("page fetched: %d characters of text", len(page.text))
        text = page.text if len(page.text) <= chars else page.text[:chars] + "\n[…the rest of the page is left out]"
        return f"{page.title}\n{page.url}\n\n{text}", Opened(url=url, page=page)

    async def find(self, url: object, pattern: object, **filters: object) -> tuple[str, Opened]:
        if not isinstance(pattern, str) or not pattern.strip():
            opened = Opened(url=str(url or ""), error="the call needs a non-empty string 'pattern'", error_kind="invalid_tool_input")
            return f"Error: {opened.error}", opened
        text, opened = await self.open(url, **filters)  # type: ignore[arg-type]
        if opened.page is None:
            return text, opened
        passages = find(opened.page.text, pattern)
        if not passages:
            return f"{pattern!r} is not on {opened.page.url}.", opened
        return f"{len(passages)} passages of {opened.page.url} with {pattern!r}:\n\n" + "\n---\n".join(passages), opened
