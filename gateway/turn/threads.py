"""Message threads: the Messages API's `thread`, held by the gateway for every backend.

A client that threads (the anthropic SDKs' tool runners and `thread.send()`,
with `anthropic-beta: message-threads-2026-08-12`) sends the conversation
once, with `thread: {"type": "create"}`, and afterwards only what is new,
with `thread: {"type": "continue", "previous_message_id": <the last answer's
id>}` and without the fields a thread is created with (`system`, `tools`).
The gateway keeps each answer's thread in the store (`StoredThread`, under
the answer's `msg_…` id, its key's own, expiring `STORE_TTL` after its last
write) and puts it back before the new messages, so that every backend gets
the whole conversation.  An Anthropic backend gets it whole as well, without
`thread`: the ids it would hold are not the ones the client was given.

    open_thread      before the turn is admitted: a `create` noted; a
                     `continue` found, checked, claimed (one continue per
                     answer and one at a time: a compare-and-set on the stored
                     thread, which holds across every process sharing a Redis)
                     and its history, `system` and `tools` put back
    Threading.keep   the answer is complete (before its last events go out,
                     so that a client continuing at once finds it): its thread
                     stored, the answer it continued marked as continued
    Threading.release  the turn ended without an answer: the claim let go, so
                     the same answer can be continued again

The refusals (`ThreadRefused`, with `error.details.error_code`): see
`_refusal`'s callers.  `restore` and `fingerprint_mismatch` are pure.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import GatewayError, ThreadRefused
from ..store.base import ResponseStore, StoredThread
from ..wire.messages import check_tool_results

__all__ = ["CREATE_ONLY", "THREADS_BETA", "Threading", "fingerprint_mismatch", "open_thread", "restore"]

log = logging.getLogger("gateway.turn")

THREADS_BETA = "message-threads-2026-08-12"
CREATE_ONLY = ("system", "tools")  # what a thread is created with, and a continue may not change
# How long a continue holds its answer: a process that dies mid-turn lets go after this.
CLAIM_SECONDS = 900.0
# What threads cannot be combined with, as Anthropic answers it (`unsupported`).
_UNSUPPORTED = ("context_management",)
_PARAM = "thread.previous_message_id"


def fingerprint_mismatch(body: Mapping[str, Any], stored: StoredThread) -> list[str]:
    """The create-only fields `body` sends again with another value than the thread's."""
    kept = {"system": stored.system, "tools": stored.tools}
    return [name for name in CREATE_ONLY if name in body and body[name] is not None and body[name] != kept[name]]


def restore(body: dict[str, Any], stored: StoredThread) -> None:
    """`body` (a continue) made whole, in place: the thread's messages before its own, and the
    thread's `system` and `tools`; no `thread` left.

    Raises:
        InvalidRequest: a new `tool_result` answers no `tool_use` of the conversation.
    """
    new = body["messages"]
    check_tool_results(new, stored.messages)
    body["messages"] = [*stored.messages, *new]
    for name, value in (("system", stored.system), ("tools", stored.tools)):
        if value is not None:
            body[name] = value
        else:
            body.pop(name, None)
    body.pop("thread", None)


def _readable(thread: StoredThread) -> bool:
    messages = thread.messages
    return (
        isinstance(messages, list)
        and bool(messages)
        and all(isinstance(m, dict) and m.get("role") in ("user", "assistant", "system") and "content" in m for m in messages)
        and (thread.tools is None or isinstance(thread.tools, list))
    )


@dataclass
class Threading:
    """A turn's thread: what to store once its answer is made (`keep`), or let go (`release`)."""

    store: ResponseStore
    clock: Callable[[], float]
    owner: str | None
    messages: list[dict[str, Any]]  # the whole conversation the answer is to follow
    system: Any
    tools: list[Any] | None
    answer_id: str
    parent: str | None = None  # the answer it continues (claimed), for a continue
    kept: bool = False

    async def keep(self, message: Mapping[str, Any]) -> None:
        """Store the thread as of `message` (the complete answer) and mark the one it continued.
        A store that fails is logged: the client's next continue then finds no thread, and
        its SDK sends the whole conversation again."""
        self.kept = True
        thread = StoredThread(
            id=self.answer_id,
            created_at=int(self.clock()),
            messages=[*self.messages, {"role": "assistant", "content": list(message.get("content") or [])}],
            system=self.system,
            tools=self.tools,
            owner=self.owner,
        )
        try:
            await self.store.save_thread(thread)
            if self.parent is not None:
                await self.store.update_thread(self.parent, self._continued)
        except GatewayError as error:
            log.warning("message thread %s not stored: %s", self.answer_id, error.cause or error.message)

    async def release(self) -> None:
        """The turn ended without an answer: the answer it continued may be continued again."""
        if self.parent is None or self.kept:
            return
        try:
            await self.store.update_thread(self.parent, self._released)
        except GatewayError as error:  # the claim lapses on its own (CLAIM_SECONDS)
            log.warning("message thread %s not released: %s", self.parent, error.cause or error.message)

    def _continued(self, current: StoredThread) -> StoredThread | None:
        if current.next != self.answer_id:
            return None
        current.next_until = None
        return current

    def _released(self, current: StoredThread) -> StoredThread | None:
        if current.next != self.answer_id or current.next_until is None:
            return None
        current.next = current.next_until = None
        return current


