"""The usage a relayed event stream reports, read off its bytes wherever the reads cut it."""

from __future__ import annotations

import json

import orjson
from hypothesis import given
from hypothesis import strategies as st

from gateway.streams.usage import UsageMeter, usage_tokens


def _reference_usage(stream: bytes) -> dict[str, int] | None:
    """What reading every whole `data:` line of the stream as JSON says (the slow way)."""
    found: dict[str, int] = {}
    for line in stream.splitlines():
        if not line.startswith(b"data:"):
            continue
        try:
            event = orjson.loads(line[5:].strip())
        except orjson.JSONDecodeError:
            continue
        usage = event.get("usage") if isinstance(event, dict) else None
        if usage is None and isinstance(event, dict) and isinstance(event.get("message"), dict):
            usage = event["message"].get("usage")
        if isinstance(usage, dict):
            found.update({k: v for k, v in usage.items() if isinstance(v, int) and v >= 0})
            if "total_tokens" not in usage:
                found.pop("total_tokens", None)
    return found or None


_event = st.one_of(
    st.builds(lambda n: {"choices": [{"delta": {"content": "t" * n}}], "usage": None}, st.integers(0, 5)),
    st.builds(
        lambda p, c: {"choices": [], "usage": {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}},
        st.integers(0, 99), st.integers(0, 99),
    ),
    st.builds(lambda i: {"type": "message_start", "message": {"usage": {"input_tokens": i, "output_tokens": 1}}}, st.integers(0, 99)),
    st.builds(lambda o: {"type": "message_delta", "usage": {"output_tokens": o}}, st.integers(0, 99)),
    st.just({"text": 'a "usage": {"x": 1} in a string', "usage": {"output_tokens": 7}}),
)


@given(
    events=st.lists(
        st.tuples(_event, st.sampled_from([b"\n\n", b"\r\n\r\n", b"\n", b"\r\r"]), st.booleans(), st.booleans()), max_size=12
    ),
    cuts=st.lists(st.integers(0, 4000), max_size=8),
)
def test_the_meter_finds_the_usage_reading_every_line_would_wherever_the_reads_cut_the_stream(events, cuts):
    stream = b"".join(
        (b": keep-alive\n" if comment else b"")
        + b"data: "
        + (json.dumps(event).encode() if spaced else orjson.dumps(event))  # `"usage": null` and `"usage":null`
        + end
        for event, end, comment, spaced in events
    ) + b"data: [DONE]\n\n"
    meter = UsageMeter(events=True)
    bounds = sorted({0, len(stream), *(cut for cut in cuts if cut < len(stream))})
    for start, end in zip(bounds, bounds[1:]):
        meter.feed(stream[start:end])
    expected = _reference_usage(stream)
    reported = meter.usage
    if expected is None or not any(k in expected for k in ("total_tokens", "prompt_tokens", "completion_tokens", "input_tokens", "output_tokens")):
        assert reported is None
        return
    assert reported is not None
    given_tokens = lambda *names: next((expected[n] for n in names if n in expected), 0)  # noqa: E731
    assert reported["input_tokens"] == given_tokens("prompt_tokens", "input_tokens")
    assert reported["output_tokens"] == given_tokens("completion_tokens", "output_tokens")
    assert reported["total_tokens"] == usage_tokens(expected)


def test_two_usage_objects_on_one_line_are_read_once_and_a_comment_line_is_not_read():
    meter = UsageMeter(events=True)
    line = b'data: {"usage": {"prompt_tokens": 3, "completion_tokens": 4}, "echo": {"usage": {"x": 1}}}\n\n'
    assert meter.feed(b': {"usage": {"prompt_tokens": 100}}\n' + line) is True
    assert meter.usage == {"input_tokens": 3, "output_tokens": 4, "total_tokens": 7}
    assert meter.feed(b": only a comment\n\n") is False
