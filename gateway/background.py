"""Background responses: run after the request has returned, in a server-owned nursery.

`BackgroundRunner.run` is a long-running task the app starts in its
lifespan nursery; every background job is a child of the runner's own
nursery, so shutdown cancels them all and waits until each has recorded
that it was cancelled.  A job publishes its events to in-process followers
(`GET ?stream=true` on this instance) and saves its record when it starts,
about once a second while it runs (so other instances can follow and
cancel it through the store), and when it ends.

The runner knows the store and the backend interfaces, not HTTP.
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from .backend import ChatBackend
from .errors import GatewayError, InternalError
from .store import ResponseStore, StoredResponse
from .streams.relay import collect_response, fail_with
from .streams.toolloop import ToolLoop
from .streams.translator import ResponseTranslator

__all__ = ["BackgroundJob", "BackgroundRunner", "queued_snapshot"]

log = logging.getLogger("gateway.background")

_SAVE_EVERY = 1.0  # seconds between progress saves of a running job
TERMINAL = frozenset({"completed", "incomplete", "failed", "cancelled"})


class BackgroundJob:
    """One running background response and its event log."""

    def __init__(self, record: StoredResponse, translator: ResponseTranslator) -> None:
        self.record = record
        self.translator = translator
        self.events: list[dict[str, Any]] = record.events
        self.scope = trio.CancelScope()
        self.finished = trio.Event()
        self._changed = trio.Event()

    @property
    def id(self) -> str:
        return self.record.id

    def snapshot(self) -> dict[str, Any]:
        response = dict(self.translator.response)
        response["output"] = list(response.get("output") or ())
        return response

    def publish(self, events: list[dict[str, Any]]) -> None:
        if events:
            self.events.extend(events)
            self._changed.set()
            self._changed = trio.Event()

    def changed_event(self) -> trio.Event:
        """Set at the next publish (or when the job ends): take it before reading `events`."""
        return self._changed


class BackgroundRunner:
    def __init__(self, store: ResponseStore, backend: ChatBackend) -> None:
        self._store = store
        self._backend = backend
        self._jobs: dict[str, BackgroundJob] = {}
        self._nursery: trio.Nursery | None = None
        self.stopped = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the jobs' nursery until cancelled (the app's shutdown)."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None
            self.stopped.set()

    def shutdown(self) -> None:
        """Cancel every job (each records that it was cancelled) and stop."""
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()
        else:
            self.stopped.set()

    def job(self, response_id: str) -> BackgroundJob | None:
        return self._jobs.get(response_id)

    async def start(
        self, record: StoredResponse, translator: ResponseTranslator, body: dict[str, Any], loop: ToolLoop | None = None
    ) -> BackgroundJob:
        """Store the queued response, then run it; returns at once.

        Raises:
            InternalError: the runner is not running (the app is shutting down).
        """
        if self._nursery is None:
            raise InternalError("The gateway is shutting down; background responses cannot start.")
        job = BackgroundJob(record, translator)
        await self._store.save(record)
        self._jobs[job.id] = job
        self._nursery.start_soon(self._run_job, job, body, loop)
        return job

    def cancel(self, response_id: str) -> bool:
        job = self._jobs.get(response_id)
        if job is None:
            return False
        job.scope.cancel()
        return True

    async def _run_job(self, job: BackgroundJob, body: dict[str, Any], loop: ToolLoop | None) -> None:
        translator = job.translator
        try:
            with job.scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._save_progress, job)
                    try:
                        await collect_response(self._backend, body, translator, on_events=job.publish, loop=loop)
                    except GatewayError as error:
                        if not translator.done:
                            job.publish(fail_with(translator, error))
                    except Exception:
                        log.debug("background job %s failed", job.id, exc_info=True)
                        if not translator.done:
                            job.publish(fail_with(translator, InternalError("The background response failed.")))
                    nursery.cancel_scope.cancel()
        finally:
            if not translator.done or translator.response.get("status") not in TERMINAL:
                # Cancelled (by the client or by shutdown): say so in the record.
                translator.response["status"] = "cancelled"
            job.record.response = job.snapshot()
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                try:
                    await self._store.save(job.record)
                except Exception:
                    log.warning("could not store background response %s", job.id)
            self._jobs.pop(job.id, None)
            job.finished.set()
            job._changed.set()

    async def _save_progress(self, job: BackgroundJob) -> None:
        """Save now and then; a cancel recorded by another instance stops the job."""
        saved = -1
        while True:
            await trio.sleep(_SAVE_EVERY)
            stored = await self._store.load(job.id)
            if stored is not None and stored.response.get("status") == "cancelled":
                job.scope.cancel()
                return
            if len(job.events) != saved:
                saved = len(job.events)
                job.record.response = job.snapshot()
                await self._store.save(job.record)


def queued_snapshot(response: dict[str, Any]) -> dict[str, Any]:
    snapshot = dict(response)
    snapshot["status"] = "queued"
    snapshot["output"] = []
    return snapshot