async def open_thread(
    store: ResponseStore,
    body: dict[str, Any],
    *,
    owner: str | None,
    answer_id: str,
    clock: Callable[[], float],
    enabled: bool = True,
    claim: bool = True,
) -> Threading | None:
    """The thread of a checked Messages body (`wire.messages`), None when it has none; a
    continue's `body` is made whole (`restore`) and its answer claimed for `answer_id`
    (`claim=False`, for a token count: only read).

    Raises:
        ThreadRefused: the thread cannot be used (the codes below).
        InvalidRequest: a new `tool_result` answers no `tool_use` of the conversation.
        StoreUnavailable: the store failed.
    """
    thread = body.get("thread")
    if thread is None:
        return None
    unsupported = [name for name in _UNSUPPORTED if body.get(name) is not None]
    if not enabled or unsupported:
        reason = (
            f"message threads cannot be combined with {', '.join(unsupported)}"
            if unsupported
            else "this gateway keeps no message threads (MESSAGE_THREADS is off)"
        )
        raise ThreadRefused(
            f"thread: {reason}; send the whole conversation without 'thread'.",
            "thread_unsupported_request",
            param=unsupported[0] if unsupported else "thread",
            unsupported=unsupported,
        )
    if thread["type"] == "create":
        body.pop("thread")
        return Threading(store, clock, owner, list(body["messages"]), body.get("system"), body.get("tools"), answer_id)
    previous = thread["previous_message_id"]
    try:
        stored = await store.load_thread(previous)
    except ValueError:  # (the record's bytes are not a thread: `decode_thread`)
        stored = None
        unreadable = True
    else:
        unreadable = stored is not None and not _readable(stored)
    if unreadable:
        raise ThreadRefused(
            f"{_PARAM}: the thread stored for '{previous}' cannot be read; send the whole conversation "
            "with thread type 'create'.",
            "thread_not_found",
            param=_PARAM,
        )
    if stored is None or stored.owner != owner:
        raise ThreadRefused(
            f"{_PARAM}: no message thread '{previous}' (unknown, expired, or not this key's); send the whole "
            "conversation with thread type 'create'.",
            "thread_not_found",
            status=404,
            param=_PARAM,
        )
    changed = fingerprint_mismatch(body, stored)
    if changed:
        names = " and ".join(f"'{name}'" for name in changed)
        raise ThreadRefused(
            f"{changed[0]}: {names} differ from the thread's; a continue keeps the values the thread was created "
            "with (send them unchanged or not at all, or start a new thread).",
            "thread_fingerprint_mismatch",
            param=changed[0],
        )
    _refuse_taken(stored, previous, clock())
    restore(body, stored)  # (raises before anything is claimed)
    threading = Threading(store, clock, owner, list(body["messages"]), stored.system, stored.tools, answer_id, previous)
    if claim:
        now = clock()

        def take(current: StoredThread) -> StoredThread | None:
            if _taken(current, now):
                return None
            current.next, current.next_until = answer_id, now + CLAIM_SECONDS
            return current

        claimed = await store.update_thread(previous, take)
        if claimed is None:
            raise ThreadRefused(
                f"{_PARAM}: no message thread '{previous}' (it expired); send the whole conversation with "
                "thread type 'create'.",
                "thread_not_found",
                status=404,
                param=_PARAM,
            )
        if claimed.next != answer_id:
            _refuse_taken(claimed, previous, now)
    else:
        threading.parent = None  # nothing claimed, nothing to keep: a count only reads
    return threading


def _taken(thread: StoredThread, now: float) -> bool:
    return thread.next is not None and (thread.next_until is None or thread.next_until > now)


def _refuse_taken(thread: StoredThread, previous: str, now: float) -> None:
    if not _taken(thread, now):
        return
    if thread.next_until is None:
        raise ThreadRefused(
            f"{_PARAM}: '{previous}' was already continued (by '{thread.next}'); continue from the thread's "
            "latest answer.",
            "thread_already_continued",
            param=_PARAM,
        )
    raise ThreadRefused(
        f"{_PARAM}: another request is continuing from '{previous}' now; wait for its answer and continue "
        "from that.",
        "thread_continue_in_flight",
        param=_PARAM,
    )
