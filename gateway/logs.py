"""Logging set-up: stderr and an optional file, one format.

INFO carries one line per request and life-cycle messages; never prompt
text, never a traceback (tracebacks go to DEBUG only).
"""

from __future__ import annotations

import logging
import logging.handlers
import os

from .config import Settings

__all__ = ["configure_logging"]

_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
_MARK = "_gateway_handler"


def configure_logging(settings: Settings) -> None:
    """Idempotent: safe to call once per process (workers call it too)."""
    logger = logging.getLogger("gateway")
    logger.setLevel(settings.log_level)
    for handler in list(logger.handlers):
        if getattr(handler, _MARK, False):
            logger.removeHandler(handler)
    handlers: list[logging.Handler] = [logging.StreamHandler()]
    if settings.log_file_path:
        directory = os.path.dirname(settings.log_file_path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        handlers.append(
            logging.handlers.RotatingFileHandler(settings.log_file_path, maxBytes=10 * 1024 * 1024, backupCount=3)
        )
    for handler in handlers:
        handler.setFormatter(logging.Formatter(_FORMAT))
        setattr(handler, _MARK, True)
        logger.addHandler(handler)
    logger.propagate = False
    logging.getLogger("hypercorn.error").setLevel(max(logging.WARNING, logger.level))
