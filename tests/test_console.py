"""The operator console over HTTP: a real gateway on port 0, the scripted backend, httpx2.

What is shown: the console is off until an operator credential exists; nothing of it answers a
missing or wrong credential but 401 (a browser's GET gets the sign-in form, and only that);
CONSOLE_TOKEN and an admin key open it, a plain key does not; the session cookie and its CSRF
token; keys made, limited and revoked from it, and what /v1/responses then does with them; each
page showing what the gateway holds (stored responses and their events, conversations, a stream
held open, a real MCP server's tools, the backends' errors); the playground streaming through the
Responses and Messages handlers.  The pure parts (forms, the chart, the origin check) are tested
without I/O at the end.
"""

from __future__ import annotations

import json
import re
import sys
import pathlib

import httpx2
import pytest
import trio

from gateway.config import ConfigError, load_settings
from gateway.console.auth import safe_next, same_origin
from gateway.console.charts import usage_chart
from gateway.console.forms import parse_limits, parse_new_key
from gateway.keys import AUTH_ON, REVOCATION_BOUND, ApiKey, KeyLimits, digest
from gateway.keys.stores import MemoryKeys
from gateway.observe.usage import UsageBucket

from conftest import parse_sse

TOKEN = "console-token-for-tests-0123456789"
ADMIN_SECRET = "sk-gw-admin-secret-for-the-console-tests"
PLAIN_SECRET = "sk-gw-plain-secret-for-the-console-tests"
EXAMPLE_SERVER = pathlib.Path(__file__).resolve().parent.parent / "examples" / "mcp_server.py"

PAGES = [
    "/console",
    "/console/backends",
    "/console/keys",
    "/console/streams",
    "/console/responses",
    "/console/responses/{response_id}",
    "/console/conversations",
    "/console/conversations/{conversation_id}",
    "/console/mcp",
    "/console/playground",
]
FORMS = [
    "/console/logout",
    "/console/keys",
    "/console/keys/bystander/revoke",
    "/console/keys/bystander/limits",
    "/console/playground/responses",
    "/console/playground/messages",
]


def bearer(secret: str) -> dict[str, str]:
    return {"authorization": f"Bearer {secret}"}


async def key_store(*keys: tuple[str, str, bool]) -> MemoryKeys:
    """A key store holding (name, secret, admin) keys, authentication on."""
    store = MemoryKeys()
    for name, secret, admin in keys:
        await store.put(ApiKey(name=name, id=f"key_{name}", digest=digest(secret), created_at=1_700_000_000.0, admin=admin))
    await store.set_auth(AUTH_ON)
    return store


async def stored_response(client: httpx2.AsyncClient, url: str, headers: dict[str, str] | None = None) -> str:
    r = await client.post(url + "/v1/responses", json={"model": "text", "input": "hi", "stream": True}, headers=headers or {})
    assert r.status_code == 200
    created = next(event for event in parse_sse(r.content) if isinstance(event, dict) and event["type"] == "response.created")
    return str(created["response"]["id"])


async def sign_in(client: httpx2.AsyncClient, url: str, credential: str) -> tuple[dict[str, str], str]:
    """Sign in through the form as a browser would: the cookie header to send, and the CSRF token."""
    r = await client.post(url + "/console/login", data={"credential": credential, "next": "/console/keys"}, headers={"origin": url})
    assert r.status_code == 303 and r.headers["location"] == "/console/keys"
    cookie = r.headers["set-cookie"].split(";", 1)[0]
    page = await client.get(url + "/console/keys", headers={"cookie": cookie})
    assert page.status_code == 200
    csrf = re.search(r'<meta name="csrf-token" content="([^"]+)">', page.text)
    assert csrf is not None
    return {"cookie": cookie}, csrf[1]


# --- off, and who gets in ------------------------------------------------------------------------


