"""Web search run by the gateway: a provider behind one interface, and the tool the model calls.

    SearchProvider   what an engine must do: one query in, results out
                     (`SearchResult`: title, url, snippet, page age), or a
                     `SearchError` saying why not (unreachable, timed out, no
                     engine answered)
    SearxngProvider  a self-hosted SearXNG (or searx) instance's JSON API,
                     `GET {WEB_SEARCH_URL}/search?q=…&format=json`, over the
                     gateway's HTTP client; `unresponsive_engines` with no
                     result is an error, never an empty answer
    SearchOptions    what a client's tool asks of the search (pure): domain
                     filters, the language a user location implies, how many
                     results and how long a snippet (`search_context_size`),
                     whether it may search live (`external_web_access`)
    WebSearch        the executor of one turn's `web_search` calls: the query
                     searched (or, with no live access, answered from the
                     gateway's own cache of earlier results), the results
                     filtered and written as a compact text the model can cite
                     (`results_text`), what it found kept for the client's
                     items (`Found`)

Pure but for the provider's request.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

import orjson

from ..errors import InvalidRequest

if TYPE_CHECKING:  # (the HTTP client only where a search is made: the planner reads this module's options)
    import httpx2

__all__ = [
    "FIND_IN_PAGE",
    "FUNCTION",
    "Found",
    "OPEN_PAGE",
    "SearchError",
    "SearchOptions",
    "SearchProvider",
    "SearchResult",
    "SearxngProvider",
    "WebSearch",
    "WEB_SEARCH_TYPES",
    "domain_allowed",
    "is_messages_web_search",
    "messages_search_options",
    "responses_search_options",
    "results_text",
]

log = logging.getLogger("gateway.tools")

# The function the model is offered for a client's web search tool.
FUNCTION: dict[str, Any] = {
    "name": "web_search",
    "description": (
        "Search the web. Returns numbered results, each with a title, its URL and a snippet; "
        "cite the URL of each result you use."
    ),
    "parameters": {
        "type": "object",
        "properties": {"query": {"type": "string", "description": "What to search for."}},
        "required": ["query"],
    },
}

# The functions that open the pages a search found (OpenAI's `open_page` and `find_in_page` actions).
OPEN_PAGE: dict[str, Any] = {
    "name": "open_page",
    "description": "Open a web page (a URL from the search results) and read its text.",
    "parameters": {"type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"]},
}
FIND_IN_PAGE: dict[str, Any] = {
    "name": "find_in_page",
    "description": "Find the passages of a web page that contain a pattern.",
    "parameters": {
        "type": "object",
        "properties": {"url": {"type": "string"}, "pattern": {"type": "string"}},
        "required": ["url", "pattern"],
    },
}

# search_context_size: how many results the model sees, and how much of each snippet.
_CONTEXT = {"low": (3, 200), "medium": (5, 400), "high": (10, 800)}
_PAGE_CHARS = {"low": 3000, "medium": 8000, "high": 20000}  # how much of an opened page the model reads


@dataclass(frozen=True, slots=True)
class SearchResult:
    title: str
    url: str
    snippet: str = ""
    page_age: str | None = None  # what the engine says of the page's date, when it does


class SearchError(Exception):
    """A search that could not be made; `kind` is what the operator's metrics count
    (`unreachable`, `timeout`, `status`, `no_engine`, `bad_answer`)."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind


class SearchProvider(Protocol):
    async def probe(self) -> None:
        """Whether the engine answers at all (for /ready).

        Raises:
            SearchError: it does not.
        """
        ...

    async def search(self, query: str, *, language: str | None, count: int) -> list[SearchResult]:
        """Results for `query`, best first (at most a page of them).

        Raises:
            SearchError: the engine could not answer.
        """
        ...


