"""HTTP/1.1 framing without I/O: the request reader and the response framer of the gateway's own server.

Bytes in, events out, as h11 does, and nothing else: no sockets, no trio,
no clock.  `gateway.server.http11` is the shell that reads and writes.

`RequestReader` (what a client sends).  httptools (llhttp) parses every
byte, but the reader feeds it one message at a time, so that it always
knows where a message ends and the next begins: a head up to its blank
line, a `Content-Length` body up to its length, a chunked body up to each
CRLF (a chunked message can only end just after one).  What llhttp lets
pass and h11 refuses is checked on the raw head before anything is said:
the request line's exact shape (single spaces, no empty lines before it,
HTTP/1.0 or 1.1), exactly one `Host` on HTTP/1.1 (at most one on 1.0), a
`Transfer-Encoding` that is `chunked` and nothing else (501, as h11), none
on HTTP/1.0 (RFC 9112 §6.1), no `CONNECT`, no body on a request to switch
protocols.  llhttp itself refuses every other smuggling shape: both
`Content-Length` and `Transfer-Encoding`, a doubled or listed length,
obs-fold, bare CR or LF, a malformed chunk size, extension, terminator or
trailer.  A refusal is final: the reader says nothing more, and a body it
refused part-way is never reported complete.

After a message's end the reader pauses (h11's PAUSED): what follows is
kept, unparsed, until `next_cycle()`, once the response is over.

`ResponseFramer` (what the app sends).  The head is built from the app's
status and headers, each name and value checked (a token; no CR, LF, NUL
or other control character but HTAB), framing headers decided here: the
app's `Content-Length` is kept and accounted (too much is cut and the
connection closed, too little closes it), its `Transfer-Encoding: chunked`
honoured, and a body of unknown length chunked (HTTP/1.1) or ended by the
close (HTTP/1.0).  An app response that cannot be framed is an
`InvalidResponse`: the shell answers 500 instead, if it still can.
"""

from __future__ import annotations

import http
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httptools

__all__ = [
    "END",
    "FRAMING",
    "Framing",
    "InvalidResponse",
    "Refusal",
    "Request",
    "RequestReader",
    "ResponseFramer",
    "check_lines",
    "status_line",
]

_TOKEN = rb"[-!#$%&'*+.^_`|~0-9a-zA-Z]+"
# RFC 9112 §3: method SP request-target SP HTTP-version; h11 takes any visible ASCII as the target.
_REQUEST_LINE = re.compile(rb"(%b) ([\x21-\x7e]+) HTTP/([0-9]\.[0-9])" % _TOKEN)
# RFC 9110 §5.5 field-value: visible characters and obs-text, with SP or HTAB only between them.
_FIELD_VALUE = re.compile(rb"(?:[\x21-\x7e\x80-\xff]+(?:[ \t]+[\x21-\x7e\x80-\xff]+)*)?")
_DIGITS = re.compile(rb"[0-9]{1,19}")
_HEADER_LINES = re.compile(rb"(?:%b: (?:[\x21-\x7e\x80-\xff]+(?:[ \t]+[\x21-\x7e\x80-\xff]+)*)?\r\n)*" % _TOKEN)
_OWS = b" \t"
_TRANSFER_ENCODING = re.compile(rb"\r\ntransfer-encoding:([^\r\n]*)", re.IGNORECASE)
_NOT_IN_A_LINE = re.compile(rb"[^\x21-\x7e ]")  # a byte no request line holds (a TLS hello on the plain port)


class Request:
    """A request's head, once the reader has checked it whole."""

    __slots__ = ("method", "target", "version", "headers", "keep_alive", "expect_continue", "upgrade", "head")

    def __init__(
        self,
        method: str,
        target: bytes,
        version: str,
        headers: list[tuple[bytes, bytes]],
        keep_alive: bool,
        expect_continue: bool,
        upgrade: bytes | None,
        head: bytes,
    ) -> None:
        self.method = method
        self.target = target
        self.version = version  # "1.0" or "1.1"
        self.headers = headers  # names in lower case, values without their surrounding whitespace
        self.keep_alive = keep_alive
        self.expect_continue = expect_continue
        self.upgrade = upgrade  # a request to switch protocols: the `Upgrade` header's value, lower case
        self.head = head  # the raw bytes of the line and headers (what a protocol switch hands on)


