"""The gateway's one exception hierarchy, and how errors look on the wire.

Every error a client can see is a `GatewayError` carrying its HTTP status and
its OpenAI error `type` and `code`.  Library exceptions are converted at the
edge where they arise (the backend adapter maps httpx2's, the stores their
database clients', `wire` pydantic's); this module imports none of those
libraries, so the pure core can use it.

    GatewayError
    ├── InvalidRequest            400 invalid_request_error
    │   └── RequestTooLarge       413
    ├── Unauthorized              401 (no API key, or one that is not valid)
    ├── RateLimited               429 (a key's limit: Retry-After says when to come back)
    ├── NotFound                  404
    ├── ThreadRefused             400 or 404, a message thread the request cannot use
                                  (`error.details.error_code`, as Anthropic's SDKs read it)
    ├── BackendError              the backend could not serve the request
    │   ├── BackendUnavailable    502 (connect refused, reset, protocol error)
    │   ├── BackendTimeout        504 (connect or read timeout)
    │   ├── BackendStatusError    the backend's own 4xx (passed on) or 5xx (502)
    │   └── BackendStreamError    an error payload inside a 200 stream, or a cut stream
    ├── StoreUnavailable          503 (the conversation store could not be reached)
    ├── ShuttingDown              503 (the gateway is draining)
    ├── LoopDetected              508 (the request came back through this gateway)
    └── InternalError             500 (a bug; details only in DEBUG logs)
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

_log = logging.getLogger("gateway")

__all__ = [
    "is_failure",
    "BackendError",
    "BackendStatusError",
    "BackendStreamError",
    "BackendTimeout",
    "BackendUnavailable",
    "GatewayError",
    "InternalError",
    "InvalidRequest",
    "LoopDetected",
    "NotFound",
    "RequestTooLarge",
    "RateLimited",
    "ShuttingDown",
    "StoreUnavailable",
    "ThreadRefused",
    "Unauthorized",
    "anthropic_error_body",
    "anthropic_error_type",
    "error_body",
    "error_json",
    "report",
]


class GatewayError(Exception):
    """Base of every error a client may see."""

    status: int = 500
    type: str = "server_error"
    code: str | None = "server_error"
    # What failed, for the operator's log line (a store and its URL, a backend's
    # name and URL, the library's error): never sent to a client.
    cause: str | None = None
    # Anthropic's `error.details` (`{"error_code": ...}`), which its SDKs act on; None for most.
    details: dict[str, Any] | None = None

    def __init__(
        self, message: str, *, param: str | None = None, code: str | None = None, cause: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        if cause is not None:
            self.cause = cause

    def payload(self) -> dict[str, Any]:
        """The OpenAI error object: message, type, param, code."""
        return {"message": self.message, "type": self.type, "param": self.param, "code": self.code}


class InvalidRequest(GatewayError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_request"

    @classmethod
    def missing(cls, param: str) -> InvalidRequest:
        """A required parameter is absent (or empty)."""
        return cls(f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter")


class RequestTooLarge(InvalidRequest):
    status = 413
    code = "request_too_large"


class Unauthorized(GatewayError):
    status = 401
    type = "invalid_request_error"
    code = "invalid_api_key"


class RateLimited(GatewayError):
    """A key's limit was reached; `retry_after` is how many seconds until it is not."""

    status = 429
    type = "requests"
    code = "rate_limit_exceeded"

    def __init__(self, message: str, *, retry_after: float, kind: str = "requests", param: str | None = None) -> None:
        """`kind`: what ran out, as OpenAI types it (`requests` or `tokens`)."""
        super().__init__(message, param=param)
        self.retry_after = retry_after
        self.type = kind


class ShuttingDown(GatewayError):
    """The gateway is draining: new requests are refused, unfinished work ends with this."""

    status = 503
    type = "server_error"
    code = "server_shutting_down"

    @classmethod
    def refusal(cls) -> ShuttingDown:
        """A request that arrives while the gateway drains."""
        return cls("The gateway is shutting down; send the request again (to another instance).")

    @classmethod
    def stopped(cls) -> ShuttingDown:
        """Work the drain stopped when its grace ran out."""
        return cls("The gateway shut down before the answer finished; send the request again.")


class LoopDetected(GatewayError):
    """A request that came back through the gateway that sent it (a backend URL that leads to itself)."""

    status = 508
    type = "server_error"
    code = "loop_detected"


class NotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class ThreadRefused(GatewayError):
    """A message thread the request cannot use (the Messages API's `thread`): `error_code` is
    what the anthropic SDKs read in `error.details` (on `thread_not_found`,
    `thread_already_continued` and `thread_continue_in_flight` they send the whole conversation
    again under a new thread)."""

    type = "invalid_request_error"

    def __init__(
        self, message: str, error_code: str, *, status: int = 400, param: str | None = None, unsupported: list[str] | None = None
    ) -> None:
        super().__init__(message, param=param, code=error_code)
        self.status = status
        self.details = {"error_code": error_code}
        if unsupported is not None:
            self.details["unsupported"] = unsupported


class InternalError(GatewayError):
    status = 500
    type = "server_error"
    code = "internal_error"


class StoreUnavailable(GatewayError):
    """The conversation store failed (Redis down, SQLite locked or unwritable).

    Stores raise it for their library's errors; the message never carries
    the library's text, which may name hosts or paths.
    """

    status = 503
    type = "server_error"
    code = "store_unavailable"


class BackendError(GatewayError):
    status = 502
    type = "server_error"
    code = "backend_error"


class BackendUnavailable(BackendError):
    code = "backend_unavailable"


class BackendTimeout(BackendError):
    status = 504
    code = "backend_timeout"


