"""OpenTelemetry traces (placeholder: implemented by the tracing work)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import Telemetry

if TYPE_CHECKING:
    from ..config import Settings

__all__ = ["OpenTelemetryTracing"]


class OpenTelemetryTracing(Telemetry):
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
