"""Streams: the pure translator and the async shells that feed it.

`ResponseTranslator` (chat chunks -> Responses events) is usable on its own.
"""

from .chunks import DONE, ChunkDecoder
from .sse import SSEDecoder, encode_event
from .translator import ResponseTranslator, usage_from_chat

__all__ = ["DONE", "ChunkDecoder", "ResponseTranslator", "SSEDecoder", "encode_event", "usage_from_chat"]
