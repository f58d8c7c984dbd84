"""The operator console's routes (`/console/...`): the operator checked, then a page or a change.

Every console row is `auth="operator"`: the edge asks it for no API key,
and each handler here checks the operator's credential first
(`gateway.console.auth`):

- without CONSOLE_TOKEN and without an admin key the console is off: 404,
  with one line saying how to turn it on;
- without the credential, or with a wrong one: 401 and nothing else (a
  browser's GET gets the sign-in form, and only that);
- a POST borne by the session cookie needs its session's CSRF token and a
  same-origin `Origin` (or `Referer`), else 403 and nothing changed; a POST
  with `Authorization: Bearer` needs neither (no browser sends it unasked);
- a form with a bad value: 400, the page again with the problem next to
  its field, nothing changed.

The playground's POST runs its body through the very handlers of
`/v1/responses` and `/v1/messages` (`api.responses.create`,
`api.messages.create`) as the operator: an admin key's own limits apply;
CONSOLE_TOKEN's requests are nobody's, as without keys.  The static files
(htmx, the stylesheet, the script) are the same for everyone and need no
credential, only a console that is on.  Pages are `console.views`
(pure), rendered by `console.pages`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from ..backends.routing import backend_models, models_for
from ..console import views
from ..console.auth import ConsoleAuth, Operator, safe_next, same_origin
from ..console.forms import FieldErrors, form_fields, parse_limits, parse_new_key
from ..console.pages import Page, render, static_file
from ..errors import InvalidRequest, NotFound, Unauthorized
from ..keys import KeyLimits, KeyStore, PermissionDenied
from ..keys import admin as key_changes
from ..transport.body import DeferredHeadBody
from ..transport.render import Dialect
from . import messages, responses
from .args import int_arg
from .routes import Call, Handler

__all__ = [
    "backends",
    "conversation",
    "conversations",
    "create_key",
    "key_limits",
    "keys",
    "login",
    "login_form",
    "logout",
    "mcp",
    "overview",
    "playground",
    "playground_send",
    "response",
    "responses_page",
    "revoke_key",
    "static",
    "streams",
]

_OFF = (
    "The operator console is off: set CONSOLE_TOKEN (16 characters or more), or make an admin key "
    "(gateway keys create NAME --admin), and restart or sign in."
)
_NO_CREDENTIAL = "The console needs the operator's credential: sign in at /console/login, or send Authorization: Bearer."

Render = Callable[[Call, Operator], Awaitable[DeferredHeadBody]]


def _auth(call: Call) -> ConsoleAuth:
    return ConsoleAuth(call.shared.resources.settings, call.shared.keyring)


def _key_store(call: Call) -> KeyStore:
    store = call.shared.keyring.store
    if store is None:  # (an embedder's gateway without one: nothing to manage)
        raise InvalidRequest("This gateway has no key store.", code="no_key_store")
    return store


async def _enabled(auth: ConsoleAuth) -> None:
    if not await auth.enabled():
        raise NotFound(_OFF, code="console_disabled")


def _sign_in(*, next_path: str, status: int = 200, failed: bool = False) -> Page:
    context = {**views.frame("login", "Sign in", None, None), "next": safe_next(next_path), "failed": failed}
    return Page(render("login.html", context), status)


def _page(
    operator: Operator, template: str, current: str, title: str, context: Mapping[str, Any], status: int = 200,
    headers: Mapping[str, str] | None = None,
) -> Page:
    return Page(render(template, {**views.frame(current, title, operator.name, operator.csrf), **context}), status, headers)


def _message(operator: Operator, title: str, text: str, back: str, status: int) -> Page:
    return _page(operator, "message.html", "", title, {"message": text, "back": back, "error": status >= 400}, status)


def _gated(render_page: Render, *, path: str, post: bool = False) -> Handler:
    """`render_page` behind the operator's credential (and, for a POST, CSRF and same-origin);
    `path`: where a browser signing in goes on to (a list page, never an id of what it guards)."""

    async def handler(call: Call) -> DeferredHeadBody:
        """Raises: NotFound (the console is off), Unauthorized (no operator credential),
        PermissionDenied (a cookie-borne POST without its CSRF token, or from another origin)."""
        auth = _auth(call)
        await _enabled(auth)
        operator = await auth.check(call.headers)
        if operator is None:
            if call.method == "GET" and "text/html" in call.headers.get("accept", ""):
                return _sign_in(next_path=path, status=401)
            raise Unauthorized(_NO_CREDENTIAL, code="console_unauthorized")
        if post and operator.csrf is not None:  # borne by the cookie: a browser's, maybe not sent by the console
            if not same_origin(call.headers):
                raise PermissionDenied("A console form must be sent from the console's own pages.", code="cross_origin")
            given = call.headers.get("x-csrf-token") or form_fields(await call.read()).get("csrf")
            if not ConsoleAuth.csrf_ok(operator, given):
                raise PermissionDenied("The form's CSRF token is missing or wrong: reload the page.", code="csrf_failed")
        return await render_page(call, operator)

    return handler


# --- signing in and out --------------------------------------------------------------------------


async def login_form(call: Call) -> DeferredHeadBody:
    """The sign-in form (to anyone, once the console is on).

    Raises:
        NotFound: the console is off.
    """
    await _enabled(_auth(call))
    return _sign_in(next_path=call.args.get("next", "/console"))


async def login(call: Call) -> DeferredHeadBody:
    """A session for the credential the form sent (a cookie, and on to the page asked for), or
    401 and the form again.

    Raises:
        NotFound: the console is off.  PermissionDenied: posted from another origin.
    """
    auth = _auth(call)
    await _enabled(auth)
    if not same_origin(call.headers):
        raise PermissionDenied("Sign in from the console's own page.", code="cross_origin")
    fields = form_fields(await call.read())
    operator = await auth.sign_in(fields.get("credential", "").strip())
    if operator is None:
        return _sign_in(next_path=fields.get("next", "/console"), status=401, failed=True)
    secure = call.headers.get("origin", call.headers.get("referer", "")).startswith("https://")
    headers = {"location": safe_next(fields.get("next")), "set-cookie": auth.session_cookie(operator, secure=secure)}
    return Page(b"", 303, headers)


async def _logout(call: Call, operator: Operator) -> DeferredHeadBody:
    secure = call.headers.get("origin", call.headers.get("referer", "")).startswith("https://")
    return Page(b"", 303, {"location": "/console/login", "set-cookie": ConsoleAuth.ended_cookie(secure=secure)})


logout = _gated(_logout, path="/console", post=True)


# --- pages ---------------------------------------------------------------------------------------


async def _overview(call: Call, operator: Operator) -> DeferredHeadBody:
    _, report = call.shared.readiness.report()
    store = call.shared.keyring.store
    keys = [key for key in await store.all() if key.active] if store is not None else []
    mcp_status = getattr(call.shared.resources.mcp, "status", None)
    context = views.overview_view(
        report,
        keys=len(keys) + len(call.shared.keyring.static_names),
        streams=len(call.shared.heartbeats.open_streams()),
        mcp_servers=len(mcp_status()) if mcp_status is not None else 0,
    )
    return _page(operator, "overview.html", "overview", "Overview", context)


overview = _gated(_overview, path="/console")


async def _model_names(call: Call, limits: KeyLimits) -> list[str]:
    backend = call.shared.resources.backend
    listed = await models_for(backend, limits)
    entries = listed if listed is not None else await backend_models(backend)
    return [str(entry["id"]) for entry in entries]


async def _backends(call: Call, operator: Operator) -> DeferredHeadBody:
    _, report = call.shared.readiness.report()
    backend = call.shared.resources.backend
    context = views.backends_view(
        report,
        getattr(backend, "config", None),
        await _model_names(call, KeyLimits()),
        call.shared.usage.recent_backend_errors(limit=20),
    )
    return _page(operator, "backends.html", "backends", "Backends and routes", context)


backends = _gated(_backends, path="/console/backends")


async def _keys_page(
    call: Call, operator: Operator, *, status: int = 200, form: Mapping[str, str] | None = None,
    errors: FieldErrors | None = None, editing: str | None = None, created: Any = None,
) -> Page:
    store = _key_store(call)
    stored = await store.all()
    limiter = call.shared.resources.limiter
    tokens = {key.name: await limiter.tokens_used(key) for key in stored if key.active}
    context = views.keys_view(
        stored,
        static_names=call.shared.keyring.static_names,
        tokens=tokens,
        usage=call.shared.usage.per_key(minutes=60),
        now=time.time(),
        form=form,
        errors=errors,
        editing=editing,
        created=created,
    )
    return _page(operator, "keys.html", "keys", "Keys", context, status)


async def _keys(call: Call, operator: Operator) -> DeferredHeadBody:
    return await _keys_page(call, operator)


keys = _gated(_keys, path="/console/keys")


async def _create_key(call: Call, operator: Operator) -> DeferredHeadBody:
    fields = form_fields(await call.read())
    new, errors = parse_new_key(fields)
    if new is None:
        return await _keys_page(call, operator, status=400, form=fields, errors=errors)
    made = await key_changes.create_key(_key_store(call), new.name, limits=new.limits, admin=new.admin, now=time.time())
    if made is None:
        errors = {"name": f"An active key is named {new.name}: revoke it first, or pick another name."}
        return await _keys_page(call, operator, status=400, form=fields, errors=errors)
    return await _keys_page(call, operator, created=made)


create_key = _gated(_create_key, path="/console/keys", post=True)


async def _revoke_key(call: Call, operator: Operator) -> DeferredHeadBody:
    name = call.params["name"]
    if await key_changes.revoke_key(_key_store(call), name, now=time.time()) is None:
        return _message(operator, "No such key", f"No active key is named {name}.", "/console/keys", 404)
    return Page(b"", 303, {"location": "/console/keys"})


revoke_key = _gated(_revoke_key, path="/console/keys", post=True)


async def _key_limits(call: Call, operator: Operator) -> DeferredHeadBody:
    name = call.params["name"]
    store = _key_store(call)
    found = await store.by_name(name)
    if found is None or not found.active:
        return _message(operator, "No such key", f"No active key is named {name}.", "/console/keys", 404)
    fields = form_fields(await call.read())
    limits, errors = parse_limits(fields, found.limits)
    if limits is None:
        return await _keys_page(call, operator, status=400, form=fields, errors=errors, editing=name)
    await key_changes.change_key(store, name, limits=limits)
    return Page(b"", 303, {"location": "/console/keys"})


key_limits = _gated(_key_limits, path="/console/keys", post=True)


async def _streams(call: Call, operator: Operator) -> DeferredHeadBody:
    context = views.streams_view(call.shared.heartbeats.open_streams())
    if call.args.get("part") == "table":  # htmx's refresh: the table alone
        return _page(operator, "_streams_table.html", "streams", "Streams", context)
    return _page(operator, "streams.html", "streams", "Live streams", context)


streams = _gated(_streams, path="/console/streams")


def _paging(call: Call) -> tuple[int, str | None]:
    return int_arg(call.args, "limit", 50, low=1, high=200), call.args.get("before") or None


async def _responses(call: Call, operator: Operator) -> DeferredHeadBody:
    limit, before = _paging(call)
    records = await call.shared.resources.store.list_responses(limit=limit, before=before)
    context = views.responses_view(records, limit=limit, before=before)
    return _page(operator, "responses.html", "responses", "Stored responses", context)


responses_page = _gated(_responses, path="/console/responses")


async def _response(call: Call, operator: Operator) -> DeferredHeadBody:
    response_id = call.params["response_id"]
    record = await call.shared.resources.store.load(response_id)
    if record is None:
        return _message(operator, "No such response", f"No stored response has the id {response_id}.", "/console/responses", 404)
    return _page(operator, "response.html", "responses", f"Response {response_id}", views.response_view(record))


response = _gated(_response, path="/console/responses")


async def _conversations(call: Call, operator: Operator) -> DeferredHeadBody:
    limit, before = _paging(call)
    found = await call.shared.resources.store.list_conversations(limit=limit, before=before)
    context = views.conversations_view(found, limit=limit, before=before)
    return _page(operator, "conversations.html", "conversations", "Conversations", context)


conversations = _gated(_conversations, path="/console/conversations")


async def _conversation(call: Call, operator: Operator) -> DeferredHeadBody:
    conversation_id = call.params["conversation_id"]
    found = await call.shared.resources.store.load_conversation(conversation_id)
    if found is None:
        text = f"No conversation has the id {conversation_id}."
        return _message(operator, "No such conversation", text, "/console/conversations", 404)
    return _page(operator, "conversation.html", "conversations", f"Conversation {conversation_id}", views.conversation_view(found))


conversation = _gated(_conversation, path="/console/conversations")


async def _mcp(call: Call, operator: Operator) -> DeferredHeadBody:
    source = call.shared.resources.mcp
    status = getattr(source, "status", None)
    context = views.mcp_view(status() if status is not None else None, source.tools() if source is not None else [])
    return _page(operator, "mcp.html", "mcp", "MCP servers and tools", context)


mcp = _gated(_mcp, path="/console/mcp")


async def _playground(call: Call, operator: Operator) -> DeferredHeadBody:
    context = views.playground_view(await _model_names(call, operator.caller.limits))
    return _page(operator, "playground.html", "playground", "Playground", context)


playground = _gated(_playground, path="/console/playground")

_FRONTS = {"responses": responses.create, "messages": messages.create}


async def _playground_send(call: Call, operator: Operator) -> DeferredHeadBody:
    front = _FRONTS.get(call.params["api"])
    if front is None:
        raise NotFound("The playground speaks the Responses API (responses) or the Messages API (messages).", code="unknown_url")
    dialect: Dialect = "anthropic" if call.params["api"] == "messages" else "openai"
    as_operator = dataclasses.replace(call, ctx=dataclasses.replace(call.ctx, caller=operator.caller, dialect=dialect))
    return await front(as_operator)


playground_send = _gated(_playground_send, path="/console/playground", post=True)


async def static(call: Call) -> DeferredHeadBody:
    """One of the console's own files (no credential: they are the same for everyone).

    Raises:
        NotFound: the console is off, or there is no such file.
    """
    await _enabled(_auth(call))
    found = static_file(call.params["name"])
    if found is None:
        raise NotFound(f"The console has no file named {call.params['name']}.", code="not_found")
    return found