async def test_the_console_is_off_until_an_operator_credential_is_configured(start_gateway, client):
    url = await start_gateway(keys=await key_store(("plain", PLAIN_SECRET, False)))
    for path in ["/console", "/console/login", "/console/keys", "/console/static/htmx.min.js"]:
        r = await client.get(url + path, headers=bearer(PLAIN_SECRET))
        assert r.status_code == 404, path
        error = r.json()["error"]
        assert error["code"] == "console_disabled" and "CONSOLE_TOKEN" in error["message"] and "--admin" in error["message"]
    r = await client.post(url + "/console/keys", data={"name": "x"}, headers=bearer(PLAIN_SECRET))
    assert r.status_code == 404 and r.json()["error"]["code"] == "console_disabled"


def test_a_console_token_shorter_than_16_characters_is_refused_at_start_up_naming_the_variable():
    with pytest.raises(ConfigError) as refused:
        load_settings(_env_file=None, console_token="too-short")
    assert "CONSOLE_TOKEN" in str(refused.value) and "too-short" not in str(refused.value)
    assert load_settings(_env_file=None, console_token=TOKEN).console_token == TOKEN
    assert TOKEN not in repr(load_settings(_env_file=None, console_token=TOKEN))


async def test_without_or_with_a_wrong_credential_the_console_answers_401_and_nothing_else(start_gateway, client):
    store = await key_store(("admin", ADMIN_SECRET, True), ("bystander", PLAIN_SECRET, False))
    url = await start_gateway(console_token=TOKEN, keys=store)
    response_id = await stored_response(client, url, bearer(PLAIN_SECRET))
    conv = await client.post(url + "/v1/conversations", json={"metadata": {"who": "bystander"}}, headers=bearer(PLAIN_SECRET))
    conversation_id = conv.json()["id"]
    forged = "gateway_console=eyJzIjoidG9rZW46eCIsImMiOiJ4In0.forged.signature"
    wrong = [
        {},
        bearer("console-token-for-tests-but-wrong"),
        bearer(PLAIN_SECRET),  # a key, but not an admin's
        {"authorization": f"Basic {TOKEN}"},
        {"cookie": forged},
        {"cookie": forged, "authorization": "Bearer nope"},
    ]
    for headers in wrong:
        for template in PAGES:
            path = template.format(response_id=response_id, conversation_id=conversation_id)
            r = await client.get(url + path, headers=headers)
            assert r.status_code == 401, (path, headers)
            assert r.json()["error"]["code"] == "console_unauthorized"
            for secret in (response_id, conversation_id, "bystander", "admin"):
                assert secret not in r.text, (path, secret)
            # A browser is given the sign-in form, and only that.
            r = await client.get(url + path, headers={**headers, "accept": "text/html,application/xhtml+xml"})
            assert r.status_code == 401 and 'name="credential"' in r.text
            assert response_id not in r.text and conversation_id not in r.text and "bystander" not in r.text
            assert "Sign out" not in r.text and 'aria-label="Console pages"' not in r.text  # no nav
        for path in FORMS:
            r = await client.post(url + path, data={"name": "intruder", "rpm": "1"}, headers={**headers, "origin": url})
            assert r.status_code == 401, (path, headers)
            assert "bystander" not in r.text and "admin" not in r.text
    names = {key.name: key for key in await store.all()}
    assert sorted(names) == ["admin", "bystander"] and names["bystander"].active and names["bystander"].limits == KeyLimits()


async def test_the_console_token_as_a_bearer_opens_every_page(start_gateway, client):
    url = await start_gateway(console_token=TOKEN)
    response_id = await stored_response(client, url)
    conversation_id = (await client.post(url + "/v1/conversations", json={})).json()["id"]
    for template in PAGES:
        r = await client.get(url + template.format(response_id=response_id, conversation_id=conversation_id), headers=bearer(TOKEN))
        assert r.status_code == 200, template
        assert r.headers["content-type"] == "text/html; charset=utf-8"
        csp = r.headers["content-security-policy"]
        assert "default-src 'self'" in csp and "script-src 'self'" in csp and "unsafe-inline" not in csp
        assert r.headers["cache-control"] == "no-store" and r.headers["x-frame-options"] == "DENY"
        assert 'href="#main"' in r.text and '<main id="main"' in r.text and "Signed in as <strong>CONSOLE_TOKEN</strong>" in r.text
        assert "<script>" not in r.text and " style=" not in r.text and "http://" not in r.text.replace(url, "")


