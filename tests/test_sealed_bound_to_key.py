"""Sealed content opens only for the key it was made for; sealed approvals only for their server.

Reasoning and compaction items carry another key's conversation: replayed
by a different key they are ignored (reasoning) or refused (compaction)
exactly as a stranger's token.  An approval request is bound to its call,
its key and the URL of the MCP server it runs on: approving it with the
label moved to another URL runs nothing.
"""

from __future__ import annotations

from typing import Any

from test_hosted_mcp import mcp_tool
from test_keys import ALICE, BOB, auth, keyed  # noqa: F401  (keyed is a fixture)
from test_mcp_manager import make_test_server, start_http_server

USER = lambda text: {"type": "message", "role": "user", "content": text}  # noqa: E731


async def test_sealed_reasoning_replayed_by_another_key_is_ignored(keyed, client, backend):  # noqa: F811
    url = keyed[0]
    first = (
        await client.post(
            url + "/v1/responses",
            json={"model": "reasoning", "input": "2+2?", "store": False, "include": ["reasoning.encrypted_content"]},
            headers=auth(ALICE),
        )
    ).json()
    reasoning, answer = first["output"][0], first["output"][1]
    replay = [USER("2+2?"), {"type": "reasoning", "summary": [], "encrypted_content": reasoning["encrypted_content"]}, answer, USER("and?")]
    await client.post(url + "/v1/responses", json={"model": "text", "input": replay, "store": False}, headers=auth(ALICE))
    assert backend.chat_requests[-1]["messages"][1]["reasoning_content"] == "Let me think."
    r = await client.post(url + "/v1/responses", json={"model": "text", "input": replay, "store": False}, headers=auth(BOB))
    assert r.status_code == 200
    assert "reasoning_content" not in backend.chat_requests[-1]["messages"][1]  # bob learns nothing of alice's thinking


async def test_a_compaction_item_used_by_another_key_is_refused_as_a_strangers(keyed, client, backend):  # noqa: F811
    url = keyed[0]
    conversation = [USER("alice's secret plan"), {"role": "assistant", "content": "noted"}, USER("go on")]
    compacted = (await client.post(url + "/v1/responses/compact", json={"model": "text", "input": conversation}, headers=auth(ALICE))).json()
    window = [*compacted["output"], USER("continue")]
    mine = await client.post(url + "/v1/responses", json={"model": "text", "input": window}, headers=auth(ALICE))
    assert mine.status_code == 200
    theirs = await client.post(url + "/v1/responses", json={"model": "text", "input": window}, headers=auth(BOB))
    assert theirs.status_code == 400 and theirs.json()["error"]["code"] == "invalid_encrypted_content"


async def test_an_approval_does_not_follow_its_label_to_another_server(nursery, start_gateway, client, backend):
    first_server = await start_http_server(nursery, make_test_server())
    other_server = await start_http_server(nursery, make_test_server())
    url = await start_gateway(mcp_allowed_urls="127.0.0.1")
    asked = (
        await client.post(url + "/v1/responses", json={"model": "mcp-add", "input": "2+3?", "tools": [mcp_tool(first_server)]})
    ).json()
    ask = next(i for i in asked["output"] if i["type"] == "mcp_approval_request")
    approve = {"type": "mcp_approval_response", "approval_request_id": ask["id"], "approve": True}

    def continuation(server: str, *, stateless: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"model": "mcp-add", "tools": [mcp_tool(server)]}
        if stateless:
            return {**body, "input": [USER("2+3?"), *asked["output"], approve], "store": False}
        return {**body, "input": [approve], "previous_response_id": asked["id"]}

    for stateless in (False, True):
        moved = await client.post(url + "/v1/responses", json=continuation(other_server, stateless=stateless))
        assert moved.status_code == 400 and moved.json()["error"]["code"] == "approval_request_not_found", moved.text
    ran = (await client.post(url + "/v1/responses", json=continuation(first_server, stateless=False))).json()
    call = next(i for i in ran["output"] if i["type"] == "mcp_call")
    assert (call["name"], call["output"]) == ("add", "5")