class BackendStreamError(BackendError):
    code = "backend_stream_error"


class BackendStatusError(BackendError):
    """The backend answered with an error status.

    A 4xx is the client's problem (unknown model, context too long) and is
    passed on with the backend's status, type, code and message; a 5xx is ours
    to report as 502.
    """

    def __init__(
        self,
        backend_status: int,
        message: str,
        *,
        type: str | None = None,
        code: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message, param=param)
        self.backend_status = backend_status
        self.retry_after: float | None = None  # seconds the backend asked to wait (Retry-After)
        self.context_window: int | None = None  # what a context-length error says the window is
        if 400 <= backend_status < 500:
            self.status = backend_status
            self.type = type or "invalid_request_error"
            self.code = code or _CODE_FOR_STATUS.get(backend_status, "invalid_request")
        else:
            self.status = 502
            self.code = "backend_error"

    @classmethod
    def from_body(cls, backend_status: int, body: bytes) -> "BackendStatusError":
        """Build from the backend's error body, whatever shape it has."""
        message, type_, code, param = _parse_error_body(body)
        if code is None and (type_ == "exceed_context_size_error" or "context length" in message.lower()):
            code = "context_length_exceeded"  # llama.cpp and vLLM say it in their own words
        if not message:
            message = f"the backend answered with HTTP {backend_status}"
        if backend_status >= 500:
            message = f"the backend failed (HTTP {backend_status}): {message}"
        error = cls(backend_status, message, type=type_, code=code, param=param)
        if code == "context_length_exceeded":
            error.context_window = _window_of(body, message)
        return error


def _window_of(body: bytes, message: str) -> int | None:
    """The context window a context-length error names: llama.cpp's `n_ctx`, or vLLM's and
    OpenAI's "maximum context length is N tokens"."""
    import re

    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        data = None
    err = data.get("error", data) if isinstance(data, dict) else None
    n_ctx = err.get("n_ctx") if isinstance(err, dict) else None
    if isinstance(n_ctx, int) and not isinstance(n_ctx, bool) and n_ctx > 0:
        return n_ctx
    found = re.search(r"maximum context length is (\d+)", message)
    return int(found.group(1)) if found else None


_CODE_FOR_STATUS = {
    400: "invalid_request",
    401: "backend_unauthorized",
    403: "backend_forbidden",
    404: "model_not_found",
    408: "backend_timeout",
    413: "request_too_large",
    422: "invalid_request",
    429: "rate_limit_exceeded",
}

_MAX_MESSAGE = 2000


def _parse_error_body(body: bytes) -> tuple[str, str | None, str | None, str | None]:
    """Extract (message, type, code, param) from OpenAI-, llama.cpp- or plain-text errors."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode("utf-8", "replace").strip()[:_MAX_MESSAGE], None, None, None
    return error_fields(data)


def error_fields(data: Any) -> tuple[str, str | None, str | None, str | None]:
    """(message, type, code, param) from a decoded error payload of any common shape."""
    err = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(err, str):
        return err[:_MAX_MESSAGE], None, None, None
    if not isinstance(err, dict):
        return str(err)[:_MAX_MESSAGE], None, None, None
    message = err.get("message") or err.get("detail") or err.get("msg") or ""
    if not isinstance(message, str):
        message = str(message)
    type_ = err.get("type") if isinstance(err.get("type"), str) else None
    code = err.get("code")
    code = str(code) if code is not None and not isinstance(code, bool) else None
    if code is not None and code.isdigit():
        code = None  # llama.cpp puts the HTTP status here; that is not an OpenAI code
    param = err.get("param") if isinstance(err.get("param"), str) else None
    return message[:_MAX_MESSAGE], type_, code, param


def report(error: GatewayError, where: str = "") -> None:
    """The operator's line for an error a client is answered with: every 5xx, naming its cause
    (what failed: a store and its URL, a backend's name and URL), never a traceback."""
    if error.status >= 500:
        _log.warning(
            "%s answered %d %s: %s", where or "a request", error.status, error.code, error.cause or error.message
        )


def error_body(exc: GatewayError) -> dict[str, Any]:
    """`{"error": {...}}` as OpenAI returns it."""
    return {"error": exc.payload()}


def error_json(exc: GatewayError) -> bytes:
    return orjson.dumps(error_body(exc))


# Anthropic's error types, by the HTTP status an error has (its own list; other 4xx are the
# request's, other 5xx the API's).
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def anthropic_error_type(status: int) -> str:
    """The `error.type` Anthropic gives an error of HTTP `status`."""
    return _ANTHROPIC_TYPES.get(status) or ("invalid_request_error" if status < 500 else "api_error")


def anthropic_error_body(
    status: int, message: str, request_id: str | None = None, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    """`{"type": "error", "error": {"type", "message"}}` as Anthropic returns it (a body, or a
    stream's `error` event), with the error's `details` and the request's id when there are."""
    error: dict[str, Any] = {"type": anthropic_error_type(status), "message": message}
    if details:
        error["details"] = details
    body: dict[str, Any] = {"type": "error", "error": error}
    if request_id:
        body["request_id"] = request_id
    return body


def is_failure(exc: BaseException) -> bool:
    """An error to contain (an app's, a connection's), not cancellation or an interpreter exit
    (to pass on); in a group, one that holds an error and no exit."""
    if isinstance(exc, BaseExceptionGroup):
        exits, _ = exc.split((KeyboardInterrupt, SystemExit))
        _, rest = exc.split(lambda leaf: not isinstance(leaf, (Exception, BaseExceptionGroup)))
        return exits is None and rest is not None
    return isinstance(exc, Exception)