class Refusal:
    """The request cannot be served: answer `status` with `code` and `message` (in the
    client's API shape) and close."""

    __slots__ = ("status", "code", "message", "reason")

    def __init__(self, status: int, reason: str) -> None:
        self.status = status
        self.code, self.message = _ANSWERS.get((status, reason)) or _ANSWERS[status, ""]
        self.reason = reason  # what exactly, for the log line (llhttp's words among them)

    def __repr__(self) -> str:
        return f"Refusal({self.status}, {self.reason!r})"


_HOST = "missing Host"
_HOSTS = "more than one Host"
_METHOD = "unknown method"
_CODING = "unsupported Transfer-Encoding"
# What a client is told of a refusal, by status (and by reason where one status has several).
_ANSWERS = {
    (400, ""): ("invalid_request", "The request is not valid HTTP, or frames its body two ways."),
    (400, _HOST): ("invalid_request", "An HTTP/1.1 request must carry a Host header."),
    (400, _HOSTS): ("invalid_request", "A request may carry one Host header, not several."),
    (414, ""): ("request_too_large", "The request's target is too long."),
    (431, ""): ("request_too_large", "The request's headers are too large."),
    (501, ""): ("not_implemented", "The request asks for something this server does not implement."),
    (501, _METHOD): ("method_not_supported", "The request's method is not one this server knows."),
    (501, _CODING): ("unsupported_transfer_encoding", "The request's Transfer-Encoding is not chunked; no other is supported."),
    (505, ""): ("http_version_not_supported", "This server speaks HTTP/1.0 and HTTP/1.1."),
}


class _End:
    __slots__ = ()

    def __repr__(self) -> str:
        return "END"


END = _End()
"""The request's body is complete (after its last bytes)."""

# The reader's states.
_HEAD, _LENGTH, _CHUNKED, _PAUSED, _SWITCHED, _REFUSED = range(6)


