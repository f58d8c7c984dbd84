"""What a caller may do now: requests and tokens per minute, concurrent streams, models, MCP
servers; a refusal is a 429 with Retry-After (or 404 for a model the key may not use, as
OpenAI answers)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import trio

from ..errors import GatewayError, NotFound, RateLimited
from .model import ANONYMOUS, ApiKey, Caller, KeyLimits, KeyStore

__all__ = ["Limiter", "StreamSlot", "reset_text", "token_reservation"]


@dataclass
class StreamSlot:
    """What an admitted request holds until it ends: a concurrent-stream slot (`pool`, `slot`),
    and the tokens reserved for it, by minute counter."""

    pool: str | None = None
    slot: str | None = None
    reserved: dict[str, int] = field(default_factory=dict)
    released: bool = False


class Limiter:
    """Per-key limits, counted in the key store (shared by every instance on Redis).

    Windows are whole minutes of wall-clock time: a refusal's Retry-After is
    the time left in the minute.  Tokens are reserved when a request is
    admitted (its input, estimated, plus the most it may generate) and
    settled from its usage when it ends; a request is admitted while the
    minute's count, reservations included, is below the limit, so parallel
    requests on any number of instances exceed it by at most one
    reservation.  Stream slots are leased, renewed by the process that
    holds them (`run_renewals`), so a dead process frees its slots after
    one lease.
    """

    def __init__(self, store: KeyStore | None, *, clock: Callable[[], float] = time.time, lease: float = 60.0) -> None:
        self.store = store
        self._clock = clock
        self._lease = lease
        self._held: dict[str, set[str]] = {}  # pool -> slots this process holds

    def _minute(self) -> tuple[int, float]:
        now = self._clock()
        return int(now // 60), 60.0 - now % 60

    async def admit_request(self, caller: Caller) -> None:
        """Count one request against the caller's requests per minute.

        Raises:
            RateLimited: over the limit.
        """
        rpm = caller.limits.rpm
        if rpm is None or caller.key is None or self.store is None:
            return
        minute, left = self._minute()
        used = rpm + 1 if rpm <= 0 else await self.store.add(f"rpm:{caller.key.id}:{minute}", 1, ttl=120)
        _note_rate(caller, "requests", rpm, used, left)
        if used > rpm:
            raise RateLimited(
                f"Rate limit reached for requests: this key may make {rpm} requests per minute.", retry_after=left
            )

    def check_model(self, caller: Caller, model: str) -> None:
        """Raises NotFound (`model_not_found`, as OpenAI answers) when the key may not use `model`."""
        if caller.key is not None and not caller.limits.allows_model(model):
            raise NotFound(
                f"The model '{model}' does not exist or you do not have access to it.",
                param="model",
                code="model_not_found",
            )

    async def admit_stream(self, caller: Caller, model: str, slot: str, *, tokens: int = 0) -> StreamSlot | None:
        """Check the model, reserve `tokens` against the tokens per minute and take a stream slot,
        before any backend call.

        Returns what to give back when the request ends (`settle`), or None
        when the caller has no such limits.

        Raises:
            NotFound: the key may not use `model` (`model_not_found`, as OpenAI answers).
            RateLimited: tokens per minute used up, or too many streams at once.
        """
        limits = caller.limits
        if caller.key is None:
            return None
        self.check_model(caller, model)
        if self.store is None or (limits.tpm is None and limits.concurrency is None):
            return None
        held = StreamSlot()
        await self.reserve(held, caller, tokens)
        if limits.concurrency is not None:
            pool = f"streams:{caller.key.id}"
            now = self._clock()
            if limits.concurrency <= 0 or not await self.store.acquire(
                pool, slot, limits.concurrency, now + self._lease, now
            ):
                await self.release(held)  # the reservation goes back
                raise RateLimited(
                    f"Rate limit reached for concurrent streams: this key may hold {limits.concurrency} at once.",
                    retry_after=1.0,
                )
            self._held.setdefault(pool, set()).add(slot)
            held.pool, held.slot = pool, slot
        return held

    async def reserve(self, held: StreamSlot | None, caller: Caller, tokens: int) -> None:
        """Reserve `tokens` more for an admitted request (its first backend round, or a later one:
        a tool loop's every round is admitted like a request of its own).

        Raises:
            RateLimited: the key's tokens per minute are used up (`type: tokens`).
        """
        tpm = caller.limits.tpm
        if held is None or tpm is None or caller.key is None or self.store is None:
            return
        minute, left = self._minute()
        counter = f"tpm:{caller.key.id}:{minute}"
        amount = max(0, tokens)
        taken, used = (False, 0) if tpm <= 0 else await self.store.reserve(counter, amount, tpm, ttl=120)
        _note_rate(caller, "tokens", tpm, used, left)
        if not taken:
            raise RateLimited(
                f"Rate limit reached for tokens: this key may use {tpm} tokens per minute and has used or reserved {used}.",
                retry_after=left,
                kind="tokens",
            )
        held.reserved[counter] = held.reserved.get(counter, 0) + amount

    async def release(self, slot: StreamSlot | None) -> None:
        """Give back a stream slot and its reservations, counting nothing."""
        await self.settle(slot, ANONYMOUS, 0)

    async def settle(self, slot: StreamSlot | None, caller: Caller, tokens: int | None) -> None:
        """A request ended: give back its slot, and replace its reservations by the tokens it used
        (counted against this minute's limit and the key's total), in one store call, whatever
        happens to it.

        `tokens=None`: its usage is unknown (a relayed body whose usage never
        came), so what it reserved stays counted.
        """
        release = None
        counters: list[tuple[str, int, float]] = []
        if slot is not None and not slot.released:
            slot.released = True
            if slot.pool is not None and slot.slot is not None:
                held = self._held.get(slot.pool)
                if held is not None:
                    held.discard(slot.slot)
                    if not held:
                        del self._held[slot.pool]
                release = (slot.pool, slot.slot)
            if tokens is not None:
                counters += [(counter, -amount, 120.0) for counter, amount in slot.reserved.items() if amount]
        if caller.key is not None and tokens:
            if caller.limits.tpm is not None:  # (the minute's count matters only to a key with a limit)
                minute, _ = self._minute()
                counters.append((f"tpm:{caller.key.id}:{minute}", tokens, 120.0))
            counters.append((f"tokens:{caller.key.id}", tokens, 0.0))
        if self.store is None or (release is None and not counters):
            return
        with trio.CancelScope(shield=True, deadline=trio.current_time() + 5):  # whatever happens to the request
            await self.store.settle(release, counters)

    async def tokens_used(self, key: ApiKey) -> int:
        return await self.store.read(f"tokens:{key.id}") if self.store is not None else 0

    async def run_renewals(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Renew the slots this process holds, a third of a lease apart, until cancelled."""
        task_status.started()
        while True:
            await trio.sleep(self._lease / 3)
            if self.store is None:
                continue
            until = self._clock() + self._lease
            for pool, slots in list(self._held.items()):
                try:
                    await self.store.renew(pool, sorted(slots), until)
                except GatewayError:
                    pass  # retried at the next renewal; a lease outlives two missed ones


# The fields of a generation request that are its input (Chat Completions,
# completions, embeddings, Anthropic Messages): their JSON, a quarter token a byte.
_INPUT_FIELDS = ("messages", "prompt", "input", "system", "tools", "functions")
_OUTPUT_FIELDS = ("max_completion_tokens", "max_tokens", "max_output_tokens")


def token_reservation(body: Mapping[str, Any], limits: KeyLimits, *, generates: bool = True) -> tuple[int, int | None]:
    """What a request reserves against its key's tokens per minute: (tokens, max_tokens to set).

    Its input, estimated at four bytes of JSON a token, plus the most it may
    generate: its own maximum, else the key's output reservation -- which is
    then also the maximum the backend is given (the second value), so that
    what it reserved bounds what it can use.  (0, None) for a key without a
    token limit.
    """
    if limits.tpm is None:
        return 0, None
    import orjson  # the keys package is imported by the CLI too; orjson is only needed here

    given = {name: body[name] for name in _INPUT_FIELDS if body.get(name) is not None}
    tokens = len(orjson.dumps(given)) // 4 if given else 0
    if not generates:
        return tokens, None
    for name in _OUTPUT_FIELDS:
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return tokens + value, None
    return tokens + limits.output_reservation, limits.output_reservation


def _note_rate(caller: Caller, kind: str, limit: int, used: int, reset: float) -> None:
    """What OpenAI's `x-ratelimit-*` headers say of one limit, noted on the caller for the edge."""
    caller.rate[f"x-ratelimit-limit-{kind}"] = str(limit)
    caller.rate[f"x-ratelimit-remaining-{kind}"] = str(max(0, limit - used))
    caller.rate[f"x-ratelimit-reset-{kind}"] = reset_text(reset)


def reset_text(seconds: float) -> str:
    """A duration as OpenAI writes it in `x-ratelimit-reset-*`: `20ms`, `1.5s`, `6m0s`."""
    if seconds < 1:
        return f"{max(0, round(seconds * 1000))}ms"
    minutes, rest = divmod(seconds, 60)
    text = f"{round(rest, 3):g}s"
    return f"{int(minutes)}m{text}" if minutes else text
