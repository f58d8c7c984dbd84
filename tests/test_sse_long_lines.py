"""SSE decoding costs time linear in the bytes read, however long a line is (backend streams and the byte relay).

A decoder that joined its unfinished tail to every read rescanned the whole
line each time: an 8 MiB line cost 0.92 s of CPU, a 16 MiB one (the limit)
3.84 s, and every stream of the process waited meanwhile.  Now a read that
ends no line is set aside and the line is joined once, when its end arrives
(`gateway.streams.sse`, and the relay's `UsageMeter`).  Shown here: the
events and the usage are the same however long lines are cut, and a line
being read is never copied whole before it ends.  (The figure for a 16 MiB
line is in docs/http-server.md, with the server's figures.)
"""

from __future__ import annotations

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.streams.sse import SSEDecoder, SSETooLarge
from gateway.streams.usage import UsageMeter

_EOL = st.sampled_from([b"\n", b"\r\n", b"\r"])


@st.composite
def streams_with_long_lines(draw):
    """Events, some of whose data lines run to hundreds of kilobytes, with any line ending."""
    eol = draw(_EOL)
    events = []
    for _ in range(draw(st.integers(1, 4))):
        size = draw(st.sampled_from([0, 1, 100, 70_000, 300_000]))
        text = draw(st.sampled_from([b"x", b"ab\xe2\x80\xa8", b'{"k":"v"}'])) * (size // 3 + 1)
        lines = [b"data: " + text]
        if draw(st.booleans()):
            lines.insert(0, b"event: long")
        if draw(st.booleans()):
            lines.append(b"data: " + text[: size // 2])
        events.append(eol.join(lines) + eol + eol)
    return b"".join(events)


def _decode(data: bytes, cuts: list[int], *, hot: bool) -> list[object]:
    decoder = SSEDecoder()
    out: list[object] = []
    edges = [0, *sorted(c for c in set(cuts) if 0 < c < len(data)), len(data)]
    for start, end in zip(edges, edges[1:]):
        piece = data[start:end]
        out += decoder.decode_data(piece) if hot else [(e.event, e.data) for e in decoder.decode(piece)]
    out += [e.data if hot else (e.event, e.data) for e in decoder.flush()]
    return out


@settings(max_examples=80, deadline=None)
@given(streams_with_long_lines(), st.lists(st.integers(1, 1_500_000), max_size=30), st.booleans())
def test_long_lines_decode_to_the_same_events_however_they_are_cut(data, cuts, hot):
    assert _decode(data, cuts, hot=hot) == _decode(data, [], hot=hot)


def test_a_line_being_read_is_set_aside_in_its_pieces_not_joined_at_every_read():
    decoder = SSEDecoder()
    piece = b"x" * 4096
    assert decoder.decode(b"data: ") == []
    for _ in range(1024):  # 4 MiB of one line, in 4 KiB reads
        assert decoder.decode_data(piece) == []
        assert len(decoder._buffer) <= 4096  # (what is joined so far: the first piece only)
    [data] = decoder.decode_data(b"\n\n")
    assert len(data) == 4 * 1024 * 1024


def test_the_limit_holds_on_a_line_read_in_pieces():
    decoder = SSEDecoder(max_event_bytes=10_000)
    decoder.decode(b"data: ")
    try:
        for _ in range(10):
            decoder.decode(b"y" * 2000)
    except SSETooLarge:
        return
    raise AssertionError("a line past the limit was not refused")


@settings(max_examples=60, deadline=None)
@given(streams_with_long_lines(), st.lists(st.integers(1, 1_500_000), max_size=30))
def test_the_relays_usage_meter_finds_the_usage_after_long_lines_however_they_are_cut(data, cuts):
    usage = b"data: " + orjson.dumps({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}}) + b"\n\n"
    stream = data + usage + b"data: [DONE]\n\n"
    meter = UsageMeter(events=True)
    edges = [0, *sorted(c for c in set(cuts) if 0 < c < len(stream)), len(stream)]
    for start, end in zip(edges, edges[1:]):
        meter.feed(stream[start:end])
    assert meter.tokens == 7
