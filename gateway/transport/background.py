"""Background responses: run after the request has returned, in a server-owned nursery.

`BackgroundRunner.run` is a long-running task the app starts in its
lifespan nursery; every background job is a child of the runner's own
nursery, so shutdown cancels them all and waits until each has recorded
that it was cancelled.  A job publishes its events to in-process followers
(`GET ?stream=true` on this instance) and saves its record when it starts,
about once a second while it runs (so other instances can follow and
cancel it through the store), and when it ends.

A record whose status is terminal always ends its event log with that
end's terminal event: only the job's end (or a cancel, or a lost lease)
writes a terminal status, together with its terminal events.  A progress
save never does, however the turn's own state has moved on by the time it
runs (its terminal event is held until the end is stored, and the save
may run in between).

A running job holds a lease in its record (`lease_until`), renewed with
each progress save.  A process that dies (SIGKILL, a crash, a lost machine)
cannot say so; its jobs' leases run out instead.  At start-up, and whenever
a client reads or follows such a record, an expired lease ends the response
as `failed` with the terminal events its followers are waiting for.  Every
change of a running record goes through the store's `update` (a
compare-and-set): the first terminal status written wins.

A job is a turn (`gateway.turn`) run in the runner's nursery instead of a
request's; the runner knows the store and the turn, not HTTP.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any

import trio

from ..errors import ShuttingDown, StoreUnavailable
from ..store import ResponseStore, StoredResponse
from ..store.base import OwnerView, save_retrying
from ..streams.translator import cancel_recorded, ends_with_terminal, fail_recorded
from ..turn import Turn

__all__ = ["LEASE_SECONDS", "BackgroundJob", "BackgroundRunner", "queued_snapshot"]

log = logging.getLogger("gateway.background")

_SAVE_EVERY = 1.0  # seconds between progress saves of a running job
LEASE_SECONDS = 15.0  # the default: a lease outlives many missed renewals before it is judged lost
TERMINAL = frozenset({"completed", "incomplete", "failed", "cancelled"})
_LOST = "The gateway instance running this background response stopped before it finished."


class BackgroundJob:
    """One running background response and its event log (what followers on this instance read)."""

    def __init__(self, record: StoredResponse, turn: Turn) -> None:
        self.record = record
        self.turn = turn
        self.events: list[dict[str, Any]] = record.events
        self.scope = trio.CancelScope()
        self.finished = trio.Event()
        self._changed = trio.Event()

    @property
    def id(self) -> str:
        return self.record.id

    def snapshot(self) -> dict[str, Any]:
        response = dict(self.turn.response)
        response["output"] = list(response.get("output") or ())
        return response

    async def publish(self, events: list[dict[str, Any]]) -> None:
        if events:
            self.events.extend(events)
            self._changed.set()
            self._changed = trio.Event()

    def changed_event(self) -> trio.Event:
        """Set at the next publish (or when the job ends): take it before reading `events`."""
        return self._changed


class BackgroundRunner:
    def __init__(
        self,
        store: ResponseStore,
        *,
        clock: Callable[[], float] = time.time,
        retry_seconds: float = 2.0,
        lease_seconds: float = LEASE_SECONDS,
    ) -> None:
        self._store = store
        self._lease = lease_seconds
        self._clock = clock
        self._retry = retry_seconds
        self._jobs: dict[str, BackgroundJob] = {}
        self._nursery: trio.Nursery | None = None
        self.stopped = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the jobs' nursery until cancelled (the app's shutdown).

        First ends the responses whose process died (expired leases).
        """
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await self.end_lost()
                await trio.sleep_forever()
        finally:
            self._nursery = None
            self.stopped.set()

    async def end_lost(self) -> int:
        """End every stored response whose lease has expired; how many were ended."""
        try:
            expired = await self._store.expired_leases(self._clock())
            ended = 0
            for response_id in expired:
                record = await self._store.update(response_id, _lost_change(self._clock()))
                ended += record is not None and record.lease_until is None
        except StoreUnavailable:
            log.warning("could not look for lost background responses: the store is unavailable")
            return 0
        if ended:
            log.info("ended %d background responses whose gateway instance had stopped", ended)
        return ended

    async def load(self, response_id: str, owner: str | None = None) -> StoredResponse | None:
        """A stored response `owner` may see; one whose process died is ended first (expired lease).

        Raises:
            StoreUnavailable: the store failed.
        """
        record = await OwnerView(self._store, owner).load(response_id)
        if record is not None and _lease_expired(record, self._clock()):
            record = await self._store.update(response_id, _lost_change(self._clock()))
        return record

    async def cancel_stored(self, response_id: str) -> StoredResponse | None:
        """Record a cancel for a response another instance runs (it sees it at its next save).

        Raises:
            StoreUnavailable: the store failed.
        """

        def cancel(record: StoredResponse) -> StoredResponse | None:
            if record.response.get("status") in TERMINAL:
                return None
            record.events += cancel_recorded(record.response, record.events)
            record.lease_until = None
            return record

        return await self._store.update(response_id, cancel)

    def shutdown(self) -> None:
        """Cancel every job (each records that it was cancelled) and stop."""
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()
        else:
            self.stopped.set()

    def job(self, response_id: str, owner: str | None = None) -> BackgroundJob | None:
        """The job running here for response `response_id`, if `owner` may see it."""
        job = self._jobs.get(response_id)
        return job if job is not None and job.turn.caller.owner == owner else None

    async def start(self, turn: Turn) -> BackgroundJob:
        """Store the queued response, then run it; returns at once.

        Raises:
            ShuttingDown: the runner is not running (the app is shutting down).
            StoreUnavailable: the queued response could not be stored.
        """
        if self._nursery is None:
            raise ShuttingDown.refusal()
        record = turn.record([], queued_snapshot(turn.response))
        record.lease_until = self._clock() + self._lease
        await save_retrying(self._store, record, within=self._retry)
        job = BackgroundJob(record, turn)
        self._jobs[job.id] = job
        self._nursery.start_soon(self._run_job, job)
        return job

    def cancel(self, response_id: str) -> bool:
        job = self._jobs.get(response_id)
        if job is None:
            return False
        job.scope.cancel()
        return True

    async def _run_job(self, job: BackgroundJob) -> None:
        turn = job.turn
        try:
            with job.scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._save_progress, job)
                    await turn.run(job.publish, persist=functools.partial(self._store_end, job))
                    nursery.cancel_scope.cancel()
        finally:
            if not turn.translator.done:
                # Cancelled (by the client, another instance or shutdown): say so, to the
                # followers here and in the record.
                ending = cancel_recorded(turn.response, job.events)
                turn.outcome.status = "cancelled"
                with trio.CancelScope(shield=True), trio.move_on_after(self._retry + 5):
                    try:
                        instead = await self._store_end(job, turn.record([*job.events, *ending], dict(turn.response)))
                    except StoreUnavailable:
                        log.warning("could not record that background response %s was cancelled", job.id)
                    else:
                        ending = ending if instead is None else instead
                await job.publish(ending)
            job.record.response = job.snapshot()
            self._jobs.pop(job.id, None)
            job.finished.set()
            job._changed.set()
            turn.finish()

    async def _store_end(self, job: BackgroundJob, record: StoredResponse) -> list[dict[str, Any]] | None:
        """Store the job's end (compare-and-set: the first end stands).

        Returns the stored events to end with instead when the response had
        already ended elsewhere (a cancel, a lost lease).
        """
        record.lease_until = None
        if not ends_with_terminal(record.events):  # a bug, not a state to store
            log.error("background response %s ended without a terminal event", job.id)
        taken: list[StoredResponse] = []

        def finish(stored: StoredResponse) -> StoredResponse | None:
            taken[:] = [stored]
            return None if stored.response.get("status") in TERMINAL else record

        deadline = trio.current_time() + self._retry
        while True:
            try:
                await self._store.update(job.id, finish)
                break
            except StoreUnavailable:
                if trio.current_time() >= deadline:
                    raise
                await trio.sleep(0.1)
        if taken and taken[0].response.get("status") in TERMINAL:
            last = job.events[-1]["sequence_number"] if job.events else -1
            return [e for e in taken[0].events if e.get("sequence_number", -1) > last]
        return None

    def _progress_record(self, job: BackgroundJob) -> StoredResponse:
        """The running job as a progress save writes it: never with a terminal status (the turn
        may have ended already, its terminal event held until `_store_end` stores it)."""
        snapshot = job.snapshot()
        if snapshot.get("status") in TERMINAL:
            snapshot["status"] = "in_progress"
        record = job.turn.record(list(job.events), snapshot)
        record.lease_until = self._clock() + self._lease
        return record

    async def _save_progress(self, job: BackgroundJob) -> None:
        """Save now and then, renewing the lease; a cancel recorded elsewhere stops the job."""
        saved = -1
        renewed = trio.current_time()
        while True:
            await trio.sleep(_SAVE_EVERY)
            # Write when something changed, and often enough to keep the lease.
            if len(job.events) == saved and trio.current_time() - renewed < self._lease / 3 - _SAVE_EVERY:
                stored = await self._quietly(self._store.load(job.id))
                stop = stored is not None and stored.response.get("status") in TERMINAL
            else:
                count = len(job.events)
                stop, written = await self.save_progress(job)
                if written:
                    saved, renewed = count, trio.current_time()
            if stop:
                job.scope.cancel()
                return

    async def save_progress(self, job: BackgroundJob) -> tuple[bool, bool]:
        """One progress save: (the response has ended elsewhere, the save was written)."""
        ended = False

        def progress(stored: StoredResponse) -> StoredResponse | None:
            nonlocal ended
            if stored.response.get("status") in TERMINAL:
                ended = True
                return None
            return self._progress_record(job)

        written = await self._quietly(self._store.update(job.id, progress)) is not None and not ended
        return ended, written

    async def _quietly(self, call: Any) -> Any:
        try:
            return await call
        except StoreUnavailable:
            log.debug("progress save of a background response failed; retried at the next one")
            return None


def _lease_expired(record: StoredResponse, now: float) -> bool:
    return (
        record.lease_until is not None
        and record.lease_until < now
        and record.response.get("status") not in TERMINAL
    )


def _lost_change(now: float) -> Callable[[StoredResponse], StoredResponse | None]:
    def lost(record: StoredResponse) -> StoredResponse | None:
        if not _lease_expired(record, now):
            return None
        record.events += fail_recorded(record.response, record.events, "server_error", _LOST)
        record.lease_until = None
        return record

    return lost


def queued_snapshot(response: dict[str, Any]) -> dict[str, Any]:
    snapshot = dict(response)
    snapshot["status"] = "queued"
    snapshot["output"] = []
    return snapshot
