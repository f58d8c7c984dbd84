"""Settings: the one place configuration is read.

Owns every environment variable the gateway understands (names and defaults
follow the open-responses-server table so existing deployments keep working),
the `.env` file, and the normalisation of values such as the backend URL.
No other module reads the environment: code receives a `Settings` object.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterable
from typing import Literal

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = [
    "ConfigError",
    "Settings",
    "check_key_name",
    "default_sqlite_path",
    "environment_warnings",
    "load_settings",
    "misspelt_settings",
    "static_key_entries",
]


class ConfigError(Exception):
    """An environment variable holds a value the gateway cannot use."""


def default_sqlite_path() -> str:
    """The per-user SQLite file, `$XDG_DATA_HOME/responses-gateway/responses.sqlite3` (XDG's default
    `~/.local/share`): not relative to the working directory, so that `gateway keys create` run
    anywhere writes to the store a gateway started anywhere else reads."""
    if os.path.exists(LEGACY_SQLITE_PATH):
        # The default of earlier versions, still here: its keys (and so whether a key is required)
        # are kept rather than silently replaced by an empty store that serves everyone.
        return LEGACY_SQLITE_PATH
    base = os.environ.get("XDG_DATA_HOME", "")
    if not os.path.isabs(base):  # unset, empty or relative: ignored, as the XDG spec says
        base = os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "responses-gateway", "responses.sqlite3")


LEGACY_SQLITE_PATH = "./data/responses.sqlite3"  # the default before it stopped depending on the directory


class Settings(BaseSettings):
    """Frozen gateway configuration, built once and passed explicitly.

    Each field maps to the upper-case environment variable of the same name.
    """

    model_config = SettingsConfigDict(
        env_file=".env",
        env_file_encoding="utf-8",
        extra="ignore",
        frozen=True,
        case_sensitive=False,
    )

    # --- backend -----------------------------------------------------------
    openai_base_url_internal: str = Field(
        "http://localhost:8000",
        description="Chat Completions backend base URL, with or without a trailing /v1.",
    )
    openai_base_url: str = Field(
        "http://localhost:8080", description="This gateway's external URL (informational)."
    )
    openai_api_key: str = Field(
        "dummy-key", description="API key sent to the backend as a Bearer token.", repr=False
    )
    stream_timeout: float = Field(
        120.0, gt=0, description="Seconds the backend may stay silent (read timeout) before the response fails."
    )
    connect_timeout: float = Field(10.0, gt=0, description="Seconds to open a connection to the backend.")
    upstream_max_connections: int = Field(
        10_000, ge=1, description="Upper bound on concurrent connections to the backend."
    )
    tool_call_protocol: Literal["standard", "required_action"] = Field(
        "standard",
        description="required_action: also emit response.required_action and accept POST "
        "/v1/responses/{id}/submit_tool_outputs (the protocol of some gateways' clients).",
    )
    gateway_config: str = Field(
        "", description="A TOML file of named backends and model routes (empty: the one backend above)."
    )

    # --- server ------------------------------------------------------------
    api_adapter_host: str = Field(
        "127.0.0.1", description="Bind address (loopback unless told otherwise: 0.0.0.0 for every interface, as in a container)."
    )
    api_adapter_port: int = Field(8080, ge=0, le=65535, description="Bind port (0 picks a free port).")
    heartbeat_interval: float = Field(
        15.0, gt=0, description="Seconds of silence on a stream before an SSE keep-alive comment is sent."
    )
    client_stall_timeout: float = Field(
        60.0,
        gt=0,
        description="Seconds a streaming client may leave a write unread (its buffers full) before its stream is closed.",
    )
    max_request_body_bytes: int = Field(
        64 * 1024 * 1024, ge=1024, description="Largest accepted request body (after decompression); larger ones get 413."
    )
    max_decompression_ratio: float = Field(
        100.0,
        ge=1,
        description=(
            "A compressed request body may inflate at most this many times its size once it passes 8 MiB "
            "(a small upload that inflates to the body limit is refused before it is held whole)."
        ),
    )
    readiness_interval: float = Field(
        5.0,
        gt=0,
        description="Seconds between the background checks of the store and the backends that /ready reports.",
    )
    websocket_max_connections: int = Field(
        1000, ge=1, description="WebSocket connections one process holds at once; more are refused with 429."
    )
    request_header_timeout: float = Field(
        10.0,
        gt=0,
        description="Seconds a request's line and headers may take to arrive once its first byte has (slow clients are cut off).",
    )
    keep_alive_timeout: float = Field(
        75.0,
        gt=0,
        description="Seconds an idle keep-alive connection stays open (longer than a load balancer's own idle timeout in front).",
    )
    http1_server: Literal["gateway", "hypercorn"] = Field(
        "gateway",
        description=(
            "Who serves plain HTTP/1.1 connections: 'gateway' (its own lean protocol, httptools) or "
            "'hypercorn' (h11, and wsproto for WebSockets). HTTP/2 is hypercorn's either way."
        ),
    )
    websocket_max_age: float = Field(
        3600.0, gt=0, description="Seconds a WebSocket connection may stay open (the spec's 60-minute limit); a turn running then ends first."
    )
    reasoning_events: Literal["openai", "spec"] = Field(
        "openai",
        description=(
            "Event names for reasoning text: 'openai' emits response.reasoning_text.* "
            "(what the OpenAI SDKs and Codex render); 'spec' emits response.reasoning.* "
            "as named by the Open Responses specification."
        ),
    )

    gateway_secret_key: str = Field(
        "",
        description=(
            "Secret for sealing reasoning and compaction content that clients carry between turns; "
            "set the same value on every instance (empty: a random key per process)."
        ),
        repr=False,
    )

    # --- conversation state ------------------------------------------------
    store_backend: Literal["sqlite", "memory", "redis"] = Field(
        "sqlite", description="Where stored responses live: sqlite (embedded default), memory or redis."
    )
    sqlite_path: str = Field(
        default_factory=default_sqlite_path,
        description=(
            "SQLite database file (default: $XDG_DATA_HOME/responses-gateway/responses.sqlite3, that is "
            "~/.local/share/responses-gateway/responses.sqlite3: the same file whatever the working directory)."
        ),
    )
    redis_url: str = Field("redis://localhost:6379/0", description="Redis URL (STORE_BACKEND=redis).", repr=False)
    store_ttl: float = Field(
        30 * 24 * 3600.0,
        ge=0,
        description="Seconds a stored response is kept (30 days, as OpenAI keeps them); 0 keeps it until deleted or evicted.",
    )
    max_conversation_history: int = Field(100, ge=1, description="Stored responses kept by the memory store.")
    web_search_url: str = Field(
        "",
        description="A self-hosted SearXNG (or searx) instance the gateway searches the web with, for clients' "
        "web search tools (its JSON format on); empty: web search tools are left out.",
    )
    web_search_timeout: float = Field(10.0, gt=0, description="Seconds a web search may take before it is a tool error.")
    web_fetch_allowed_hosts: str = Field(
        "",
        description="Comma-separated hosts, host:port, addresses or networks a model's page fetches may reach although "
        "they are loopback or private (refused otherwise).",
    )
    message_threads: bool = Field(
        True,
        description="Keep the Messages API's message threads (`thread`) in the store; off: a request with "
        "`thread` gets thread_unsupported_request.",
    )
    background_lease_seconds: float = Field(
        15.0,
        ge=3,
        description=(
            "Seconds a running background response's lease lasts (renewed about every second); once it "
            "expires, its gateway instance is taken to be dead and the response ends as failed."
        ),
    )
    store_retry_seconds: float = Field(
        2.0,
        ge=0,
        description=(
            "Seconds a failing store is retried before a response that must be stored fails with "
            "store_unavailable (a Redis restart, a locked SQLite file)."
        ),
    )

    # --- tools (used by later features; names kept stable) -------------------
    max_tool_call_iterations: int = Field(25, ge=1, description="Tool-loop rounds before a response stops.")
    mcp_tool_refresh_interval: float = Field(10.0, gt=0, description="Seconds between MCP tool refreshes.")
    mcp_servers_config_path: str | None = Field(None, description="Path of the MCP servers JSON file.")
    mcp_call_timeout: float = Field(60.0, gt=0, description="Seconds one MCP tool call may take.")
    mcp_connect_timeout: float = Field(
        10.0, gt=0, description="Seconds an MCP server may take to connect, initialise and list its tools."
    )
    mcp_allowed_urls: str = Field(
        "",
        description=(
            "Comma-separated hosts, host:port, IPs or CIDR networks that hosted mcp tools may reach although "
            "they are loopback or private (refused otherwise)."
        ),
    )
    mcp_call_concurrency: int = Field(8, ge=1, description="MCP tool calls run at once per response.")

    # --- keys and limits -------------------------------------------------------
    gateway_api_keys: str = Field(
        "",
        description=(
            "Fixed API keys, 'name=key' pairs separated by commas (no limits); keys made with "
            "`gateway keys create` live in the store instead."
        ),
        repr=False,
    )
    shutdown_grace: float = Field(
        25.0,
        ge=0,
        description=(
            "Seconds open streams, WebSocket turns and background responses get to finish after SIGTERM; "
            "then they end with a terminal event."
        ),
    )
    cors_allow_origins: str = Field(
        "", description="Origins browsers may call from: '*' or a comma-separated list (empty: no CORS)."
    )

    # --- observability -------------------------------------------------------
    metrics_enabled: bool = Field(True, description="Keep Prometheus metrics and serve them at /metrics.")
    metrics_token: str = Field(
        "", description="Bearer token /metrics requires (empty: /metrics is open to whoever reaches the port).", repr=False
    )
    console_token: str = Field(
        "",
        description=(
            "The operator console's credential (/console), at least 16 characters; an API key with the admin flag "
            "works too (empty and no admin key: the console is off)."
        ),
        repr=False,
    )
    otel_exporter_otlp_endpoint: str = Field(
        "", description="OTLP/HTTP endpoint traces are exported to (e.g. http://collector:4318); empty: no traces."
    )
    otel_service_name: str = Field("responses-gateway", description="service.name of the exported traces.")

    # --- logging -----------------------------------------------------------
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = Field(
        "INFO", description="Logging level."
    )
    log_file_path: str | None = Field(
        "./log/api_adapter.log", description="Log file; empty to log to stderr only."
    )
    log_format: Literal["text", "json"] = Field(
        "text", description="text: one escaped line per record; json: one JSON object per line (for log collectors)."
    )

    @field_validator("gateway_api_keys")
    @classmethod
    def _static_keys(cls, value: str) -> str:
        static_key_entries(value)  # raises ValueError naming the problem (never the keys)
        return value

    @field_validator("console_token")
    @classmethod
    def _console_token(cls, value: str) -> str:
        value = value.strip()
        if value and len(value) < 16:
            raise ValueError("must be at least 16 characters (openssl rand -hex 24 makes one), or empty")
        return value

    @field_validator("store_backend", mode="before")
    @classmethod
    def _lower_backend(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper_level(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    @field_validator("log_format", mode="before")
    @classmethod
    def _lower_format(cls, value: object) -> object:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("web_search_url")
    @classmethod
    def _search_engine_url(cls, value: str) -> str:
        value = value.strip()
        if value and not (value.startswith("http://") or value.startswith("https://")):
            raise ValueError("must be an http:// or https:// URL (the SearXNG instance), or empty")
        return value

    @field_validator("openai_base_url_internal")
    @classmethod
    def _backend_url(cls, value: str) -> str:
        value = value.strip().rstrip("/")
        if not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        if value.endswith("/v1"):
            value = value[: -len("/v1")]
        return value

    @field_validator("log_file_path", "mcp_servers_config_path", mode="before")
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        return None if value == "" else value

    @property
    def backend_v1(self) -> str:
        """The backend's `/v1` root, never doubled."""
        return self.openai_base_url_internal + "/v1"


