"""A streamed response's disconnect watch starts once the response has run a while (transport/watches.py)."""

from __future__ import annotations

import trio

from gateway.transport.watches import WATCH_AFTER, LateWatches


async def test_a_response_still_running_gets_its_watch_after_a_while_and_one_over_by_then_never_does(autojump_clock):
    watches = LateWatches()
    started: dict[str, float] = {}

    def watch_for(name: str):
        async def watch(scope: trio.CancelScope) -> None:
            started[name] = trio.current_time()
            await trio.sleep_forever()  # (a client that never leaves)

        return watch

    async with trio.open_nursery() as owner:  # the app's nursery
        await owner.start(watches.run)
        begun = trio.current_time()
        async with trio.open_nursery() as short:  # a response over in a few milliseconds
            pending = watches.watch(short, watch_for("short"))
            await trio.sleep(WATCH_AFTER / 10)
            pending.cancel()
        async with trio.open_nursery() as long:  # a response still running after WATCH_AFTER
            watches.watch(long, watch_for("long"))
            await trio.sleep(3 * WATCH_AFTER)
            long.cancel_scope.cancel()
        owner.cancel_scope.cancel()
    assert "short" not in started
    # Started at WATCH_AFTER at the earliest, and at most half of it later (the starts are batched).
    assert begun + WATCH_AFTER / 10 + WATCH_AFTER <= started["long"] <= begun + WATCH_AFTER / 10 + 1.5 * WATCH_AFTER + 1e-6


async def test_a_watch_whose_response_ended_just_as_it_was_due_is_not_started_and_the_ticker_goes_on(autojump_clock):
    watches = LateWatches()
    started = []

    async def watch(scope: trio.CancelScope) -> None:
        started.append(trio.current_time())

    async with trio.open_nursery() as owner:
        await owner.start(watches.run)
        async with trio.open_nursery() as response:
            watches.watch(response, watch)
        # The response's nursery closed without forgetting its watch: starting it fails, and is skipped.
        await trio.sleep(2 * WATCH_AFTER)
        async with trio.open_nursery() as later:  # the ticker still starts the next one
            watches.watch(later, watch)
            await trio.sleep(2 * WATCH_AFTER)
        owner.cancel_scope.cancel()
    assert len(started) == 1


async def test_a_client_that_leaves_while_the_backend_is_silent_stops_the_backend_relayed_or_streamed(start_gateway, backend, client):
    # The backend holds its answer back; the client leaves once its request reached the backend.
    # The watch, started once the response has run WATCH_AFTER, sees it, and the backend's
    # request ends: for a chat completion relayed as bytes and for a streamed Responses turn.
    gateway = await start_gateway()
    asks = [
        ("/v1/chat/completions", {"model": "hang-before-headers", "stream": True, "messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/responses", {"model": "hang-before-headers", "stream": True, "input": "hi"}),
    ]
    for number, (path, body) in enumerate(asks, start=1):
        backend.client_left = trio.Event()
        with trio.fail_after(15):
            async with trio.open_nursery() as leaving:

                async def ask() -> None:
                    async with client.stream("POST", gateway + path, json=body) as r:
                        async for _ in r.aiter_bytes():
                            pass

                leaving.start_soon(ask)
                await backend.wait_for(lambda: len(backend.chat_requests) >= number)
                left_at = trio.current_time()
                leaving.cancel_scope.cancel()  # the client leaves
            await backend.client_left.wait()
        assert backend.client_left_at is not None and backend.client_left_at - left_at < 10 * WATCH_AFTER