async def test_an_admin_key_opens_the_console_and_a_plain_key_does_not(start_gateway, client):
    url = await start_gateway(keys=await key_store(("ops", ADMIN_SECRET, True), ("app", PLAIN_SECRET, False)))
    r = await client.get(url + "/console/keys", headers=bearer(ADMIN_SECRET))
    assert r.status_code == 200 and "Signed in as <strong>ops</strong>" in r.text and "app" in r.text
    r = await client.get(url + "/console/keys", headers=bearer(PLAIN_SECRET))
    assert r.status_code == 401 and "app" not in r.text
    # The admin key is also an API key like any other.
    r = await client.post(url + "/v1/responses", json={"model": "text", "input": "hi"}, headers=bearer(ADMIN_SECRET))
    assert r.status_code == 200


async def test_signing_in_sets_a_strict_http_only_session_cookie_and_the_pages_then_render(start_gateway, client):
    url = await start_gateway(console_token=TOKEN)
    r = await client.get(url + "/console/login")
    assert r.status_code == 200 and 'name="credential"' in r.text and 'type="password"' in r.text
    r = await client.post(url + "/console/login", data={"credential": TOKEN, "next": "/console/streams"}, headers={"origin": url})
    assert r.status_code == 303 and r.headers["location"] == "/console/streams"
    cookie = r.headers["set-cookie"]
    attributes = {part.strip().split("=", 1)[0].lower() for part in cookie.split(";")[1:]}
    assert {"httponly", "samesite", "path", "max-age"} <= attributes and "secure" not in attributes
    assert "SameSite=Strict" in cookie and "Path=/console" in cookie and TOKEN not in cookie
    session = {"cookie": cookie.split(";", 1)[0]}
    for path in ("/console", "/console/keys", "/console/streams"):
        r = await client.get(url + path, headers=session)
        assert r.status_code == 200 and "Sign out" in r.text
    # The sign-in's next page is always one of the console's.
    r = await client.post(url + "/console/login", data={"credential": TOKEN, "next": "//evil.example/"}, headers={"origin": url})
    assert r.headers["location"] == "/console"
    # Over https (as the browser's Origin says), the cookie is sent over https only.
    r = await client.post(url + "/console/login", data={"credential": TOKEN}, headers={"origin": url.replace("http://", "https://")})
    assert r.status_code == 303 and "; Secure" in r.headers["set-cookie"]
    # Signing out ends the cookie.
    headers, csrf = await sign_in(client, url, TOKEN)
    r = await client.post(url + "/console/logout", data={"csrf": csrf}, headers={**headers, "origin": url})
    assert r.status_code == 303 and "Max-Age=0" in r.headers["set-cookie"]


async def test_a_wrong_credential_at_sign_in_gets_the_form_again_and_no_cookie(start_gateway, client):
    url = await start_gateway(keys=await key_store(("ops", ADMIN_SECRET, True), ("app", PLAIN_SECRET, False)))
    for credential in ("guess-guess-guess-guess", PLAIN_SECRET, ""):
        r = await client.post(url + "/console/login", data={"credential": credential}, headers={"origin": url})
        assert r.status_code == 401 and "set-cookie" not in r.headers
        assert "not accepted" in r.text and 'aria-invalid="true"' in r.text and "app" not in r.text
    # A sign-in posted from another site is refused before the credential is looked at.
    r = await client.post(url + "/console/login", data={"credential": ADMIN_SECRET}, headers={"origin": "http://evil.example"})
    assert r.status_code == 403 and "set-cookie" not in r.headers


