"""The gateway's HTTP/1.1 server against h11: the same bytes give the app the same request, or both refuse.

h11 is the strict sans-IO parser hypercorn serves with; the gateway's own
server must refuse at least what it refuses.  Every case here goes to both:
the gateway's request reader (`gateway.server.h1`, whole and re-cut at
random) and `h11.Connection(SERVER)`.  Either both refuse, or both read the
same requests (method, target, version, headers, body), or the gateway
refuses where h11 accepts for one of the reasons RFC 9112 gives a server
(`stricter`, decided from the bytes alone, never from the gateway's
verdict).  The gateway accepting what h11 refuses always fails.

The corpora: RFC 9112's and h11's own examples, every smuggling shape of
the issue that asked for this (a broken chunked body, transfer codings
other than `chunked`, CL+TE, doubled and listed lengths, obs-fold, bare CR
and LF, a missing or doubled Host), and hypothesis's requests and
mutations of them.  The same corpus then goes over real sockets to `gateway
serve` (`test_http_differential_sockets.py`), and what goes out is read back
by h11 as a client (the end of this file).
"""

from __future__ import annotations

import re
from typing import Any

import h11
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.server.h1 import END, InvalidResponse, Refusal, Request, RequestReader, ResponseFramer

REFUSED = "refused"

