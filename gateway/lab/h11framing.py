"""h11 as the framing of the gateway's own connections: the other side of the bench's parser comparison.

The gateway's plain connections take their framing from `gateway.server.h1`
(llhttp through httptools, fed a message at a time and checked as strictly
as h11).  Here is the alternative the bench measures it against: a lean
trio server on h11, the well-kept sans-IO library, doing all of it: one
`h11.Connection` per connection reads every request (`H11Reader`) and
writes every response's head, chunks and end (`H11Framer`).  Everything
else is the same shell (`gateway.server.http11`), so the difference the
bench prints is the parsers' alone.

    python -m gateway.lab.h11framing serve [gateway serve's options]

runs `gateway serve` with it (`gateway bench --only parsers` does).
"""

from __future__ import annotations

import sys
from typing import Any

import h11

from ..server import h1

__all__ = ["H11_FRAMING", "H11Framer", "H11Reader", "main"]


class H11Reader:
    """`h1.RequestReader`'s interface, on an `h11.Connection(SERVER)`."""

    def __init__(self, max_head: int = 16 * 1024) -> None:
        self.max_head = max_head
        self.connection = h11.Connection(h11.SERVER, max_incomplete_event_size=max_head)
        self._refused = False
        self._switched = False

    @property
    def head_begun(self) -> bool:
        connection = self.connection
        return connection.their_state is h11.IDLE and bool(connection.trailing_data[0])

    @property
    def held(self) -> int:
        return len(self.connection.trailing_data[0]) if self.connection.their_state is h11.DONE else 0

    def trailing(self) -> bytes:
        data, _ = self.connection.trailing_data
        return bytes(data)

    def feed(self, data: bytes) -> list[Any]:
        if self._refused or self._switched:
            return []
        self.connection.receive_data(data)
        return self._events()

    def next_cycle(self) -> list[Any]:
        connection = self.connection
        if connection.our_state is not h11.DONE or connection.their_state is not h11.DONE:
            return []
        connection.start_next_cycle()
        return self._events()

    def _events(self) -> list[Any]:
        events: list[Any] = []
        connection = self.connection
        try:
            while True:
                event = connection.next_event()
                if event is h11.NEED_DATA or event is h11.PAUSED:
                    break
                if isinstance(event, h11.Request):
                    events.append(self._request(event))
                    if self._switched:
                        break
                elif isinstance(event, h11.Data):
                    events.append(bytes(event.data))
                elif isinstance(event, h11.EndOfMessage):
                    events.append(h1.END)
                else:
                    break
        except h11.RemoteProtocolError as error:
            self._refused = True
            events.append(h1.Refusal(error.error_status_hint, str(error)))
        return events

    def _request(self, event: h11.Request) -> h1.Request:
        headers = [(bytes(name), bytes(value)) for name, value in event.headers]
        tokens = {t.strip() for name, value in headers if name == b"connection" for t in value.lower().split(b",")}
        version = event.http_version.decode()
        keep_alive = b"close" not in tokens and (version == "1.1" or b"keep-alive" in tokens)
        upgrade = next((value.lower() for name, value in headers if name == b"upgrade"), None) if b"upgrade" in tokens else None
        self._switched = upgrade is not None
        head = b"%b %b HTTP/%b\r\n" % (event.method, event.target, event.http_version)
        head += b"".join(b"%b: %b\r\n" % pair for pair in headers) + b"\r\n"
        return h1.Request(
            event.method.decode("ascii"),
            bytes(event.target),
            version,
            headers,
            keep_alive,
            self.connection.they_are_waiting_for_100_continue,
            upgrade,
            head,
        )


class H11Framer:
    """`h1.ResponseFramer`'s interface, on the reader's `h11.Connection`: h11 writes the head,
    each chunk and the end, and keeps the accounts."""

    def __init__(self, reader: H11Reader, status: Any, headers: Any, *, version: str, head_request: bool, keep_alive: bool) -> None:
        self.connection = reader.connection
        self.keep_alive = keep_alive
        self.overrun = self.short = False
        self.plain_chunks = False  # (h11 frames every chunk itself)
        self.head_request = head_request
        own = [(bytes(n), bytes(v)) for n, v in headers if bytes(n).lower() not in (b"date", b"connection")]
        if not keep_alive:
            own.append((b"connection", b"close"))
        try:
            head = self.connection.send(h11.Response(status_code=status, headers=own))
        except h11.LocalProtocolError as error:
            raise h1.InvalidResponse(str(error)) from None
        assert head is not None
        # The shell adds its own `date` (and `connection: close`): the head without its blank line.
        lines = head[:-4].split(b"\r\n")
        self.head = b"\r\n".join(line for line in lines if not line.lower().startswith(b"connection:")) + b"\r\n"
        if self.connection.our_state is h11.MUST_CLOSE:
            self.keep_alive = False

    def body(self, data: bytes, more: bool) -> bytes:
        connection = self.connection
        out = b""
        try:
            if data and not self.head_request:
                out = connection.send(h11.Data(data=data)) or b""
            if not more:
                out += connection.send(h11.EndOfMessage()) or b""
        except h11.LocalProtocolError:
            self.overrun = True
            self.keep_alive = False
        if connection.our_state is h11.MUST_CLOSE:
            self.keep_alive = False
        return out


def _framer(reader: Any, status: Any, headers: Any, **how: Any) -> H11Framer:
    return H11Framer(reader, status, headers, **how)


H11_FRAMING = h1.Framing(H11Reader, _framer)


def main() -> int:
    """`gateway` with h11 framing every plain connection (see the module docstring)."""
    from ..cli import main as gateway_main

    h1.FRAMING = H11_FRAMING  # read when the serve loop makes its plain server
    return gateway_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