async def test_a_session_ends_when_its_key_is_revoked(start_gateway, client):
    url = await start_gateway(console_token=TOKEN, keys=await key_store(("ops", ADMIN_SECRET, True)))
    session, _ = await sign_in(client, url, ADMIN_SECRET)
    assert (await client.get(url + "/console", headers=session)).status_code == 200
    r = await client.post(url + "/console/keys/ops/revoke", headers=bearer(TOKEN))
    assert r.status_code == 303
    assert (await client.get(url + "/console", headers=session)).status_code == 401


async def test_a_cookie_borne_post_without_its_csrf_token_or_from_another_origin_is_refused_and_changes_nothing(start_gateway, client):
    store = await key_store(("ops", ADMIN_SECRET, True))
    url = await start_gateway(keys=store)
    session, csrf = await sign_in(client, url, ADMIN_SECRET)
    refused = [
        ({"name": "mallory"}, {"origin": url}, "csrf_failed"),
        ({"name": "mallory", "csrf": "not-the-token"}, {"origin": url}, "csrf_failed"),
        ({"name": "mallory", "csrf": csrf}, {"origin": "http://evil.example"}, "cross_origin"),
        ({"name": "mallory", "csrf": csrf}, {"referer": "http://evil.example/console/keys"}, "cross_origin"),
        ({"name": "mallory", "csrf": csrf}, {"origin": "null"}, "cross_origin"),
        ({"name": "mallory", "csrf": csrf}, {}, "cross_origin"),  # neither Origin nor Referer
    ]
    for form, extra, code in refused:
        r = await client.post(url + "/console/keys", data=form, headers={**session, **extra})
        assert r.status_code == 403 and r.json()["error"]["code"] == code, (form, extra)
        r = await client.post(url + "/console/keys/ops/revoke", data=form, headers={**session, **extra})
        assert r.status_code == 403
    assert [key.name for key in await store.all()] == ["ops"] and (await store.by_name("ops")).active  # type: ignore[union-attr]
    # The same form, with its token and from the console's own origin (a Referer will do), is taken.
    r = await client.post(url + "/console/keys", data={"name": "mallory", "csrf": csrf}, headers={**session, "referer": url + "/console/keys"})
    assert r.status_code == 200 and await store.by_name("mallory") is not None


# --- keys ----------------------------------------------------------------------------------------


async def test_a_key_created_in_the_console_is_shown_once_works_and_is_refused_once_revoked(start_gateway, client):
    url = await start_gateway(console_token=TOKEN)
    r = await client.post(url + "/v1/responses", json={"model": "text", "input": "hi"})
    assert r.status_code == 200  # no key yet: anyone may call
    r = await client.post(url + "/console/keys", data={"name": "alice", "rpm": "30", "models": "text, qwen*"}, headers=bearer(TOKEN))
    assert r.status_code == 200
    secret = re.search(r'<output id="new-secret" class="secret">(sk-gw-[A-Za-z0-9_-]+)</output>', r.text)
    assert secret is not None
    listing = await client.get(url + "/console/keys", headers=bearer(TOKEN))
    assert "alice" in listing.text and "rpm=30" in listing.text and "models=text,qwen*" in listing.text
    assert secret[1] not in listing.text  # shown once
    # Making a key turned authentication on (within the key ring's documented bound): the key works,
    # nobody else does.
    with trio.fail_after(REVOCATION_BOUND + 5):
        while (await client.post(url + "/v1/responses", json={"model": "text", "input": "hi"})).status_code != 401:
            await trio.sleep(0.05)
    r = await client.post(url + "/v1/responses", json={"model": "text", "input": "hi"}, headers=bearer(secret[1]))
    assert r.status_code == 200 and r.headers["x-ratelimit-limit-requests"] == "30"
    r = await client.post(url + "/console/keys/alice/revoke", headers=bearer(TOKEN))
    assert r.status_code == 303 and r.headers["location"] == "/console/keys"
    r = await client.post(url + "/v1/responses", json={"model": "text", "input": "hi"}, headers=bearer(secret[1]))
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert "revoked" in (await client.get(url + "/console/keys", headers=bearer(TOKEN))).text
    # A name in use by an active key is refused next to the name field.
    await client.post(url + "/console/keys", data={"name": "bob"}, headers=bearer(TOKEN))
    r = await client.post(url + "/console/keys", data={"name": "bob"}, headers=bearer(TOKEN))
    assert r.status_code == 400 and 'id="new-name-error"' in r.text
    # Revoking what is not there is a 404 page.
    assert (await client.post(url + "/console/keys/nobody/revoke", headers=bearer(TOKEN))).status_code == 404


