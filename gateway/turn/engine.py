"""The turn engine: one response, from a parsed request to its stored end, for every transport.

    prepare_turn   before anything is sent, so that a request that cannot be
                   served gets a clear error in OpenAI's shape: the
                   conversation (`previous_response_id`, item references),
                   the plan (the chat request and the response skeleton),
                   the hosted MCP servers' URLs checked, the session.
    Turn.run       in a nursery the transport owns, beside its heartbeat: the
                   hosted MCP servers connected and listed, the tools offered
                   (the client's functions, configured and hosted MCP tools),
                   approved calls resumed, the backend rounds and the
                   gateway's tool calls.  Each batch of events goes to the
                   transport's `emit` as it is produced; the response is
                   stored before its terminal event; whatever fails, exactly
                   one terminal event ends the stream.
    report_outcome how a response went (`observe.outcome.TurnOutcome`), to
                   telemetry and the log line, once its transport is done.

`run_rounds` is the one loop that drives a session (Responses events, or
chat chunks for `/v1/chat/completions`) through backend rounds and tool
calls.  Nothing here knows HTTP, Quart, or how events become bytes.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import trio

from ..backends import ChatBackend, ReadWatch
from ..backends.routing import context_window_of
from ..builtins.fetch import Opened, PageTools
from ..builtins.search import (
    FIND_IN_PAGE,
    OPEN_PAGE,
    WEB_SEARCH_TYPES,
    Found,
    WebSearch,
)
from ..builtins.search import FUNCTION as WEB_SEARCH_FUNCTION
from ..config import Settings
from ..errors import (
    BackendStatusError,
    BackendStreamError,
    GatewayError,
    InternalError,
    InvalidRequest,
    RateLimited,
    ShuttingDown,
    StoreUnavailable,
)
from ..keys import ANONYMOUS, Caller, Limiter, StreamSlot, token_reservation
from ..observe import Telemetry
from ..observe.outcome import TurnOutcome
from ..ops.drain import Drain
from ..store import ResponseStore, StoredResponse
from ..store.base import OwnerView, save_retrying
from ..streams.session import ResponseSession
from ..streams.translator import ResponseTranslator, RoundCall
from ..wire import CreateResponseRequest
from . import conversation
from .compact import compacted, compaction_item, summarise
from .fit import fit, room_for
from .base import TurnBase
from .plan import ChatPlan, TranslateOptions, compaction_asked, plan_chat_request
from .rounds import Emit, failed_with, run_rounds
from .sealing import Sealer
from .tools import (
    HostedSpec,
    RequestTools,
    ToolOutcome,
    ToolSource,
    check_hosted,
    hosted_specs,
    listed_tool,
    offer_configured,
    offers_gateway_tools,
    open_hosted,
    run_calls,
)

__all__ = ["Resources", "Turn", "prepare_turn"]

log = logging.getLogger("gateway.turn")

Event = dict[str, Any]


@dataclass
class Resources:
    """What every turn shares: the app's backend, store, MCP servers and settings (owned by the app)."""

    settings: Settings
    backend: ChatBackend
    store: ResponseStore
    mcp: ToolSource | None
    sealer: Sealer
    clock: Callable[[], float]
    ids: Callable[[str], str]
    telemetry: Telemetry = field(default_factory=Telemetry)
    limiter: Limiter = field(default_factory=lambda: Limiter(None))
    drain: Drain = field(default_factory=Drain)
    web_search: WebSearch | None = None  # the gateway's web search, when WEB_SEARCH_URL names an engine
    pages: PageTools | None = None  # the pages a model opens (open_page, find_in_page, web_fetch)
    # The process's ticker, which keeps the backend reads' timeout (`run_rounds`); None: a timer per read.
    read_watch: ReadWatch | None = None

    @functools.cached_property
    def conversation_locks(self) -> conversation.ConversationLocks:
        """Whose turn it is on each conversation (a lease in the store, as long as a background one's)."""
        return conversation.ConversationLocks(self.store, clock=self.clock, lease=self.settings.background_lease_seconds)

    def options_for(self, owner: str | None) -> TranslateOptions:
        """How a request of `owner` reads what it carries: sealed content opens only for the key
        it was sealed for (another key's reasoning or compaction is ignored, as a stranger's)."""
        sealer = self.sealer

        def open_sealed(kind: str, token: str) -> dict[str, Any] | None:
            value = sealer.open(kind, token)
            return value if value is not None and value.get("owner") == owner else None

        return TranslateOptions(open_sealed=open_sealed)


