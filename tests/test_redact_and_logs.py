"""Secrets redaction and the one log format: one record is one line, no secret, no traceback above DEBUG."""

from __future__ import annotations

import io
import logging
import logging.handlers
import stat
import sys
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
import trio
from hypothesis import given, settings, strategies as st

from gateway import Settings
from gateway.ops.logs import SafeFormatter, add_log_secrets, configure_logging, escape_control, set_log_redactor
from gateway.ops.redact import MARKER, Redactor
from test_multi_instance_and_crash import STARTUP_SECONDS, run_gateway_process

SECRET = "sk-test-9f3c1e7a5b2d4c6e8f0a1b3c5d7e9f1a"
FORGED = "2026-01-01 00:00:00,000 INFO gateway forged"


def make_settings(**values: Any) -> Settings:
    return Settings(_env_file=None, **{"log_file_path": "", **values})  # type: ignore[call-arg]


# --- Redactor ------------------------------------------------------------------------------------


def test_each_secret_becomes_the_marker_and_short_or_empty_ones_are_ignored() -> None:
    redactor = Redactor(["", "abc", "12345", SECRET])
    assert redactor.secrets == (SECRET,)
    assert redactor.redact(f"key={SECRET}; abc 12345") == f"key={MARKER}; abc 12345"
    assert redactor.redact_bytes(f"key={SECRET}!".encode()) == f"key={MARKER}!".encode()


def test_a_secret_containing_another_is_replaced_whole() -> None:
    redactor = Redactor(["secret", "secret-and-more"])
    assert redactor.redact("a secret-and-more b secret c") == f"a {MARKER} b {MARKER} c"
    assert redactor.redact_bytes(b"secret-and-more") == MARKER.encode()


def test_text_without_a_secret_is_returned_as_it_is() -> None:
    text, data = "nothing to see here " * 100, b"nothing to see here " * 100
    assert Redactor([SECRET]).redact(text) is text
    assert Redactor([SECRET]).redact_bytes(data) is data
    assert Redactor([]).redact(text) is text
    assert not Redactor(["short"])


def test_the_settings_secrets_are_the_keys_and_the_redis_credentials() -> None:
    redactor = Redactor.from_settings(
        make_settings(
            openai_api_key=SECRET,
            gateway_secret_key="sealing-key-0123456789",
            redis_url="redis://admin:p%40ss-word-42@redis.internal:6379/0",
        )
    )
    line = f"{SECRET} sealing-key-0123456789 p@ss-word-42 redis://admin:p%40ss-word-42@redis.internal"
    assert redactor.redact(line) == f"{MARKER} {MARKER} {MARKER} redis://{MARKER}@redis.internal"
    assert "admin:p%40ss-word-42" in redactor.secrets and "admin:p@ss-word-42" in redactor.secrets


def test_with_secrets_returns_a_new_redactor_and_leaves_the_old_one_alone() -> None:
    base = Redactor([SECRET])
    more = base.with_secrets(["Bearer mcp-header-token"])
    assert more.redact("Bearer mcp-header-token") == MARKER
    assert base.redact("Bearer mcp-header-token") == "Bearer mcp-header-token"
    assert SECRET not in repr(more)


def test_a_stream_releases_ordinary_bytes_at_once_and_holds_only_a_possible_secret_start() -> None:
    stream = Redactor([SECRET]).stream()
    assert stream.feed(b"data: hello\n\n") == b"data: hello\n\n"
    assert stream.feed(b"data: sk-te") == b"data: "
    assert stream.feed(SECRET[5:].encode() + b" done") == MARKER.encode() + b" done"
    assert stream.feed(b" sk-test-9") == b" "
    assert stream.feed(b"x") == b"sk-test-9x"
    assert stream.feed(b"tail sk") == b"tail "
    assert stream.flush() == b"sk"
    assert stream.flush() == b""


def test_a_stream_without_secrets_passes_chunks_through() -> None:
    stream = Redactor([]).stream()
    chunk = b"anything at all"
    assert stream.feed(chunk) is chunk
    assert stream.flush() == b""


# Secrets avoid the marker's own characters: one overlapping "[redacted]" could reappear.
_SECRET_TEXT = st.text(alphabet="xyz0-é😀", min_size=1, max_size=12)


