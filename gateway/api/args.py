"""What a route reads from its path and query: a relayed path made safe, list arguments
(`limit`, `order`, `after`, `before`) and their page, numbers and flags."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from ..errors import InvalidRequest

__all__ = ["flag_arg", "int_arg", "page", "relay_path"]


def relay_path(path: str) -> str:
    """The part of `/v1/{path}` a relayed request may forward, ready for a URL.

    `path` arrives decoded (`%2e%2e` is already `..`).  Dot-segments are
    resolved and empty segments dropped; a path that would leave `/v1`, or
    that carries control characters, is refused.  Each segment is
    percent-encoded again, so the backend's URL parser cannot read a new
    structure into it.

    Raises:
        InvalidRequest: `invalid_path`.
    """
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in path):
        raise InvalidRequest("The request path contains control characters.", code="invalid_path")
    segments: list[str] = []
    for segment in path.split("/"):
        if segment in ("", "."):
            continue
        if segment == "..":
            if not segments:
                raise InvalidRequest("The request path leaves /v1.", code="invalid_path")
            segments.pop()
            continue
        segments.append(segment)
    if not segments:
        raise InvalidRequest("The request path names nothing under /v1.", code="invalid_path")
    return "/".join(quote(segment, safe="") for segment in segments)


def int_arg(args: Mapping[str, str], name: str, default: int, *, low: int | None = None, high: int | None = None) -> int:
    """A whole-number query argument.

    Raises:
        InvalidRequest: not a number (`invalid_type`), or out of range (`invalid_value`).
    """
    raw = args.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidRequest(f"Invalid value for '{name}': expected an integer.", param=name, code="invalid_type") from None
    if (low is not None and value < low) or (high is not None and value > high):
        raise InvalidRequest(f"Invalid value for '{name}': out of range.", param=name, code="invalid_value")
    return value


def flag_arg(args: Mapping[str, str], name: str) -> bool:
    """A yes/no query argument (`?stream=true`)."""
    return args.get(name, "").lower() in ("true", "1")


def page(items: list[dict[str, Any]], args: Mapping[str, str]) -> dict[str, Any]:
    """One page of a list in OpenAI's cursor shape (`limit` 1-100, `order`, `after`, `before`).

    Raises:
        InvalidRequest: an argument out of range, or a cursor naming no item of the list.
    """
    limit = int_arg(args, "limit", 20, low=1, high=100)
    order = args.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidRequest("Invalid value for 'order': expected 'asc' or 'desc'.", param="order", code="invalid_value")
    ordered = items if order == "asc" else list(reversed(items))
    ids = [item.get("id") for item in ordered]
    start, end = 0, len(ordered)
    for name in ("after", "before"):
        cursor = args.get(name)
        if cursor:
            if cursor not in ids:
                raise InvalidRequest(f"No item with id '{cursor}' in this list.", param=name, code="invalid_value")
            if name == "after":
                start = ids.index(cursor) + 1
            else:
                end = ids.index(cursor)
    window = ordered[start:end]
    data = window[:limit]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0].get("id") if data else None,
        "last_id": data[-1].get("id") if data else None,
        "has_more": len(window) > limit,
    }
