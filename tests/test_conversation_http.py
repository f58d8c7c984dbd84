"""Stored responses over HTTP: previous_response_id, retrieval, deletion, input items."""

from __future__ import annotations

from typing import Any

import openai
import pytest
import trio

from conftest import parse_sse
from spec import validate_response

TOOLS: list[Any] = [
    {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
]


async def create(client: Any, url: str, **body: Any) -> dict[str, Any]:
    r = await client.post(url + "/v1/responses", json={"model": "text", **body})
    assert r.status_code == 200, r.text
    return r.json()


async def test_a_stored_response_is_retrieved_and_deleted(gateway_url, client):
    made = await create(client, gateway_url, input="hi")
    got = await client.get(f"{gateway_url}/v1/responses/{made['id']}")
    assert got.status_code == 200 and got.json() == made
    validate_response(got.json())
    deleted = await client.delete(f"{gateway_url}/v1/responses/{made['id']}")
    assert deleted.json() == {"id": made["id"], "object": "response.deleted", "deleted": True}
    again = await client.get(f"{gateway_url}/v1/responses/{made['id']}")
    assert again.status_code == 404 and again.json()["error"]["code"] == "response_not_found"
    assert (await client.delete(f"{gateway_url}/v1/responses/{made['id']}")).status_code == 404


async def test_store_false_keeps_nothing(gateway_url, client):
    made = await create(client, gateway_url, input="hi", store=False)
    assert made["store"] is False
    assert (await client.get(f"{gateway_url}/v1/responses/{made['id']}")).status_code == 404
    r = await client.post(gateway_url + "/v1/responses", json={"model": "text", "input": "x", "previous_response_id": made["id"]})
    assert r.status_code == 404 and r.json()["error"]["code"] == "previous_response_not_found"


async def test_previous_response_id_gives_the_model_the_earlier_turns(gateway_url, client, backend):
    first = await create(client, gateway_url, input="one", instructions="first instructions")
    second = await create(client, gateway_url, input="two", previous_response_id=first["id"], instructions="second")
    await create(client, gateway_url, input="three", previous_response_id=second["id"])
    messages = backend.chat_requests[-1]["messages"]
    # Instructions are not carried over; previous input, previous output, then the new input.
    assert [(m["role"], m["content"]) for m in messages] == [
        ("user", "one"),
        ("assistant", "Hello, world!"),
        ("user", "two"),
        ("assistant", "Hello, world!"),
        ("user", "three"),
    ]


async def test_an_unknown_previous_response_fails_before_any_stream_starts(gateway_url, client, backend):
    r = await client.post(
        gateway_url + "/v1/responses", json={"model": "text", "input": "x", "previous_response_id": "resp_nope", "stream": True}
    )
    assert r.status_code == 404 and r.headers["content-type"].startswith("application/json")
    assert r.json()["error"]["code"] == "previous_response_not_found"
    assert backend.chat_requests == []


async def test_a_function_call_output_continues_from_the_stored_call(gateway_url, client, backend):
    first = await create(client, gateway_url, model="weather", input="Weather in Paris?", tools=TOOLS)
    call = first["output"][0]
    assert call["type"] == "function_call"
    second = await create(
        client,
        gateway_url,
        model="weather",
        tools=TOOLS,
        previous_response_id=first["id"],
        input=[{"type": "function_call_output", "call_id": call["call_id"], "output": "rainy"}],
    )
    assert second["output"][0]["content"][0]["text"] == "The tool said: rainy"
    messages = backend.chat_requests[-1]["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[1]["tool_calls"][0]["id"] == messages[2]["tool_call_id"] == call["call_id"]


async def test_item_references_resolve_from_stored_items(gateway_url, client, backend):
    first = await create(client, gateway_url, input="remember me")
    output_id = first["output"][0]["id"]
    await create(client, gateway_url, input=[{"type": "item_reference", "id": output_id}, {"role": "user", "content": "and?"}])
    messages = backend.chat_requests[-1]["messages"]
    assert messages[0] == {"role": "assistant", "content": "Hello, world!"}
    r = await client.post(
        gateway_url + "/v1/responses", json={"model": "text", "input": [{"type": "item_reference", "id": "msg_unknown"}]}
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "item_not_found"


async def test_a_streamed_response_is_stored_before_its_terminal_event(gateway_url, client):
    async with client.stream("POST", gateway_url + "/v1/responses", json={"model": "text", "input": "hi", "stream": True}) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: ") and '"response.completed"' in line:
                response_id = line.split('"id":"', 1)[1].split('"', 1)[0]
                # The client may continue the moment it sees the terminal event.
                got = await client.get(f"{gateway_url}/v1/responses/{response_id}")
                assert got.status_code == 200 and got.json()["status"] == "completed"
                break


async def test_stored_events_replay_as_sse_after_a_sequence_number(gateway_url, client):
    async with client.stream("POST", gateway_url + "/v1/responses", json={"model": "text", "input": "hi", "stream": True}) as r:
        original = parse_sse(b"".join([chunk async for chunk in r.aiter_raw()]))
    response_id = original[0]["response"]["id"]
    replay = parse_sse((await client.get(f"{gateway_url}/v1/responses/{response_id}?stream=true")).content)
    assert replay == original
    tail = parse_sse((await client.get(f"{gateway_url}/v1/responses/{response_id}?stream=true&starting_after=4")).content)
    assert [e["sequence_number"] for e in tail[:-1]] == list(range(5, len(original) - 1))
    assert tail[-1] == "[DONE]"


async def test_input_items_are_listed_with_cursor_pagination(gateway_url, client):
    items = [{"role": "user", "content": f"m{n}"} for n in range(5)]
    made = await create(client, gateway_url, input=items)
    base = f"{gateway_url}/v1/responses/{made['id']}/input_items"
    page = (await client.get(base, params={"order": "asc", "limit": 2})).json()
    assert [i["content"][0]["text"] for i in page["data"]] == ["m0", "m1"]
    assert page["object"] == "list" and page["has_more"] is True and page["first_id"] == page["data"][0]["id"]
    nxt = (await client.get(base, params={"order": "asc", "limit": 2, "after": page["last_id"]})).json()
    assert [i["content"][0]["text"] for i in nxt["data"]] == ["m2", "m3"]
    desc = (await client.get(base)).json()
    assert [i["content"][0]["text"] for i in desc["data"]] == ["m4", "m3", "m2", "m1", "m0"] and desc["has_more"] is False
    before = (await client.get(base, params={"order": "asc", "before": nxt["first_id"]})).json()
    assert [i["content"][0]["text"] for i in before["data"]] == ["m0", "m1"]
    bad = await client.get(base, params={"limit": 0})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "limit"


async def test_the_openai_sdk_retrieves_lists_streams_and_deletes(gateway_url):
    sdk = openai.AsyncOpenAI(base_url=gateway_url + "/v1", api_key="x", max_retries=0)
    made = await sdk.responses.create(model="text", input="hi")
    got = await sdk.responses.retrieve(made.id)
    assert got.id == made.id and got.output_text == "Hello, world!"
    listed = await sdk.responses.input_items.list(made.id)
    assert [item.type for item in listed.data] == ["message"] and listed.data[0].content[0].text == "hi"
    async with sdk.responses.stream(response_id=made.id) as stream:
        async for _ in stream:
            pass
        final = await stream.get_final_response()
    assert final.id == made.id and final.output_text == "Hello, world!"
    second = await sdk.responses.create(model="text", input="again", previous_response_id=made.id)
    assert second.previous_response_id == made.id
    await sdk.responses.delete(made.id)
    with pytest.raises(openai.NotFoundError):
        await sdk.responses.retrieve(made.id)
