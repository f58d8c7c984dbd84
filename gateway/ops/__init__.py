"""Process-wide services: the drain, the event loops' watch, logs, redaction, the outbound address guard."""

__all__: list[str] = []
