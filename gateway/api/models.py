"""The models a key may use, in the shape its client expects.

    list_models      OpenAI's list; Anthropic's page (`data` of
                               `{type: "model", id, display_name, created_at}`,
                               `has_more`, `first_id`, `last_id`; `limit` 1-1000,
                               `after_id`, `before_id`) when the request carries
                               `anthropic-version`, as Anthropic's clients' do
    retrieve_model   one model: Anthropic's object for Anthropic's
                               clients; otherwise relayed to the backend

The list is the router's configured names and each backend's own, filtered
by the key's model list (`backends.routing.models_for`); with one backend
and no model list, an OpenAI client gets the backend's answer as it gives it.

"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from ..backends.routing import backend_models, models_for
from ..errors import InvalidRequest, NotFound
from ..transport.body import DeferredHeadBody
from ..transport.json import JsonBody
from ..transport.passthrough import passthrough
from ..turn.relay import prepare_relay
from .args import int_arg, relay_path
from .routes import Call

__all__ = ["anthropic_model", "list_models", "retrieve_model"]


def _anthropic(call: Call) -> bool:
    return call.headers.get("anthropic-version") is not None


async def _listed(call: Call) -> list[dict[str, Any]] | None:
    resources = call.shared.resources
    return await models_for(resources.backend, call.ctx.caller.limits)


async def _relayed(call: Call, path: str) -> DeferredHeadBody:
    resources = call.shared.resources
    relay = await prepare_relay(resources, call.ctx, "GET", relay_path(path), call.query, dict(call.headers), b"")
    return passthrough(resources, relay, call.shared.heartbeats)


async def _all_models(call: Call) -> list[dict[str, Any]]:
    listed = await _listed(call)
    return listed if listed is not None else await backend_models(call.shared.resources.backend)


def anthropic_model(entry: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI-shaped model entry as Anthropic's model object."""
    created = entry.get("created")
    stamp = datetime.fromtimestamp(created if isinstance(created, int) and created > 0 else 0, tz=timezone.utc)
    model_id = str(entry["id"])
    return {
        "type": "model",
        "id": model_id,
        "display_name": str(entry.get("display_name") or model_id),
        "created_at": stamp.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


async def list_models(call: Call) -> DeferredHeadBody:
    if not _anthropic(call):
        listed = await _listed(call)
        return await _relayed(call, "models") if listed is None else JsonBody({"object": "list", "data": listed})
    models = [anthropic_model(entry) for entry in await _all_models(call)]
    limit = int_arg(call.args, "limit", 20, low=1, high=1000)
    ids = [model["id"] for model in models]
    start, end = 0, len(models)
    after, before = call.args.get("after_id"), call.args.get("before_id")
    for name, cursor in (("after_id", after), ("before_id", before)):
        if cursor and cursor not in ids:
            raise InvalidRequest(f"{name}: no model with id '{cursor}' in this list.", param=name, code="invalid_value")
    if after:
        start = ids.index(after) + 1
    if before:
        end = ids.index(before)
    window = models[start:end]
    data = window[-limit:] if before and not after else window[:limit]
    return JsonBody(
        {
            "data": data,
            "has_more": len(window) > limit,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
        }
    )


async def retrieve_model(call: Call) -> DeferredHeadBody:
    model_id = call.params["model_id"]
    if not _anthropic(call):
        return await _relayed(call, f"models/{model_id}")
    call.shared.resources.limiter.check_model(call.ctx.caller, model_id)
    for entry in await _all_models(call):
        if str(entry["id"]) == model_id:
            return JsonBody(anthropic_model(entry))
    raise NotFound(f"model: {model_id}", param="model", code="model_not_found")
