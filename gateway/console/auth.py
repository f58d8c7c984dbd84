"""The operator's credential: who may open the console, and a browser's session with it.

Owns:

- the credential: `CONSOLE_TOKEN`, compared in constant time, or an active
  API key with the admin flag (asked of the key ring, so a revoked key is
  refused at its next request); the console is off while neither exists;
- a script's way: `Authorization: Bearer <credential>` on each request, no
  cookie and no CSRF token (a browser never adds that header on its own);
- a browser's way: the sign-in form sets one signed session cookie
  (HttpOnly, SameSite=Strict, Path=/console, `Secure` when the page is
  https, expiring after `SESSION_SECONDS`), signed by itsdangerous under
  GATEWAY_SECRET_KEY, else CONSOLE_TOKEN, else a random key of this
  process; the session names its subject (the token, by a fingerprint,
  or the key by name and id), so a changed token or a revoked, re-created
  or demoted key ends it;
- CSRF: each session's random token, which every form carries and every
  cookie-borne POST must present, and the same-origin check those POSTs
  pass (`Origin`, else `Referer`, naming the request's `Host`).

Knows request headers (names in lower case), the settings and the key ring;
nothing of routes, templates or the framework.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import http.cookies
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import itsdangerous

from ..errors import Unauthorized
from ..keys import ANONYMOUS, Caller, KeyRing

__all__ = ["COOKIE", "SESSION_SECONDS", "ConsoleAuth", "Operator", "safe_next", "same_origin"]

COOKIE = "gateway_console"
SESSION_SECONDS = 12 * 3600
TOKEN_NAME = "CONSOLE_TOKEN"
# Sessions of a gateway with neither GATEWAY_SECRET_KEY nor CONSOLE_TOKEN are signed with this:
# they end with the process (and each worker process has its own).
_PROCESS_SECRET = secrets.token_bytes(32)


@dataclass(frozen=True)
class Operator:
    """Who opened the console, and how."""

    name: str  # what the pages call them: CONSOLE_TOKEN, or the admin key's name
    caller: Caller  # whom the playground's requests run as: the admin key (its limits), or nobody
    subject: str  # what a session names: `token:<fingerprint>` or `key:<name>:<id>`
    csrf: str | None = None  # the session's CSRF token; None for a bearer request (no cookie: no CSRF)


class ConsoleAuth:
    """The console's credential check for one gateway (built per request: it is cheap)."""

    def __init__(self, settings: Any, keyring: KeyRing) -> None:
        self._token: str = settings.console_token
        self._keyring = keyring
        secret = settings.gateway_secret_key or self._token
        self._sessions = itsdangerous.URLSafeTimedSerializer(
            secret.encode() if secret else _PROCESS_SECRET, salt="gateway.console.session"
        )

    async def enabled(self) -> bool:
        """Whether the console is on: a CONSOLE_TOKEN, or an active admin key in the key store.

        Raises:
            StoreUnavailable: the key store failed.
        """
        if self._token:
            return True
        store = self._keyring.store
        return store is not None and any(key.active and key.admin for key in await store.all())

    async def check(self, headers: Mapping[str, str]) -> Operator | None:
        """The operator a request's `Authorization: Bearer` or session cookie names, or None.

        A request that carries the header is judged by it alone (a wrong one gets nothing, cookie or not).

        Raises:
            StoreUnavailable: the key store failed.
        """
        authorization = headers.get("authorization")
        if authorization is not None:
            scheme, _, value = authorization.strip().partition(" ")
            operator = await self.sign_in(value.strip()) if scheme.lower() == "bearer" else None
            return dataclasses.replace(operator, csrf=None) if operator is not None else None
        session = _session_cookie(headers.get("cookie", ""))
        if session is None:
            return None
        try:
            data = self._sessions.loads(session, max_age=SESSION_SECONDS)
        except itsdangerous.BadData:  # forged, altered or expired
            return None
        if not isinstance(data, dict) or not isinstance(data.get("s"), str) or not isinstance(data.get("c"), str):
            return None
        operator = await self._subject(data["s"])
        return Operator(operator.name, operator.caller, operator.subject, data["c"]) if operator is not None else None

    async def sign_in(self, credential: str) -> Operator | None:
        """The operator `credential` (CONSOLE_TOKEN, or an admin key's secret) makes, with a new
        CSRF token for a session; None for anything else.

        Raises:
            StoreUnavailable: the key store failed.
        """
        if not credential or len(credential) > 512 or not credential.isascii():
            return None
        csrf = secrets.token_urlsafe(32)
        if self._token and hmac.compare_digest(credential.encode(), self._token.encode()):
            return Operator(TOKEN_NAME, ANONYMOUS, f"token:{self._fingerprint()}", csrf)
        try:
            caller = await self._keyring.identify([(b"authorization", b"Bearer " + credential.encode())])
        except Unauthorized:
            return None
        if not caller.admin or caller.key is None:
            return None
        return Operator(caller.key.name, caller, f"key:{caller.key.name}:{caller.key.id}", csrf)

    def session_cookie(self, operator: Operator, *, secure: bool) -> str:
        """The `Set-Cookie` value that opens `operator`'s session."""
        value = self._sessions.dumps({"s": operator.subject, "c": operator.csrf})
        return _cookie(value, SESSION_SECONDS, secure)

    @staticmethod
    def ended_cookie(*, secure: bool) -> str:
        """The `Set-Cookie` value that ends a session."""
        return _cookie("", 0, secure)

    @staticmethod
    def csrf_ok(operator: Operator, given: str | None) -> bool:
        """Whether a cookie-borne POST presented its session's CSRF token."""
        return operator.csrf is not None and bool(given) and hmac.compare_digest(str(given).encode(), operator.csrf.encode())

    async def _subject(self, subject: str) -> Operator | None:
        """The operator a session's subject still is (the token unchanged; the key active and admin)."""
        kind, _, rest = subject.partition(":")
        if kind == "token":
            if self._token and hmac.compare_digest(rest, self._fingerprint()):
                return Operator(TOKEN_NAME, ANONYMOUS, subject)
            return None
        name, _, key_id = rest.partition(":")
        store = self._keyring.store
        if kind != "key" or store is None or not name:
            return None
        key = await store.by_name(name)
        if key is None or not key.active or not key.admin or key.id != key_id:
            return None
        return Operator(key.name, Caller(key), subject)

    def _fingerprint(self) -> str:
        return hashlib.sha256(b"gateway.console.token:" + self._token.encode()).hexdigest()[:32]


