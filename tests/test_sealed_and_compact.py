"""Sealed reasoning for stateless clients, and /v1/responses/compact."""

from __future__ import annotations

from spec import _cached_validator, validate_response

USER = lambda text: {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}  # noqa: E731


async def test_reasoning_comes_back_sealed_and_a_stateless_replay_restores_it(gateway_url, client, backend):
    first = (
        await client.post(
            gateway_url + "/v1/responses",
            json={"model": "reasoning", "input": "2+2?", "store": False, "include": ["reasoning.encrypted_content"]},
        )
    ).json()
    validate_response(first)
    reasoning = first["output"][0]
    assert reasoning["type"] == "reasoning" and reasoning["encrypted_content"].startswith("gws1.")
    assert "think" not in reasoning["encrypted_content"]  # sealed, not merely encoded
    # Codex replays reasoning with only its encrypted_content.
    replay = [USER("2+2?"), {"type": "reasoning", "id": reasoning["id"], "summary": [], "encrypted_content": reasoning["encrypted_content"]}]
    replay += [first["output"][1], USER("and 3+3?")]
    await client.post(gateway_url + "/v1/responses", json={"model": "text", "input": replay, "store": False})
    assistant = backend.chat_requests[-1]["messages"][1]
    assert assistant["role"] == "assistant" and assistant["reasoning_content"] == "Let me think."


async def test_without_include_there_is_no_encrypted_content_and_foreign_tokens_are_ignored(gateway_url, client, backend):
    plain = (await client.post(gateway_url + "/v1/responses", json={"model": "reasoning", "input": "x"})).json()
    assert "encrypted_content" not in plain["output"][0]
    foreign = [USER("q"), {"type": "reasoning", "summary": [], "encrypted_content": "gAAAA-someone-elses"}, {"role": "assistant", "content": "a"}]
    r = await client.post(gateway_url + "/v1/responses", json={"model": "text", "input": foreign})
    assert r.status_code == 200 and "reasoning_content" not in backend.chat_requests[-1]["messages"][1]


async def test_compaction_summarises_and_a_later_request_expands_it(gateway_url, client, backend):
    conversation = [USER("build a parser"), {"role": "assistant", "content": "done: parser.py"}, USER("now tests")]
    r = await client.post(gateway_url + "/v1/responses/compact", json={"model": "text", "input": conversation})
    compacted = r.json()
    assert r.status_code == 200 and compacted["object"] == "response.compaction"
    _cached_validator("CompactResource").validate(compacted)
    assert backend.chat_requests[-1]["messages"][-1]["content"].startswith("Summarise the conversation")
    kinds = [(i["type"], i.get("role")) for i in compacted["output"]]
    assert kinds == [("message", "user"), ("message", "user"), ("compaction", None)]
    window = [*compacted["output"], USER("continue")]
    await client.post(gateway_url + "/v1/responses", json={"model": "text", "input": window})
    messages = backend.chat_requests[-1]["messages"]
    assert {"role": "system", "content": "Summary of the conversation so far:\nHello, world!"} in messages
    assert messages[-1] == {"role": "user", "content": "continue"}


async def test_a_tampered_compaction_item_is_refused(gateway_url, client):
    r = await client.post(
        gateway_url + "/v1/responses",
        json={"model": "text", "input": [{"type": "compaction", "encrypted_content": "gws1.tampered"}, USER("hi")]},
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_encrypted_content"
