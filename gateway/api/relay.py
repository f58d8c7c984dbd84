"""The relay: any other `/v1/{path}`, sent to the backend as it came, a key's models and limits holding here too."""

from __future__ import annotations

from ..transport.body import DeferredHeadBody
from ..transport.passthrough import passthrough
from ..turn.relay import prepare_relay
from .args import relay_path
from .routes import Call

__all__ = ["relay"]


async def relay(call: Call) -> DeferredHeadBody:
    resources = call.shared.resources
    target = relay_path(call.params["passthrough"])
    prepared = await prepare_relay(
        resources, call.ctx, call.method, target, call.query, dict(call.headers), await call.read()
    )
    return passthrough(resources, prepared, call.shared.heartbeats)
