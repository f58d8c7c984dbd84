"""Clients that leave, noticed at once: one task per process watches the sockets that asked.

A streamed response must end as soon as its client leaves (the backend's
request closed, a tool call cancelled), whether the response is writing or
waiting on a silent backend.  Reading the socket to see its end costs a
task per response beside the send loop (spawned, parked on the socket,
cancelled), about a tenth of a millisecond of CPU each on this stack.
Here, a connection whose response wants to hear of its client leaving puts
its socket in one epoll set of the process's, for `EPOLLRDHUP` (the
client's FIN; a reset comes as `EPOLLHUP`/`EPOLLERR`, which epoll always
reports); one task (`run`, owned by the serve loop) waits for that set's
own descriptor to become readable and calls back each connection whose
client hung up.  Registering is one `epoll_ctl`; a client that sends more
(a pipelined request) wakes nothing; nothing is read.

Linux only (`Hangups.open()` is None elsewhere: the app then reads, a task
per response, as on any ASGI server).
"""

from __future__ import annotations

import contextlib
import logging
import select
from collections.abc import Callable

import trio

__all__ = ["Hangups"]

log = logging.getLogger("gateway")


class Hangups:
    """The process's watch of clients leaving (see the module docstring)."""

    def __init__(self, epoll: select.epoll) -> None:
        self._epoll = epoll
        self._watched: dict[int, Callable[[], None]] = {}

    @classmethod
    def open(cls) -> Hangups | None:
        """A watch, where the platform has epoll with `EPOLLRDHUP`."""
        if not hasattr(select, "epoll") or not hasattr(select, "EPOLLRDHUP"):
            return None
        return cls(select.epoll())

    def watch(self, fd: int, hung_up: Callable[[], None]) -> None:
        """Call `hung_up()` once, from the watch's task, when the socket's client closes or
        resets it (at the next pass if it already has)."""
        self._watched[fd] = hung_up
        try:
            self._epoll.register(fd, select.EPOLLRDHUP)  # level-triggered: a FIN already seen counts
        except FileExistsError:  # (a socket closed while watched, its number reused)
            self._epoll.modify(fd, select.EPOLLRDHUP)

    def unwatch(self, fd: int) -> None:
        """Forget the socket (before it is closed)."""
        if self._watched.pop(fd, None) is not None:
            with contextlib.suppress(OSError):
                self._epoll.unregister(fd)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Call back the clients that hang up, until cancelled; the set is closed then."""
        epoll, watched = self._epoll, self._watched
        task_status.started()
        try:
            while True:
                await trio.lowlevel.wait_readable(epoll.fileno())
                for fd, _ in epoll.poll(0):
                    hung_up = watched.pop(fd, None)
                    with contextlib.suppress(OSError):
                        epoll.unregister(fd)
                    if hung_up is None:
                        continue
                    try:
                        hung_up()
                    except Exception as exc:  # one connection's failure is not every connection's
                        log.error("a hang-up could not be handled (%s)", type(exc).__name__)
                        log.debug("hang-up failure", exc_info=exc)
        finally:
            watched.clear()
            epoll.close()