class SearxngProvider:
    """SearXNG's JSON API (`format=json`; searx answers it too), at `base_url`."""

    def __init__(self, base_url: str, client: httpx2.AsyncClient, *, timeout: float = 10.0) -> None:
        self.url = base_url.rstrip("/") + "/search"
        self._client = client
        self._timeout = timeout

    async def probe(self) -> None:
        """Whether the instance answers (`GET /config`, which SearXNG and searx both serve).

        Raises:
            SearchError: it could not be reached, or did not answer 200.
        """
        import httpx2

        try:
            response = await self._client.get(self.url.removesuffix("/search") + "/config", timeout=self._timeout)
        except httpx2.HTTPError:
            raise SearchError("the search engine could not be reached", "unreachable") from None
        if response.status_code != 200:
            raise SearchError(f"the search engine answered HTTP {response.status_code}", "status")

    async def search(self, query: str, *, language: str | None, count: int) -> list[SearchResult]:
        import httpx2

        params = {"q": query, "format": "json", "pageno": "1", "safesearch": "0"}
        if language:
            params["language"] = language
        try:
            response = await self._client.get(self.url, params=params, timeout=self._timeout, headers={"accept": "application/json"})
        except httpx2.TimeoutException:
            raise SearchError("the search engine did not answer in time", "timeout") from None
        except httpx2.HTTPError:
            raise SearchError("the search engine could not be reached", "unreachable") from None
        if response.status_code != 200:
            raise SearchError(f"the search engine answered HTTP {response.status_code}", "status")
        return parse_searxng(response.content)[:count]


def parse_searxng(body: bytes) -> list[SearchResult]:
    """SearXNG's JSON answer as results (pure).

    Raises:
        SearchError: not its JSON (`bad_answer`), or no result while engines failed (`no_engine`).
    """
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise SearchError("the search engine's answer is not JSON (is its json format enabled?)", "bad_answer") from None
    if not isinstance(data, dict) or not isinstance(data.get("results"), list):
        raise SearchError("the search engine's answer has no results list", "bad_answer")
    results = []
    for entry in data["results"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("url"), str):
            continue
        url = entry["url"]
        if urlsplit(url).scheme not in ("http", "https"):
            continue
        title, snippet, age = entry.get("title"), entry.get("content"), entry.get("publishedDate")
        results.append(
            SearchResult(
                title=(title.strip() if isinstance(title, str) else "") or url,
                url=url,
                snippet=snippet.strip() if isinstance(snippet, str) else "",
                page_age=age if isinstance(age, str) and age else None,
            )
        )
    failed = data.get("unresponsive_engines")
    if not results and isinstance(failed, list) and failed:
        names = ", ".join(str(engine[0] if isinstance(engine, list) and engine else engine) for engine in failed)
        raise SearchError(f"no search engine answered ({names})", "no_engine")
    return results


def _host(url: str) -> str:
    return (urlsplit(url).hostname or "").lower().rstrip(".")


def domain_allowed(url: str, allowed: Sequence[str], blocked: Sequence[str]) -> bool:
    """Whether `url` passes the filters (a domain covers its subdomains; pure)."""
    host = _host(url)

    def under(domain: str) -> bool:
        domain = domain.lower().strip().removeprefix("https://").removeprefix("http://").split("/", 1)[0].rstrip(".")
        return bool(domain) and (host == domain or host.endswith("." + domain))

    if any(under(d) for d in blocked):
        return False
    return not allowed or any(under(d) for d in allowed)


@dataclass(frozen=True)
class SearchOptions:
    """What one client's web search tool asks of the search."""

    allowed_domains: tuple[str, ...] = ()
    blocked_domains: tuple[str, ...] = ()
    context_size: str = "medium"
    language: str | None = None
    live: bool = True  # external_web_access: false asks for the gateway's cache only
    max_uses: int | None = None
    page_text: int | None = None  # how much of an opened page the model reads (None: by the context size)

    @property
    def count(self) -> int:
        return _CONTEXT[self.context_size][0]

    @property
    def snippet_chars(self) -> int:
        return _CONTEXT[self.context_size][1]

    @property
    def page_chars(self) -> int:
        return self.page_text if self.page_text is not None else _PAGE_CHARS[self.context_size]


