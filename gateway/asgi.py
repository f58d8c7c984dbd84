"""ASGI entry point for process managers (`hypercorn gateway.asgi:app -k trio`).

Builds the app from the environment; each worker process imports this.
"""

from .app import create_app
from .config import load_settings
from .ops.logs import configure_logging

settings = load_settings()
configure_logging(settings)
app = create_app(settings)