@st.composite
def secrets_text_and_cuts(draw: st.DrawFn) -> tuple[list[str], str, list[int]]:
    secrets = draw(st.lists(_SECRET_TEXT, max_size=4))
    # Text built from secrets, their pieces and other characters, so matches and near misses are common.
    piece = st.one_of(
        st.sampled_from(secrets) if secrets else st.just("x"),
        st.builds(lambda s, n: s[:n], st.sampled_from(secrets) if secrets else st.just("xyz"), st.integers(0, 11)),
        st.text(alphabet="xyz0-é😀[]redacted\n", max_size=6),
    )
    text = "".join(draw(st.lists(piece, max_size=12)))
    size = len(text.encode())
    cuts = sorted(draw(st.lists(st.integers(0, size), max_size=8)))
    return secrets, text, cuts


@settings(max_examples=500, deadline=None)
@given(secrets_text_and_cuts())
def test_a_stream_cut_anywhere_gives_exactly_the_whole_text_redacted(case: tuple[list[str], str, list[int]]) -> None:
    secrets, text, cuts = case
    redactor = Redactor(secrets)
    data = text.encode()
    stream = redactor.stream()
    output = b""
    for start, end in zip([0, *cuts], [*cuts, len(data)]):
        output += stream.feed(data[start:end])
    output += stream.flush()
    assert output == redactor.redact_bytes(data) == redactor.redact(text).encode()
    for secret in redactor.secrets:
        assert secret.encode() not in output


