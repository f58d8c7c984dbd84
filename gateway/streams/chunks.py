"""Chat Completions stream bytes -> decoded chunks (pure, incremental).

Wraps the SSE decoder: each `data:` payload becomes a dict, `[DONE]` becomes
the `DONE` marker.  Malformed payloads raise `BackendStreamError`; nothing
here knows what a chunk means.
"""

from __future__ import annotations

from typing import Any, Final

import orjson

from ..errors import BackendStreamError
from .sse import SSEDecoder, SSETooLarge

__all__ = ["DONE", "ChunkDecoder"]


class _Done:
    __slots__ = ()

    def __repr__(self) -> str:
        return "DONE"


DONE: Final = _Done()


class ChunkDecoder:
    def __init__(self, max_event_bytes: int = 16 * 1024 * 1024) -> None:
        self._sse = SSEDecoder(max_event_bytes)
        self.saw_done = False
        self.failed = False

    def decode(self, data: bytes) -> list[Any]:
        """Chunks completed by `data`, in order; stops at `[DONE]`.

        A payload that is not JSON (or too large) ends the list with a
        `BackendStreamError` instance, after the chunks decoded before it, so
        what reaches the consumer never depends on how the bytes were cut.
        """
        if self.saw_done or self.failed:
            return []
        try:
            payloads = self._sse.decode_data(data)
        except SSETooLarge:
            self.failed = True
            return [BackendStreamError("the backend sent an oversized stream event")]
        return self._convert(payloads)

    def flush(self) -> list[Any]:
        if self.saw_done or self.failed:
            return []
        return self._convert([event.data for event in self._sse.flush()])

    @property
    def finished(self) -> bool:
        """`[DONE]` was seen or the stream became unreadable: stop reading."""
        return self.saw_done or self.failed

    def _convert(self, payloads: list[bytes]) -> list[Any]:
        done = b"[DONE]" in payloads
        if done:
            payloads = payloads[: payloads.index(b"[DONE]")]
        try:
            out = [_loads(payload) for payload in payloads]  # the hot path: every payload is JSON
        except orjson.JSONDecodeError:
            out = []
            for payload in payloads:
                try:
                    out.append(_loads(payload))
                except orjson.JSONDecodeError:
                    self.failed = True
                    out.append(BackendStreamError("the backend sent data that is not JSON"))
                    return out
        if done:
            self.saw_done = True
            out.append(DONE)
        return out


_loads = orjson.loads
