"""What every turn is, whatever its front end: a Responses response (`engine.Turn`), a chat
completion or an Anthropic message (`chat.ChatTurn`).

    TurnBase.begin    the first round's request begun by the backend early
                      (while the transport sets up), once; `abandon` lets it go
    TurnBase.run      the skeleton: started, produced (the front end's own
                      `_produce`), then, whatever happened, its outcome
                      concluded and, shielded, settled (the stream slot given
                      back, the tokens counted)
    TurnBase.finish   what the transport saw of the delivery (`Delivery`),
                      handed over once: the outcome completed and reported

Admission of a tool loop's next round (its tokens reserved like a request's)
is the same for every turn.  Nothing here knows HTTP or bytes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from ..backends import ChatOpening
from ..errors import GatewayError
from ..keys import Caller, StreamSlot, token_reservation
from ..observe.outcome import TurnOutcome
from .rounds import Emit, Session, begin_round, report_outcome

if TYPE_CHECKING:
    from .engine import Resources

__all__ = ["Delivery", "TurnBase"]

log = logging.getLogger("gateway.turn")


@dataclass(frozen=True)
class Delivery:
    """What a transport saw of a turn's delivery, handed to `TurnBase.finish` once it is done."""

    client_left: bool = False
    first_event_at: float | None = None  # a stream's first write went out
    finished_at: float | None = None  # its last write went out (a stream lasts until then)
    status: int | None = None  # the status line sent, where the transport decided it (an error)
    socket: bool = False  # on a WebSocket: the turn had no status line of its own


class TurnBase:
    """The skeleton every turn shares (see the module docstring)."""

    session: Session

    def __init__(self, resources: Resources, caller: Caller, slot: StreamSlot | None, outcome: TurnOutcome) -> None:
        self.resources = resources
        self.caller = caller
        self.slot = slot
        self.outcome = outcome
        # The backend answered, or the turn failed before it did (`rejection`): until then a
        # transport may still answer with an HTTP error rather than a stream.
        self.answered = trio.Event()
        self.rejection: GatewayError | None = None
        self.failure: GatewayError | None = None  # what failed it, when a gateway error did
        self._opening: ChatOpening | None = None  # the first round's request, when `begin` began it
        self._begun = False
        self._finished = False
        self._slot_settled = False

    # --- the first round, begun early ----------------------------------------------

    def begin(self) -> None:
        """Have the backend start on the first round's request now, once, when the turn may
        (`_may_begin`); the first round takes it up, or `abandon` lets it go."""
        if self._begun or not self._may_begin():
            return
        self._begun = True
        self._opening = begin_round(self.resources, self.session)

    def _may_begin(self) -> bool:
        """Nothing the turn does before its first round can change that round's request."""
        return True

    def abandon(self) -> None:
        """Let go of a request `begin` began that no round took (nothing otherwise)."""
        opening, self._opening = self._opening, None
        if opening is not None:
            opening.close()

    # --- the run ------------------------------------------------------------------------

    async def run(self, emit: Emit) -> None:
        """Produce the turn, each batch of output to `emit`; whatever happens, concluded and
        settled.  Never raises but for cancellation (the client left, shutdown)."""
        telemetry = self.resources.telemetry
        telemetry.turn_started(self.outcome)
        try:
            self.begin()  # (unless its transport did, before setting up)
            with telemetry.span("turn", model=self.outcome.model, transport=self.outcome.transport):
                await self._produce(emit)
        finally:
            self.abandon()  # (a request begun early that no round took)
            self._conclude()
            with trio.CancelScope(shield=True):
                await self._settle()

    async def _produce(self, emit: Emit) -> None:
        raise NotImplementedError

    def _conclude(self) -> None:
        """Fill in the outcome from what the turn produced."""

    async def _settle(self) -> None:
        """Give back what the turn held (the front end's own first), then its slot, counting its tokens."""
        await self._settle_slot()

    async def _settle_slot(self) -> None:
        """The slot given back and the tokens counted, once (a turn may do it before its end)."""
        if self._slot_settled:
            return
        self._slot_settled = True
        usage = self._usage()
        try:
            await self.resources.limiter.settle(self.slot, self.caller, int(usage.get("total_tokens") or 0))
        except GatewayError:
            log.warning("could not count the tokens of %s", self.outcome.response_id)

    def _usage(self) -> dict[str, Any]:
        return {}

    async def _admit_round(self, request: dict[str, Any]) -> None:
        """A tool loop's next backend round reserves its tokens like a request of its own."""
        tokens, _ = token_reservation(request, self.caller.limits)
        await self.resources.limiter.reserve(self.slot, self.caller, tokens)

    # --- the delivery -------------------------------------------------------------------

    def finish(self, delivery: Delivery = Delivery()) -> None:
        """The transport is done with the turn: what it saw goes to the outcome, which is
        reported (to telemetry and the log line) once."""
        if self._finished:
            return
        self._finished = True
        outcome = self.outcome
        outcome.client_left = outcome.client_left or delivery.client_left
        if delivery.first_event_at is not None:
            outcome.first_event_at = delivery.first_event_at
        if delivery.finished_at is not None:
            outcome.finished_at = delivery.finished_at
        if delivery.status is not None:
            outcome.http_status = delivery.status
        if delivery.socket:
            outcome.http_status = None
        report_outcome(self.resources, outcome)