# (name, bytes): requests h11 and the gateway must agree on.
CORPUS: list[tuple[str, bytes]] = [
    # RFC 9112 and RFC 9110's examples, and h11's own test vectors (h11/tests/test_io.py, test_connection.py)
    ("rfc9112 get", b"GET /hello.txt HTTP/1.1\r\nUser-Agent: curl/7.64.1\r\nHost: www.example.com\r\nAccept-Language: en, mi\r\n\r\n"),
    ("rfc9112 absolute form", b"GET http://www.example.org/pub/WWW/TheProject.html HTTP/1.1\r\nHost: www.example.org\r\n\r\n"),
    ("rfc9112 asterisk form", b"OPTIONS * HTTP/1.1\r\nHost: www.example.org:8001\r\n\r\n"),
    ("rfc9112 authority form", b"CONNECT www.example.com:80 HTTP/1.1\r\nHost: www.example.com\r\n\r\n"),
    ("rfc9112 chunked with trailer", b"POST /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nExpires: never\r\n\r\n"),
    ("h11 simple get", b"GET /a HTTP/1.1\r\nHost: foo\r\nConnection: close\r\n\r\n"),
    ("h11 http/1.0 head", b"HEAD /foo HTTP/1.0\r\nSome: header\r\n\r\n"),
    ("h11 http/1.0 no headers", b"HEAD /foo HTTP/1.0\r\n\r\n"),
    ("h11 obs-fold", b"HEAD /foo HTTP/1.1\r\nHost: example.com\r\nSome: multi-line\r\n header\r\n\tnonsense\r\n\r\n"),
    ("h11 fold at start", b"HEAD /foo HTTP/1.1\r\n  folded: line\r\n\r\n"),
    ("h11 space before colon", b"HEAD /foo HTTP/1.1\r\nfoo  : line\r\n\r\n"),
    ("h11 tab before colon", b"HEAD /foo HTTP/1.1\r\nfoo\t: line\r\n\r\n"),
    ("h11 empty name", b"HEAD /foo HTTP/1.1\r\n: line\r\n\r\n"),
    ("h11 garbage after request line", b"HEAD /foo HTTP/1.1 xxxxxx\r\nHost: a\r\n\r\n"),
    ("h11 chunked, hex cases", b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\naA\r\n" + b"x" * 0xAA + b"\r\n0\r\n\r\n"),
    ("h11 chunk size too long", b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + b"9" * 100 + b"\r\nxxx"),
    ("h11 chunk size with NUL", b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n10\x00\r\nxxx"),
    ("h11 chunk extensions", b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5; hello=there\r\nxxxxx\r\n0; random=\"junk\"; some=more\r\n\r\n"),
    ("h11 chunk size with whitespace", b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5   \t \r\n01234\r\n0\r\n\r\n"),
    ("h11 chunk terminator garbage", b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nxxx__1a\r\n"),
    ("h11 chunk terminator CR_", b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nxxx\r_1a\r\n"),
    ("h11 chunk terminator _LF", b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nxxx_\n1a\r\n"),
    # the smuggling shapes
    ("broken chunk after a whole json body", b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n11\r\n{\"model\":\"m\",\"x\"}\r\nzz\r\n"),
    ("te xchunked", b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: xchunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
    ("te gzip", b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\nabc"),
    ("te gzip, chunked", b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
    ("te identity", b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: identity\r\n\r\n"),
    ("te chunked twice", b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
    ("te chunked, trailing comma", b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked,\r\n\r\n0\r\n\r\n"),
    ("te upper case", b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: CHUNKED\r\n\r\n0\r\n\r\n"),
    ("te on http/1.0", b"POST / HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
    ("chunk ext with bare CR", b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5;a\rb\r\nhello\r\n0\r\n\r\n"),
    ("chunk size 0x19", b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0x19\r\n" + b"x" * 25 + b"\r\n0\r\n\r\n"),
    ("chunk size overflow", b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nFFFFFFFFFFFFFFFFFFFF\r\nhello\r\n0\r\n\r\n"),
    ("chunk lines with bare LF", b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\n0\n\n"),
    ("trailer without colon", b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-T y\r\n\r\n"),
    ("cl and te", b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
    ("te and cl", b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n"),
    ("cl doubled, same value", b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello"),
    ("cl doubled, other value", b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!"),
    ("cl listed", b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5, 5\r\n\r\nhello"),
    ("cl plus sign", b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: +5\r\n\r\nhello"),
    ("cl negative", b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\nhello"),
    ("cl huge", b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999\r\n\r\n"),
    ("obs-fold in a value", b"GET / HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\n\r\n"),
    ("obs-fold of transfer-encoding", b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\n"),
    ("bare LF head", b"GET / HTTP/1.1\nHost: x\n\n"),
    ("bare CR in a header", b"GET / HTTP/1.1\r\nHost: x\rX: y\r\n\r\n"),
    ("no host", b"GET / HTTP/1.1\r\n\r\n"),
    ("two hosts", b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"),
    ("two hosts on http/1.0", b"GET / HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n"),
    ("empty host", b"GET / HTTP/1.1\r\nHost:\r\n\r\n"),
    ("NUL in a value", b"GET / HTTP/1.1\r\nHost: x\r\nX: a\x00b\r\n\r\n"),
    ("SOH in a value", b"GET / HTTP/1.1\r\nHost: x\r\nX: a\x01b\r\n\r\n"),
    ("DEL in a value", b"GET / HTTP/1.1\r\nHost: x\r\nX: a\x7fb\r\n\r\n"),
    ("obs-text in a value", b"GET / HTTP/1.1\r\nHost: x\r\nX: a\xe9b\r\n\r\n"),
    ("tab in a value", b"GET / HTTP/1.1\r\nHost: x\r\nX: a\tb\r\n\r\n"),
    ("whitespace around a value", b"GET / HTTP/1.1\r\nHost:  x \t\r\nX:\t y \r\n\r\n"),
    ("unknown method", b"FOO / HTTP/1.1\r\nHost: x\r\n\r\n"),
    ("lower case method", b"get / HTTP/1.1\r\nHost: x\r\n\r\n"),
    ("http/2.0 request line", b"GET / HTTP/2.0\r\nHost: x\r\n\r\n"),
    ("http/1.2", b"GET / HTTP/1.2\r\nHost: x\r\n\r\n"),
    ("http/0.9", b"GET /\r\n\r\n"),
    ("space in the target", b"GET /a b HTTP/1.1\r\nHost: x\r\n\r\n"),
    ("control byte in the target", b"GET /a\x01b HTTP/1.1\r\nHost: x\r\n\r\n"),
    ("high byte in the target", b"GET /\xe9 HTTP/1.1\r\nHost: x\r\n\r\n"),
    ("fragment in the target", b"GET /a#b HTTP/1.1\r\nHost: x\r\n\r\n"),
    ("two spaces in the request line", b"GET  / HTTP/1.1\r\nHost: x\r\n\r\n"),
    ("two spaces before the version", b"GET /  HTTP/1.1\r\nHost: x\r\n\r\n"),
    ("empty line before the request", b"\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n"),
    ("whitespace before the first header", b"GET / HTTP/1.1\r\n Host: x\r\n\r\n"),
    ("a get with a body", b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"),
    ("a post with an empty body", b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"),
    ("a tls hello on the plain port", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 32),
    ("expect 100-continue", b"POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n{}"),
    ("a websocket with a body", b"GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nContent-Length: 3\r\n\r\nabc"),
    ("pipelined", b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nPOST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabcGET /c HTTP/1.1\r\nHost: x\r\n\r\n"),
    ("pipelined after chunked", b"POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n"),
    ("smuggled in a chunked body", b"POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /admin HTTP/1.1\r\nHost: x\r\nX: \x00\r\n\r\n"),
]

_FOLD = re.compile(rb"\r?\n[ \t]")
_BARE_LF = re.compile(rb"(?<!\r)\n")
# The head of a request pipelined behind the first: its request line to its blank line.
_LATER_HEAD = re.compile(rb"[A-Z][A-Z-]* [^ \r\n]+ HTTP/[0-9]\.[0-9]\r?\n.*?(?:\r\n\r\n|\Z)", re.S)
_CTL_IN_VALUE = re.compile(rb"\n[^:\r\n]+:[^\r\n]*[\x01-\x08\x0e-\x1f\x7f]")
_VERSION = re.compile(rb"^[^\r\n]* HTTP/([0-9]\.[0-9])\r?\n")
# A chunk-size line (after the head, or after a chunk's CRLF) with whitespace in it, a bare CR in
# its extension, or a size past 64 bits.
_CHUNK_LINE_ODD = re.compile(rb"\n0*(?:[0-9A-Fa-f]+[ \t]|[0-9A-Fa-f]+;[^\r\n]*[ \t]|[0-9A-Fa-f]+;[^\n]*\r(?!\n)|[0-9A-Fa-f]{17,})")


def stricter(data: bytes) -> str | None:
    """Why a server may refuse these bytes where h11 reads them (RFC 9112's leave to a recipient),
    or None.  Decided from the bytes alone."""
    head, _, rest = data.partition(b"\r\n\r\n")
    lowered = head.lower()
    if _FOLD.search(head):
        return "obs-fold (RFC 9112 §5.2: a server may reject it)"
    if _BARE_LF.search(head) or _BARE_LF.search(rest[:64]) or any(_BARE_LF.search(h.group()) for h in _LATER_HEAD.finditer(rest)):
        return "a bare LF (RFC 9112 §2.2: a recipient may, not must, take LF alone)"
    if lowered.count(b"\r\ncontent-length:") > 1 or re.search(rb"\r\ncontent-length:[^\r\n]*,", lowered):
        return "a doubled or listed Content-Length (RFC 9110 §8.6: invalid unless identical; refused)"
    if b"\r\ncontent-length:" in lowered and b"\r\ntransfer-encoding:" in lowered:
        return "both Content-Length and Transfer-Encoding (RFC 9112 §6.1: a server may reject)"
    if _CTL_IN_VALUE.search(head):
        return "a control character in a field value (RFC 9110 §5.5: not a field value)"
    version = _VERSION.match(data)
    if version and version.group(1) not in (b"1.0", b"1.1"):
        return "an HTTP version this server does not speak (505)"
    method = data.split(b" ", 1)[0]
    if method not in _KNOWN_METHODS:
        return "a method this server does not implement (501)"
    if method == b"CONNECT":
        return "CONNECT: this server is no proxy (501)"
    if version and version.group(1) == b"1.0" and b"\r\ntransfer-encoding:" in lowered:
        return "Transfer-Encoding on HTTP/1.0 (RFC 9112 §6.1: the framing is faulty)"
    if b"\r\nupgrade:" in lowered and (b"\r\ncontent-length:" in lowered or b"\r\ntransfer-encoding:" in lowered):
        return "a request to switch protocols that carries a body"
    if b"\r\ntransfer-encoding:" in lowered and _CHUNK_LINE_ODD.search(rest if rest.startswith(b"\n") else b"\n" + rest):
        # llhttp's chunk syntax, since the chunk-extension smuggling fixes: no whitespace in the
        # line (RFC 9112 §7.1.1 allows BWS around `;`; h11 takes more), sizes within 64 bits.
        return "whitespace or a bare CR in a chunk-size line, or a size past 64 bits"
    return None


_KNOWN_METHODS = {
    m.encode()
    for m in "DELETE GET HEAD POST PUT CONNECT OPTIONS TRACE COPY LOCK MKCOL MOVE PROPFIND PROPPATCH SEARCH UNLOCK BIND "
    "REBIND UNBIND ACL REPORT MKACTIVITY CHECKOUT MERGE M-SEARCH NOTIFY SUBSCRIBE UNSUBSCRIBE PATCH PURGE MKCALENDAR "
    "LINK UNLINK SOURCE QUERY".split()
}


def _requests_of(events: list[Any]) -> list[tuple[Any, ...]]:
    """(method, target, version, headers, body, whole) of each request the events read."""
    out: list[list[Any]] = []
    for event in events:
        if isinstance(event, tuple):
            out.append(list(event))
        elif isinstance(event, bytes):
            out[-1][4] += event
        elif event == "end":
            out[-1][5] = True
    return [tuple(request) for request in out]


def h11_reads(data: bytes) -> tuple[list[tuple[Any, ...]], str]:
    """What h11, as a server, reads of `data`: its requests, and whether it then refused
    (REFUSED) or waits for more ("open")."""
    connection = h11.Connection(h11.SERVER)
    connection.receive_data(data)
    events: list[Any] = []
    try:
        while True:
            event = connection.next_event()
            if event is h11.NEED_DATA:
                break
            if event is h11.PAUSED:
                if connection.their_state is h11.MUST_CLOSE:
                    return _requests_of(events), "closed"
                if connection.their_state is h11.MIGHT_SWITCH_PROTOCOL or connection.our_state is not h11.SEND_RESPONSE:
                    break
                connection.send(h11.Response(status_code=200, headers=[(b"content-length", b"0")]))
                connection.send(h11.EndOfMessage())
                if connection.our_state is not h11.DONE or connection.their_state is not h11.DONE:
                    break
                connection.start_next_cycle()
                continue
            if isinstance(event, h11.Request):
                headers = [(bytes(name), bytes(value)) for name, value in event.headers]
                events.append((event.method.decode(), bytes(event.target), event.http_version.decode(), headers, b"", False))
            elif isinstance(event, h11.Data):
                events.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                events.append("end")
            elif isinstance(event, h11.ConnectionClosed):
                break
    except h11.RemoteProtocolError:
        return _requests_of(events), REFUSED
    return _requests_of(events), "open"


def gateway_reads(data: bytes, cuts: list[int] | None = None) -> tuple[list[tuple[Any, ...]], str]:
    """What the gateway's reader makes of `data` (fed in the pieces `cuts` makes): its requests,
    and whether it then refused (REFUSED) or waits for more ("open")."""
    reader = RequestReader()
    pieces = [data] if not cuts else [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    said: list[Any] = []
    for piece in pieces:
        said += reader.feed(piece)
    events: list[Any] = []
    while True:
        ended = False
        for event in said:
            if isinstance(event, Refusal):
                return _requests_of(events), REFUSED
            if isinstance(event, Request):
                events.append((event.method, event.target, event.version, event.headers, b"", False))
                if event.upgrade is not None:
                    return _requests_of(events), "open"
            elif isinstance(event, bytes):
                events.append(event)
            elif event is END:
                events.append("end")
                ended = True
        if not ended:
            return _requests_of(events), "open"
        if _last_closes(events):
            return _requests_of(events), "closed"  # (nothing after it is read)
        said = reader.next_cycle()
        if not said:
            return _requests_of(events), "open"


def _last_closes(events: list[Any]) -> bool:
    """The last request said the connection closes after it (nothing more is read, as h11 does)."""
    last = next(event for event in reversed(events) if isinstance(event, tuple))
    headers = dict(last[3])
    connection = headers.get(b"connection", b"").lower()
    return (last[2] == "1.0" and b"keep-alive" not in connection) or b"close" in connection


def _heads(requests: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Whole requests as they are; of a partial one, its head."""
    return [request if request[5] else request[:4] for request in requests]


_COMPLETIONS = [b"", b"\r\n\r\n", b"\r\n0\r\n\r\n", b"0\r\n\r\n", b"\r\n\r\n0\r\n\r\n"]


def verdict(data: bytes, cuts: list[int] | None = None) -> str:
    """"same", "both refuse" or "stricter" (see the module docstring); fails on any other outcome.

    Where one side refuses and the other waits for more bytes, the bytes are completed (a blank
    line, a last chunk) until the waiting side decides too."""
    (theirs, their_end), (ours, our_end) = h11_reads(data), gateway_reads(data, cuts)
    if our_end == "closed" or their_end == "closed":
        # A request after which the connection closes: what follows it is never read (h11
        # refuses it, the gateway leaves it unread); both served the same requests.
        assert _heads(ours) == _heads(theirs), f"h11 and the gateway read different requests from {data!r}"
        return "same"
    if our_end == REFUSED and their_end != REFUSED:
        if any(h11_reads(data + more)[1] == REFUSED for more in _COMPLETIONS[1:]):
            their_end = REFUSED  # (h11 refuses these bytes too, once it has read far enough)
    if their_end == REFUSED and our_end != REFUSED:
        completed = [gateway_reads(data + more) for more in _COMPLETIONS[1:]]
        assert all(end == REFUSED for _, end in completed), f"the gateway accepted what h11 refuses: {data!r} -> {ours!r}"
        our_end = REFUSED
    if our_end == REFUSED and their_end == REFUSED:
        return "both refuse"
    if our_end == REFUSED:
        assert stricter(data) is not None, f"the gateway refused what h11 reads, for no reason RFC 9112 gives: {data!r} -> {theirs!r}"
        return "stricter"
    assert _heads(ours) == _heads(theirs), f"h11 and the gateway read different requests from {data!r}"
    return "same"


@pytest.mark.parametrize("data", [data for _, data in CORPUS], ids=[name for name, _ in CORPUS])
def test_every_case_of_the_corpus_reads_as_h11_reads_it_or_is_refused(data):
    verdict(data)


def test_the_issues_smuggling_shapes_are_all_refused():
    refused = {
        "broken chunk after a whole json body", "te xchunked", "te gzip", "te gzip, chunked", "te identity",
        "chunk ext with bare CR", "chunk size 0x19", "chunk size overflow", "cl and te", "te and cl",
        "cl doubled, same value", "cl listed", "obs-fold in a value", "obs-fold of transfer-encoding", "bare LF head",
        "bare CR in a header", "no host", "two hosts", "chunk lines with bare LF", "trailer without colon",
    }
    corpus = dict(CORPUS)
    assert {name for name in refused if gateway_reads(corpus[name])[1] != REFUSED} == set()
    # A transfer coding that is not chunked is 501, as h11 answers it.
    for name in ("te xchunked", "te gzip", "te gzip, chunked", "te identity"):
        statuses = [e.status for e in RequestReader().feed(corpus[name]) if isinstance(e, Refusal)]
        assert statuses == [501], name


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(CORPUS), st.data())
def test_every_case_reads_the_same_however_it_is_cut(case, data):
    name, raw = case
    cuts = sorted(set(data.draw(st.lists(st.integers(1, max(1, len(raw) - 1)), max_size=12))))
    whole, cut = gateway_reads(raw), gateway_reads(raw, [c for c in cuts if 0 < c < len(raw)])
    assert (_heads(cut[0]), cut[1]) == (_heads(whole[0]), whole[1]), name


# --- generated requests and their mutations ----------------------------------------------------

_TOKEN = st.text("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-!#$%&'*+.^_`|~", min_size=1, max_size=12)
_VALUE = st.text("abcxyzABC0123 \t/;=,.:-_\"'()<>[]{}?@\\", max_size=24).map(lambda v: v.strip(" \t"))
_PATH = st.text("abcdefghijklmnopqrstuvwxyz0123456789-._~!$&'()*+,;=:@/%?", max_size=24).map(lambda p: "/" + p)


@st.composite
def requests(draw: Any) -> bytes:
    """A valid request (or a few, pipelined): a method, a target, headers, and a body framed
    by Content-Length or chunked, in chunks of any size, with or without extensions and trailers."""
    out = []
    for _ in range(draw(st.integers(1, 3))):
        method = draw(st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]))
        version = draw(st.sampled_from(["1.1", "1.1", "1.0"]))
        headers = [(draw(_TOKEN), draw(_VALUE)) for _ in range(draw(st.integers(0, 4)))]
        headers = [(n, v) for n, v in headers if n.lower() not in ("host", "content-length", "transfer-encoding", "connection", "upgrade", "expect")]
        if version == "1.1" or draw(st.booleans()):
            headers.insert(draw(st.integers(0, len(headers))), ("Host", draw(st.sampled_from(["x", "example.com:8080", ""]))))
        body = draw(st.binary(max_size=40))
        chunked = version == "1.1" and draw(st.booleans())
        head = f"{method} {draw(_PATH)} HTTP/{version}\r\n" + "".join(f"{n}: {v}\r\n" for n, v in headers)
        if chunked:
            head += "Transfer-Encoding: chunked\r\n\r\n"
            pieces, at = [], 0
            while at < len(body):
                size = draw(st.integers(1, max(1, len(body) - at)))
                ext = draw(st.sampled_from(["", ";a=b", ';name="v v"']))
                pieces.append(b"%x%b\r\n%b\r\n" % (size, ext.encode(), body[at : at + size]))
                at += size
            trailer = draw(st.sampled_from([b"", b"X-Trailer: yes\r\n"]))
            out.append(head.encode() + b"".join(pieces) + b"0\r\n" + trailer + b"\r\n")
        else:
            if body or draw(st.booleans()):
                head += f"Content-Length: {len(body)}\r\n"
            else:
                body = b""
            out.append(head.encode() + b"\r\n" + body)
        if version == "1.0":
            break  # (not kept alive: nothing may follow it)
    return b"".join(out)


_MUTATION_BYTES = [b"\r", b"\n", b"\r\n", b" ", b"\t", b"\x00", b"\x01", b":", b",", b"0", b"a", b"\x7f", b"\xff", b"\r\n ", b";", b"-"]


@st.composite
def mutations(draw: Any) -> bytes:
    """A valid request with bytes inserted, replaced, removed or a line doubled."""
    data = draw(requests())
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(data)))
        kind = draw(st.sampled_from(["insert", "replace", "delete", "double a line"]))
        if kind == "insert":
            data = data[:at] + draw(st.sampled_from(_MUTATION_BYTES)) + data[at:]
        elif kind == "replace" and at < len(data):
            data = data[:at] + draw(st.sampled_from(_MUTATION_BYTES)) + data[at + 1 :]
        elif kind == "delete" and at < len(data):
            data = data[:at] + data[at + 1 :]
        else:
            lines = data.split(b"\r\n")
            index = draw(st.integers(0, len(lines) - 1))
            lines.insert(index, lines[index])
            data = b"\r\n".join(lines)
    return data


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def test_generated_requests_read_as_h11_reads_them(data):
    assert verdict(data) == "same"


@settings(max_examples=int(__import__("os").environ.get("DIFFERENTIAL_EXAMPLES", "1500")), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutations(), st.lists(st.integers(1, 400), max_size=6))
def test_mutated_requests_read_as_h11_reads_them_or_are_refused(data, cuts):
    verdict(data, sorted(c for c in set(cuts) if c < len(data)))


# --- what goes out ----------------------------------------------------------------------------

_SAFE_VALUE = st.text("abcxyzABC0123 \t/;=,.:-_\"'()<>?@", max_size=20).map(lambda v: v.strip(" \t"))


@st.composite
def responses(draw: Any) -> dict[str, Any]:
    """What an app sends: a status, headers (with or without Content-Length or Transfer-Encoding),
    and its body in pieces, to a GET or a HEAD on HTTP/1.1 or 1.0."""
    body = [draw(st.binary(max_size=30)) for _ in range(draw(st.integers(0, 4)))]
    headers = [(draw(_TOKEN).encode(), draw(_SAFE_VALUE).encode()) for _ in range(draw(st.integers(0, 4)))]
    headers = [(n, v) for n, v in headers if n.lower() not in (b"content-length", b"transfer-encoding", b"connection", b"date", b"keep-alive")]
    framing = draw(st.sampled_from(["none", "length", "chunked"]))
    if framing == "length":
        headers.append((b"Content-Length", str(sum(map(len, body))).encode()))
    elif framing == "chunked":
        headers.append((b"Transfer-Encoding", b"chunked"))
    return {
        "status": draw(st.sampled_from([200, 201, 204, 304, 400, 404, 500, 503, 299, 599])),
        "headers": headers,
        "body": body,
        "method": draw(st.sampled_from(["GET", "HEAD", "POST"])),
        "version": draw(st.sampled_from(["1.1", "1.0"])),
    }


def body_read(client: h11.Connection) -> bytes | None:
    """The body an h11 client reads after a response's head, to its end; None if it has no end."""
    body = b""
    while True:
        event = client.next_event()
        if isinstance(event, h11.Data):
            body += bytes(event.data)
        elif isinstance(event, h11.EndOfMessage):
            return body
        else:
            return None


def _written(response: dict[str, Any]) -> tuple[ResponseFramer, bytes]:
    framer = ResponseFramer(
        response["status"], response["headers"], version=response["version"], head_request=response["method"] == "HEAD", keep_alive=True
    )
    data = framer.head + b"date: Tue, 01 Dec 2026 00:00:00 GMT\r\n" + (b"connection: close\r\n" if not framer.keep_alive else b"") + b"\r\n"
    pieces = response["body"] or [b""]
    for index, piece in enumerate(pieces):
        data += framer.body(piece, index < len(pieces) - 1)
    return framer, data


@settings(max_examples=500, deadline=None)
@given(responses())
def test_what_the_server_writes_is_read_back_by_h11_as_the_app_sent_it(response):
    framer, data = _written(response)
    client = h11.Connection(h11.CLIENT)
    client.send(h11.Request(method=response["method"], target="/", headers=[(b"host", b"x")]))  # (h11 writes 1.1 only)
    client.send(h11.EndOfMessage())
    if response["version"] == "1.0":
        client.their_http_version = b"1.0"  # (as if the request had said 1.0: no chunked, the close ends the body)
    client.receive_data(data)
    if not framer.keep_alive:
        client.receive_data(b"")
    head = client.next_event()
    assert isinstance(head, h11.Response) and head.status_code == response["status"]
    sent = [(n.lower(), v) for n, v in response["headers"] if n.lower() not in (b"content-length", b"transfer-encoding")]
    got = [(bytes(n), bytes(v)) for n, v in head.headers if n not in (b"date", b"connection", b"content-length", b"transfer-encoding")]
    assert got == sent
    body = body_read(client)
    assert body is not None, f"h11 could not read the response to its end from {data!r}"
    no_body = response["method"] == "HEAD" or response["status"] in (204, 304)
    assert body == (b"" if no_body else b"".join(response["body"]))
    # (a body on a 204 or 304 is an app's mistake: not written, and the connection closes after)
    assert framer.overrun == (response["status"] in (204, 304) and any(response["body"]) and response["method"] != "HEAD")
    assert not framer.short


@pytest.mark.parametrize(
    "headers",
    [
        [(b"x-echo", b"a\r\nSet-Cookie: stolen=1")],
        [(b"x-echo", b"a\nb")],
        [(b"x-echo", b"a\rb")],
        [(b"x-echo", b"a\x00b")],
        [(b"x-echo", b"a\x01b")],
        [(b"bad name", b"v")],
        [(b"bad:name", b"v")],
        [(b"", b"v")],
        [(b"transfer-encoding", b"gzip")],
        [(b"content-length", b"5"), (b"content-length", b"6")],
        [(b"content-length", b"-1")],
        [(b"x", "é")],
    ],
)
def test_a_header_no_response_may_carry_is_refused_before_anything_is_written(headers):
    with pytest.raises(InvalidResponse):
        ResponseFramer(200, headers, version="1.1", head_request=False, keep_alive=True)


@pytest.mark.parametrize("status", [100, 101, 199, 1000, "200", 200.0])
def test_a_status_no_response_may_start_with_is_refused(status):
    with pytest.raises(InvalidResponse):
        ResponseFramer(status, [], version="1.1", head_request=False, keep_alive=True)


def test_more_than_the_content_length_is_cut_and_less_is_told_and_either_closes_the_connection():
    framer = ResponseFramer(200, [(b"content-length", b"2")], version="1.1", head_request=False, keep_alive=True)
    assert framer.body(b"okEXTRA", True) == b"ok" and framer.overrun and not framer.keep_alive
    assert framer.body(b"more", False) == b""
    short = ResponseFramer(200, [(b"content-length", b"5")], version="1.1", head_request=False, keep_alive=True)
    assert short.body(b"ok", False) == b"ok" and short.short and not short.keep_alive


def test_an_apps_own_chunked_coding_is_honoured_and_its_length_beside_it_dropped():
    framer = ResponseFramer(
        200, [(b"Transfer-Encoding", b"chunked"), (b"Content-Length", b"3")], version="1.1", head_request=False, keep_alive=True
    )
    assert framer.chunked and b"content-length" not in framer.head.lower()
    assert framer.head.lower().count(b"transfer-encoding: chunked") == 1
    assert framer.body(b"abc", True) + framer.body(b"", False) == b"3\r\nabc\r\n0\r\n\r\n"
    # To an HTTP/1.0 client: no chunks; the close ends the body.
    old = ResponseFramer(200, [(b"Transfer-Encoding", b"chunked")], version="1.0", head_request=False, keep_alive=True)
    assert not old.chunked and not old.keep_alive and b"transfer-encoding" not in old.head.lower()
