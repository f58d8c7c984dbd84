"""The gateway's built-in tools: what a hosted tool type asks for, run by the gateway itself.

    fetch      the pages a model opens (`open_page`, `find_in_page`, Anthropic's
               `web_fetch_…`), behind the address guard, their text extracted
               by trafilatura
    search     web search (`web_search` for Responses clients, Anthropic's
               `web_search_…` server tool for Messages clients): one
               executor, a provider behind one interface (`SearchProvider`;
               SearXNG's JSON API today, `WEB_SEARCH_URL`)

Each built-in tool is one executor serving both fronts: the turn offers it to
the model as a function and runs its calls beside the MCP tools' (in the
turn's nursery, cancelled with it); the fronts only show its calls in their
own shapes.  A failure is a tool error the model sees, never an exception.
"""

from __future__ import annotations

from .search import SearchError, SearchOptions, SearchProvider, SearchResult, SearxngProvider, WebSearch

__all__ = ["SearchError", "SearchOptions", "SearchProvider", "SearchResult", "SearxngProvider", "WebSearch"]