async def test_invalid_limits_are_shown_next_to_their_field_and_change_nothing(start_gateway, client):
    store = await key_store(("ops", ADMIN_SECRET, True))
    url = await start_gateway(keys=store)
    for form, field in [
        ({"name": "carol", "rpm": "-1"}, "rpm"),
        ({"name": "carol", "rpm": "abc"}, "rpm"),
        ({"name": "carol", "tpm": "1.5"}, "tpm"),
        ({"name": "carol", "concurrency": "99999999999999"}, "concurrency"),
        ({"name": "carol", "models": "bad model!"}, "models"),
        ({"name": "-carol"}, "name"),
    ]:
        r = await client.post(url + "/console/keys", data=form, headers=bearer(ADMIN_SECRET))
        assert r.status_code == 400, form
        field_id = f"new-{field}"
        tag = re.search(rf'<input id="{field_id}"[^>]*>', r.text)
        assert tag is not None and 'aria-invalid="true"' in tag[0] and f"{field_id}-error" in tag[0]
        assert f'<p class="error" id="{field_id}-error">' in r.text
        assert f'value="{form[field]}"' in r.text.replace("&#34;", '"')  # what was typed is kept
    assert [key.name for key in await store.all()] == ["ops"]
    await client.post(url + "/console/keys", data={"name": "dave", "rpm": "10"}, headers=bearer(ADMIN_SECRET))
    before = await store.by_name("dave")
    r = await client.post(url + "/console/keys/dave/limits", data={"rpm": "5", "tpm": "abc"}, headers=bearer(ADMIN_SECRET))
    assert r.status_code == 400
    tag = re.search(r'<input id="key-dave-tpm"[^>]*>', r.text)
    assert tag is not None and 'aria-invalid="true"' in tag[0]
    assert await store.by_name("dave") == before  # rpm too: nothing changed
    r = await client.post(url + "/console/keys/dave/limits", data={"rpm": "5", "tpm": "", "models": "none"}, headers=bearer(ADMIN_SECRET))
    assert r.status_code == 303
    changed = await store.by_name("dave")
    assert changed is not None and changed.limits.rpm == 5 and changed.limits.tpm is None and changed.limits.models == ()


async def test_the_keys_page_charts_each_keys_use_over_the_last_hour(start_gateway, client):
    url = await start_gateway(keys=await key_store(("ops", ADMIN_SECRET, True), ("app", PLAIN_SECRET, False)))
    for _ in range(3):
        assert (await client.post(url + "/v1/responses", json={"model": "text", "input": "hi"}, headers=bearer(PLAIN_SECRET))).status_code == 200
    bad = await client.post(url + "/v1/responses", json={"model": "text", "input": 5}, headers=bearer(PLAIN_SECRET))
    assert bad.status_code == 400
    r = await client.get(url + "/console/keys", headers=bearer(ADMIN_SECRET))
    app = r.text[r.text.index('id="key-app-h"'):]
    assert 'aria-label="last 60 minutes: 4 requests, 54 tokens, 1 errors"' in app[: app.index("</figure>")]


# --- pages ---------------------------------------------------------------------------------------