@settings(max_examples=200, deadline=None)
@given(st.lists(_SECRET_TEXT, max_size=4), st.text(max_size=40))
def test_redacted_text_holds_no_secret(secrets: list[str], text: str) -> None:
    redactor = Redactor(secrets)
    for secret in redactor.secrets:
        text = text[: len(text) // 2] + secret + text[len(text) // 2 :]
    redacted = redactor.redact(text)
    assert all(secret not in redacted for secret in redactor.secrets)


# --- the formatter -------------------------------------------------------------------------------


def record(message: str, *args: Any, level: int = logging.INFO, exc_info: Any = None, stack_info: str | None = None) -> logging.LogRecord:
    made = logging.LogRecord("gateway", level, __file__, 1, message, args or None, exc_info)
    made.stack_info = stack_info
    return made


def raised(message: str) -> Any:
    try:
        raise ValueError(message)
    except ValueError:
        return sys.exc_info()


def test_a_newline_in_a_logged_field_does_not_start_a_second_line() -> None:
    line = SafeFormatter().format(record("model=%s status=ok", "x\n" + FORGED))
    assert "\n" not in line
    assert line.endswith("INFO gateway model=x\\n" + FORGED + " status=ok")


@pytest.mark.parametrize(
    ("raw", "escaped"),
    [
        ("a\r\nb\tc", "a\\r\\nb\\tc"),
        ("\x00\x1b[31m\x7f", "\\x00\\x1b[31m\\x7f"),
        ("next\x85line", "next\\x85line"),
        ("para\u2028graph\u2029", "para\\u2028graph\\u2029"),
        ("C:\\path\\n", "C:\\\\path\\\\n"),  # a backslash is escaped, so "\n" in a line is always an escape
        ("plain ascii and é 😀", "plain ascii and é 😀"),
    ],
)
def test_control_characters_and_backslashes_are_escaped(raw: str, escaped: str) -> None:
    assert escape_control(raw) == escaped
    line = SafeFormatter().format(record("%s", raw))
    assert line.endswith(" gateway " + escaped)
    assert len(line.splitlines()) == 1


def test_secrets_are_redacted_in_the_message_and_its_arguments() -> None:
    formatter = SafeFormatter(Redactor([SECRET]))
    line = formatter.format(record(f"key {SECRET} and %s", f"Bearer {SECRET}"))
    assert SECRET not in line
    assert line.endswith(f"key {MARKER} and Bearer {MARKER}")


def test_an_exception_below_debug_adds_only_its_type() -> None:
    formatter = SafeFormatter(Redactor([SECRET]))
    line = formatter.format(record("request failed", level=logging.ERROR, exc_info=raised(f"bad {SECRET}")))
    assert line.endswith("ERROR gateway request failed (ValueError)")
    assert "Traceback" not in line and "\n" not in line
    assert "Stack" not in formatter.format(record("x", stack_info="Stack (most recent call last):\n  File x"))


def test_at_debug_the_traceback_follows_redacted_and_indented_with_its_newlines() -> None:
    formatter = SafeFormatter(Redactor([SECRET]), tracebacks=True)
    made = record("request failed", level=logging.ERROR, exc_info=raised(f"bad {SECRET}\r\n{FORGED}"))
    lines = formatter.format(made).split("\n")
    assert lines[0].endswith("ERROR gateway request failed")
    assert lines[1] == "  Traceback (most recent call last):"
    assert any(line.startswith('    File "') for line in lines)
    assert lines[-2:] == [f"  ValueError: bad {MARKER}\\r", "  " + FORGED]  # indented: not a record
    assert all(line.startswith("  ") for line in lines[1:])
    assert SECRET not in "\n".join(lines)
    assert made.exc_text is None  # other handlers format the record afresh
    stacked = formatter.format(record("here", stack_info=f"Stack (most recent call last):\n  {SECRET}"))
    assert stacked.split("\n")[1:] == ["  Stack (most recent call last):", f"    {MARKER}"]


# --- configure_logging -----------------------------------------------------------------------------


@pytest.fixture
def restored_logging() -> Iterator[None]:
    """configure_logging changes process-wide state; put it back afterwards."""
    root, gateway = logging.getLogger(), logging.getLogger("gateway")
    hypercorn = logging.getLogger("hypercorn.error")
    saved = [(lg, lg.level, list(lg.handlers), lg.propagate) for lg in (root, gateway, hypercorn)]
    try:
        yield
    finally:
        for lg, level, handlers, propagate in saved:
            for handler in lg.handlers:
                if handler not in handlers:
                    lg.removeHandler(handler)
                    handler.close()
            lg.setLevel(level)
            lg.propagate = propagate


def ours(logger: logging.Logger) -> list[logging.Handler]:
    return [h for h in logger.handlers if isinstance(h.formatter, SafeFormatter)]


def test_configuring_twice_installs_the_handlers_once_on_root_and_gateway(restored_logging: None, tmp_path: Any) -> None:
    for _ in range(3):
        configure_logging(make_settings(log_file_path=str(tmp_path / "log" / "gateway.log")))
    assert len(ours(logging.getLogger())) == 2
    assert ours(logging.getLogger("gateway")) == ours(logging.getLogger())
    assert logging.getLogger("gateway").level == logging.INFO
    assert logging.getLogger("mcp.client.streamable_http").getEffectiveLevel() == logging.WARNING
    assert logging.getLogger("hypercorn.error").getEffectiveLevel() == logging.WARNING
    configure_logging(make_settings(log_level="DEBUG"))
    assert len(ours(logging.getLogger())) == 1
    assert logging.getLogger("trio").getEffectiveLevel() == logging.DEBUG


def test_a_library_error_is_one_redacted_line_without_its_traceback(
    restored_logging: None, capsys: pytest.CaptureFixture[str]
) -> None:
    configure_logging(make_settings(openai_api_key=SECRET))
    try:
        raise RuntimeError(f"upstream said {SECRET}")
    except RuntimeError:
        logging.getLogger("hypercorn.error").exception("Error in ASGI Framework")
    logging.getLogger("mcp.client").info("not shown at INFO")
    logging.getLogger("gateway.app").info("model=%s", f"m\n{SECRET}")
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 2, err
    assert lines[0].endswith("ERROR hypercorn.error Error in ASGI Framework (RuntimeError)")
    assert lines[1].endswith(f"INFO gateway.app model=m\\n{MARKER}")
    assert SECRET not in err and "Traceback" not in err


def test_secrets_added_later_are_redacted_by_the_installed_handlers(
    restored_logging: None, capsys: pytest.CaptureFixture[str]
) -> None:
    configure_logging(make_settings())
    add_log_secrets(["mcp-header-value-1"])
    logging.getLogger("gateway").warning("sent mcp-header-value-1")
    set_log_redactor(Redactor(["only-this-one"]))
    logging.getLogger("gateway").warning("mcp-header-value-1 only-this-one")
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].endswith(f"gateway sent {MARKER}")
    assert lines[1].endswith(f"gateway mcp-header-value-1 {MARKER}")


def file_handler() -> logging.handlers.RotatingFileHandler:
    (handler,) = [h for h in ours(logging.getLogger()) if isinstance(h, logging.handlers.RotatingFileHandler)]
    return handler


def test_the_log_file_and_its_rotated_copies_are_readable_by_their_owner_only(
    restored_logging: None, tmp_path: Any
) -> None:
    directory = tmp_path / "logs"
    configure_logging(make_settings(log_file_path=str(directory / "gateway.log")))
    for n in range(3):
        logging.getLogger("gateway").warning("resp_%d failed for key ops", n)
        file_handler().doRollover()  # what 10 MiB of lines would do
    logging.getLogger("gateway").warning("after the rollovers")
    names = sorted(path.name for path in directory.iterdir())
    assert names == ["gateway.log", "gateway.log.1", "gateway.log.2", "gateway.log.3"]
    assert {name: stat.S_IMODE((directory / name).stat().st_mode) for name in names} == dict.fromkeys(names, 0o600)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert "after the rollovers" in (directory / "gateway.log").read_text()


