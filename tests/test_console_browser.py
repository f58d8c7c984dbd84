"""The operator console in a real browser: Debian's chromium, driven by Playwright.

The gateway and the scripted backend run in the test's trio nursery; the browser part runs on
asyncio in a worker thread (Playwright's async API), every wait bounded by Playwright's timeouts
and the scenario's own.  Chromium is the system's (/usr/bin/chromium, never a downloaded one),
with a fresh profile for each test.  Every page is loaded with no console error and no page error
(the strict CSP makes anything loaded from elsewhere, or any inline script or style, an error);
a screenshot of each goes to test-output/console/, which CI keeps.
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import httpx2
import pytest
import trio

from gateway.keys import AUTH_ON, ApiKey, digest
from gateway.keys.stores import MemoryKeys

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
ROOT = pathlib.Path(__file__).resolve().parent.parent
SHOTS = ROOT / "test-output" / "console"
EXAMPLE_SERVER = ROOT / "examples" / "mcp_server.py"
TOKEN = "console-token-for-the-browser-tests"
SCENARIO_SECONDS = 120
BODY = {"model": "text", "input": "hi"}

pytestmark = pytest.mark.skipif(
    not os.path.exists(CHROMIUM), reason="Debian's chromium is not at /usr/bin/chromium (apt install chromium chromium-driver)"
)

Scenario = Callable[[Any, list[str]], Awaitable[Any]]


async def in_chromium(profile: pathlib.Path, scenario: Scenario, url: str) -> Any:
    """`scenario(page, problems)` in Chromium; `problems` collects every console error, page error
    and request to anywhere but the gateway at `url` (nothing comes from a CDN)."""

    async def main() -> Any:
        from playwright.async_api import async_playwright

        async with async_playwright() as playwright:
            context = await playwright.chromium.launch_persistent_context(
                str(profile), executable_path=CHROMIUM, headless=True, args=ARGS, viewport={"width": 1280, "height": 860}
            )
            try:
                context.set_default_timeout(15_000)
                page = context.pages[0] if context.pages else await context.new_page()
                problems: list[str] = []
                page.on("console", lambda message: problems.append(f"{message.type}: {message.text}") if message.type == "error" else None)
                page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
                page.on("request", lambda request: None if request.url.startswith(url + "/") else problems.append(f"request to {request.url}"))
                return await asyncio.wait_for(scenario(page, problems), SCENARIO_SECONDS)
            finally:
                await context.close()

    return await trio.to_thread.run_sync(asyncio.run, main())


async def sign_in(page: Any, url: str, credential: str = TOKEN) -> None:
    await page.goto(url + "/console/login")
    await page.get_by_label("Operator credential").fill(credential)
    await page.get_by_role("button", name="Sign in").click()
    await page.wait_for_url(url + "/console")


async def shot(page: Any, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


async def stored_response(client: httpx2.AsyncClient, url: str, headers: dict[str, str] | None = None) -> str:
    r = await client.post(url + "/v1/responses", json={**BODY, "input": "Say hello"}, headers=headers or {})
    assert r.status_code == 200
    return str(r.json()["id"])


async def test_each_console_page_loads_in_chromium_with_no_console_or_page_error(start_gateway, backend, client, nursery, tmp_path):
    config = tmp_path / "servers.json"
    config.write_text(json.dumps({"mcpServers": {"example": {"command": sys.executable, "args": [str(EXAMPLE_SERVER)]}}}))
    url = await start_gateway(console_token=TOKEN, mcp_servers_config_path=str(config))
    # Something to show: keys with use, a stored response, a conversation, a stream held open.
    made = await client.post(url + "/console/keys", data={"name": "ci-bot", "rpm": "60", "models": "text*"}, headers={"authorization": f"Bearer {TOKEN}"})
    secret = made.text.split('<output id="new-secret" class="secret">', 1)[1].split("<", 1)[0]
    await client.post(url + "/console/keys", data={"name": "ops", "admin": "on"}, headers={"authorization": f"Bearer {TOKEN}"})
    response_id = await stored_response(client, url, {"authorization": f"Bearer {secret}"})
    for _ in range(3):
        await client.post(url + "/v1/responses", json=BODY, headers={"authorization": f"Bearer {secret}"})
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Remember: the kettle is on."}]}
    conversation = await client.post(url + "/v1/conversations", json={"items": [item]}, headers={"authorization": f"Bearer {secret}"})
    conversation_id = conversation.json()["id"]
    opened = trio.Event()

    async def hold_open() -> None:
        async with httpx2.AsyncClient(timeout=30) as other:
            body = {"model": "text-then-wait", "input": "hi", "stream": True}
            async with other.stream("POST", url + "/v1/responses", json=body, headers={"authorization": f"Bearer {secret}"}) as r:
                async for data in r.aiter_raw():
                    if b"Hello" in data:
                        opened.set()

    nursery.start_soon(hold_open)
    with trio.fail_after(10):
        await opened.wait()
    pages = {
        "overview": ("/console", "Overview"),
        "backends": ("/console/backends", "Backends and routes"),
        "keys": ("/console/keys", "Keys"),
        "streams": ("/console/streams", "Live streams"),
        "responses": ("/console/responses", "Stored responses"),
        "response": (f"/console/responses/{response_id}", f"Response {response_id}"),
        "conversations": ("/console/conversations", "Conversations"),
        "conversation": (f"/console/conversations/{conversation_id}", f"Conversation {conversation_id}"),
        "mcp": ("/console/mcp", "MCP servers and tools"),
        "playground": ("/console/playground", "Playground"),
    }

    async def scenario(page: Any, problems: list[str]) -> dict[str, Any]:
        await page.goto(url + "/console/login")
        await shot(page, "login")
        await sign_in(page, url)
        seen: dict[str, Any] = {}
        for name, (path, title) in pages.items():
            await page.goto(url + path)
            await page.wait_for_load_state("load")
            seen[name] = {
                "h1": await page.locator("h1").inner_text(),
                "current": await page.locator("nav a[aria-current=page]").inner_text(),
                "text": await page.locator("main").inner_text(),
            }
            await shot(page, name)
        # The streams table is refreshed in place by htmx (every 3 s): the stream is still listed after it.
        await page.goto(url + "/console/streams")
        async with page.expect_response(lambda answer: "/console/streams?part=table" in answer.url, timeout=10_000) as refreshed:
            pass
        seen["refreshed"] = (await refreshed.value).status
        seen["refreshed_text"] = await page.locator("#streams").inner_text()
        # The skip link is the first stop of the keyboard, and goes to the main content.
        await page.keyboard.press("Tab")
        seen["first_tab"] = await page.evaluate("document.activeElement.textContent")
        seen["problems"] = list(problems)
        return seen

    seen = await in_chromium(tmp_path / "profile", scenario, url)
    backend.release.set()
    assert seen["problems"] == []
    for name, (_, title) in pages.items():
        assert seen[name]["h1"] == title, name
    assert seen["keys"]["current"] == "Keys" and "ci-bot" in seen["keys"]["text"] and "5 requests" in seen["keys"]["text"]  # 4 responses, 1 conversation
    assert "ready" in seen["mcp"]["text"] and "word_count" in seen["mcp"]["text"]
    assert "text-then-wait" in seen["streams"]["text"] and "Responses (SSE)" in seen["streams"]["text"]
    assert seen["refreshed"] == 200 and "text-then-wait" in seen["refreshed_text"]
    assert response_id in seen["responses"]["text"] and "response.completed" in seen["response"]["text"]
    assert "the kettle is on" in seen["conversation"]["text"]
    assert seen["first_tab"] == "Skip to content"
    for name in [*pages, "login"]:
        assert (SHOTS / f"{name}.png").stat().st_size > 1000, name


async def test_the_playground_streams_a_reply_with_its_tool_calls_and_raw_events_using_the_keyboard(start_gateway, tmp_path):
    url = await start_gateway(console_token=TOKEN)

    async def scenario(page: Any, problems: list[str]) -> dict[str, Any]:
        await sign_in(page, url)
        await page.goto(url + "/console/playground")
        await page.get_by_label("Route (model)").fill("text-then-tool")
        await page.locator("body").focus()
        # The keyboard alone: Tab to the prompt, type, Tab to the tool's box and tick it, Tab to Send.
        for _ in range(40):
            await page.keyboard.press("Tab")
            if await page.evaluate("document.activeElement.id") == "prompt":
                break
        focused = await page.evaluate("document.activeElement.id")
        await page.keyboard.type("What is the weather in Kyiv?")
        await page.keyboard.press("Tab")
        await page.keyboard.press("Space")
        await page.keyboard.press("Tab")
        send = await page.evaluate("document.activeElement.id")
        await page.keyboard.press("Enter")
        await page.locator("#status").filter(has_text="Done").wait_for()
        responses = {
            "focused": focused,
            "send": send,
            "reply": await page.locator("#reply").inner_text(),
            "tools": await page.locator("#tool-calls").inner_text(),
            "raw": await page.locator("#raw-events").inner_text(),
            "live": await page.locator("#reply").get_attribute("aria-live"),
        }
        await shot(page, "playground-responses")
        # The Messages API, the same way.
        await page.get_by_label("Messages").check()
        await page.get_by_label("Route (model)").fill("text")
        await page.get_by_label("Offer a sample function tool").uncheck()
        await page.get_by_label("Prompt").fill("Say hello")
        await page.get_by_role("button", name="Send").click()
        await page.locator("#status").filter(has_text="Done").wait_for()
        messages = {"reply": await page.locator("#reply").inner_text(), "raw": await page.locator("#raw-events").inner_text()}
        await shot(page, "playground-messages")
        return {"responses": responses, "messages": messages, "problems": list(problems)}

    seen = await in_chromium(tmp_path / "profile", scenario, url)
    assert seen["problems"] == []
    responses = seen["responses"]
    assert responses["focused"] == "prompt" and responses["send"] == "send" and responses["live"] == "polite"
    assert responses["reply"] == "Let me check."
    assert 'get_weather({"city": "Kyiv"})' in responses["tools"]
    assert "event: response.output_text.delta" in responses["raw"] and "data: [DONE]" in responses["raw"]
    assert seen["messages"]["reply"] == "Hello, world!" and "event: message_stop" in seen["messages"]["raw"]


async def test_a_key_created_and_revoked_through_the_console_forms_is_then_refused_at_v1_responses(start_gateway, client, tmp_path):
    url = await start_gateway(console_token=TOKEN)

    async def create(page: Any, problems: list[str]) -> dict[str, Any]:
        await sign_in(page, url)
        await page.goto(url + "/console/keys")
        await page.locator("#new-name").fill("browser-bot")
        await page.locator("#new-rpm").fill("-1")
        await page.get_by_role("button", name="Create key").click()
        await page.locator("#new-rpm-error").wait_for()
        invalid = {
            "error": await page.locator("#new-rpm-error").inner_text(),
            "aria_invalid": await page.locator("#new-rpm").get_attribute("aria-invalid"),
            "described_by": await page.locator("#new-rpm").get_attribute("aria-describedby"),
            "kept": await page.locator("#new-name").input_value(),
        }
        await page.locator("#new-rpm").fill("10")
        await page.get_by_role("button", name="Create key").click()
        secret = await page.locator("#new-secret").inner_text()
        return {"invalid": invalid, "secret": secret, "problems": list(problems)}

    made = await in_chromium(tmp_path / "profile", create, url)
    # The only console message is the browser's note of the 400 page itself.
    assert [problem for problem in made["problems"] if "status of 400" not in problem] == []
    assert made["invalid"]["aria_invalid"] == "true" and "new-rpm-error" in made["invalid"]["described_by"]
    assert "whole number" in made["invalid"]["error"] and made["invalid"]["kept"] == "browser-bot"
    secret = made["secret"]
    assert secret.startswith("sk-gw-")
    r = await client.post(url + "/v1/responses", json=BODY, headers={"authorization": f"Bearer {secret}"})
    assert r.status_code == 200

    async def revoke(page: Any, problems: list[str]) -> dict[str, Any]:
        await sign_in(page, url)
        await page.goto(url + "/console/keys")
        await page.get_by_role("button", name="Revoke browser-bot").click()
        await page.wait_for_url(url + "/console/keys")
        return {"text": await page.locator("#key-browser-bot-h").locator("..").inner_text(), "problems": list(problems)}

    revoked = await in_chromium(tmp_path / "profile2", revoke, url)
    assert revoked["problems"] == [] and "revoked" in revoked["text"]
    r = await client.post(url + "/v1/responses", json=BODY, headers={"authorization": f"Bearer {secret}"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


async def test_a_wrong_credential_at_sign_in_gets_nothing_in_the_browser(start_gateway, client, tmp_path):
    store = MemoryKeys()
    await store.put(ApiKey(name="bystander", id="key_b", digest=digest("sk-gw-bystander-0123456789"), created_at=0.0))
    await store.set_auth(AUTH_ON)
    url = await start_gateway(console_token=TOKEN, keys=store)
    response_id = await stored_response(client, url, {"authorization": "Bearer sk-gw-bystander-0123456789"})

    async def scenario(page: Any, problems: list[str]) -> dict[str, Any]:
        await page.goto(url + "/console/login")
        await page.get_by_label("Operator credential").fill("a-wrong-credential-guess")
        await page.get_by_role("button", name="Sign in").click()
        await page.get_by_role("alert").wait_for()
        seen = {"alert": await page.get_by_role("alert").inner_text(), "cookies": await page.context.cookies()}
        pages = {}
        for path in ("/console/keys", "/console/responses", f"/console/responses/{response_id}"):
            await page.goto(url + path)
            pages[path] = await page.content()
        seen["pages"] = pages
        return seen

    seen = await in_chromium(tmp_path / "profile", scenario, url)
    assert "not accepted" in seen["alert"] and seen["cookies"] == []
    for path, html in seen["pages"].items():
        assert 'name="credential"' in html, path
        assert "bystander" not in html and response_id not in html, path


async def test_a_stored_responses_events_replay_in_order_in_the_page(start_gateway, client, tmp_path):
    url = await start_gateway(console_token=TOKEN)
    response_id = await stored_response(client, url)

    async def scenario(page: Any, problems: list[str]) -> dict[str, Any]:
        await sign_in(page, url)
        await page.goto(url + "/console/responses")
        await page.get_by_role("link", name=response_id).click()
        await page.get_by_role("button", name="Replay the events").click()
        await page.locator("#status").filter(has_text="Replayed").wait_for()
        return {
            "reply": await page.locator("#reply").inner_text(),
            "raw": await page.locator("#raw-events").inner_text(),
            "status": await page.locator("#status").inner_text(),
            "problems": list(problems),
        }

    seen = await in_chromium(tmp_path / "profile", scenario, url)
    assert seen["problems"] == []
    assert seen["reply"] == "Hello, world!"
    raw = seen["raw"]
    assert raw.index("event: response.created") < raw.index("event: response.output_text.delta") < raw.index("event: response.completed")
