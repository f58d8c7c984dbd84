"""The operator's endpoints: what is running, whether it is ready, and its metrics."""

from __future__ import annotations

from ..observe import metrics_page
from ..transport.body import DeferredHeadBody
from ..transport.json import FixedBody, JsonBody
from .routes import Call

__all__ = ["health", "metrics", "ready", "root"]


async def root(call: Call) -> DeferredHeadBody:
    """What is served here: every row of the route table, as method and path."""
    from . import ROUTES  # (the table is built from this module's handlers)

    return JsonBody(
        {
            "message": "Responses gateway is running.",
            "endpoints": [f"{route.method} {route.path}" for route in ROUTES],
        }
    )


async def health(call: Call) -> DeferredHeadBody:
    return JsonBody({"status": "ok", "adapter": "running"})


async def ready(call: Call) -> DeferredHeadBody:
    """What the last background check found (never a check per request)."""
    is_ready, report = call.shared.readiness.report()
    return JsonBody(report, 200 if is_ready else 503)


async def metrics(call: Call) -> DeferredHeadBody:
    settings = call.shared.resources.settings
    page, content_type = metrics_page(call.shared.resources.telemetry, settings.metrics_token, call.headers.get("authorization", ""))
    return FixedBody(page, content_type=content_type)