def results_text(query: str, results: Sequence[SearchResult], snippet_chars: int) -> str:
    """The results as the model reads them: numbered, each with its title, URL and snippet."""
    if not results:
        return f"No results for {query!r}."
    lines = [f"Results for {query!r}:"]
    for n, result in enumerate(results, start=1):
        snippet = result.snippet if len(result.snippet) <= snippet_chars else result.snippet[: snippet_chars - 1] + "…"
        age = f" ({result.page_age})" if result.page_age else ""
        lines.append(f"[{n}] {result.title}{age}\n{result.url}\n{snippet}".rstrip())
    return "\n\n".join(lines)


# The Responses tool types that ask for web search (OpenAI's current, dated and preview names).
WEB_SEARCH_TYPES = frozenset(("web_search", "web_search_2025_08_26", "web_search_preview", "web_search_preview_2025_03_11"))
# A user location's country as the language SearXNG is asked to search in.
_LANGUAGES = {
    "US": "en-US", "GB": "en-GB", "CA": "en-CA", "AU": "en-AU", "IE": "en-IE", "NZ": "en-NZ", "IN": "en-IN",
    "DE": "de-DE", "AT": "de-AT", "CH": "de-CH", "FR": "fr-FR", "BE": "fr-BE", "ES": "es-ES", "MX": "es-MX",
    "AR": "es-AR", "IT": "it-IT", "NL": "nl-NL", "PT": "pt-PT", "BR": "pt-BR", "PL": "pl-PL", "SE": "sv-SE",
    "NO": "nb-NO", "DK": "da-DK", "FI": "fi-FI", "CZ": "cs-CZ", "UA": "uk-UA", "RU": "ru-RU", "TR": "tr-TR",
    "JP": "ja-JP", "KR": "ko-KR", "CN": "zh-CN", "TW": "zh-TW",
}  # fmt: skip


