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


async def test_signed_reasoning_is_sealed_and_replayed_signed_but_never_sent_to_a_chat_backend(start_gateway, client, backend):
    """A backend that signs its thinking (Anthropic) gets it back signed; the signature travels
    only inside the gateway's seal, and a Chat Completions backend never sees the field."""
    from gateway.streams.translator import ResponseTranslator
    from gateway.turn.sealing import Sealer
    from gateway.turn.plan import TranslateOptions, plan_chat_request
    from gateway.wire import parse_create_request
    import orjson

    sealer = Sealer("k" * 32)
    translator = ResponseTranslator(
        {"id": "resp_1", "object": "response", "output": [], "status": "in_progress", "model": "m"},
        clock=lambda: 0.0,
        seal_signed=lambda text, signature: sealer.seal("reasoning", {"text": text, "signature": signature}),
    )
    chunks = [
        {"choices": [{"index": 0, "delta": {"reasoning_content": "Let me think."}}]},
        {"choices": [{"index": 0, "delta": {"reasoning_signature": "sig-part-1"}}]},
        {"choices": [{"index": 0, "delta": {"reasoning_signature": "+2"}}]},
        {"choices": [{"index": 0, "delta": {"content": "4"}, "finish_reason": "stop"}]},
    ]
    for chunk in chunks:
        translator.feed(chunk)
    translator.finish()
    reasoning = translator.response["output"][0]
    assert reasoning["type"] == "reasoning" and "sig-part-1" not in orjson.dumps(reasoning).decode()
    assert sealer.open("reasoning", reasoning["encrypted_content"]) == {"kind": "reasoning", "text": "Let me think.", "signature": "sig-part-1+2"}

    replay = parse_create_request(orjson.dumps({"model": "m", "input": [
        {"type": "message", "role": "user", "content": "2+2?"}, reasoning, translator.response["output"][1],
        {"type": "message", "role": "user", "content": "and 3+3?"},
    ]}))
    plan = plan_chat_request(replay, response_id="resp_2", created_at=0, options=TranslateOptions(open_sealed=sealer.open))
    assistant = plan.body["messages"][1]
    assert assistant["reasoning_content"] == "Let me think." and assistant["reasoning_signature"] == "sig-part-1+2"

    # Through a Chat Completions backend: the field is stripped before sending.
    url = await start_gateway(gateway_secret_key="k" * 32)
    r = await client.post(url + "/v1/responses", json={"model": "text", "input": replay.model_dump(exclude_none=True)["input"]})
    assert r.status_code == 200
    assert all("reasoning_signature" not in m for m in backend.chat_requests[-1]["messages"])
