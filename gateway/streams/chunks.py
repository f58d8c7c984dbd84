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

    def decode(self, data: bytes) -> list[Any]:
        """Chunks completed by `data`; stops at `[DONE]`.

        Raises:
            BackendStreamError: a payload is not JSON, or is too large.
        """
        try:
            return self._convert(self._sse.decode(data))
        except SSETooLarge:
            raise BackendStreamError("the backend sent an oversized stream event") from None

    def flush(self) -> list[Any]:
        return self._convert(self._sse.flush())

    def _convert(self, events: list[Any]) -> list[Any]:
        out: list[Any] = []
        if self.saw_done:
            return out
        for event in events:
            data = event.data
            if data == b"[DONE]":
                self.saw_done = True
                out.append(DONE)
                break
            try:
                out.append(orjson.loads(data))
            except orjson.JSONDecodeError:
                raise BackendStreamError("the backend sent data that is not JSON") from None
        return out
