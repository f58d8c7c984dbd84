"""A streamed body whose producer takes the send loop's steps itself (issue 45).

A token the backend sent is written to the client from the turn's own task
(one wake-up per event, not two); a task of the send loop runs only while
there is waiting to do: the head of a slow backend, a keep-alive, a write
still on its way to a slow client.  Every guarantee stays: order, heartbeats,
backpressure, the client leaving, the terminal event and the end.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import orjson
import trio
import trio.testing

from conftest import parse_sse
from gateway.transport.asgi import SendLoop
from gateway.transport.body import DeferredHeadBody, SendPath
from scripted_backend import chunk
from test_concurrency import HEARTBEAT, ChannelBackend, make_body


def is_turn(task: trio.lowlevel.Task) -> bool:
    """The task that runs the turn: the one the body's nursery runs its producer in."""
    return task.name.endswith("._produce_then_end")


class RecordingPath(SendPath):
    """The HTTP layer's send path, recording each write, the task that made it, and the time."""

    def __init__(self) -> None:
        self.head: tuple[int, dict[str, str]] | None = None
        self.writes: list[tuple[float, bytes, bool, trio.lowlevel.Task]] = []
        self.gate: trio.Event | None = None  # while set and not yet fired, a write waits: a slow client
        self.ended = False

    async def __call__(self, body: DeferredHeadBody) -> None:  # pragma: no cover - never the loop here
        raise AssertionError("a body given a send path takes its steps itself")

    async def start(self, status: int, headers: dict[str, str]) -> None:
        self.head = (status, headers)

    async def write(self, data: bytes, *, last: bool = False) -> None:
        if self.gate is not None:
            await self.gate.wait()
        self.writes.append((trio.current_time(), data, last, trio.lowlevel.current_task()))
        if last:
            self.ended = True

    @property
    def body(self) -> bytes:
        return b"".join(data for _, data, _, _ in self.writes)


class Steps(trio.abc.Instrument):
    """How many steps each task took, by name."""

    def __init__(self) -> None:
        self.by_name: Counter[str] = Counter()

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.by_name[task.name.rsplit(".", 1)[-1]] += 1


def sse(content: str) -> bytes:
    return b"data: " + orjson.dumps(chunk({"content": content})) + b"\n\n"


async def test_every_token_goes_out_from_the_turns_own_task_and_no_send_loop_task_runs_per_token(autojump_clock, nursery):
    backend = ChannelBackend()
    backend.answer.set()
    body = await make_body(backend, interval=5.0, nursery=nursery)
    path = RecordingPath()
    steps = Steps()

    async def tokens() -> None:
        await backend.asked.wait()
        trio.lowlevel.add_instrument(steps)
        for n in range(40):
            await trio.sleep(0.02)  # a model's pace: each token its own read
            await backend.send.send(sse(f"t{n} "))
        await backend.send.send(b"data: [DONE]\n\n")

    async def serve() -> None:
        await body.serve(path)

    nursery.start_soon(tokens)
    await serve()
    trio.lowlevel.remove_instrument(steps)

    frames = parse_sse(path.body)
    deltas = [f for f in frames if isinstance(f, dict) and f.get("type") == "response.output_text.delta"]
    assert len(deltas) == 40 and frames[-1] == "[DONE]" and path.ended
    assert path.head is not None and path.head[0] == 200
    # Every write, the head's and the end's too, was made by the task that runs the turn.
    # Every token, the terminal event and the end were written by the task that runs the turn;
    # the send loop's first task wrote the head and what the turn had queued before the backend
    # answered, then ended: no loop task took a step while the tokens came.
    loop_writes = [data for _, data, _, task in path.writes if not is_turn(task)]
    assert len(loop_writes) <= 1 and b"response.output_text.delta" not in b"".join(loop_writes)
    assert path.writes[-1][2] and is_turn(path.writes[-1][3])
    assert steps.by_name["_first_loop"] <= 1 and steps.by_name["_drain"] == 0
    assert body.first_write_at is not None and not body.client_left


async def test_the_terminal_event_and_done_leave_in_one_write(autojump_clock, nursery):
    # A client that acts on `response.completed` (a browser's reader, an SDK that stops there)
    # has the whole stream in the same read: `[DONE]` is not a write of its own after it.
    backend = ChannelBackend()
    backend.answer.set()
    body = await make_body(backend, interval=5.0, nursery=nursery)
    path = RecordingPath()

    async def tokens() -> None:
        await backend.asked.wait()
        for n in range(3):
            await trio.sleep(0.02)
            await backend.send.send(sse(f"t{n} "))
        await backend.send.send(b"data: [DONE]\n\n")

    nursery.start_soon(tokens)
    await body.serve(path)
    (terminal,) = [data for _, data, _, _ in path.writes if b"event: response.completed" in data]
    assert terminal.endswith(b"data: [DONE]\n\n") and path.body.count(b"data: [DONE]") == 1
    assert path.writes[-1][2]  # and then the end


