"""Prometheus metrics (placeholder: implemented by the metrics work)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import Telemetry

if TYPE_CHECKING:
    from ..config import Settings

__all__ = ["PrometheusTelemetry"]


class PrometheusTelemetry(Telemetry):
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