KEY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # what an API key's name may be


def check_key_name(name: str) -> str:
    """A key's name as given, if it is one (1-64 letters, digits, `.`, `_`, `-`, not starting with
    punctuation): names appear in logs, metrics labels and CLI output.

    Raises:
        ValueError: the name is empty, too long, or has other characters.
    """
    if not KEY_NAME.fullmatch(name):
        raise ValueError(
            f"{name!r} is not a valid key name: use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return name


def static_key_entries(text: str) -> list[tuple[str, str]]:
    """`GATEWAY_API_KEYS` (`name=key,name2=key2`) as (name, key) pairs.

    Raises:
        ValueError: an entry is not `name=key`, a name is not a key name, or a key is shorter
            than 8 characters (the message never quotes a key).
    """
    entries = []
    for entry in filter(None, (part.strip() for part in text.split(","))):
        name, sep, secret = entry.partition("=")
        if not sep or not name.strip() or len(secret.strip()) < 8:
            raise ValueError("entries must be name=key, the key at least 8 characters")
        entries.append((check_key_name(name.strip()), secret.strip()))
    return entries


def load_settings(**overrides: object) -> Settings:
    """Build settings from the environment (and `.env`), with overrides.

    A name in `.env` that is not a setting but nearly is (`STREAM_TIMOUT`)
    is refused: the file is the gateway's, and a typo there would silently
    leave the default in force.

    Raises:
        ConfigError: a value is invalid, or `.env` misspells a setting; the
            message names the variable.
    """
    env_file = overrides.get("_env_file", Settings.model_config.get("env_file"))
    from_file: set[str] = set()  # the settings `.env` gives (and the environment does not override)
    if isinstance(env_file, str) and os.path.isfile(env_file):
        from dotenv import dotenv_values

        values = dotenv_values(env_file)
        misspelt = misspelt_settings(values)
        if misspelt:
            raise ConfigError(
                f"invalid configuration in {env_file}: "
                + "; ".join(f"{name} is not a setting (did you mean {known}?)" for name, known in misspelt)
            )
        environment = {name.upper() for name in os.environ}
        from_file = {name.upper() for name in values if name.upper() not in environment}
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            name = ".".join(str(p) for p in err["loc"]).upper() or "?"
            source = f" (read from {env_file})" if name in from_file and name.lower() not in overrides else ""
            problems.append(f"{name}{source}: {err['msg']}")
        raise ConfigError("invalid configuration: " + "; ".join(problems)) from None


# Variables a letter from a setting that are not misspellings: the key a client of the gateway
# presents (`gateway launch --url`, the Codex and opencode recipes), one away from GATEWAY_API_KEYS.
_CLIENT_VARIABLES = frozenset({"GATEWAY_API_KEY"})


def misspelt_settings(names: Iterable[str]) -> list[tuple[str, str]]:
    """(name, the setting it nearly is) for each of `names` that is a near miss.

    The environment holds many variables that are not the gateway's; only
    names within a letter or two of a setting count.
    """
    known = sorted(name.upper() for name in Settings.model_fields)
    found = []
    for name in names:
        upper = name.upper()
        if upper in known or upper in _CLIENT_VARIABLES:
            continue
        close = difflib.get_close_matches(upper, known, n=1, cutoff=0.88)
        if close:
            found.append((name, close[0]))
    return found


def environment_warnings() -> list[str]:
    """Process environment variables that look like misspelt settings (warned about, not refused:
    the environment is shared with other programs)."""
    return [
        f"environment variable {name} is not a setting (did you mean {known}?)"
        for name, known in misspelt_settings(os.environ)
    ]
