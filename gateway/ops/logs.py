"""Logging set-up: stderr and an optional file, one format, one formatter.

INFO carries one line per request and life-cycle messages; never prompt
text, never a traceback (tracebacks go to DEBUG only).  Every record, the
gateway's and the libraries' (hypercorn, mcp, httpx2, trio), goes through
`SafeFormatter`: one record is one line, and configured secrets never
reach the log.

Escaping, applied to the formatted line (time, level, logger name, message):

- backslash becomes `\\\\`, so every backslash in a line starts an escape and
  a client cannot forge one (the line can be unescaped exactly);
- LF, CR and TAB become `\\n`, `\\r`, `\\t`;
- other C0 controls, DEL and the C1 controls U+0080-U+009F (NEL among them)
  become `\\xNN`;
- LINE SEPARATOR and PARAGRAPH SEPARATOR become `\\u2028` and `\\u2029`.

With LOG_FORMAT=json, `JsonFormatter` writes one JSON object per line
instead (`time`, `level`, `logger`, `message`, and the record's `fields`:
the per-response line carries request id, key name, model, status,
durations and tokens); JSON's own escaping keeps it on one line, and the
same redaction applies.

A DEBUG traceback (or stack) follows its line with its newlines kept,
everything else escaped the same way, and each of its lines indented by two
spaces: only a record's first line starts at the left margin, so an
exception message cannot forge a record either.  Below DEBUG a record with
an exception gets only ` (ExceptionType)` appended.

The log file (LOG_FILE_PATH) carries response ids, key names and error
details: it and its rotated copies are readable by their owner only (0600,
an existing file tightened too), in a directory created 0700.  A log file
that cannot be opened (its directory cannot be created, it is a directory,
it is not writable) is a `ConfigError` naming LOG_FILE_PATH and the path,
raised before the logging in place is touched.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import re
import time
from collections.abc import Iterable
from typing import Any

import orjson

from ..config import ConfigError, Settings
from .redact import Redactor

__all__ = ["JsonFormatter", "SafeFormatter", "add_log_secrets", "configure_logging", "escape_control", "set_log_redactor"]

_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
_MARK = "_gateway_handler"

_ESCAPES: dict[int, str] = {code: f"\\x{code:02x}" for code in [*range(0x20), *range(0x7F, 0xA0)]}
_ESCAPES.update({0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r", 0x5C: "\\\\", 0x2028: "\\u2028", 0x2029: "\\u2029"})
_NEEDS_ESCAPE = re.compile("[\x00-\x1f\x7f-\x9f\\\\\u2028\u2029]")
_MULTILINE_ESCAPES = {code: text for code, text in _ESCAPES.items() if code != 0x0A}


def escape_control(text: str) -> str:
    """`text` on one line: control characters and backslashes escaped (module docstring)."""
    return text.translate(_ESCAPES) if _NEEDS_ESCAPE.search(text) else text


def _escape_multiline(text: str) -> str:
    return text.translate(_MULTILINE_ESCAPES) if _NEEDS_ESCAPE.search(text) else text


class SafeFormatter(logging.Formatter):
    """The gateway's formatter: one line per record, secrets redacted.

    `tracebacks` is true only when the configured level is DEBUG.  The
    record itself is left as the standard formatter leaves it (no cached
    `exc_text`), so other handlers see the original.
    """

    def __init__(self, redactor: Redactor | None = None, *, tracebacks: bool = False) -> None:
        super().__init__(_FORMAT)
        self.redactor = redactor if redactor is not None else Redactor(())
        self.tracebacks = tracebacks

    def format(self, record: logging.LogRecord) -> str:
        redactor = self.redactor  # read once: the app may swap it from another thread
        record.message = record.getMessage()
        if self.usesTime():
            record.asctime = self.formatTime(record, self.datefmt)
        # Redact before escaping (a secret may hold a control character) and after
        # (escaping must not assemble a secret that was not there as such).
        line = redactor.redact(escape_control(redactor.redact(self.formatMessage(record))))
        exc_info = record.exc_info
        if self.tracebacks:
            if exc_info and exc_info[0] is not None:
                line += "\n" + self._detail(self.formatException(exc_info), redactor)
            elif record.exc_text:
                line += "\n" + self._detail(record.exc_text, redactor)
            if record.stack_info:
                line += "\n" + self._detail(self.formatStack(record.stack_info), redactor)
        elif exc_info and exc_info[0] is not None:
            line += f" ({exc_info[0].__name__})"
        return line

    @staticmethod
    def _detail(text: str, redactor: Redactor) -> str:
        text = redactor.redact(_escape_multiline(redactor.redact(text.rstrip("\n"))))
        return "  " + text.replace("\n", "\n  ")


class JsonFormatter(SafeFormatter):
    """One JSON object per record, for log collectors (LOG_FORMAT=json).

    Secrets are redacted from the encoded line, as from a text line.  A
    traceback (DEBUG only) is the `exception` field; below DEBUG only the
    exception's type is given.
    """

    def format(self, record: logging.LogRecord) -> str:
        redactor = self.redactor
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": redactor.redact(record.getMessage()),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update({k: v for k, v in fields.items() if k not in entry})
        exc_info = record.exc_info
        if exc_info and exc_info[0] is not None:
            entry["exception"] = self.formatException(exc_info) if self.tracebacks else exc_info[0].__name__
        line = orjson.dumps(entry, default=str).decode()
        return redactor.redact(line)


class _PrivateFileHandler(logging.handlers.RotatingFileHandler):
    """A rotating log file created 0600, and reopened so after each rollover.

    A rollover renames the file (its copies keep its mode) and opens a new
    one through `_open`, which the standard handler creates with the umask's
    mode (0644, usually).
    """

    def __init__(self, path: str) -> None:
        super().__init__(path, maxBytes=10 * 1024 * 1024, backupCount=3)
        for n in range(1, self.backupCount + 1):  # copies an earlier version rotated
            _tighten(self.rotation_filename(f"{self.baseFilename}.{n}"))

    def _open(self) -> Any:
        fd = os.open(self.baseFilename, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.fchmod(fd, 0o600)  # a file that existed before keeps its mode otherwise
        except PermissionError:
            pass  # not ours to change; writing to it still works
        try:
            return open(fd, "a", encoding=self.encoding, errors=self.errors)
        except BaseException:
            os.close(fd)
            raise


def _tighten(path: str) -> None:
    try:
        os.chmod(path, 0o600)
    except (FileNotFoundError, PermissionError):
        pass


def _open_log_file(path: str) -> _PrivateFileHandler:
    """The handler for the log file at `path`, its directory made if need be.

    Raises:
        ConfigError: naming LOG_FILE_PATH, the path and the cause.
    """
    directory = os.path.dirname(path)
    try:
        if directory:
            os.makedirs(directory, mode=0o700, exist_ok=True)  # an existing directory is the operator's
    except OSError as error:
        raise ConfigError(
            f"LOG_FILE_PATH: cannot create the directory of the log file {path!r}: {_cause(error)}"
        ) from None
    try:
        return _PrivateFileHandler(path)
    except OSError as error:
        raise ConfigError(f"LOG_FILE_PATH: cannot open the log file {path!r}: {_cause(error)}") from None


def _cause(error: OSError) -> str:
    return error.strerror or type(error).__name__


def configure_logging(settings: Settings, *, redactor: Redactor | None = None) -> Redactor:
    """Route every logger through the gateway's handlers; returns the redactor in use.

    The handlers sit on the root logger (libraries: WARNING, or DEBUG when
    LOG_LEVEL is DEBUG) and on "gateway" (LOG_LEVEL, not propagating), so
    `logging.lastResort` never prints a library's error.  `redactor`
    defaults to `Redactor.from_settings(settings)`.  Idempotent: calling it
    again replaces (and closes) the handlers it installed before.

    Raises:
        ConfigError: the log file cannot be opened (naming LOG_FILE_PATH and
            the path); the logging in place is left as it was.
    """
    handlers: list[logging.Handler] = [logging.StreamHandler()]
    if settings.log_file_path:
        handlers.append(_open_log_file(settings.log_file_path))
    redactor = Redactor.from_settings(settings) if redactor is None else redactor
    level = logging.getLevelName(settings.log_level)
    debug = level == logging.DEBUG
    library_level = logging.DEBUG if debug else max(logging.WARNING, level)
    root = logging.getLogger()
    logger = logging.getLogger("gateway")

    old: list[logging.Handler] = []
    for target in (root, logger):
        for handler in list(target.handlers):
            if getattr(handler, _MARK, False):
                target.removeHandler(handler)
                if handler not in old:
                    old.append(handler)
    for handler in old:
        handler.close()

    formatter = (JsonFormatter if settings.log_format == "json" else SafeFormatter)(redactor, tracebacks=debug)
    for handler in handlers:
        handler.setFormatter(formatter)
        setattr(handler, _MARK, True)
        root.addHandler(handler)
        logger.addHandler(handler)
    root.setLevel(library_level)
    logger.setLevel(level)
    logger.propagate = False  # its records reach the same handlers directly, once
    logging.getLogger("hypercorn.error").setLevel(library_level)
    return redactor


def set_log_redactor(redactor: Redactor) -> None:
    """Use `redactor` in every handler `configure_logging` installed."""
    for formatter in _formatters():
        formatter.redactor = redactor


def add_log_secrets(secrets: Iterable[str]) -> None:
    """Redact these secrets too (MCP header values, say) in the installed handlers."""
    secrets = list(secrets)
    for formatter in _formatters():
        formatter.redactor = formatter.redactor.with_secrets(secrets)


def _formatters() -> list[SafeFormatter]:
    found: list[SafeFormatter] = []
    for handler in logging.getLogger().handlers:
        formatter = handler.formatter
        if getattr(handler, _MARK, False) and isinstance(formatter, SafeFormatter) and formatter not in found:
            found.append(formatter)
    return found
