"""The route table: the one place a path is named, served by one dispatcher, the docs its mirror."""

from __future__ import annotations

import pathlib
import re

import pytest

from gateway.api import ROUTES
from gateway.api.routes import Route, RouteTable

ROOT = pathlib.Path(__file__).parent.parent


def _documented() -> set[tuple[str, str]]:
    text = (ROOT / "docs" / "endpoints.md").read_text()
    return set(re.findall(r"^\| `([A-Z*]+)` \| `([^`]+)` \|", text, re.M))


def _plain(path: str) -> str:
    return re.sub(r"\{(\w+):path\}", r"{\1}", path)


def test_the_docs_list_exactly_the_route_table():
    table = {(route.method, _plain(route.path)) for route in ROUTES}
    documented = {(method, re.sub(r"\{path\}", "{passthrough}", path)) for method, path in _documented()}
    assert documented == table


def test_post_v1_responses_is_a_row_like_any_other():
    rows = [route for route in ROUTES if route.path == "/v1/responses"]
    assert sorted(route.method for route in rows) == ["POST", "WEBSOCKET"]
    assert all(route.unversioned for route in rows)


def test_only_exact_rows_with_their_measured_cost_are_served_ahead_of_the_framework():
    async def handler(call):  # pragma: no cover - never called
        raise AssertionError

    with pytest.raises(ValueError):
        Route("POST", "/v1/things", handler, served="ahead")  # no figure
    with pytest.raises(ValueError):
        Route("GET", "/v1/things/{thing_id}", handler, served="ahead", cost="1 ms")  # not exact
    ahead = [route for route in ROUTES if route.served == "ahead"]
    assert {(route.method, route.path) for route in ahead} == {
        ("POST", "/v1/responses"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/messages"),
    }
    assert all(re.search(r"\d+(\.\d+)? ms", route.cost) for route in ahead)


def test_the_table_names_each_path_its_label_dialect_and_who_may_call_it():
    table = RouteTable(ROUTES)
    assert table.label("/v1/responses") == "/v1/responses"
    assert table.label("/responses/resp_1/cancel") == "/responses/{id}/cancel"
    assert table.label("/v1/conversations/conv_1/items/msg_2") == "/v1/conversations/{id}/items/{item_id}"
    assert table.label("/v1/models/org/model:tag") == "/v1/models/{id}"
    assert table.label("/v1/embeddings") == "/v1/{passthrough}"
    assert table.label("/elsewhere") == "other"
    assert table.dialect("/v1/messages") == table.dialect("/messages/count_tokens") == "anthropic"
    assert table.dialect("/v1/responses") == "openai"
    assert table.paths("anyone") == {"/health", "/ready"}
    assert table.paths("own token") == {"/metrics"}


def _example(path: str) -> str:
    return re.sub(r"\{\w+(?::path)?\}", "x", path)


async def test_every_row_is_served_at_each_of_its_paths(start_gateway, client):
    """No row falls through to the framework's 404 (`unknown_url`): each answers itself, with a
    success or its own refusal of the example request (the required_action protocol on, so that
    `submit_tool_outputs` is served)."""
    gateway_url = await start_gateway(tool_call_protocol="required_action")
    for route in ROUTES:
        if route.method in ("WEBSOCKET", "*"):
            continue
        for path in route.paths:
            answer = await client.request(route.method, gateway_url + _example(path), content=b"{}")
            if answer.status_code == 404:
                assert answer.json()["error"]["code"] != "unknown_url", (route.method, path)
            else:
                assert answer.status_code in (200, 400, 503), (route.method, path, answer.status_code)