# --- preparing a turn ----------------------------------------------------------------------


async def prepare_turn(
    resources: Resources,
    req: CreateResponseRequest,
    *,
    transport: str,
    caller: Caller = ANONYMOUS,
    gateway_tools: bool = True,
    cached: tuple[str, Sequence[Any]] | None = None,
    request_id: str | None = None,
    admit: bool = True,
    arrived: float | None = None,
) -> Turn:
    """Everything that can refuse the request, done before any byte is sent.

    The conversation is what `caller` may see: responses another key made
    do not exist for it.  `cached` is a WebSocket connection's copy of its
    latest response (its id, and the items it continues from):
    `previous_response_id` naming it is answered from there, so that
    `store: false` turns can continue.  The caller's limits are checked
    last, and a stream slot taken, which the turn gives back when it ends.
    `admit=False` plans a turn that will not run (a count of its input):
    a conversation's items are read without taking its lock, and only the
    key's model list is checked (no tokens reserved, no slot taken).

    Raises:
        InvalidRequest: the request cannot be served as it is (400), such as a
            continuation with a tool output for a call its chain never made.
        NotFound: `previous_response_id` names no response the caller may see,
            or the key may not use the model.
        PermissionDenied: the key may not use an MCP server the request names.
        RateLimited: a limit of the key is reached.
        StoreUnavailable: the store failed.
    """
    if req.background and req.store is False:
        raise InvalidRequest(
            "Background responses must be stored: 'store' cannot be false.", param="store", code="invalid_value"
        )
    conversation_id = conversation.conversation_id_of(req)
    response_id = resources.ids("resp")
    lock, items = None, []
    if conversation_id is not None and not admit:
        items = await resources.conversation_locks.items(conversation_id, caller.owner)
    elif conversation_id is not None:  # taken first, for its items; let go if anything below refuses
        lock, items = await resources.conversation_locks.acquire(conversation_id, caller.owner, response_id)
    try:
        return await _prepare(
            resources, req, transport, caller, gateway_tools, cached, request_id, response_id, lock, items, admit, arrived
        )
    except BaseException:
        if lock is not None:
            with trio.CancelScope(shield=True):
                await lock.release()
        raise


