"""The load-test backend (gateway.lab.simulator), tested over real loopback sockets."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import h11
import httpx2
import orjson
import pytest
import trio
import trio.testing

from gateway.lab.simulator import SimConfig, SimConfigError, Simulator

MESSAGES = [{"role": "user", "content": "x" * 40}]  # 40 characters ≈ 10 prompt tokens
PATH = "/v1/chat/completions"

StartSim = Callable[..., Awaitable[tuple[Simulator, str]]]


@pytest.fixture
def start_sim(nursery: trio.Nursery) -> StartSim:
    async def start(**config: Any) -> tuple[Simulator, str]:
        simulator = Simulator(SimConfig(**config))
        url = await nursery.start(simulator.serve)
        return simulator, url

    return start


def chat(model: str = "sim", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": MESSAGES, **extra}


async def stream_chunks(
    url: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[list[dict[str, Any]], bool]:
    """The JSON chunks of one streamed answer, and whether it ended with [DONE]."""
    chunks: list[dict[str, Any]] = []
    done = False
    async with httpx2.AsyncClient(timeout=10) as http:
        body = {**body, "stream": True}
        async with http.stream("POST", f"{url}{PATH}", json=body, headers=headers) as resp:
            assert resp.status_code == 200
            assert resp.headers["content-type"] == "text/event-stream"
            async for line in resp.aiter_lines():
                if not line:
                    continue
                assert line.startswith("data: ")
                assert not done, "nothing may follow [DONE]"
                if line == "data: [DONE]":
                    done = True
                else:
                    chunks.append(orjson.loads(line[6:]))
    return chunks, done


def deltas(chunks: list[dict[str, Any]], key: str) -> list[Any]:
    found = [c["choices"][0]["delta"] for c in chunks if c.get("choices")]
    return [delta[key] for delta in found if key in delta]


def finish_reasons(chunks: list[dict[str, Any]]) -> list[str]:
    reasons = [c["choices"][0]["finish_reason"] for c in chunks if c.get("choices")]
    return [reason for reason in reasons if reason]


async def test_a_stream_sends_the_role_then_tokens_then_finish_usage_and_done(start_sim: StartSim):
    simulator, url = await start_sim(tokens=5)
    with trio.fail_after(5):
        chunks, done = await stream_chunks(url, chat(stream_options={"include_usage": True}))
    assert done
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[0]["object"] == "chat.completion.chunk"
    assert len({c["id"] for c in chunks}) == 1
    contents = deltas(chunks, "content")[1:]
    assert len(contents) == 5
    assert all(text.startswith("tok") and text.endswith(" ") for text in contents)
    assert finish_reasons(chunks) == ["stop"]
    assert chunks[-1]["choices"] == []
    usage = chunks[-1]["usage"]
    assert usage["prompt_tokens"] == 10
    assert usage["completion_tokens"] == 5
    assert usage["total_tokens"] == 15
    assert all(c["usage"] is None for c in chunks[:-1])  # as OpenAI does with include_usage
    assert simulator.stats.streams_completed == 1
    assert simulator.stats.internal_errors == 0


async def test_without_include_usage_no_usage_chunk_is_sent(start_sim: StartSim):
    _, url = await start_sim(tokens=2)
    with trio.fail_after(5):
        chunks, done = await stream_chunks(url, chat())
    assert done
    assert all("usage" not in c for c in chunks)
    assert finish_reasons(chunks) == ["stop"]


async def test_tool_calls_stream_with_index_id_name_and_split_arguments(start_sim: StartSim):
    _, url = await start_sim(tokens=0, tools=2)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    with trio.fail_after(5):
        chunks, done = await stream_chunks(url, chat(tools=tools))
    assert done
    assert finish_reasons(chunks) == ["tool_calls"]
    calls: dict[int, dict[str, str]] = {}
    pieces = 0
    for part in (p for delta in deltas(chunks, "tool_calls") for p in delta):
        call = calls.setdefault(part["index"], {"id": "", "name": "", "arguments": ""})
        if "id" in part:
            call["id"] = part["id"]
            call["name"] = part["function"]["name"]
        elif part["function"]["arguments"]:
            pieces += 1
        call["arguments"] += part["function"]["arguments"]
    assert sorted(calls) == [0, 1]
    assert [c["name"] for c in calls.values()] == ["get_weather", "get_weather"]
    assert len({c["id"] for c in calls.values()}) == 2
    assert pieces > 2, "arguments arrive in several chunks"
    for call in calls.values():
        assert isinstance(orjson.loads(call["arguments"]), dict)


async def test_reasoning_chunks_come_before_the_content(start_sim: StartSim):
    _, url = await start_sim(tokens=2, reasoning=3)
    with trio.fail_after(5):
        chunks, _ = await stream_chunks(url, chat(stream_options={"include_usage": True}))
    kinds = [k for c in chunks if c["choices"] for k in c["choices"][0]["delta"] if k != "role"]
    # The role chunk carries content "" too.
    assert kinds == ["content"] + ["reasoning_content"] * 3 + ["content"] * 2
    assert chunks[-1]["usage"]["completion_tokens_details"]["reasoning_tokens"] == 3


async def test_max_tokens_smaller_than_tokens_cuts_the_answer_with_length(start_sim: StartSim):
    _, url = await start_sim(tokens=10, tools=1)
    with trio.fail_after(5):
        usage = {"include_usage": True}
        chunks, done = await stream_chunks(url, chat(max_tokens=3, stream_options=usage))
        async with httpx2.AsyncClient(timeout=5) as http:
            resp = await http.post(f"{url}{PATH}", json=chat(max_tokens=3))
    assert done
    assert len(deltas(chunks, "content")[1:]) == 3
    assert deltas(chunks, "tool_calls") == []
    assert finish_reasons(chunks) == ["length"]
    assert chunks[-1]["usage"]["completion_tokens"] == 3
    choice = resp.json()["choices"][0]
    assert choice["finish_reason"] == "length"
    assert len(choice["message"]["content"].split()) == 3


async def test_a_non_streamed_answer_is_one_chat_completion(start_sim: StartSim):
    simulator, url = await start_sim(tokens=4, reasoning=1)
    async with httpx2.AsyncClient(timeout=5) as http:
        with trio.fail_after(5):
            resp = await http.post(f"{url}{PATH}", json=chat())
    assert resp.status_code == 200
    body = resp.json()
    assert body["object"] == "chat.completion"
    message = body["choices"][0]["message"]
    assert message["role"] == "assistant"
    assert len(message["content"].split()) == 4
    assert message["reasoning_content"].startswith("think")
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"] == {
        "prompt_tokens": 10,
        "completion_tokens": 5,
        "total_tokens": 15,
        "prompt_tokens_details": {"cached_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 1},
    }
    assert simulator.stats.responses_completed == 1


async def test_failure_500_is_an_http_error_before_any_stream(start_sim: StartSim):
    simulator, url = await start_sim(fail=1.0, kinds=("500",))
    async with httpx2.AsyncClient(timeout=5) as http:
        with trio.fail_after(5):
            resp = await http.post(f"{url}{PATH}", json=chat(stream=True))
    assert resp.status_code == 500
    assert resp.json()["error"]["type"] == "server_error"
    assert simulator.stats.failures == {"500": 1}


async def test_failure_midstream_sends_chunks_then_an_error_event_without_done(start_sim: StartSim):
    simulator, url = await start_sim(tokens=10, fail=1.0, kinds=("midstream",))
    with trio.fail_after(5):
        chunks, done = await stream_chunks(url, chat())
    assert not done
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert 1 <= len(deltas(chunks, "content")[1:]) <= 10
    assert finish_reasons(chunks) == []
    assert chunks[-1]["error"]["code"] == 500
    assert simulator.stats.failures == {"midstream": 1}
    assert simulator.stats.streams_completed == 0


async def test_failure_hang_sends_headers_then_nothing_until_the_client_leaves(start_sim: StartSim):
    simulator, url = await start_sim(fail=1.0, kinds=("hang",))
    async with httpx2.AsyncClient(timeout=5) as http:
        with trio.fail_after(5):
            async with http.stream("POST", f"{url}{PATH}", json=chat(stream=True)) as resp:
                assert resp.status_code == 200
                await simulator.wait_stats(lambda s: s.failures.get("hang") == 1)
                assert simulator.stats.active == 1
                assert simulator.stats.client_disconnects == 0
            # Closing an unfinished response closes its connection.
            await simulator.wait_stats(lambda s: s.client_disconnects == 1)
    assert simulator.stats.active == 0
    assert simulator.stats.internal_errors == 0


async def test_failure_drop_closes_the_connection_without_the_last_chunk(start_sim: StartSim):
    simulator, url = await start_sim(tokens=10, fail=1.0, kinds=("drop",))
    lines: list[str] = []
    async with httpx2.AsyncClient(timeout=5) as http:
        with trio.fail_after(5), pytest.raises(httpx2.RemoteProtocolError):
            async with http.stream("POST", f"{url}{PATH}", json=chat(stream=True)) as resp:
                assert resp.status_code == 200
                async for line in resp.aiter_lines():
                    lines.append(line)
    data = [line for line in lines if line]
    assert data[0].startswith("data: ")
    assert "data: [DONE]" not in data
    assert simulator.stats.failures == {"drop": 1}
    assert simulator.stats.client_disconnects == 0


async def test_overrides_come_from_the_model_name_and_headers_win_over_it(start_sim: StartSim):
    _, url = await start_sim(tokens=4)
    with trio.fail_after(5):
        default, _ = await stream_chunks(url, chat("sim"))
        by_model, _ = await stream_chunks(url, chat("sim:tokens=2,reasoning=1"))
        header = {"x-sim-tokens": "3"}
        by_header, _ = await stream_chunks(url, chat("sim:tokens=2,reasoning=1"), header)
    assert len(deltas(default, "content")) == 1 + 4
    assert len(deltas(by_model, "content")) == 1 + 2
    assert len(deltas(by_model, "reasoning_content")) == 1
    assert len(deltas(by_header, "content")) == 1 + 3
    assert len(deltas(by_header, "reasoning_content")) == 1


async def test_an_invalid_override_is_a_400_naming_the_key(start_sim: StartSim):
    simulator, url = await start_sim()
    async with httpx2.AsyncClient(timeout=5) as http:
        with trio.fail_after(5):
            bad_model = await http.post(f"{url}{PATH}", json=chat("sim:ttft=soon"))
            bad_header = await http.post(f"{url}{PATH}", json=chat(), headers={"x-sim-fail": "2"})
            unknown = await http.post(f"{url}{PATH}", json=chat("sim:tokns=3"))
            bad_kind = await http.post(f"{url}{PATH}", json=chat("sim:kinds=500+boom"))
    cases = ((bad_model, "ttft"), (bad_header, "fail"), (unknown, "tokns"), (bad_kind, "kinds"))
    for resp, key in cases:
        assert resp.status_code == 400
        error = resp.json()["error"]
        assert error["type"] == "invalid_request_error"
        assert error["param"] == key
        assert error["code"] == "invalid_sim_setting"
    assert simulator.stats.bad_requests == 4
    assert simulator.stats.completions == 0


def test_merged_applies_the_model_name_then_the_headers_and_names_bad_keys():
    base = SimConfig(tokens=7)
    assert base.merged("gpt-4o", {}) is base
    merged = base.merged("sim:ttft=0.5,kinds=500+drop,seed=3", {"X-Sim-Seed": "4", "other": "x"})
    assert merged == SimConfig(ttft=0.5, tokens=7, kinds=("500", "drop"), seed=4)
    with pytest.raises(SimConfigError) as info:
        base.merged("sim", {"x-sim-jitter": "-1"})
    assert info.value.key == "jitter"
    with pytest.raises(SimConfigError) as info:
        SimConfig(tokens=-1)
    assert info.value.key == "tokens"


async def test_the_same_seed_gives_the_same_sequence_of_failures_and_text(start_sim: StartSim):
    async def run() -> list[tuple[int, str]]:
        kinds = ("500", "midstream")
        _, url = await start_sim(tokens=3, fail=0.5, kinds=kinds, jitter=0.001, seed=7)
        outcomes = []
        async with httpx2.AsyncClient(timeout=5) as http:
            for _ in range(8):
                resp = await http.post(f"{url}{PATH}", json=chat())
                choices = resp.json().get("choices") or [{"message": {"content": ""}}]
                outcomes.append((resp.status_code, choices[0]["message"]["content"]))
        return outcomes

    with trio.fail_after(10):
        first = await run()
        second = await run()
    assert first == second
    assert {status for status, _ in first} == {200, 500}  # seed 7 mixes both outcomes
    texts = [text for status, text in first if status == 200]
    assert len(set(texts)) == len(texts), "each request draws its own words"


def test_a_plan_depends_only_on_the_seed_and_the_request_number():
    from gateway.lab.simulator import _plan, _request_rng

    config = SimConfig(
        tokens=30, tools=2, reasoning=3, delay=0.01, jitter=0.005, fail=0.5, kinds=("drop", "500")
    )

    def plan(seed: int, n: int) -> tuple[str | None, int, list[tuple[float, str, Any]]]:
        completion = _plan(config, chat(), _request_rng(seed, n), "chatcmpl-x")
        events = list(completion.events())  # (delay, kind, word): jitter values and text
        return completion.failure, completion.fail_at, events

    assert plan(7, 0) == plan(7, 0)
    assert plan(7, 1) == plan(7, 1)
    assert plan(7, 0) != plan(7, 1)
    assert plan(7, 0) != plan(8, 0)
    delays = [delay for delay, _, _ in plan(7, 0)[2][1:]]
    assert len(set(delays)) > 1 and all(0.005 <= d <= 0.015 for d in delays)


async def test_a_connection_serves_sequential_requests_until_connection_close(start_sim: StartSim):
    simulator, url = await start_sim(tokens=3)
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with trio.fail_after(5):
        stream = await trio.open_tcp_stream(host, int(port))
    client = h11.Connection(h11.CLIENT)

    async def exchange(body: dict[str, Any], close: bool) -> tuple[h11.Response, bytes]:
        payload = orjson.dumps(body)
        headers = [("host", host), ("content-length", str(len(payload)))]
        if close:
            headers.append(("connection", "close"))
        request = h11.Request(method="POST", target="/v1/chat/completions", headers=headers)
        data = client.send(request) + client.send(h11.Data(data=payload))
        await stream.send_all(data + client.send(h11.EndOfMessage()))
        response = None
        data = b""
        while True:
            event = client.next_event()
            if event is h11.NEED_DATA:
                client.receive_data(await stream.receive_some(65536))
            elif isinstance(event, h11.Response):
                response = event
            elif isinstance(event, h11.Data):
                data += event.data
            elif isinstance(event, h11.EndOfMessage):
                assert response is not None
                return response, data

    async with stream:
        with trio.fail_after(5):
            first, streamed = await exchange(chat(stream=True), close=False)
            client.start_next_cycle()
            second, whole = await exchange(chat(), close=True)
            assert client.their_state is h11.MUST_CLOSE
            assert await stream.receive_some(100) == b"", "closed after connection: close"
    assert first.status_code == second.status_code == 200
    assert streamed.endswith(b"data: [DONE]\n\n")
    assert orjson.loads(whole)["object"] == "chat.completion"
    assert simulator.stats.connections == 1
    assert simulator.stats.requests == 2


async def test_twenty_concurrent_streams_all_complete(start_sim: StartSim):
    simulator, url = await start_sim(tokens=20, delay=0.001, jitter=0.001)
    results: list[bool] = []

    async def one(http: httpx2.AsyncClient) -> None:
        async with http.stream("POST", f"{url}{PATH}", json=chat(stream=True)) as resp:
            lines = [line async for line in resp.aiter_lines() if line]
        results.append(lines[-1] == "data: [DONE]" and len(lines) == 1 + 20 + 1 + 1)

    limits = httpx2.Limits(max_connections=20)
    async with httpx2.AsyncClient(timeout=10, limits=limits) as http:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                for _ in range(20):
                    nursery.start_soon(one, http)
    assert results == [True] * 20
    assert simulator.stats.streams_completed == 20
    assert simulator.stats.client_disconnects == 0


async def test_models_health_stats_and_unknown_paths(start_sim: StartSim):
    simulator, url = await start_sim()
    async with httpx2.AsyncClient(timeout=5) as http:
        with trio.fail_after(5):
            models = await http.get(f"{url}/v1/models")
            health = await http.get(f"{url}/health")
            missing = await http.post(f"{url}/v1/responses", json={})
            stats = await http.get(f"{url}/stats")
    assert models.json()["data"][0]["id"] == "sim"
    assert health.json() == {"status": "ok"}
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"
    assert stats.json()["stats"]["requests"] == 4
    assert stats.json()["stats"]["bad_requests"] == 1
    assert stats.json()["config"]["tokens"] == 20
    assert simulator.stats.requests == 4


async def test_the_server_holds_many_hanging_streams_and_notices_each_leave(start_sim: StartSim):
    simulator, url = await start_sim(fail=1.0, kinds=("hang",))
    count = 50
    all_hanging = trio.Event()

    async def one(http: httpx2.AsyncClient) -> None:
        async with http.stream("POST", f"{url}{PATH}", json=chat(stream=True)) as resp:
            assert resp.status_code == 200
            await all_hanging.wait()

    limits = httpx2.Limits(max_connections=count)
    async with httpx2.AsyncClient(timeout=10, limits=limits) as http:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                for _ in range(count):
                    nursery.start_soon(one, http)
                await simulator.wait_stats(lambda s: s.active == count)
                all_hanging.set()
            await simulator.wait_stats(lambda s: s.client_disconnects == count)
    assert simulator.stats.active == 0
    assert simulator.stats.internal_errors == 0


async def test_a_client_leaving_a_slow_stream_is_counted_and_all_goes_on(start_sim: StartSim):
    simulator, url = await start_sim(tokens=1000, delay=0.002)
    async with httpx2.AsyncClient(timeout=5) as http:
        with trio.fail_after(5):
            async with http.stream("POST", f"{url}{PATH}", json=chat(stream=True)) as resp:
                async for line in resp.aiter_lines():
                    if "tok" in line:
                        break  # leave after the first token
            await simulator.wait_stats(lambda s: s.client_disconnects == 1)
            after = await http.post(f"{url}{PATH}", json=chat("sim:tokens=1"))
    assert after.status_code == 200
    assert simulator.stats.streams_completed == 0
    assert simulator.stats.internal_errors == 0


async def test_cancelling_the_server_ends_sleeping_streams_at_once():
    simulator = Simulator(SimConfig(ttft=60))
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            url = await nursery.start(simulator.serve)

            async def client() -> None:
                async with httpx2.AsyncClient(timeout=30) as http:
                    await http.post(f"{url}{PATH}", json=chat(stream=True))

            nursery.start_soon(client)
            await simulator.wait_stats(lambda s: s.active == 1)
            nursery.cancel_scope.cancel()
    assert simulator.stats.active == 0


async def test_the_portable_send_all_path_sends_the_same_stream(start_sim: StartSim, monkeypatch):
    from gateway.lab import simulator as module

    _, direct_url = await start_sim(tokens=40, delay=0.0005, seed=3)
    _, portable_url = await start_sim(tokens=40, delay=0.0005, seed=3)
    with trio.fail_after(5):
        direct, _ = await stream_chunks(direct_url, chat())
        monkeypatch.setattr(module, "_DIRECT_WRITES", False)
        portable, done = await stream_chunks(portable_url, chat())
    assert done
    assert len(deltas(portable, "content")) == 1 + 40
    assert deltas(portable, "content") == deltas(direct, "content")


def test_the_module_exports_exactly_its_api():
    from gateway.lab import simulator as module

    assert sorted(module.__all__) == [
        "FAILURE_KINDS",
        "SimConfig",
        "SimConfigError",
        "SimStats",
        "Simulator",
        "add_arguments",
        "main",
    ]


def test_the_cli_refuses_an_invalid_setting_before_serving(capsys):
    import argparse

    from gateway.lab.simulator import add_arguments, main

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--port", "0", "--fail", "2", "--kinds", "500,drop"])
    assert main(args) == 2
    assert "'fail'" in capsys.readouterr().err


async def test_python_dash_m_serves_until_ctrl_c():
    import signal
    import subprocess
    import sys

    command = [sys.executable, "-m", "gateway.lab.simulator", "--port", "0", "--tokens", "2"]
    proc = await trio.lowlevel.open_process(command, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        with trio.fail_after(30):
            line = b""
            while not line.endswith(b"\n"):
                data = await proc.stdout.receive_some(4096)
                assert data, "the simulator exited before printing its URL"
                line += data
            url = line.decode().split()[-4].removesuffix("/v1")  # "... at URL/v1 (Ctrl-C to stop)"
            async with httpx2.AsyncClient(timeout=5) as http:
                resp = await http.post(f"{url}{PATH}", json=chat())
            assert len(resp.json()["choices"][0]["message"]["content"].split()) == 2
            proc.send_signal(signal.SIGINT)
            assert await proc.wait() == 0
    finally:
        with trio.move_on_after(5, shield=True):
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            assert proc.stdout is not None
            await proc.stdout.aclose()


async def test_with_a_step_every_stream_gets_its_tokens_on_the_same_shared_clock(
    start_sim: StartSim, mock_clock: trio.testing.MockClock
):
    """A batched model server's decoding steps: streams that started at different moments get
    their later tokens at the same instants, the multiples of `step`."""
    mock_clock.autojump_threshold = 0.05  # real sockets: the clock jumps only once bytes have had time to arrive
    simulator, url = await start_sim(tokens=4, delay=0.1, step=0.1)
    arrivals: dict[int, list[float]] = {}

    async def stream(index: int, start_at: float) -> None:
        await trio.sleep_until(start_at)
        async with httpx2.AsyncClient(timeout=10) as http:
            async with http.stream("POST", f"{url}{PATH}", json=chat(stream=True)) as resp:
                async for line in resp.aiter_lines():
                    if '"content":"tok' in line:
                        arrivals.setdefault(index, []).append(trio.current_time())

    began = trio.current_time()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for index, offset in enumerate((0.013, 0.047, 0.071)):
                nursery.start_soon(stream, index, began + offset)
    for times in arrivals.values():
        assert len(times) == 4
        later = [t / 0.1 for t in times[1:]]  # the first token comes at once; the others on the steps
        assert all(abs(step - round(step)) < 0.02 for step in later), later
    assert {round(t, 3) for t in arrivals[0][1:]} == {round(t, 3) for t in arrivals[2][1:]}


def test_a_step_must_be_a_finite_non_negative_number():
    with pytest.raises(SimConfigError) as caught:
        SimConfig(step=-1)
    assert caught.value.key == "step"
    assert SimConfig().merged("sim:step=0.02", {}).step == 0.02