async def test_a_keep_alive_goes_out_from_a_loop_task_and_tokens_queued_behind_a_slow_write_leave_in_one(
    autojump_clock, nursery
):
    backend = ChannelBackend()
    backend.answer.set()
    body = await make_body(backend, interval=2.0, nursery=nursery)
    path = RecordingPath()
    released = trio.Event()

    async def script() -> None:
        await backend.send.send(sse("first "))
        await trio.sleep(1.0)
        path.gate = released  # the client stops reading: the keep-alive due at 2 s waits in its write
        await trio.sleep(1.5)
        for n in range(10):  # the tokens meanwhile queue behind it
            await backend.send.send(sse(f"q{n} "))
            await trio.testing.wait_all_tasks_blocked()
        await trio.sleep(0.5)
        path.gate = None
        released.set()
        await trio.testing.wait_all_tasks_blocked()
        await backend.send.send(sse("after "))
        await trio.testing.wait_all_tasks_blocked()
        await backend.send.send(b"data: [DONE]\n\n")

    async def serve() -> None:
        await body.serve(path)

    nursery.start_soon(script)
    await serve()

    kinds = []
    for _, data, _, task in path.writes:
        mine = "turn" if is_turn(task) else "loop"
        if data == HEARTBEAT:
            kinds.append((mine, "keep-alive"))
        elif b"response.output_text.delta" in data:
            kinds.append((mine, data.count(b"event: response.output_text.delta")))
    first_queued = next(i for i, k in enumerate(kinds) if k[1] == "keep-alive")
    # The first token from the turn; the keep-alive from a loop task, then the ten tokens that
    # queued while it waited, in one write by that loop; then the turn writes its own again.
    assert kinds[0] == ("turn", 1)
    assert kinds[first_queued : first_queued + 2] == [("loop", "keep-alive"), ("loop", 10)]
    assert kinds[first_queued + 2] == ("turn", 1)
    frames = parse_sse(path.body)
    texts = [f["delta"] for f in frames if isinstance(f, dict) and f.get("type") == "response.output_text.delta"]
    assert texts == ["first ", *[f"q{n} " for n in range(10)], "after "]  # in order
    assert frames[-1] == "[DONE]" and path.ended


async def test_a_client_that_stops_reading_holds_the_turn_once_its_queue_is_full(autojump_clock, nursery):
    backend = ChannelBackend()
    backend.answer.set()
    body = await make_body(backend, interval=2.0, nursery=nursery)
    path = RecordingPath()
    sent = 0
    never = trio.Event()

    async def flood() -> None:
        nonlocal sent
        await backend.send.send(sse("first "))
        await trio.sleep(1.0)
        path.gate = never  # the keep-alive at 2 s never finishes: every later token queues
        await trio.sleep(1.5)
        for n in range(1000):
            await backend.send.send(sse(f"t{n} "))
            sent += 1

    nursery.start_soon(flood)
    with trio.move_on_after(60):
        await body.serve(path)
    # The turn stopped taking the backend's tokens: a bounded queue, the rest left unread
    # (the channel to the backend holds 100, the body's queue 256 writes).
    assert 250 <= sent <= 256 + 100 + 1
    assert backend.send.statistics().current_buffer_used == 100


async def test_a_client_leaving_while_the_turn_writes_its_own_ends_the_turn_and_its_backend_call(autojump_clock, nursery):
    backend = ChannelBackend()
    backend.answer.set()
    body = await make_body(backend, interval=5.0, nursery=nursery)
    path = RecordingPath()
    watched: list[trio.Nursery] = []

    def watch(body_nursery: trio.Nursery) -> None:
        watched.append(body_nursery)  # the HTTP layer cancels it when the client hangs up

    async def script() -> None:
        for n in range(5):
            await backend.send.send(sse(f"t{n} "))
            await trio.sleep(0.02)
        watched[0].cancel_scope.cancel()  # the client hung up

    nursery.start_soon(script)
    with trio.fail_after(5):
        await body.serve(path, watch)
    assert body.client_left and backend.closed.is_set()
    assert not path.ended  # no end of a response whose client left


async def test_a_backend_slow_to_answer_gets_the_head_and_keep_alives_from_loop_tasks_then_the_turn_writes(
    autojump_clock, nursery
):
    backend = ChannelBackend()
    body = await make_body(backend, interval=2.0, nursery=nursery)
    path = RecordingPath()

    async def script() -> None:
        await trio.sleep(4.5)
        backend.answer.set()
        await backend.send.send(sse("late "))
        await trio.testing.wait_all_tasks_blocked()
        await backend.send.send(b"data: [DONE]\n\n")

    async def serve() -> None:
        await body.serve(path)

    nursery.start_soon(script)
    await serve()
    by: list[tuple[float, str, Any]] = []
    for at, data, _, task in path.writes:
        by.append((at, "turn" if is_turn(task) else "loop", HEARTBEAT if data == HEARTBEAT else data[:40]))
    # The head commits after half an interval (the stream's created and in_progress with it),
    # keep-alives follow each silent interval, all from loop tasks; the late token from the turn.
    assert by[0][0] == 1.0 and by[0][1] == "loop" and b"response.created" in path.writes[0][1]
    assert [(at, who) for at, who, what in by if what == HEARTBEAT] == [(3.0, "loop")]
    late = next(i for i, w in enumerate(path.writes) if b"late" in w[1])
    assert by[late][1] == "turn" and by[late][0] == 4.5
    assert parse_sse(path.body)[-1] == "[DONE]" and path.ended


async def test_a_send_loop_sends_a_bodys_pieces_by_the_servers_stream_extension_and_its_head_and_end_as_messages():
    # Where the server offers `gateway.stream`, the pieces between the head and the end go
    # without a message each (nor the app's wrappers of `send`, which act on those two only).
    messages: list[dict[str, Any]] = []
    pieces: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)

    async def piece(data: bytes) -> None:
        pieces.append(data)

    for offered in (piece, None):
        messages.clear()
        loop = SendLoop(send, offered)
        await loop.start(200, {"content-type": "text/event-stream"})
        await loop.write(b"one")
        await loop.write(b"two")
        await loop.write(b"end", last=True)
        assert loop.ended and messages[0]["type"] == "http.response.start"
        bodies = [(m["body"], m["more_body"]) for m in messages[1:]]
        if offered is piece:
            assert pieces == [b"one", b"two"] and bodies == [(b"end", False)]
        else:
            assert bodies == [(b"one", True), (b"two", True), (b"end", False)]
