"""A call to one of the table routes (stored responses, conversations, Messages, models), as the app hands it over.

The app registers each module's `ROUTES` table (method, rule, handler);
a handler takes a `Call` and returns the body to send, or raises a
`GatewayError` for the renderer.  Knows nothing of the framework.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .intake import RequestContext
from .wire import decode_json_object

if TYPE_CHECKING:
    from .lifespan import Shared
    from .transport.sse import DeferredHeadBody

__all__ = ["Call", "Handler", "Route"]


@dataclass
class Call:
    shared: Shared  # the app's resources
    ctx: RequestContext  # who asks
    params: Mapping[str, str]  # the path's
    args: Mapping[str, str]  # the query's
    read: Callable[[], Awaitable[bytes]]  # the body, decoded by the intake
    headers: Mapping[str, str] = field(default_factory=dict)  # the request's, names in lower case
    query: bytes = b""  # the raw query string, for a request relayed as it is

    async def json(self) -> dict[str, Any]:
        """The body as a JSON object ({} when empty).

        Raises:
            InvalidRequest: not a JSON object.
        """
        raw = await self.read()
        return decode_json_object(raw) if raw.strip() else {}


Handler = Callable[[Call], Awaitable["DeferredHeadBody"]]
Route = tuple[str, str, Handler]
