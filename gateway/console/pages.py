"""The console's pages as bytes: its templates rendered, its static files, and the headers every page carries.

Owns the Jinja2 environment (autoescaped, strict about undefined names),
the `Page` body a console handler answers with (HTML with a strict
Content-Security-Policy: scripts, styles and requests only from the gateway
itself, no inline script or style, never framed, never cached), and the
vendored static files (htmx, the stylesheet, the playground's script),
served from the package and nothing else.

Knows nothing of routes, credentials or where the data came from: it is
given a template name and its context.
"""

from __future__ import annotations

import pathlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

import jinja2

from ..transport.body import DeferredHeadBody

__all__ = ["CSP", "Page", "render", "static_file"]

_HERE = pathlib.Path(__file__).parent
# Everything from the gateway itself: it also proves nothing comes from a CDN (a page that tried
# would be refused by the browser, and the browser test would see the console error).
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'; object-src 'none'"
)
_PAGE_HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",  # the Referer a same-origin check may read, never sent elsewhere
    "cache-control": "no-store",  # pages show keys' names, stored responses, a new key's secret
    "x-frame-options": "DENY",
}
_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml", ".txt": "text/plain; charset=utf-8"}
# The static files, read once: only these names are ever served (no path from a request reaches the disk).
_STATIC = {path.name: path for path in (_HERE / "static").iterdir() if path.suffix in _TYPES}

_env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(_HERE / "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


def render(template: str, context: Mapping[str, Any]) -> bytes:
    """A template rendered with `context`, as UTF-8.

    Raises:
        jinja2.TemplateError: the template is missing or uses a name the context lacks (a bug).
    """
    return _env.get_template(template).render(**context).encode()


class Page(DeferredHeadBody):
    """An answer already decided: its bytes, status and headers (a page's carry the CSP)."""

    def __init__(self, data: bytes, status: int = 200, headers: Mapping[str, str] | None = None, *, html: bool = True) -> None:
        self._data = data
        self._status = status
        base = {"content-type": "text/html; charset=utf-8", **_PAGE_HEADERS} if html else {}
        self._headers = {**base, **(headers or {}), "content-length": str(len(data))}

    async def head(self) -> tuple[int, dict[str, str]]:
        return self._status, self._headers

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._once()

    async def _once(self) -> AsyncIterator[bytes]:
        if self._data:
            yield self._data


def static_file(name: str) -> Page | None:
    """One of the vendored static files, or None for any other name."""
    path = _STATIC.get(name)
    if path is None:
        return None
    headers = {
        "content-type": _TYPES[path.suffix],
        "x-content-type-options": "nosniff",
        "cache-control": "public, max-age=3600",
    }
    return Page(path.read_bytes(), headers=headers, html=False)