async def _prepare(
    resources: Resources,
    req: CreateResponseRequest,
    transport: str,
    caller: Caller,
    gateway_tools: bool,
    cached: tuple[str, Sequence[Any]] | None,
    request_id: str | None,
    response_id: str,
    lock: conversation.ConversationLock | None,
    conversation_items: list[dict[str, Any]],
    admit: bool,
    arrived: float | None,
) -> Turn:
    settings = resources.settings
    visible = OwnerView(resources.store, caller.owner)
    if cached is not None:
        prepared = await conversation.prepare(visible, req.model_copy(update={"previous_response_id": None}), resources.ids)
        prepared.history = [*cached[1], *prepared.history]
    else:
        prepared = await conversation.prepare(visible, req, resources.ids)
    if conversation_items:
        prepared.history = [*conversation.to_wire(conversation_items), *prepared.history]
    if req.previous_response_id:
        conversation.check_outputs_answer_calls(prepared)
    plan = plan_chat_request(
        req,
        response_id=response_id,
        created_at=int(resources.clock()),
        options=resources.options_for(caller.owner),
        history=prepared.history,
        items=prepared.input,
    )
    if conversation_items or lock is not None:
        plan.response["conversation"] = {"id": conversation.conversation_id_of(req)}
    hosted = hosted_specs(req.tools)
    await check_hosted(hosted, resources.mcp, _allow_list(settings), caller.limits)
    translator = ResponseTranslator(
        plan.response,
        ids=resources.ids,
        clock=resources.clock,
        reasoning_events=settings.reasoning_events,
        allowed_tools=plan.allowed_tools,
        input_tokens_estimate=lambda: len(orjson.dumps(plan.body["messages"])) // 4,
        tool_kinds=plan.tool_kinds,
        seal_reasoning=(lambda text: resources.sealer.seal("reasoning", {"text": text, "owner": caller.owner}))
        if "reasoning.encrypted_content" in (req.include or ())
        else None,
        seal_approval=lambda item: resources.sealer.seal("approval", _approval_terms(item, caller.owner, hosted)),
        required_action=settings.tool_call_protocol == "required_action",
        seal_signed=lambda text, signature: resources.sealer.seal(
            "reasoning", {"text": text, "signature": signature, "owner": caller.owner}
        ),
    )
    model = str(plan.body["model"])
    window = None
    compact_asked, compact_threshold = compaction_asked(req.context_management)
    if req.truncation == "auto" or (compact_asked and compact_threshold is None):
        window = await context_window_of(resources.backend, model)
    if compact_asked and compact_threshold is None and window is not None:
        compact_threshold = window * 4 // 5  # (the default: 80% of the window, when it is known)
    if req.truncation == "auto":  # (before the reservation: what it reserves is what goes)
        if window is not None:
            fitted, dropped = await fit(plan.body["messages"], room_for(window, req.max_output_tokens, "max_output_tokens"), _counter(resources, plan.body))
            if dropped:
                plan.body["messages"] = fitted
                log.debug("response %s: %d oldest messages dropped to fit %d tokens (truncation auto)", response_id, dropped, window)
    started = arrived if arrived is not None else trio.current_time()  # (when the edge saw the request)
    outcome = TurnOutcome(response_id, model, transport, started, key=caller.name, request_id=request_id)
    tokens, max_tokens = token_reservation(plan.body, caller.limits)
    if max_tokens is not None:
        plan.body["max_tokens"] = max_tokens  # what it reserved bounds what it may use
    if not admit:
        resources.limiter.check_model(caller, model)
    slot = await resources.limiter.admit_stream(caller, model, response_id, tokens=tokens) if admit else None
    turn = Turn(resources, req, prepared, plan, translator, hosted, gateway_tools, outcome, caller, slot, lock)
    turn.fits_on_error = req.truncation == "auto" and window is None
    turn.compact_threshold = compact_threshold
    return turn


def _counter(resources: Resources, body: dict[str, Any]) -> Callable[[list[dict[str, Any]]], Awaitable[int]]:
    """The exact prompt tokens of `body` with other messages, counted by the backend; one it
    refuses as too long counts as more than any window."""

    async def count(messages: list[dict[str, Any]]) -> int:
        try:
            return await resources.backend.count_tokens({**body, "messages": messages}, headers=resources.telemetry.trace_headers())
        except BackendStatusError as error:
            if error.code != "context_length_exceeded":
                raise
            return 1 << 62

    return count


def _search_item(found: Found, sources: bool) -> dict[str, Any]:
    """A `web_search_call` item's `status` and `action` for what one search found (`sources`: as
    `include: ["web_search_call.action.sources"]` asks), and what the answer may `cite` (its
    `url_citation` annotations; not part of the item)."""
    action: dict[str, Any] = {"type": "search", "query": found.query, "queries": [found.query] if found.query else []}
    if sources:
        action["sources"] = [{"type": "url", "url": result.url} for result in found.results]
    cite = [{"url": result.url, "title": result.title} for result in found.results]
    return {"status": "failed" if found.error else "completed", "action": action, "cite": cite}


async def timed_web(resources: Resources, tool: str, call: Awaitable[tuple[str, Any]]) -> tuple[str, Any]:
    """A web search or page fetch (`call`: what `WebSearch.run` or `PageTools` give), counted in
    the telemetry by its outcome (`ok`, or the kind of its failure) and time."""
    started = trio.current_time()
    text, outcome = await call
    kind = "ok" if outcome.error is None else outcome.error_kind or "error"
    resources.telemetry.web_tool(tool=tool, outcome=kind, seconds=trio.current_time() - started)
    return text, outcome


