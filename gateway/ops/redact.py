"""Secrets redaction: replace every configured secret with `[redacted]`.

Owns which strings count as secrets (the backend key, the sealing key, the
Redis password, MCP header values) and how they are cut out of text, bytes
and byte streams cut at arbitrary points.  Pure: no I/O, no clock, no
settings beyond reading the fields of a `Settings` it is handed.

Secrets shorter than `MIN_SECRET_LENGTH` are ignored: redacting a
three-letter password would mangle ordinary text.  Where secrets overlap,
the longest one starting leftmost wins, so a secret that contains another
is replaced whole.  A secret that overlaps the marker text itself (say
`"acted]"`) can reappear after redaction; real keys do not look like that.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

if TYPE_CHECKING:
    from ..config import Settings

__all__ = ["MARKER", "MIN_SECRET_LENGTH", "Redactor", "StreamRedactor", "public_url"]

MARKER = "[redacted]"
MIN_SECRET_LENGTH = 6
_MARKER_BYTES = MARKER.encode()


class Redactor:
    """Immutable: a set of secrets and the compiled patterns that find them."""

    __slots__ = ("_by_first_byte", "_bytes_pattern", "_encoded", "_secrets", "_text_pattern")

    def __init__(self, secrets: Iterable[str]) -> None:
        kept = {s for s in secrets if len(s) >= MIN_SECRET_LENGTH}
        # Longest first: alternation tries branches in order, so at one position the
        # longest secret matches, and one secret containing another goes whole.
        self._secrets: tuple[str, ...] = tuple(sorted(kept, key=lambda s: (-len(s), s)))
        self._encoded: tuple[bytes, ...] = tuple(
            sorted((s.encode() for s in self._secrets), key=lambda b: (-len(b), b))
        )
        self._text_pattern = re.compile("|".join(map(re.escape, self._secrets))) if self._secrets else None
        self._bytes_pattern = re.compile(b"|".join(map(re.escape, self._encoded))) if self._encoded else None
        # What a stream must hold back: a tail that is a proper prefix of some secret.
        by_first_byte: dict[bytes, list[bytes]] = {}
        for secret in self._encoded:
            by_first_byte.setdefault(secret[:1], []).append(secret)
        self._by_first_byte = {first: tuple(found) for first, found in by_first_byte.items()}

    @classmethod
    def from_settings(cls, settings: Settings) -> Redactor:
        """The secrets of a `Settings`: backend key, sealing key, Redis credentials.

        The backend key's documented placeholder (`dummy-key`) is public
        knowledge, not a secret: text that mentions it is left alone.
        """
        key = settings.openai_api_key
        placeholder = type(settings).model_fields["openai_api_key"].default
        keys = [key] if key != placeholder else []
        return cls([*keys, settings.gateway_secret_key, *_url_secrets(settings.redis_url)])

    def with_secrets(self, secrets: Iterable[str]) -> Redactor:
        """A new redactor knowing these secrets too (MCP header values, say)."""
        return Redactor([*self._secrets, *secrets])

    @property
    def secrets(self) -> tuple[str, ...]:
        """The secrets kept, longest first."""
        return self._secrets

    def __bool__(self) -> bool:
        return bool(self._secrets)

    def __repr__(self) -> str:
        return f"<Redactor of {len(self._secrets)} secrets>"  # never the secrets themselves

    def redact(self, text: str) -> str:
        """`text` with every secret replaced by `[redacted]`."""
        if self._text_pattern is None or not any(s in text for s in self._secrets):
            return text
        return self._text_pattern.sub(MARKER, text)

    def redact_bytes(self, data: bytes) -> bytes:
        """`data` with every UTF-8 encoded secret replaced by `[redacted]`."""
        if self._bytes_pattern is None or not any(s in data for s in self._encoded):
            return data
        return self._bytes_pattern.sub(_MARKER_BYTES, data)

    def stream(self) -> StreamRedactor:
        """An incremental redactor for one byte stream."""
        return StreamRedactor(self)


class StreamRedactor:
    """Redacts a byte stream cut at arbitrary points.

    `feed(chunk)` returns what can be released now; it holds back only a tail
    that could still grow into a secret, so a stream without secret-like
    tails is never delayed.  `flush()` returns the rest at the end.  The
    concatenated output equals `redactor.redact_bytes(whole stream)`.
    """

    __slots__ = ("_pending", "_redactor")

    def __init__(self, redactor: Redactor) -> None:
        self._redactor = redactor
        self._pending = b""

    def feed(self, chunk: bytes) -> bytes:
        """What of the stream so far can be released now, redacted."""
        redactor = self._redactor
        pattern = redactor._bytes_pattern
        if pattern is None:
            return chunk
        data = self._pending + chunk if self._pending else chunk
        if not any(s in data for s in redactor._encoded):  # the common case: no secret, one copy
            hold = self._hold_point(data, 0)
            self._pending = data[hold:]
            return data[:hold]
        out = bytearray()
        position = 0
        while True:
            hold = self._hold_point(data, position)
            match = pattern.search(data, position)
            # A match starting before `hold` is final: no secret starting at or before it
            # is still incomplete, so more data cannot change what the scan decides there.
            if match is None or match.start() >= hold:
                out += data[position:hold]
                self._pending = data[hold:]
                return bytes(out)
            out += data[position : match.start()]
            out += _MARKER_BYTES
            position = match.end()

    def flush(self) -> bytes:
        """The held-back tail, redacted; the stream is over."""
        rest, self._pending = self._pending, b""
        return self._redactor.redact_bytes(rest)

    def _hold_point(self, data: bytes, start: int) -> int:
        """The first index at or after `start` from which `data` is a proper prefix of a secret."""
        redactor = self._redactor
        end = len(data)
        window = max(start, end - len(redactor._encoded[0]) + 1)  # a longer tail holds a whole secret
        hold = end
        for first, secrets in redactor._by_first_byte.items():
            index = data.find(first, window, hold)
            while index != -1:
                tail = data[index:]
                if any(len(secret) > len(tail) and secret.startswith(tail) for secret in secrets):
                    hold = index
                    break
                index = data.find(first, index + 1, hold)
        return hold


def _url_secrets(url: str) -> list[str]:
    """The password and the whole userinfo of a URL, as written and percent-decoded."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return []
    userinfo = parts.netloc.rpartition("@")[0] if "@" in parts.netloc else ""
    found = [value for value in (password, userinfo) if value]
    return found + [unquote(value) for value in found]


def public_url(url: str) -> str:
    """`url` fit for a log line or a CLI message: its password (and user) replaced by the marker."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "(an invalid URL)"
    if "@" not in parts.netloc:
        return url
    host = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=f"{MARKER}@{host}").geturl()