async def test_the_responses_page_lists_a_stored_response_and_its_page_shows_its_events(start_gateway, client):
    url = await start_gateway(console_token=TOKEN)
    first, second = await stored_response(client, url), await stored_response(client, url)
    r = await client.get(url + "/console/responses", headers=bearer(TOKEN))
    assert r.status_code == 200 and r.text.index(second) < r.text.index(first)  # newest first
    assert "Hello, world!" in r.text
    paged = await client.get(url + "/console/responses?limit=1", headers=bearer(TOKEN))
    assert second in paged.text and first not in paged.text and f"before={second}" in paged.text
    older = await client.get(url + f"/console/responses?limit=1&before={second}", headers=bearer(TOKEN))
    assert first in older.text and second not in older.text
    r = await client.get(url + f"/console/responses/{first}", headers=bearer(TOKEN))
    assert r.status_code == 200
    for kind in ("response.created", "response.output_text.delta", "response.completed"):
        assert f'<code class="event-type">{kind}</code>' in r.text
    data = re.search(r'<script type="application/json" id="events-data">(.*?)</script>', r.text, re.S)
    assert data is not None
    events = json.loads(data[1])
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == "Hello, world!"
    assert 'id="replay"' in r.text and 'aria-live="polite"' in r.text
    assert (await client.get(url + "/console/responses/resp_unknown", headers=bearer(TOKEN))).status_code == 404


async def test_conversations_are_listed_with_their_items(start_gateway, client):
    url = await start_gateway(console_token=TOKEN)
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "remember the <teapot>"}]}
    conv = await client.post(url + "/v1/conversations", json={"items": [item], "metadata": {"topic": "tea"}})
    conversation_id = conv.json()["id"]
    r = await client.get(url + "/console/conversations", headers=bearer(TOKEN))
    assert r.status_code == 200 and conversation_id in r.text
    r = await client.get(url + f"/console/conversations/{conversation_id}", headers=bearer(TOKEN))
    assert r.status_code == 200 and "remember the &lt;teapot&gt;" in r.text and "<teapot>" not in r.text  # escaped
    assert "topic" in r.text


async def test_the_streams_page_shows_a_stream_the_backend_holds_open(start_gateway, backend, client, nursery):
    url = await start_gateway(console_token=TOKEN)
    opened = trio.Event()

    async def hold_open() -> None:
        async with httpx2.AsyncClient(timeout=30) as other:
            body = {"model": "text-then-wait", "input": "hi", "stream": True}
            async with other.stream("POST", url + "/v1/responses", json=body) as r:
                async for data in r.aiter_raw():
                    if b"Hello" in data:
                        opened.set()

    nursery.start_soon(hold_open)
    with trio.fail_after(10):
        await opened.wait()
    r = await client.get(url + "/console/streams", headers=bearer(TOKEN))
    assert r.status_code == 200 and "Responses (SSE)" in r.text and "text-then-wait" in r.text
    assert 'hx-get="/console/streams?part=table"' in r.text and 'hx-trigger="every 3s"' in r.text
    part = await client.get(url + "/console/streams?part=table", headers=bearer(TOKEN))
    assert "text-then-wait" in part.text and "<html" not in part.text
    backend.release.set()
    with trio.fail_after(10):
        while "text-then-wait" in (await client.get(url + "/console/streams?part=table", headers=bearer(TOKEN))).text:
            await trio.sleep(0.05)


async def test_the_mcp_page_lists_a_real_mcp_servers_tools(start_gateway, client, tmp_path):
    config = tmp_path / "servers.json"
    config.write_text(json.dumps({"mcpServers": {"example": {"command": sys.executable, "args": [str(EXAMPLE_SERVER)]}}}))
    url = await start_gateway(console_token=TOKEN, mcp_servers_config_path=str(config))
    r = await client.get(url + "/console/mcp", headers=bearer(TOKEN))
    assert r.status_code == 200 and "example" in r.text and "ready" in r.text
    for tool in ("add", "echo", "word_count"):
        assert f"<code>{tool}</code>" in r.text