@functools.cache
def _warn_no_engine() -> None:
    """Once per process: a client asked for web search (Codex does on every request), and no engine is set."""
    log.warning("a request's web search tool is left out: set WEB_SEARCH_URL to a SearXNG instance to run it (see docs/web-search.md)")


async def counted(resources: Resources, caller: Caller) -> str | None:
    """A built-in tool's call counted as one of the key's requests (its rpm); why it may not run, or None."""
    try:
        await resources.limiter.admit_request(caller)
    except RateLimited as limited:
        return f"the key's rate limit is reached ({limited.message.rstrip('.')}); try again in {limited.retry_after:.0f} s"
    except GatewayError:
        return None  # (the key store failed: the call is not refused for that)
    return None


def _page_outcome(text: str, opened: Opened, action: dict[str, Any]) -> ToolOutcome:
    """A page call's outcome: what the model reads, and its `web_search_call` item's action (a page
    read is citable, as a search's results are)."""
    if opened.error is not None:
        return ToolOutcome(error=text.removeprefix("Error: "), detail={"status": "failed", "action": action})
    page = opened.page
    cite = [{"url": page.url, "title": page.title}] if page is not None else []
    return ToolOutcome(output=text, detail={"status": "completed", "action": action, "cite": cite})


def _allow_list(settings: Settings) -> list[str]:
    return [entry.strip() for entry in settings.mcp_allowed_urls.split(",") if entry.strip()]


