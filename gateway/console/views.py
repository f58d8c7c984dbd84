"""What each console page shows: the gateway's data in, a template's context out (pure).

One function per page.  Each takes what the wiring read (the readiness
report, keys and their use, open streams, stored records, MCP servers) and
returns plain values for its template: times formatted, JSON pretty-printed,
streams grouped, the usage charts drawn (`charts`).  `frame` is what every
page's layout needs (the nav, who is signed in, the CSRF token of the forms).

Knows the shapes of the records it is given; no HTTP, no store, no template.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson

from ..keys import ApiKey
from ..observe.outcome import ANONYMOUS_KEY
from .charts import usage_chart
from .forms import LIMIT_FIELDS, FieldErrors, limit_text

__all__ = [
    "NAV",
    "backends_view",
    "conversation_view",
    "conversations_view",
    "frame",
    "keys_view",
    "mcp_view",
    "overview_view",
    "playground_view",
    "response_view",
    "responses_view",
    "streams_view",
]

NAV = (
    ("overview", "/console", "Overview"),
    ("backends", "/console/backends", "Backends"),
    ("keys", "/console/keys", "Keys"),
    ("streams", "/console/streams", "Streams"),
    ("responses", "/console/responses", "Responses"),
    ("conversations", "/console/conversations", "Conversations"),
    ("mcp", "/console/mcp", "MCP"),
    ("playground", "/console/playground", "Playground"),
)
# Transports as the streams page names them.
_TRANSPORTS = {"sse": "Responses (SSE)", "chat": "Chat Completions", "messages": "Messages", "relay": "Relayed"}
_MAX_EVENTS_SHOWN = 5000  # a long response's event log is cut here on its page (and in the replay)


def frame(current: str, title: str, operator: str | None, csrf: str | None) -> dict[str, Any]:
    """What every page's layout needs: the nav (which page is this), who is signed in, the CSRF token."""
    return {
        "nav": [{"id": key, "href": href, "label": label, "current": key == current} for key, href, label in NAV],
        "title": title,
        "operator": operator,
        "csrf": csrf or "",
    }


def _when(seconds: float | None) -> str:
    """A wall-clock time as UTC, to the second ('' when unknown)."""
    if not seconds:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(seconds))


def _span(seconds: float) -> str:
    """A duration as the streams page shows it."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes} min {rest:02d} s"


def _pretty(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode()


# --- pages ------------------------------------------------------------------------------------


def overview_view(report: Mapping[str, Any], *, keys: int, streams: int, mcp_servers: int) -> dict[str, Any]:
    """Readiness (`report`: what /ready answers) and how many of each thing the other pages show."""
    return {
        "status": report.get("status", "unknown"),
        "reasons": list(report.get("reasons") or ()),
        "backends": len(report.get("backends") or ()),
        "keys": keys,
        "streams": streams,
        "mcp_servers": mcp_servers,
    }


def backends_view(
    report: Mapping[str, Any], config: Any, models: Iterable[str], errors: Iterable[Any]
) -> dict[str, Any]:
    """`report`: what /ready answers; `config`: the GATEWAY_CONFIG file's (None: one backend);
    `models`: the names GET /v1/models lists; `errors`: the ledger's recent backend errors."""
    routes = []
    for route in getattr(config, "routes", ()) or ():
        targets = [f"{target.backend} as {target.model}" if target.model else target.backend for target in route.targets]
        routes.append({"model": route.model, "targets": targets, "context_window": route.context_window or ""})
    return {
        "status": report.get("status", "unknown"),
        "reasons": list(report.get("reasons") or ()),
        "store": (report.get("store") or {}).get("state", "unknown"),
        "web_search": (report.get("web_search") or {}).get("state"),
        "backends": [dict(entry) for entry in report.get("backends") or ()],
        "routes": routes,
        "models": sorted(set(models)),
        "errors": [{"at": _when(error.at), "kind": error.kind, "route": error.route or ""} for error in errors],
    }


def keys_view(
    keys: Sequence[ApiKey],
    *,
    static_names: Sequence[str],
    tokens: Mapping[str, int],
    usage: Mapping[str, Sequence[Any]],
    now: float,
    form: Mapping[str, str] | None = None,
    errors: FieldErrors | None = None,
    editing: str | None = None,
    created: tuple[ApiKey, str] | None = None,
) -> dict[str, Any]:
    """The keys, newest first, each with its use over the last hour; the create form (`form` and
    `errors` when it was sent with problems); `editing`: the key whose limits form had `errors`;
    `created`: a key just made, with its secret (shown this once)."""
    rows = []
    for key in sorted(keys, key=lambda key: -key.created_at):
        editing_this = editing == key.name and form is not None
        values = (
            {name: (form or {}).get(name, "") for name in (*LIMIT_FIELDS, "models")}
            if editing_this
            else {
                **{name: limit_text(getattr(key.limits, name)) for name in LIMIT_FIELDS},
                "models": _models_text(key.limits.models),
            }
        )
        rows.append(
            {
                "name": key.name,
                "active": key.active,
                "state": "active" if key.active else f"revoked {_when(key.revoked_at)}",
                "created": _when(key.created_at),
                "admin": key.admin,
                "limits": key.limits.describe(),
                "tokens": tokens.get(key.name, 0),
                "chart": usage_chart(usage.get(key.name, ()), now=now),
                "values": values,
                "errors": dict(errors or {}) if editing_this else {},
            }
        )
    create_errors = dict(errors or {}) if editing is None else {}
    sent = form if editing is None and form is not None else {}
    return {
        "keys": rows,
        "static_names": list(static_names),
        "anonymous_chart": usage_chart(usage[ANONYMOUS_KEY], now=now) if usage.get(ANONYMOUS_KEY) else None,
        "form": {name: sent.get(name, "") for name in ("name", *LIMIT_FIELDS, "models")} | {"admin": bool(sent.get("admin"))},
        "errors": create_errors,
        "created": {"name": created[0].name, "secret": created[1], "admin": created[0].admin} if created else None,
    }