def test_log_files_an_earlier_version_left_readable_are_tightened(restored_logging: None, tmp_path: Any) -> None:
    tmp_path.chmod(0o755)
    loose = [tmp_path / "gateway.log", tmp_path / "gateway.log.1"]
    for path in loose:
        path.write_text("an old line\n")
        path.chmod(0o644)
    configure_logging(make_settings(log_file_path=str(loose[0])))
    logging.getLogger("gateway").warning("a new line")
    assert [stat.S_IMODE(path.stat().st_mode) for path in loose] == [0o600, 0o600]
    assert stat.S_IMODE(tmp_path.stat().st_mode) == 0o755  # a directory the gateway did not create is the operator's
    old, new = loose[0].read_text().splitlines()
    assert old == "an old line" and new.endswith("WARNING gateway a new line")  # appended to, not replaced


# --- a real gateway process ------------------------------------------------------------------------


async def test_a_gateway_process_logs_forged_lines_escaped_and_never_its_key(tmp_path: Any, backend: Any) -> None:
    log_file = tmp_path / "gateway.log"
    env = {
        "OPENAI_BASE_URL_INTERNAL": backend.url,
        "OPENAI_API_KEY": SECRET,
        "LOG_LEVEL": "INFO",
        "LOG_FILE_PATH": str(log_file),
        "STORE_BACKEND": "memory",
    }
    models = ["x\n" + FORGED, f"leaked-{SECRET}", "echo-auth-400"]
    with trio.fail_after(STARTUP_SECONDS + 20):
        async with trio.open_nursery() as nursery, httpx2.AsyncClient(timeout=10) as http:
            gateway = await nursery.start(run_gateway_process, tmp_path, env)
            statuses = []
            for model in models:
                r = await http.post(gateway.url + "/v1/responses", json={"model": model, "input": "hi"})
                statuses.append(r.status_code)
            assert statuses[:2] == [200, 200]  # unknown model names get the scripted "text" scenario
            while bytes(gateway.stderr).count(b" model=") < len(models):
                await trio.sleep(0.01)  # the request lines land after the responses; bounded above
            nursery.cancel_scope.cancel()
    for log in (bytes(gateway.stderr).decode(), log_file.read_text()):
        lines = log.split("\n")
        assert not [line for line in lines if line.startswith(FORGED)], log
        assert [line for line in lines if " model=x\\n" + FORGED + " " in line and " status=completed " in line], log
        assert [line for line in lines if f" model=leaked-{MARKER} " in line], log
        assert SECRET not in log


async def test_log_format_json_writes_one_object_per_line_with_the_responses_fields(tmp_path, backend):
    import signal

    import httpx2
    import orjson

    from test_drain import served

    secret = "sk-test-logs-0123456789"
    async with served(tmp_path, backend.url, LOG_FORMAT="json", GATEWAY_API_KEYS=f"ops={secret}") as gateway:
        async with httpx2.AsyncClient(timeout=10) as http:
            headers = {"authorization": f"Bearer {secret}", "x-request-id": "trace-7"}
            made = await http.post(gateway.url + "/v1/responses", json={"model": "text", "input": "hi"}, headers=headers)
            assert made.status_code == 200
            streamed = await http.post(
                gateway.url + "/v1/responses", json={"model": "text", "input": "hi", "stream": True}, headers=headers
            )
            assert streamed.status_code == 200
        gateway.process.send_signal(signal.SIGTERM)
        assert await gateway.process.wait() == 0
        text = await gateway.read_rest()
    entries = [orjson.loads(line) for line in text.splitlines() if line.strip()]  # every line is one object
    assert all({"time", "level", "logger", "message"} <= set(entry) for entry in entries)
    turns = [entry for entry in entries if entry.get("response_id")]
    assert [entry["transport"] for entry in turns] == ["json", "sse"]
    for entry in turns:
        assert entry["request_id"] == "trace-7" and entry["key"] == "ops" and entry["model"] == "text"
        assert entry["status"] == "completed" and entry["http_status"] == 200
        assert (entry["input_tokens"], entry["output_tokens"]) == (11, 7)
        assert entry["duration_ms"] >= entry["first_event_ms"] >= 0
    assert secret not in text
