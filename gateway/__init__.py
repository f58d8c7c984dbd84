"""A trio gateway that serves the OpenAI Responses API on any Chat Completions backend.

Embedding in a trio program:

    settings = gateway.Settings(openai_base_url_internal="http://127.0.0.1:8000")
    async with trio.open_nursery() as nursery:
        url = await nursery.start(gateway.serve, settings)

`gateway.__version__` is the installed package's version.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    __version__: str
    from .app import create_app
    from .config import ConfigError, Settings, load_settings
    from .errors import GatewayError
    from .serving import serve
    from .streams.translator import ResponseTranslator
    from .turn.plan import plan_chat_request
    from .wire import parse_create_request

# Imported on first use: `import gateway.streams.translator` (the pure core)
# must not load the web framework, the HTTP client or the server.
_LAZY = {
    "ConfigError": ".config",
    "GatewayError": ".errors",
    "ResponseTranslator": ".streams.translator",
    "Settings": ".config",
    "create_app": ".app",
    "load_settings": ".config",
    "parse_create_request": ".wire",
    "plan_chat_request": ".turn.plan",
    "serve": ".serving",
}


# The version when the package is not installed (run from a source tree).
_UNKNOWN_VERSION = "0+unknown"


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("trio-responses-gateway")
    except PackageNotFoundError:
        return _UNKNOWN_VERSION


def __getattr__(name: str) -> Any:
    if name == "__version__":  # read from the installed package's metadata on first use
        globals()[name] = value = _version()
        return value
    if name not in _LAZY:
        raise AttributeError(f"module 'gateway' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "ConfigError",
    "GatewayError",
    "ResponseTranslator",
    "Settings",
    "create_app",
    "load_settings",
    "parse_create_request",
    "plan_chat_request",
    "serve",
]