class Turn(TurnBase):
    """One response being produced: its request, conversation, plan and session."""

    session: ResponseSession

    def __init__(
        self,
        resources: Resources,
        req: CreateResponseRequest,
        prepared: conversation.Prepared,
        plan: ChatPlan,
        translator: ResponseTranslator,
        hosted: list[HostedSpec],
        gateway_tools: bool,
        outcome: TurnOutcome,
        caller: Caller = ANONYMOUS,
        slot: StreamSlot | None = None,
        lock: conversation.ConversationLock | None = None,
    ) -> None:
        super().__init__(resources, caller, slot, outcome)
        self._lock = lock  # the conversation's, while this response runs on it
        self.req = req
        self.prepared = prepared
        self.plan = plan
        self.translator = translator
        self.session = ResponseSession(translator, plan.body, max_rounds=resources.settings.max_tool_call_iterations)
        self.events: list[Event] = []  # everything emitted, for the stored record
        self._hosted = hosted
        self._gateway_tools = gateway_tools
        self._offered: RequestTools | None = None  # the configured tools, when `begin` offered them
        self._persist: Callable[[StoredResponse], Awaitable[list[Event] | None]] | None = None
        self._held: list[Event] = []  # the terminal event, until the response is stored
        # `truncation: "auto"` with a window nobody knew: the backend's context-length error fits it once.
        self.fits_on_error = False
        # `context_management` compaction: the input tokens past which it is summarised first.
        self.compact_threshold: int | None = None

    @property
    def response(self) -> dict[str, Any]:
        return self.translator.response

    def _may_begin(self) -> bool:
        """The first round's request may be begun early when nothing the turn does before that
        round can change it: no hosted MCP servers to list, no approved calls to run first, no
        compaction that may come first (a trace context to carry: `begin_round` declines).  The
        configured tools are offered now, for that request."""
        if self._hosted or self._approval_answers() or self.compact_threshold is not None:
            return False
        self._offered = self._offer_configured(RequestTools())
        return True

    @property
    def store(self) -> bool:
        return self.req.store is not False

    def conversation_so_far(self) -> list[Any]:
        """The wire items a next turn continues from: the history, this turn's input, its output."""
        history = [item.model_dump(exclude_none=True) for item in self.prepared.history]
        return conversation.to_wire([*history, *self.prepared.input_records, *(self.response.get("output") or ())])

    def record(self, events: list[Event], response: dict[str, Any] | None = None) -> StoredResponse:
        """The stored form of this response, with `events` as its event log, owned by its caller."""
        record = conversation.record_for(self.req, self.prepared, dict(response or self.response), events)
        record.owner = self.caller.owner
        return record

    async def run(
        self, emit: Emit, *, persist: Callable[[StoredResponse], Awaitable[list[Event] | None]] | None = None
    ) -> None:
        """Produce the response to its terminal event, each batch of events to `emit`.

        With `store`, the response is stored (by `persist`, default: saved,
        retrying briefly) before its terminal event is emitted; if that
        fails, `error` (`store_unavailable`) and `response.failed` take its
        place.  `persist` may return other events to end with instead (the
        response already ended elsewhere).  Never raises but for
        cancellation (the client left, or shutdown).
        """
        self._persist = persist
        await super().run(emit)

    async def _produce(self, emit: Emit) -> None:
        session = self.session
        held = self._held

        async def hold_terminal(events: list[Event]) -> None:
            if not events:
                return
            if session.done and not held:
                events, held[:] = events[:-1], events[-1:]
                if not events:
                    return
            outcome = self.outcome
            if outcome.first_token_at is None:
                if outcome.first_event_at is None:
                    outcome.first_event_at = trio.current_time()
                if any(e["type"].endswith(".delta") for e in events):
                    outcome.first_token_at = trio.current_time()
            self.events += events
            await emit(events)

        if self._lock is None:
            await self._run(emit, hold_terminal, held, self._persist)
        else:
            async with trio.open_nursery() as nursery:  # owned here: the conversation lock's renewals
                nursery.start_soon(self._lock.run_renewals)
                await self._run(emit, hold_terminal, held, self._persist)
                nursery.cancel_scope.cancel()

    async def _settle(self) -> None:
        """The conversation let go (a response that ended without appending), then the slot and tokens."""
        if self._lock is not None:
            await self._lock.release()
        await super()._settle()

    def _usage(self) -> dict[str, Any]:
        return self.response.get("usage") or {}

    async def _run(
        self,
        emit: Emit,
        hold_terminal: Emit,
        held: list[Event],
        persist: Callable[[StoredResponse], Awaitable[list[Event] | None]] | None,
    ) -> None:
        settings = self.resources.settings
        session = self.session
        try:
            with self.resources.drain.stoppable() as stop:  # a drain out of time ends the turn here
                async with contextlib.AsyncExitStack() as stack:  # the hosted MCP sessions live here
                    tools = await self.offer_tools(stack, hold_terminal)
                    await self._compact_if_due(hold_terminal)
                    await self._resume_approvals(tools, hold_terminal)
                    failure = await run_rounds(
                        session,
                        self.resources.backend,
                        hold_terminal,
                        tools,
                        call_timeout=settings.mcp_call_timeout,
                        concurrency=settings.mcp_call_concurrency,
                        on_answer=self._on_answer,
                        telemetry=self.resources.telemetry,
                        admit_round=self._admit_round,
                        outcome=self.outcome,
                        opening=self._opening,
                        refit=self._refit if self.fits_on_error else None,
                        watch=self.resources.read_watch,
                    )
                    self._note_failure(failure)
            if stop.cancelled_caught and not session.done:
                stopping = ShuttingDown.stopped()
                self._note_failure(stopping)
                await hold_terminal(failed_with(session, stopping))
        except GatewayError as error:
            self._note_failure(error)
            await hold_terminal(failed_with(session, error))
        except Exception:
            log.debug("turn %s failed", self.outcome.response_id, exc_info=True)
            internal = InternalError("The gateway failed to process the response.")
            self._note_failure(internal)
            await hold_terminal(failed_with(session, internal))
        finally:
            self.answered.set()
        tail = held
        if held and (self.store or self._lock is not None):
            # The slot and tokens are settled while the record is stored (both wait on a store),
            # so that the terminal event waits for one of them, not one after the other.
            async with trio.open_nursery() as nursery:  # owned here: the settling beside the storing
                nursery.start_soon(self._settle_shielded)
                tail = await self._store_before(held, persist)
        self.events += tail
        await emit(tail)

    async def _settle_shielded(self) -> None:
        with trio.CancelScope(shield=True):  # (as at the turn's end: whatever happens to the request)
            await self._settle_slot()

    async def _store_before(
        self, terminal: list[Event], persist: Callable[[StoredResponse], Awaitable[list[Event] | None]] | None
    ) -> list[Event]:
        """Before the terminal event: its items appended to its conversation, and the response stored.

        A conversation gets the input and output items of a response that
        completed or ended incomplete; one that failed or was cancelled
        appends nothing, so that the client can send the same input again.
        """
        record = self.record([*self.events, *terminal])
        try:
            if self._lock is not None:
                ended = record.response.get("status") in ("completed", "incomplete")
                await self._lock.finish([*record.input_items, *(record.response.get("output") or ())] if ended else [])
            if not self.store:
                return terminal
            if persist is None:
                await save_retrying(self.resources.store, record, within=self.resources.settings.store_retry_seconds)
                return terminal
            instead = await persist(record)
            return terminal if instead is None else instead
        except Exception as exc:
            cause = exc.cause if isinstance(exc, StoreUnavailable) and exc.cause else type(exc).__name__
            log.warning("response %s could not be stored (%s)", self.outcome.response_id, cause)
            if not isinstance(exc, StoreUnavailable):
                log.debug("store failure", exc_info=True)
            error = StoreUnavailable(_NOT_STORED, cause=cause)
            retraction = self.translator.retract_terminal(error.code or "store_unavailable", _NOT_STORED)
            if retraction:
                self.failure = error
            return retraction or terminal

    async def _compact_if_due(self, emit: Emit) -> None:
        """`context_management` compaction: an input past its threshold (counted by the backend)
        is summarised first, and the turn runs on the instructions, the summary and the last user
        turn; the `compaction` item leads the output.  A summary the backend could not make leaves
        the input as it was."""
        threshold = self.compact_threshold
        if threshold is None:
            return
        resources = self.resources
        request = self.session.request
        headers = resources.telemetry.trace_headers()
        try:
            if await _counter(resources, request)(request["messages"]) <= threshold:
                return
            summary, usage = await summarise(resources.backend, request, headers=headers)
        except GatewayError as error:
            log.info("response %s: not compacted (%s); it runs on its whole input", self.outcome.response_id, error.code)
            return
        if not summary:
            return
        item = compaction_item(resources.sealer, resources.ids("cmp"), summary, self.caller.owner, replaces=True)
        request["messages"] = compacted(request["messages"], summary)
        await emit(self.translator.add_item(item, usage))

    async def _refit(self, error: GatewayError) -> bool:
        """`truncation: "auto"` with no window known: a context-length refusal that names the
        window has the request fitted into it (once)."""
        window = error.context_window if isinstance(error, BackendStatusError) else None
        if window is None:
            return False
        request = self.session.request
        try:
            room = room_for(window, self.req.max_output_tokens, "max_output_tokens")
            fitted, dropped = await fit(request["messages"], room, _counter(self.resources, request))
        except GatewayError:
            return False  # (it cannot be made to fit: the backend's refusal stands)
        if not dropped:
            return False
        log.debug("response %s: %d oldest messages dropped to fit %d tokens (truncation auto, from the backend's refusal)", self.outcome.response_id, dropped, window)
        request["messages"] = fitted
        return True

    def _on_answer(self, error: GatewayError | None) -> None:
        if self.answered.is_set():
            return
        if isinstance(error, BackendStatusError) and 400 <= error.status < 500:
            self.rejection = error  # the client's mistake (unknown model, context too long): its status stands
        self.answered.set()

    def _note_failure(self, error: GatewayError | None) -> None:
        if error is not None:
            self.failure = error

    def error_for_json(self) -> GatewayError | None:
        """The error a JSON transport answers with, when the response failed."""
        if self.response.get("status") != "failed":
            return None
        if self.failure is not None:
            return self.failure
        error = self.response.get("error") or {}
        return BackendStreamError(error.get("message") or "the backend reported an error", code=error.get("code"))

    def _conclude(self) -> None:
        outcome = self.outcome
        outcome.status = str(self.response.get("status"))
        outcome.usage = self.response.get("usage")
        outcome.error = self.response.get("error")
        outcome.rounds = self.session.rounds + 1
        outcome.finished_at = trio.current_time()
        if self.session.logprobs_missing:
            log.info(
                "response %s: logprobs were asked for, but backend %s returned none; they are empty",
                outcome.response_id,
                outcome.backend or "-",
            )

    def ping(self) -> Event | None:
        """A numbered `ping` for a quiet stream (TOOL_CALL_PROTOCOL=required_action), kept in the
        record like any event; None in the standard protocol or when it cannot go in order now."""
        if self.resources.settings.tool_call_protocol != "required_action":
            return None
        event = self.translator.ping(len(self.events))
        if event is not None:
            self.events.append(event)
        return event

    # --- tools ---------------------------------------------------------------------

    async def offer_tools(self, stack: contextlib.AsyncExitStack, emit: Emit) -> RequestTools:
        """The gateway's tools for this response: hosted servers first, then configured ones."""
        resources = self.resources
        events = self.session.start()
        if self._offered is not None:  # (`begin` offered them, with no hosted servers to list)
            await emit(events)
            return self._offered
        tools = RequestTools()
        if self._hosted:
            listings = await open_hosted(
                stack,
                self._hosted,
                resources.mcp,
                tools,
                connect_timeout=resources.settings.mcp_connect_timeout,
                trace_headers=resources.telemetry.trace_headers(),
            )
            for listing in listings:
                events += self.translator.list_tools(
                    listing.spec.server_label, [listed_tool(t) for t in listing.tools], listing.error
                )
        self._offer_configured(tools)
        await emit(events)
        return tools

    def _offer_configured(self, tools: RequestTools) -> RequestTools:
        """The configured MCP servers' tools added to `tools` (after any hosted ones) and to the
        chat request, when the request lets the gateway offer its tools."""
        plan = self.plan
        offered = offers_gateway_tools(self.req.tool_choice)
        if self._gateway_tools and offered:
            taken = {t["function"]["name"] for t in plan.body.get("tools", ())}
            offer_configured(tools, self.resources.mcp, taken=taken, limits=self.caller.limits)
        forced = isinstance(self.req.tool_choice, dict) and self.req.tool_choice.get("type") in WEB_SEARCH_TYPES
        if offered or forced:
            self._offer_builtins(tools)
        if tools.routes and (offered or forced):
            plan.body.setdefault("tools", []).extend(tools.chat_tools)
            self.translator.set_gateway_tools(tools.routes, tools.approval, tools.builtins)
            if self.req.tool_choice == "required":  # the gateway's tools are the ones to choose from
                plan.body.setdefault("tool_choice", "required")
        return tools

    def _offer_builtins(self, tools: RequestTools) -> None:
        """The built-in tools the request's own tools ask for (web search), when the gateway has
        them: the client asked for them by name, so they are offered whatever `gateway_tools` says."""
        options, engine = self.plan.web_search, self.resources.web_search
        if options is not None and engine is None:
            _warn_no_engine()
        if options is None or engine is None or not self.caller.limits.web_search:
            return
        sources = "web_search_call.action.sources" in (self.req.include or ())
        used = [0]

        async def search(arguments: dict[str, Any]) -> ToolOutcome:
            used[0] += 1
            if options.max_uses is not None and used[0] > options.max_uses:
                return ToolOutcome(error=f"the web search may be used at most {options.max_uses} times in this response")
            refused = await counted(self.resources, self.caller)
            if refused is not None:
                query = str(arguments.get("query") or "")
                return ToolOutcome(error=refused, detail=_search_item(Found(query=query, error=refused, error_kind="too_many_requests"), sources))
            text, found = await timed_web(self.resources, "web_search", engine.run(arguments, options))
            if found.error is not None:  # (counted as the tool call's error in the metrics)
                return ToolOutcome(error=text.removeprefix("Error: "), detail=_search_item(found, sources))
            return ToolOutcome(output=text, detail=_search_item(found, sources))

        tools.add_builtin(WEB_SEARCH_FUNCTION, "web_search_call", search)
        pages = self.resources.pages
        if pages is not None:
            filters = {"allowed": options.allowed_domains, "blocked": options.blocked_domains, "chars": options.page_chars}

            async def open_page(arguments: dict[str, Any]) -> ToolOutcome:
                text, opened = await timed_web(self.resources, "open_page", pages.open(arguments.get("url"), **filters))  # type: ignore[arg-type]
                return _page_outcome(text, opened, {"type": "open_page", "url": opened.url})

            async def find_in_page(arguments: dict[str, Any]) -> ToolOutcome:
                text, opened = await timed_web(self.resources, "find_in_page", pages.find(arguments.get("url"), arguments.get("pattern"), **filters))
                action = {"type": "find_in_page", "url": opened.url, "pattern": str(arguments.get("pattern") or "")}
                return _page_outcome(text, opened, action)

            tools.add_builtin(OPEN_PAGE, "web_search_call", open_page)
            tools.add_builtin(FIND_IN_PAGE, "web_search_call", find_in_page)
        choice = self.req.tool_choice
        if isinstance(choice, dict) and choice.get("type") in WEB_SEARCH_TYPES:
            self.plan.body["tool_choice"] = {"type": "function", "function": {"name": WEB_SEARCH_FUNCTION["name"]}}

    def _approval_answers(self) -> list[Any]:
        """The input's `mcp_approval_response` items (calls to run, or decline, before the first round)."""
        return [item for item in self.prepared.input if getattr(item, "type", None) == "mcp_approval_response"]

    async def _resume_approvals(self, tools: RequestTools, emit: Emit) -> None:
        """Run (or decline) the calls the client answered with `mcp_approval_response` items.

        Raises:
            InvalidRequest: a response names no approval request in the conversation.
        """
        answers = self._approval_answers()
        if not answers:
            return
        # An approval request counts only if it carries the gateway's seal over
        # exactly these terms: the call, the key it was asked of and the MCP
        # server's URL now.  A client cannot approve a call it wrote itself, nor
        # move an approved call to another server by changing `server_url`.
        sealer = self.resources.sealer
        asked: dict[Any, dict[str, Any]] = {}
        for data in (item.model_dump() for item in (*self.prepared.history, *self.prepared.input)):
            if data.get("type") != "mcp_approval_request" or data.get("id") in asked:
                continue
            token = data.get("encrypted_content")
            opened = sealer.open("approval", token) if isinstance(token, str) else None
            if opened is not None and opened == {"kind": "approval", **_approval_terms(data, self.caller.owner, self._hosted)}:
                asked[data.get("id")] = data
        settings = self.resources.settings
        for answer in answers:
            data = answer.model_dump()
            request_id = data.get("approval_request_id")
            ask = asked.get(request_id)
            if ask is None:
                raise InvalidRequest(
                    f"No mcp_approval_request with id '{request_id}' in this conversation.",
                    param="input",
                    code="approval_request_not_found",
                )
            call = RoundCall(
                request_id, request_id, ask.get("name", ""), ask.get("arguments") or "{}", ask.get("server_label", "")
            )
            if data.get("approve") is not True:
                self.session.decline(call, data.get("reason"))
                continue
            results: list[ToolOutcome] = []

            async def keep(_call: RoundCall, outcome: ToolOutcome) -> None:
                results.append(outcome)

            await run_calls(tools, [call], keep, call_timeout=settings.mcp_call_timeout, concurrency=1)
            outcome = results[0]
            await emit(self.session.resume(call, output=outcome.output, error=outcome.error, approval_request_id=request_id))


def _approval_terms(item: dict[str, Any], owner: str | None, hosted: Sequence[HostedSpec]) -> dict[str, Any]:
    """What an approval request's seal covers: the call, the key it was issued to, and the URL of
    the MCP server it runs on (None for a configured server)."""
    label = item.get("server_label")
    url = next((spec.server_url for spec in hosted if spec.server_label == label), None)
    return {
        "id": item.get("id"),
        "server_label": label,
        "name": item.get("name"),
        "arguments": item.get("arguments"),
        "owner": owner,
        "server_url": url,
    }


_NOT_STORED = (
    "The response was generated but could not be stored, so it cannot be retrieved or continued; "
    "retry the request."
)
