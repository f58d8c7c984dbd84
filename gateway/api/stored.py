"""Stored responses: what `GET`, `DELETE`, `/cancel` and `/input_items` answer.

Each takes the response id and the caller's owner (responses another key
made answer exactly as ids that do not exist), and returns the body to
send: JSON, or an event stream (a stored response replayed, a running one
followed here or, through the store, on another instance).

Raises `NotFound` (`response_not_found`), `InvalidRequest` and
`StoreUnavailable` for the renderer to answer.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import trio

from ..errors import InvalidRequest, NotFound
from ..store import ResponseStore, StoredResponse
from ..store.base import OwnerView
from ..transport.background import TERMINAL, BackgroundRunner
from ..transport.body import DeferredHeadBody
from ..transport.follow import EventReplay, follow_job, follow_store, replay
from ..transport.json import JsonBody
from .args import flag_arg, int_arg, page
from .routes import Call

__all__ = ["StoredResponses", "cancel", "delete", "get", "input_items"]


class StoredResponses:
    def __init__(self, runner: BackgroundRunner, store: ResponseStore) -> None:
        self._runner = runner
        self._store = store

    async def record(self, response_id: str, owner: str | None) -> StoredResponse:
        """The stored response `owner` may see (one whose instance died is ended first).

        Raises:
            NotFound: no such response for this caller.
        """
        record = await self._runner.load(response_id, owner)
        if record is None:
            raise NotFound(f"Response with id '{response_id}' not found.", param="response_id", code="response_not_found")
        return record

    async def get(self, response_id: str, owner: str | None, args: Mapping[str, str]) -> DeferredHeadBody:
        """The response (`?stream=true`: its events after `starting_after`, live while it runs)."""
        streaming = flag_arg(args, "stream")
        after = int_arg(args, "starting_after", -1)
        job = self._runner.job(response_id, owner)
        if job is not None:
            return EventReplay(follow_job(job, after)) if streaming else JsonBody(job.snapshot())
        record = await self.record(response_id, owner)
        if not streaming:
            return JsonBody(record.response)
        if record.response.get("status") not in TERMINAL:  # running on another instance
            return EventReplay(follow_store(functools.partial(self._runner.load, owner=owner), response_id, after))
        return EventReplay(replay(record, after))

    async def cancel(self, response_id: str, owner: str | None) -> JsonBody:
        """Stop a background response (here at once; on another instance, it sees it within a second)."""
        job = self._runner.job(response_id, owner)
        if job is not None:
            self._runner.cancel(response_id)
            with trio.move_on_after(5):
                await job.finished.wait()
            return JsonBody(job.record.response)
        record = await self.record(response_id, owner)
        if not record.response.get("background"):
            raise InvalidRequest(
                "Only responses created with background=true can be cancelled.", param="response_id", code="invalid_value"
            )
        if record.response.get("status") not in TERMINAL:
            record = await self._runner.cancel_stored(response_id) or record
        return JsonBody(record.response)

    async def delete(self, response_id: str, owner: str | None) -> JsonBody:
        if not await OwnerView(self._store, owner).delete(response_id):
            raise NotFound(f"Response with id '{response_id}' not found.", param="response_id", code="response_not_found")
        return JsonBody({"id": response_id, "object": "response.deleted", "deleted": True})

    async def input_items(self, response_id: str, owner: str | None, args: Mapping[str, str]) -> JsonBody:
        record = await self.record(response_id, owner)
        return JsonBody(page(record.input_items, args))


def _stored(call: Call) -> StoredResponses:
    return StoredResponses(call.shared.runner, call.shared.resources.store)


async def get(call: Call) -> DeferredHeadBody:
    return await _stored(call).get(call.params["response_id"], call.ctx.caller.owner, call.args)


async def cancel(call: Call) -> DeferredHeadBody:
    return await _stored(call).cancel(call.params["response_id"], call.ctx.caller.owner)


async def delete(call: Call) -> DeferredHeadBody:
    return await _stored(call).delete(call.params["response_id"], call.ctx.caller.owner)


async def input_items(call: Call) -> DeferredHeadBody:
    return await _stored(call).input_items(call.params["response_id"], call.ctx.caller.owner, call.args)