class RequestReader:
    """Feed it what the client sends (`feed`), get events: a `Request`, the body as `bytes`,
    `END`, or one `Refusal` (then nothing more).  See the module docstring."""

    def __init__(self, max_head: int = 16 * 1024) -> None:
        self.max_head = max_head
        self._parser = httptools.HttpRequestParser(self)
        self._state = _HEAD
        self._head = bytearray()  # the head so far (and, paused or switched, what followed)
        self._line_checked = False
        self._remaining = 0  # of a Content-Length body
        self._after_cr = False  # a chunked body's last byte fed was a CR: an LF may end the message
        self._events: list[Any] = []
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._complete = False
        self._headers_done = False
        self._said: tuple[str, str, bool, bool] = ("", "", False, False)  # method, version, keep-alive, upgrade

    # --- what the shell asks ------------------------------------------------------------

    @property
    def head_begun(self) -> bool:
        """Part of a request's head has arrived, not yet all of it."""
        return self._state == _HEAD and bool(self._head)

    @property
    def held(self) -> int:
        """Bytes kept unparsed while paused or switched (what the client sent ahead)."""
        return len(self._head) if self._state in (_PAUSED, _SWITCHED) else 0

    def trailing(self) -> bytes:
        """After a request to switch protocols: the bytes that followed its head (the new
        protocol's), handed over once."""
        data = bytes(self._head)
        self._head.clear()
        return data

    def next_cycle(self) -> list[Any]:
        """The response to the last request is over: parse what followed it (h11's
        `start_next_cycle`), and return the events that makes."""
        if self._state != _PAUSED:
            return []
        self._state = _HEAD
        self._line_checked = False
        held, self._head = bytes(self._head), bytearray()
        return self.feed(held) if held else []

    def feed(self, data: bytes) -> list[Any]:
        """The events the client's next bytes complete."""
        events: list[Any] = []
        state = self._state
        if state >= _PAUSED:
            if state != _REFUSED:
                self._head += data  # the next request, or the new protocol's bytes: kept for later
            return events
        self._events = events
        pos, size = 0, len(data)
        while pos < size:
            state = self._state
            if state == _HEAD:
                pos = self._feed_head(data, pos)
            elif state == _LENGTH:
                take = min(self._remaining, size - pos)
                piece = data[pos : pos + take] if pos or take < size else data
                pos += take
                self._remaining -= take
                self._execute(piece)
                self._finish_message()
            elif state == _CHUNKED:
                pos = self._feed_chunked(data, pos)
            else:
                if state != _REFUSED:
                    self._head += data[pos:]
                break
        return events

    # --- the head ---------------------------------------------------------------------------

    def _feed_head(self, data: bytes, pos: int) -> int:
        # The same bytes get the same verdict however they are cut: the request line first (a
        # byte no request line holds is refused at once, a TLS hello on the plain port say),
        # then the head's size, then the whole head, which llhttp reads in one piece.
        head = self._head
        scan = max(0, len(head) - 3)
        if head:
            head += data[pos:] if pos else data
            end = head.find(b"\r\n\r\n", scan)
            rest = len(head) - end - 4 if end >= 0 else 0
        else:
            end = data.find(b"\r\n\r\n", pos)
            head += data[pos : end + 4] if end >= 0 else data[pos:]
            end = -1 if end < 0 else end - pos
            rest = len(data) - pos - len(head) if end >= 0 else 0
        if rest:
            del head[end + 4 :]
        consumed = len(data) - rest
        limit = self.max_head
        if not self._line_checked:
            line_end = head.find(b"\r\n")
            line = head[:limit] if line_end < 0 else head[: min(line_end, limit)]
            if _NOT_IN_A_LINE.search(line, 0, len(line) - (line_end < 0 and line.endswith(b"\r"))) is not None:
                self._refuse(400, "not an HTTP request line")
            elif line_end > limit or (line_end < 0 and len(head) > limit):
                self._refuse(414, "the request line is too long")
            elif line_end >= 0:
                self._check_line(bytes(line))
            if self._state == _REFUSED or line_end < 0:
                return consumed
        if _bare_lf(head, max(0, scan - 1), limit):
            # (llhttp would refuse it once the head is whole; a head ended by one never is)
            self._refuse(400, "a bare LF in the head")
        elif (end + 4 if end >= 0 else len(head)) > limit:
            self._refuse(431, "the request's head is too large")
        elif end >= 0:
            self._complete_head()
        return consumed

    def _check_line(self, line: bytes) -> None:
        """The request line, exactly as RFC 9112 has it (llhttp takes several spaces, empty
        lines before it, HTTP/0.9)."""
        self._line_checked = True
        match = _REQUEST_LINE.fullmatch(line)
        if match is None:
            self._refuse(400, "malformed request line")
        elif match.group(3) not in (b"1.1", b"1.0"):
            self._refuse(505, "HTTP version not supported")

    def _complete_head(self) -> None:
        head = bytes(self._head)
        if b"\r\ntransfer-encoding:" in head.lower():
            codings = _TRANSFER_ENCODING.findall(head)
            if len(codings) > 1 or codings[0].strip(_OWS).lower() != b"chunked":
                # h11's rule (and RFC 9112 §6.1's): `chunked` alone, or 501; checked before
                # llhttp, which refuses some of these as malformed (400) and takes `gzip, chunked`.
                self._refuse(501, _CODING)
                return
        self._execute(head)
        if self._state == _REFUSED:
            return
        if not self._headers_done:  # (llhttp agrees on where a head ends: this cannot happen)
            self._refuse(400, "incomplete request head")
            return
        method, version, keep_alive, switching = self._said
        headers = self._headers
        hosts = 0
        chunked = False
        length = None
        expect = False
        upgrade: bytes | None = None
        for index, (name, value) in enumerate(headers):
            if name == b"host":
                hosts += 1
            elif name == b"transfer-encoding":
                chunked = True
                headers[index] = (name, b"chunked")  # (as h11 gives it)
            elif name == b"content-length":
                length = int(value)  # (llhttp checked it: digits, one header, not beside Transfer-Encoding)
            elif name == b"expect":
                expect = value.lower() == b"100-continue"
            elif name == b"upgrade":
                upgrade = value.lower()
        if hosts != 1 and (hosts or version == "1.1"):
            self._refuse(400, _HOSTS if hosts else _HOST)
            return
        if chunked and version == "1.0":
            self._refuse(400, "Transfer-Encoding on HTTP/1.0")
            return
        if method == "CONNECT":
            self._refuse(501, "CONNECT is not supported")
            return
        if switching and (chunked or length):
            self._refuse(400, "a request to switch protocols with a body")
            return
        request = Request(
            method,
            self._url,
            version,
            headers,
            keep_alive,
            expect and version == "1.1",
            upgrade if switching else None,
            head,
        )
        self._head = bytearray()
        self._events.append(request)
        if switching:
            self._state = _SWITCHED
        elif chunked:
            self._state = _CHUNKED
            self._after_cr = False
        elif length:
            self._state = _LENGTH
            self._remaining = length
        else:
            self._end_message()

    # --- bodies -------------------------------------------------------------------------

    def _feed_chunked(self, data: bytes, pos: int) -> int:
        # Up to each CRLF at a time: the message ends just after one, and nothing past its end
        # may reach llhttp (it would be parsed as the next request, unchecked).
        size = len(data)
        while pos < size:
            if self._after_cr and data[pos] == 0x0A:
                end = pos + 1
            else:
                found = data.find(b"\r\n", pos)
                end = size if found < 0 else found + 2
            piece = data[pos:end] if pos or end < size else data
            self._after_cr = piece[-1] == 0x0D
            self._execute(piece)
            pos = end
            if self._complete or self._state != _CHUNKED:
                break
        self._finish_message()
        return pos

    def _finish_message(self) -> None:
        if self._complete and self._state in (_LENGTH, _CHUNKED):
            self._end_message()

    def _end_message(self) -> None:
        self._events.append(END)
        self._state = _PAUSED

    def _execute(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserInvalidMethodError:
            # A method llhttp does not know (RFC 9110: not implemented), or no HTTP at all.
            self._refuse(501 if data[:1].isupper() else 400, _METHOD)
        except httptools.HttpParserUpgrade:
            pass  # (the head ended where the reader fed it; `_complete_head` switches)
        except httptools.HttpParserError as error:
            self._refuse(400, str(error) or type(error).__name__)

    def _refuse(self, status: int, reason: str) -> None:
        if self._state == _REFUSED:
            return
        self._state = _REFUSED
        self._head = bytearray()
        self._events.append(Refusal(status, reason))

    # --- llhttp's callbacks -------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = []
        self._complete = self._headers_done = False

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._headers_done:
            self._headers.append((name.lower(), value.rstrip(_OWS)))
        # (a chunked body's trailers come here too: checked by llhttp, not passed on)

    def on_headers_complete(self) -> None:
        # (asked now: once the message is complete, llhttp's answers are the next one's)
        parser = self._parser
        self._said = (parser.get_method().decode("ascii"), parser.get_http_version(), parser.should_keep_alive(), parser.should_upgrade())
        self._headers_done = True

    def on_body(self, body: bytes) -> None:
        self._events.append(bytes(body))

    def on_message_complete(self) -> None:
        self._complete = True


def _bare_lf(data: bytearray, start: int, end: int) -> bool:
    """An LF without its CR in `data[start:end]` (two counts: a search with a look-behind cost
    several times as much on every request's head)."""
    lone = data.count(b"\n", start, end) - data.count(b"\r\n", start, end)
    if lone and data[start : start + 1] == b"\n" and data[start - 1 : start] == b"\r":
        lone -= 1  # (its CR came just before `start`)
    return lone > 0


# --- the response ---------------------------------------------------------------------------


class InvalidResponse(Exception):
    """The app's response cannot be put on the wire (a header with CR, LF or NUL, a status out
    of range, an unknown transfer coding); the message says what, for the log."""


_NO_BODY_STATUS = frozenset({204, 304})
_STATUS_LINES = {
    status.value: b"HTTP/1.1 %d %b\r\n" % (status.value, status.phrase.encode("ascii")) for status in http.HTTPStatus
}
_OWN_HEADERS = frozenset({b"connection", b"date", b"keep-alive", b"content-length", b"transfer-encoding"})


def check_lines(lines: list[bytes]) -> None:
    """Header lines (`name: value\r\n` each) an app gave, checked in one pass: a token for a
    name, visible characters for a value, and as many line ends as lines (no value held one).

    Raises:
        InvalidResponse: naming the first header that is not one."""
    given = b"".join(lines)
    if given and (_HEADER_LINES.fullmatch(given) is None or given.count(b"\n") != len(lines)):
        bad = next(line for line in lines if _HEADER_LINES.fullmatch(line) is None or line.count(b"\n") != 1)
        raise InvalidResponse(f"the header {bad.partition(b':')[0][:40]!r} has bytes no header may carry")


def status_line(status: int) -> bytes:
    """`HTTP/1.1 200 OK\\r\\n`, with the standard reason phrase (none for a status without one)."""
    line = _STATUS_LINES.get(status)
    return line if line is not None else b"HTTP/1.1 %d \r\n" % status


class ResponseFramer:
    """One response's head and body on the wire (see the module docstring).

    `keep_alive` starts as the connection would have it and ends False when
    the response must be the connection's last (the app said `Connection:
    close`, its body ends with the close, or it sent too much or too little).
    """

    __slots__ = ("head", "keep_alive", "chunked", "bodiless", "plain_chunks", "_left", "overrun", "short")

    def __init__(self, status: Any, headers: Any, *, version: str, head_request: bool, keep_alive: bool) -> None:
        """Raises:
        InvalidResponse: as the class says."""
        if type(status) is not int or not 200 <= status <= 999:
            raise InvalidResponse(f"status {status!r} cannot start a response")
        self.keep_alive = keep_alive
        self.chunked = False
        self.bodiless = head_request or status in _NO_BODY_STATUS
        self.overrun = self.short = False
        self._left: int | None = None  # bytes the app's Content-Length still allows
        lines = [status_line(status)]
        length: bytes | None = None
        coded = False
        for name, value in headers:
            if not isinstance(name, bytes) or not isinstance(value, bytes):
                name, value = _as_bytes(name), _as_bytes(value)
            lowered = name.lower()
            value = value.strip(_OWS)
            if lowered in _OWN_HEADERS:
                if lowered == b"content-length":
                    if _DIGITS.fullmatch(value) is None or (length is not None and value != length):
                        raise InvalidResponse("an invalid or conflicting Content-Length")
                    length = value
                elif lowered == b"transfer-encoding":
                    if value.lower() != b"chunked" or coded:
                        raise InvalidResponse(f"Transfer-Encoding {value!r} is not one this server writes")
                    coded = True
                elif lowered == b"connection":
                    if b"close" in [token.strip(_OWS) for token in value.lower().split(b",")]:
                        self.keep_alive = False
                    elif _FIELD_VALUE.fullmatch(value) is None:
                        raise InvalidResponse("a Connection header with bytes no header may carry")
                continue  # (said below, as this server frames the response; `date` its own)
            lines.append(b"%b: %b\r\n" % (name, value))
        check_lines(lines[1:])
        if status in _NO_BODY_STATUS:
            pass  # no body, and no framing header (RFC 9110 §8.6)
        elif coded and version == "1.1":
            self.chunked = True
            lines.append(b"transfer-encoding: chunked\r\n")
        elif length is not None and not coded:
            if not head_request:  # (to a HEAD the length is the GET's: nothing to account)
                self._left = int(length)
            lines.append(b"content-length: %b\r\n" % length)
        elif head_request:
            pass
        elif version == "1.1":
            self.chunked = True
            lines.append(b"transfer-encoding: chunked\r\n")
        else:
            self.keep_alive = False  # HTTP/1.0 with no length: the body ends with the connection
        if status in _NO_BODY_STATUS and not head_request:
            self._left = 0
        # Chunks with no length to account: the shell may frame them itself (`body`'s rule).
        self.plain_chunks = self.chunked and self._left is None and not self.bodiless
        self.head = b"".join(lines)

    def body(self, data: bytes, more: bool) -> bytes:
        """The bytes that carry `data` on the wire (and the body's end, unless `more`)."""
        left = self._left
        if left is not None:
            if len(data) > left:
                data = data[:left]  # never past the length: the connection closes after
                self.overrun = True
                self.keep_alive = False
            left = self._left = left - len(data)
            if not more and left:
                self.short = True  # the client waits for bytes that never come: the close ends it
                self.keep_alive = False
        if self.bodiless:
            return b""
        if self.chunked:
            out = b"%x\r\n%b\r\n" % (len(data), data) if data else b""
            return out + b"0\r\n\r\n" if not more else out
        return bytes(data)


def _as_bytes(value: Any) -> bytes:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise InvalidResponse(f"a header name or value of type {type(value).__name__}, not bytes")


@dataclass(frozen=True)
class Framing:
    """What frames a plain connection's messages: a reader per connection (`reader(max_head)`),
    a framer per response (`framer(reader, status, headers, version=, head_request=, keep_alive=)`).
    The gateway's is `FRAMING`; the load lab swaps in h11's to compare them (`gateway.lab.h11framing`)."""

    reader: Callable[[int], Any]
    framer: Callable[..., Any]


def _framer(reader: Any, status: Any, headers: Any, **how: Any) -> ResponseFramer:
    return ResponseFramer(status, headers, **how)


FRAMING = Framing(RequestReader, _framer)
