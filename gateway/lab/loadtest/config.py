"""What a load test runs: `LoadConfig`, its defaults, and where its requests go.

It owns the settings of one run, their validation, and the reading of the base URL into a host,
a port and a request path (`LoadConfig.endpoint`). It knows nothing of sockets, measurements or
outputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

__all__ = ["APIS", "DEFAULT_INPUT", "DEFAULT_MAX_TOKENS", "DEFAULT_REQUESTS", "ApiKind", "Endpoint", "LoadConfig"]

#: The API a run speaks: OpenAI's Responses API, Chat Completions (a backend directly, for a
#: baseline) or Anthropic's Messages API.
ApiKind = Literal["responses", "chat", "messages"]
APIS: tuple[ApiKind, ...] = ("responses", "chat", "messages")
_PATHS: dict[str, str] = {"responses": "/responses", "chat": "/chat/completions", "messages": "/messages"}

#: Requests sent when neither a request count nor a duration is given.
DEFAULT_REQUESTS = 100
#: Anthropic's Messages API requires `max_tokens`: sent when `max_output_tokens` is not given,
#: large enough not to cut the replies of a load test short.
DEFAULT_MAX_TOKENS = 4096
DEFAULT_INPUT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


@dataclass(frozen=True)
class Endpoint:
    """Where the requests go. `authority` is the URL's host and port as written, without a user
    name or password: the `Host` header, and what reports may show."""

    host: str
    port: int
    authority: str
    path: str


@dataclass(frozen=True)
class LoadConfig:
    """What to run. `requests` and `duration` both bound the run (whichever ends it first);
    with neither, `DEFAULT_REQUESTS` requests are sent. `timeout` bounds each request, connect
    included. `warmup` requests run first, at the same concurrency, and are not counted.
    `url` is the server's base URL; a base ending in ``/v1`` is not doubled. `progress` shows a
    live progress line on stderr.

    Raises `ValueError` for invalid values.
    """

    url: str
    api: ApiKind = "responses"
    model: str = "sim"
    input: str = DEFAULT_INPUT
    max_output_tokens: int | None = None
    concurrency: int = 1
    requests: int | None = None
    duration: float | None = None
    timeout: float | None = None
    warmup: int = 0
    headers: tuple[tuple[str, str], ...] = ()
    progress: bool = False
    # Seconds over which the workers start, evenly spaced: thousands of real
    # clients do not all connect in the same millisecond.
    ramp_up: float = 0.0
    # False: JSON answers (`"stream": false`) instead of event streams.
    stream: bool = True
    # True: the Responses API's WebSocket mode, one connection per worker running its turns in
    # sequence (`response.create` frames); `api` must be "responses".
    websocket: bool = False

    def __post_init__(self) -> None:
        if self.api not in APIS:
            raise ValueError(f"api must be one of {', '.join(APIS)}, not {self.api!r}")
        if self.websocket and (self.api != "responses" or not self.stream):
            raise ValueError("websocket needs api 'responses' (and streams: every turn's events come as frames)")
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if self.requests is not None and self.requests < 1:
            raise ValueError("requests must be at least 1")
        if self.duration is not None and not self.duration > 0:
            raise ValueError("duration must be positive")
        if self.timeout is not None and not self.timeout > 0:
            raise ValueError("timeout must be positive")
        if self.warmup < 0:
            raise ValueError("warmup must not be negative")
        if self.ramp_up < 0:
            raise ValueError("ramp_up must not be negative")
        for name, value in self.headers:
            if not name or any(c in name for c in ":\r\n ") or any(c in value for c in "\r\n"):
                raise ValueError(f"invalid header {name!r}")
        self.endpoint()  # validates the URL

    @property
    def request_limit(self) -> int | None:
        if self.requests is None and self.duration is None:
            return DEFAULT_REQUESTS
        return self.requests

    def endpoint(self) -> Endpoint:
        """The host, port and path the requests go to. Raises `ValueError` for a URL this
        client cannot use: not http:// (there is no TLS), no host, a bad port."""
        parts = urlsplit(self.url)
        if parts.scheme != "http":
            raise ValueError(f"url must start with http:// (TLS is not supported): {self.url!r}")
        if not parts.hostname:
            raise ValueError(f"url has no host: {self.url!r}")
        try:
            port = parts.port or 80
        except ValueError as error:
            raise ValueError(f"bad port in url {self.url!r}") from error
        prefix = parts.path.rstrip("/")
        if not prefix.endswith("/v1"):
            prefix += "/v1"
        path = prefix + _PATHS[self.api]
        return Endpoint(parts.hostname, port, parts.netloc.rsplit("@", 1)[-1], path)
