"""The operator console at /console: server-rendered pages over what the gateway already knows.

    auth.py      the operator's credential (CONSOLE_TOKEN or an admin key), a
                 browser's signed session cookie, CSRF tokens, the same-origin check
    forms.py     the console's forms read: a key's name, limits and flag (pure)
    keys.py      keys made, revoked and their limits changed, in the key store
    views.py     each page's template context from the gateway's data (pure)
    charts.py    a key's use over time as the shapes of an inline SVG chart (pure)
    pages.py     the templates rendered, the `Page` body with its CSP, the static files
    templates/   Jinja2 templates: one layout (nav, skip link, landmarks) and a page each
    static/      htmx (vendored: `just vendor-htmx`), the stylesheet, the playground's script

The routes are `gateway.api.console` (wiring only); nothing here knows the
route table, the app or the framework, and nothing is loaded from anywhere
but the gateway itself.
"""

from __future__ import annotations

__all__: list[str] = []