async def test_the_backends_page_shows_readiness_the_models_and_recent_backend_errors(start_gateway, backend, client):
    url = await start_gateway(console_token=TOKEN)
    backend.fail_with = 503
    await client.post(url + "/v1/responses", json={"model": "text", "input": "hi"})
    backend.fail_with = None
    r = await client.get(url + "/console/backends", headers=bearer(TOKEN))
    assert r.status_code == 200 and "<code>text</code>" in r.text  # the backend's /v1/models
    errors = r.text[r.text.index('id="errors-h"'):]
    assert "<code>backend_" in errors and "None since this process started" not in errors


async def test_the_backends_page_lists_the_configured_routes_and_each_backends_state(start_gateway, backend, client, tmp_path):
    config = tmp_path / "gateway.toml"
    config.write_text(
        f"""
[backends.near]
base_url = "{backend.url}/v1"
[backends.far]
base_url = "http://127.0.0.1:9/v1"

[[routes]]
model = "smart"
backends = [{{ backend = "far", model = "big-model" }}, "near"]
context_window = 4096

[[routes]]
model = "*"
backends = ["near"]
"""
    )
    url = await start_gateway(console_token=TOKEN, gateway_config=str(config))
    r = await client.get(url + "/console/backends", headers=bearer(TOKEN))
    assert r.status_code == 200
    routes = r.text[r.text.index('id="routes-h"'):r.text.index('id="models-h"')]
    assert "<code>smart</code>" in routes and "far as big-model, then near" in routes and "4096" in routes
    assert "<code>*</code>" in routes
    backends = r.text[r.text.index('id="backends-h"'):r.text.index('id="routes-h"')]
    assert re.search(r"<th scope=\"row\">far</th><td class=\"state-unreachable\">unreachable</td>", backends)
    assert re.search(r"<th scope=\"row\">near</th><td class=\"state-reachable\">reachable</td>", backends)
    assert "127.0.0.1:9" not in r.text  # backends' URLs stay in the log


