"""A trio gateway that serves the OpenAI Responses API on any Chat Completions backend.

Embedding in a trio program:

    settings = gateway.Settings(openai_base_url_internal="http://127.0.0.1:8000")
    async with trio.open_nursery() as nursery:
        url = await nursery.start(gateway.serve, settings)
"""

from .app import create_app
from .config import ConfigError, Settings, load_settings
from .errors import GatewayError
from .server import serve
from .streams.translator import ResponseTranslator
from .translate import plan_chat_request
from .wire import parse_create_request

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
