"""Heartbeats from one timer wheel per process, or a ticker task per stream: what each costs a stream.

The design card has a heartbeat ticker task in each request's nursery; the
gateway runs one wheel per process instead (`gateway.transport.heartbeats`).
This measures why, on the skeleton of a streamed response (a producer, a send
loop and a memory channel between them, 200 events), 50 streams at once:

    python -m gateway.lab.tickers [--rounds 9]

`task`: a ticker task per stream, asleep until its deadline, which every
write moves (a quiet stream's keep-alive is due an interval after its last
write).  `wheel`: the stream holds a ticket in the process's wheel, which no
write touches.  Prints CPU per stream, median and range of the rounds
(interleaved).
"""

from __future__ import annotations

import argparse
import statistics
import time

import trio

from ..transport.heartbeats import Heartbeats

__all__ = ["measure"]

EVENTS, STREAMS, INTERVAL = 200, 50, 15.0


async def _with_tasks(streams: int) -> None:
    async def stream() -> None:
        send, receive = trio.open_memory_channel[bytes](256)
        beat = trio.CancelScope(deadline=trio.current_time() + INTERVAL)

        async def ticker() -> None:
            with beat:
                await trio.sleep_forever()

        async def writer() -> None:
            async for _ in receive:
                pass

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ticker)
            nursery.start_soon(writer)
            async with send:
                for _ in range(EVENTS):
                    await send.send(b"x")
                    beat.deadline = trio.current_time() + INTERVAL  # the keep-alive follows each write
                    await trio.lowlevel.checkpoint()
            nursery.cancel_scope.cancel()

    async with trio.open_nursery() as nursery:
        for _ in range(streams):
            nursery.start_soon(stream)


class _Quiet:
    def beat(self, now: float, stall_timeout: float | None) -> float | None:
        return now + INTERVAL


async def _with_wheel(streams: int) -> None:
    heartbeats = Heartbeats(INTERVAL, stall_timeout=None)

    async def stream() -> None:
        send, receive = trio.open_memory_channel[bytes](256)
        ticket = heartbeats.add(_Quiet(), trio.current_time() + INTERVAL)

        async def writer() -> None:
            async for _ in receive:
                pass

        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer)
            async with send:
                for _ in range(EVENTS):
                    await send.send(b"x")
                    await trio.lowlevel.checkpoint()
        ticket.cancel()

    async with trio.open_nursery() as owner:
        await owner.start(heartbeats.run)
        async with trio.open_nursery() as nursery:
            for _ in range(streams):
                nursery.start_soon(stream)
        owner.cancel_scope.cancel()


def measure(rounds: int = 9) -> dict[str, list[float]]:
    """CPU milliseconds per stream, round by round, for `task` and `wheel`."""
    found: dict[str, list[float]] = {"task": [], "wheel": []}
    for _ in range(rounds):
        for name, run in (("task", _with_tasks), ("wheel", _with_wheel)):
            began = time.process_time()
            trio.run(run, STREAMS)
            found[name].append((time.process_time() - began) / STREAMS * 1000)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m gateway.lab.tickers", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    for name, values in measure(parser.parse_args().rounds).items():
        print(f"{name}: {statistics.median(values):.2f} ms per {EVENTS}-event stream [{min(values):.2f} to {max(values):.2f}]")


if __name__ == "__main__":
    main()