async def test_the_playground_streams_a_reply_for_both_apis(start_gateway, client):
    url = await start_gateway(console_token=TOKEN)
    body = {"model": "text", "input": "hi", "stream": True}
    r = await client.post(url + "/console/playground/responses", json=body, headers=bearer(TOKEN))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [e for e in parse_sse(r.content) if isinstance(e, dict)]
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == "Hello, world!"
    body = {"model": "text-then-tool", "max_tokens": 64, "stream": True, "messages": [{"role": "user", "content": "weather?"}],
            "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}]}
    r = await client.post(url + "/console/playground/messages", json=body, headers=bearer(TOKEN))
    assert r.status_code == 200 and b"event: message_start" in r.content
    assert b'"text_delta"' in r.content and b'"tool_use"' in r.content and b"get_weather" in r.content
    assert (await client.post(url + "/console/playground/chat", json=body, headers=bearer(TOKEN))).status_code == 404


async def test_the_playground_runs_as_the_admin_key_with_its_limits(start_gateway, client):
    store = MemoryKeys()
    await store.put(ApiKey(name="ops", id="key_ops", digest=digest(ADMIN_SECRET), created_at=0.0, admin=True, limits=KeyLimits(models=("other",))))
    await store.set_auth(AUTH_ON)
    url = await start_gateway(keys=store)
    r = await client.post(url + "/console/playground/responses", json={"model": "text", "input": "hi", "stream": True}, headers=bearer(ADMIN_SECRET))
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"  # the key may use "other" only
    # The same key may use the model it is given.
    await store.put(ApiKey(name="ops", id="key_ops", digest=digest(ADMIN_SECRET), created_at=0.0, admin=True, limits=KeyLimits(models=("text",))))
    r = await client.post(url + "/console/playground/responses", json={"model": "text", "input": "hi", "stream": True}, headers=bearer(ADMIN_SECRET))
    assert r.status_code == 200 and b"response.completed" in r.content


async def test_the_static_files_are_the_gateways_own_and_need_no_credential(start_gateway, client):
    url = await start_gateway(console_token=TOKEN)
    r = await client.get(url + "/console/static/htmx.min.js")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/javascript") and b"htmx" in r.content
    r = await client.get(url + "/console/static/console.css")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/css")
    for name in ("nope.js", "..%2Fauth.py", "%2E%2E%2Fpages.py"):
        assert (await client.get(url + "/console/static/" + name)).status_code == 404


# --- the layers ----------------------------------------------------------------------------------


def test_the_console_imports_neither_the_app_nor_the_api_nor_the_framework():
    from test_public_api import breaking, modules

    assert breaking(modules("console"), "gateway.app", "gateway.api", "quart", "quart_trio", "werkzeug") == {}


# --- the pure parts ------------------------------------------------------------------------------


def test_a_key_form_reads_limits_as_the_cli_does_and_names_each_bad_field():
    new, errors = parse_new_key({"name": "ci-bot", "rpm": "60", "tpm": "", "concurrency": "0", "models": "qwen*, llama3", "admin": "on"})
    assert errors == {} and new is not None
    assert (new.name, new.admin) == ("ci-bot", True)
    assert new.limits == KeyLimits(rpm=60, tpm=None, concurrency=0, models=("qwen*", "llama3"))
    new, errors = parse_new_key({"name": "", "rpm": "-3", "tpm": "x", "concurrency": "１２"})  # full-width digits too
    assert new is None and sorted(errors) == ["concurrency", "name", "rpm", "tpm"]
    base = KeyLimits(rpm=5, mcp_servers=("docs",), hosted_mcp=False)
    limits, errors = parse_limits({"tpm": "100", "models": "none"}, base)
    assert errors == {} and limits == KeyLimits(rpm=5, tpm=100, models=(), mcp_servers=("docs",), hosted_mcp=False)
    assert parse_limits({"models": ""}, KeyLimits(models=("a",)))[0] == KeyLimits(models=None)


def test_the_usage_chart_draws_the_last_hour_on_two_scales():
    now = 60 * 1000 + 30.0
    buckets = [UsageBucket(1000, 4, 100, 50, 1), UsageBucket(999, 2, 10, 5, 0), UsageBucket(900, 9, 9, 9, 9)]  # the last is too old
    chart = usage_chart(buckets, now=now, minutes=60, width=240, height=48)
    assert (chart.total_requests, chart.total_tokens, chart.total_errors) == (6, 165, 1)
    assert [(bar.x, bar.height) for bar in chart.requests] == [(232.0, 24.0), (236.0, 48.0)]
    assert [(bar.x, bar.y, bar.height) for bar in chart.errors] == [(236.0, 36.0, 12.0)]
    points = chart.tokens.split()
    assert len(points) == 60 and points[-1] == "237.6,0.0" and points[0] == "1.6,48.0"
    assert usage_chart([], now=now).tokens == "" and usage_chart([], now=now).requests == []
    assert chart.summary == "last 60 minutes: 6 requests, 165 tokens, 1 errors"


def test_a_post_is_same_origin_only_when_its_origin_or_referer_names_the_host():
    assert same_origin({"host": "gw.example:8080", "origin": "http://gw.example:8080"})
    assert same_origin({"host": "gw.example", "origin": "https://GW.example"})
    assert same_origin({"host": "gw.example", "referer": "https://gw.example/console/keys"})
    assert not same_origin({"host": "gw.example", "origin": "https://gw.example.evil"})
    assert not same_origin({"host": "gw.example", "origin": "null", "referer": "https://gw.example/"})
    assert not same_origin({"host": "gw.example"})
    assert not same_origin({"host": "gw.example", "origin": "javascript://gw.example"})
    assert [safe_next(path) for path in ("/console/keys", "//evil", "/console//evil", "https://evil/console", "/console\\x", None)] == [
        "/console/keys", "/console", "/console", "/console", "/console", "/console",
    ]
