"""A request in a backend's own API, carried beside the chat request (see `NativeRequest`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["NativeRequest"]


@dataclass(frozen=True)
class NativeRequest:
    """A request as its client sent it, in an API some backends speak themselves.

    The chat body stays the request every backend can take; an adapter that
    speaks `api` sends `body` instead (with the chat body's `model`, which a
    route may have rewritten, and its `max_tokens`, which a key's limit may
    have lowered), so that what the chat shape cannot hold reaches it
    untouched: `cache_control`, thinking signatures, betas' fields and the
    `headers` that name them (`anthropic-beta`).
    """

    api: Literal["anthropic-messages"]
    body: Mapping[str, Any]
    headers: Mapping[str, str] = field(default_factory=dict)