def _strings(value: Any, param: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise InvalidRequest(f"Invalid value for '{param}': expected a list of domain names.", param=param, code="invalid_value")
    return tuple(v.strip() for v in value)


def responses_search_options(tool: Mapping[str, Any], index: int) -> SearchOptions:
    """What a Responses web search tool (`tools[index]`) asks (pure).

    Raises:
        InvalidRequest: a field of another shape or value than OpenAI's; `param` names it.
    """
    where = f"tools[{index}]"
    size = tool.get("search_context_size")
    if size is None:
        size = "medium"
    elif size not in _CONTEXT:
        raise InvalidRequest(
            f"Invalid value for '{where}.search_context_size': expected one of 'low', 'medium', 'high', got {size!r}.",
            param=f"{where}.search_context_size",
            code="invalid_value",
        )
    filters = tool.get("filters")
    if filters is not None and not isinstance(filters, dict):
        raise InvalidRequest(f"Invalid value for '{where}.filters': expected an object.", param=f"{where}.filters", code="invalid_type")
    filters = filters or {}
    allowed = _strings(filters.get("allowed_domains"), f"{where}.filters.allowed_domains")
    blocked = _strings(filters.get("blocked_domains"), f"{where}.filters.blocked_domains")
    live = tool.get("external_web_access")
    if live is not None and not isinstance(live, bool):
        raise InvalidRequest(
            f"Invalid value for '{where}.external_web_access': expected a boolean.", param=f"{where}.external_web_access", code="invalid_type"
        )
    location = tool.get("user_location")
    if location is not None and not isinstance(location, dict):
        raise InvalidRequest(f"Invalid value for '{where}.user_location': expected an object.", param=f"{where}.user_location", code="invalid_type")
    country = (location or {}).get("country")
    language = _LANGUAGES.get(country.upper()) if isinstance(country, str) else None
    return SearchOptions(allowed, blocked, size, language, live is not False)


def messages_search_options(tool: Mapping[str, Any], index: int) -> SearchOptions:
    """What an Anthropic web search server tool (`tools.{index}`, `web_search_…`) asks (pure).

    Raises:
        InvalidRequest: both `allowed_domains` and `blocked_domains`, a list that is not one of
            domain names, or a `max_uses` that is not a positive integer; named as Anthropic names fields.
    """
    where = f"tools.{index}"
    allowed = _strings(tool.get("allowed_domains"), f"{where}.allowed_domains")
    blocked = _strings(tool.get("blocked_domains"), f"{where}.blocked_domains")
    if allowed and blocked:
        raise InvalidRequest(
            f"{where}.blocked_domains: a web search tool takes allowed_domains or blocked_domains, not both.",
            param=f"{where}.blocked_domains",
            code="invalid_value",
        )
    uses = tool.get("max_uses")
    if uses is not None and (not isinstance(uses, int) or isinstance(uses, bool) or uses < 1):
        raise InvalidRequest(f"{where}.max_uses: must be a positive integer.", param=f"{where}.max_uses", code="invalid_value")
    location = tool.get("user_location")
    country = location.get("country") if isinstance(location, dict) else None
    language = _LANGUAGES.get(country.upper()) if isinstance(country, str) else None
    return SearchOptions(allowed, blocked, "medium", language, True, uses)


def is_messages_web_search(tool: Mapping[str, Any]) -> bool:
    """Anthropic's web search server tool (`web_search_20250305` and later)."""
    kind = tool.get("type")
    return isinstance(kind, str) and kind.startswith("web_search_") and tool.get("name", "web_search") == "web_search"


@dataclass
class Found:
    """One call's outcome as the client's item shows it: the query, what it found, or why not."""

    query: str
    results: list[SearchResult] = field(default_factory=list)
    error: str | None = None
    error_kind: str | None = None


class _Cache:
    """Earlier results by query, for searches without live access (`external_web_access: false`)."""

    def __init__(self, size: int = 512, ttl: float = 24 * 3600.0) -> None:
        self._entries: OrderedDict[tuple[str, str | None], tuple[float, list[SearchResult]]] = OrderedDict()
        self._size = size
        self._ttl = ttl

    def get(self, query: str, language: str | None) -> list[SearchResult] | None:
        key = (" ".join(query.lower().split()), language)
        entry = self._entries.get(key)
        if entry is None or time.monotonic() - entry[0] > self._ttl:
            return None
        self._entries.move_to_end(key)
        return entry[1]

    def put(self, query: str, language: str | None, results: list[SearchResult]) -> None:
        key = (" ".join(query.lower().split()), language)
        self._entries[key] = (time.monotonic(), results)
        self._entries.move_to_end(key)
        while len(self._entries) > self._size:
            self._entries.popitem(last=False)


class WebSearch:
    """The gateway's web search: the provider, its cache, and the calls of the turns that use it."""

    def __init__(self, provider: SearchProvider) -> None:
        self.provider = provider
        self.cache = _Cache()

    async def run(self, arguments: Mapping[str, Any], options: SearchOptions) -> tuple[str, Found]:
        """One `web_search` call: the text the model reads, and what the client's item shows.
        Never raises: a failure is the model's to read (and `Found.error`)."""
        query = arguments.get("query")
        if not isinstance(query, str) or not query.strip():
            found = Found(query="", error="the search needs a non-empty string 'query'", error_kind="invalid_tool_input")
            return f"Error: {found.error}", found
        query = query.strip()
        results = self.cache.get(query, options.language)
        if results is None and not options.live:
            found = Found(query=query)  # OpenAI's offline mode: nothing fetched, nothing known
            return f"No cached results for {query!r} (live web access is off for this request).", found
        if results is None:
            wanted = options.count * (3 if options.allowed_domains or options.blocked_domains else 1)
            try:
                results = await self.provider.search(query, language=options.language, count=max(wanted, 10))
            except SearchError as error:
                log.info("web search failed (%s): a query of %d characters", error.kind, len(query))
                found = Found(query=query, error=error.message, error_kind=error.kind)
                return f"Error: the web search failed: {error.message}.", found
            self.cache.put(query, options.language, results)
        kept = [r for r in results if domain_allowed(r.url, options.allowed_domains, options.blocked_domains)][: options.count]
        log.info("web search: a query of %d characters, %d results", len(query), len(kept))
        return results_text(query, kept, options.snippet_chars), Found(query=query, results=kept)
