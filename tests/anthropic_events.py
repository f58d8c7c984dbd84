"""What a strict Anthropic client checks of a Messages event stream (shared by the tests)."""

from __future__ import annotations

from typing import Any

import orjson

_DELTAS = {
    "text": {"text_delta"},
    "thinking": {"thinking_delta", "signature_delta"},
    "tool_use": {"input_json_delta"},
}


def check_stream(events: list[dict[str, Any]]) -> str:
    """Assert the grammar of a Messages stream; returns how it ended: `message_stop` or `error`.

    `message_start` first; each block started at the next index, given only
    deltas of its own kind, and stopped before `message_delta`; then
    `message_stop`, last.  Or, from any point, one `error` event, last.
    `ping` may come anywhere.
    """
    events = [event for event in events if event["type"] != "ping"]
    assert events, "an empty stream"
    if events[-1]["type"] == "error":
        assert set(events[-1]) >= {"type", "error"} and set(events[-1]["error"]) >= {"type", "message"}
        assert all(event["type"] != "error" for event in events[:-1])
        body = events[:-1]
        ended = "error"
    else:
        assert events[-1]["type"] == "message_stop", events[-1]
        assert events[-2]["type"] == "message_delta", events[-2]
        body = events[:-2]
        ended = "message_stop"
    if not body:
        assert ended == "error", "a message without message_start"
        return ended
    assert body[0]["type"] == "message_start"
    start = body[0]["message"]
    assert start["type"] == "message" and start["role"] == "assistant" and start["content"] == []
    assert start["id"].startswith("msg_")
    kinds: list[str] = []
    open_blocks: set[int] = set()
    for event in body[1:]:
        kind = event["type"]
        if kind == "content_block_start":
            assert event["index"] == len(kinds)
            kinds.append(event["content_block"]["type"])
            open_blocks.add(event["index"])
            if kinds[-1] == "tool_use":
                assert event["content_block"]["id"].startswith("toolu_") and event["content_block"]["input"] == {}
        elif kind == "content_block_delta":
            assert event["index"] in open_blocks, event
            assert event["delta"]["type"] in _DELTAS[kinds[event["index"]]], event
        elif kind == "content_block_stop":
            assert event["index"] in open_blocks
            open_blocks.remove(event["index"])
        else:
            raise AssertionError(f"unexpected {kind} inside a message")
    if ended == "message_stop":
        assert not open_blocks, "a block left open"
        delta = events[-2]
        assert delta["delta"]["stop_reason"] in ("end_turn", "max_tokens", "stop_sequence", "tool_use", "refusal", "pause_turn")
        assert set(delta["usage"]) >= {"input_tokens", "output_tokens"}
    return ended


def sse_events(raw: bytes) -> list[dict[str, Any]]:
    """The events of an SSE body, each checked to carry its `event:` name as its `type`."""
    events = []
    for frame in raw.replace(b"\r\n", b"\n").split(b"\n\n"):
        if not frame.strip():
            continue
        name, data = None, b""
        for line in frame.split(b"\n"):
            if line.startswith(b"event: "):
                name = line[7:].decode()
            elif line.startswith(b"data: "):
                data += line[6:]
        event = orjson.loads(data)
        assert event["type"] == name, frame
        events.append(event)
    return events