def _cookie(value: str, max_age: int, secure: bool) -> str:
    attributes = f"{COOKIE}={value}; Max-Age={max_age}; Path=/console; HttpOnly; SameSite=Strict"
    return attributes + "; Secure" if secure else attributes


def _session_cookie(header: str) -> str | None:
    if COOKIE not in header:
        return None
    jar: http.cookies.SimpleCookie = http.cookies.SimpleCookie()
    try:
        jar.load(header)
    except http.cookies.CookieError:
        return None
    morsel = jar.get(COOKIE)
    return morsel.value if morsel is not None and morsel.value else None


def same_origin(headers: Mapping[str, str]) -> bool:
    """Whether a browser's POST comes from a page of this gateway: its `Origin` (else its
    `Referer`) names the request's `Host`.  Neither, or `Origin: null`: not shown, so refused."""
    host = headers.get("host", "").strip().lower()
    source = headers.get("origin") or headers.get("referer") or ""
    if not host or not source or source == "null":
        return False
    try:
        parts = urlsplit(source)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and parts.netloc.lower() == host


def safe_next(target: str | None) -> str:
    """Where a sign-in goes on to: a console path, never another site (`//evil`, `/\\evil`)."""
    if not target or not target.startswith("/console") or "//" in target or "\\" in target or any(c < " " for c in target):
        return "/console"
    return target