def _models_text(models: tuple[str, ...] | None) -> str:
    if models is None:
        return ""
    return ", ".join(models) if models else "none"


def streams_view(streams: Iterable[Any]) -> dict[str, Any]:
    """Open streams grouped by transport (in the order the names come), each group oldest first."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for stream in sorted(streams, key=lambda stream: -stream.age):
        groups.setdefault(stream.transport, []).append(
            {
                "route": stream.route,
                "model": stream.model or "",
                "key": stream.key or "",
                "age": _span(stream.age),
                "silence": _span(stream.silence),
                "longest_silence": _span(stream.longest_silence),
                "events": stream.events,
            }
        )
    return {
        "groups": [{"transport": name, "label": _TRANSPORTS.get(name, name), "streams": rows} for name, rows in groups.items()],
        "total": sum(len(rows) for rows in groups.values()),
    }


def _item_text(item: Mapping[str, Any]) -> str:
    """A message item's text (its parts joined, cut short), '' for other items."""
    content = item.get("content")
    if isinstance(content, str):
        text = content
    else:
        text = " ".join(str(part.get("text", "")) for part in content or () if isinstance(part, dict) and part.get("text"))
    return text if len(text) <= 120 else text[:119] + "…"


def _output_text(response: Mapping[str, Any]) -> str:
    texts = []
    for item in response.get("output") or ():
        if isinstance(item, dict):
            if item.get("type") == "message":
                texts += [part.get("text", "") for part in item.get("content") or () if isinstance(part, dict)]
            elif item.get("type") in ("function_call", "mcp_call"):
                texts.append(f"[{item.get('type')} {item.get('name', '')}]")
    text = " ".join(text for text in texts if text)
    return text if len(text) <= 120 else text[:119] + "…"


def responses_view(records: Sequence[Any], *, limit: int, before: str | None) -> dict[str, Any]:
    """Stored responses, newest first; `older`: the cursor of the next page, when there may be one."""
    rows = []
    for record in records:
        response = record.response
        rows.append(
            {
                "id": record.id,
                "created": _when(response.get("created_at")),
                "status": response.get("status", ""),
                "model": response.get("model", ""),
                "background": bool(response.get("background")),
                "preview": _output_text(response),
                "events": len(record.events),
            }
        )
    return {"responses": rows, "older": records[-1].id if len(records) >= limit else None, "before": before}


def response_view(record: Any) -> dict[str, Any]:
    """One stored response: its JSON, its input items, its event log (listed, and for the replay)."""
    events = record.events[:_MAX_EVENTS_SHOWN]
    return {
        "id": record.id,
        "status": record.response.get("status", ""),
        "model": record.response.get("model", ""),
        "previous": record.previous_response_id,
        "response_json": _pretty(record.response),
        "input_items": [{"type": item.get("type", ""), "json": _pretty(item)} for item in record.input_items],
        "events": [
            {"n": n, "type": event.get("type", ""), "json": orjson.dumps(event).decode()} for n, event in enumerate(events)
        ],
        "events_data": events,
        "events_cut": len(record.events) - len(events),
    }


def conversations_view(conversations: Sequence[Any], *, limit: int, before: str | None) -> dict[str, Any]:
    """Stored conversations, newest first; `older`: the cursor of the next page, when there may be one."""
    rows = [
        {"id": conv.id, "created": _when(conv.created_at), "items": len(conv.items), "metadata": _pretty(conv.metadata) if conv.metadata else ""}
        for conv in conversations
    ]
    return {"conversations": rows, "older": conversations[-1].id if len(conversations) >= limit else None, "before": before}


def conversation_view(conversation: Any) -> dict[str, Any]:
    """One conversation: its metadata and its items, oldest first, each with its text and JSON."""
    return {
        "id": conversation.id,
        "created": _when(conversation.created_at),
        "metadata": _pretty(conversation.metadata),
        "items": [
            {
                "id": item.get("id", ""),
                "type": item.get("type", ""),
                "role": item.get("role", ""),
                "preview": _item_text(item),
                "json": _pretty(item),
            }
            for item in conversation.items
        ],
    }


def mcp_view(statuses: Sequence[Any] | None, tools: Sequence[Any]) -> dict[str, Any]:
    """The configured MCP servers (`statuses`: the manager's; None: no manager) with their tools."""
    by_server: dict[str, list[dict[str, Any]]] = {}
    for tool in tools:
        schema = tool.input_schema if isinstance(tool.input_schema, dict) else {}
        by_server.setdefault(tool.server, []).append(
            {
                "name": tool.name,
                "original": tool.original_name if tool.original_name != tool.name else "",
                "description": tool.description or "",
                "parameters": ", ".join(sorted((schema.get("properties") or {}).keys())),
            }
        )
    servers = [
        {
            "name": status.name,
            "type": status.type,
            "state": status.state,
            "last_error": status.last_error or "",
            "tools": by_server.get(status.name, []),
        }
        for status in statuses or ()
    ]
    return {"configured": statuses is not None, "servers": servers}


def playground_view(models: Iterable[str]) -> dict[str, Any]:
    """The routes the playground offers (`models`: the names the operator may use), the first picked."""
    names = sorted(set(models))
    return {"models": names, "default_model": names[0] if names else ""}
