"""Event streams of responses that already exist: a stored one replayed, a running one followed.

    EventReplay    an SSE body over any of the streams below
    replay         a stored response's events after `starting_after`, then `[DONE]`
    follow_job     a background response running here, live, until it ends
                   (the job goes on if the follower leaves)
    follow_store   a background response running on another instance,
                   through the store's saves, until its status is terminal

A stored event log always ends with its terminal event (transport/background.py
keeps it so), so every one of these ends with one, then `[DONE]`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import trio

from ..store import StoredResponse
from ..streams.sse import encode_done, encode_event
from .background import TERMINAL, BackgroundJob
from .body import DeferredHeadBody
from .sse import SSE_HEADERS

__all__ = ["STORE_POLL", "EventReplay", "follow_job", "follow_store", "replay"]

STORE_POLL = 0.5  # seconds between a follower's reads of a record another instance saves


class EventReplay(DeferredHeadBody):
    """An SSE body whose events come from `events` (one of the streams of this module)."""

    def __init__(self, events: AsyncIterator[bytes]) -> None:
        self._events = events

    async def head(self) -> tuple[int, dict[str, str]]:
        return 200, dict(SSE_HEADERS)

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._events


async def replay(record: StoredResponse, after: int) -> AsyncIterator[bytes]:
    """A stored response's events after sequence number `after`, then `[DONE]`, as one write."""
    yield b"".join(encode_event(e) for e in record.events if e.get("sequence_number", 0) > after) + encode_done()


async def follow_job(job: BackgroundJob, after: int) -> AsyncIterator[bytes]:
    """A running job's events after `after`, live, until it ends (the job goes on if the client leaves)."""
    index = 0
    while True:
        changed = job.changed_event()
        new = job.events[index:]
        index += len(new)
        data = b"".join(encode_event(e) for e in new if e.get("sequence_number", 0) > after)
        if data:
            yield data
        if job.finished.is_set() and index >= len(job.events):
            break
        await changed.wait()
    yield encode_done()


async def follow_store(
    load: Callable[[str], Awaitable[StoredResponse | None]], response_id: str, after: int
) -> AsyncIterator[bytes]:
    """Follow a response another instance is running, through the store's saves.

    `load` reads the record (ending it first when its instance died).
    """
    while True:
        record = await load(response_id)
        if record is None:
            break
        new = [e for e in record.events if e.get("sequence_number", 0) > after]
        if new:
            after = new[-1]["sequence_number"]
            yield b"".join(encode_event(e) for e in new)
        if record.response.get("status") in TERMINAL:
            break
        await trio.sleep(STORE_POLL)
    yield encode_done()
