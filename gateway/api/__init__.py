"""The endpoints, one module per family, and the route table: the one place a path is named.

Each row is (method, path, handler, how it is served); `gateway.app.dispatch`
serves them all.  Quart's router serves every row but those marked `ahead`,
which are looked up by exact method and path before it: only rows that run a
turn on every request, where `just bench` measured the router's cost above
0.1 ms a request (the figure is the row's `cost`; the load lab's page keeps
the measurement, `gateway bench --only dispatch`).  Paths starting `/v1/` are
also served without it, for clients configured without the `/v1`.
"""

from __future__ import annotations

from . import chat, console, conversations, messages, models, operator, relay, responses, stored
from .routes import Route

__all__ = ["ROUTES"]

# The router's cost per request for the rows served ahead of it (`gateway bench --only dispatch`).
_ROUTER_COST = "Quart's router and request objects: +0.26 ms CPU a request [0.26 to 0.28] (2026-12-02)"

ROUTES: tuple[Route, ...] = (
    # the Responses API
    Route("POST", "/v1/responses", responses.create, served="ahead", cost=_ROUTER_COST),
    Route("WEBSOCKET", "/v1/responses", responses.socket),
    Route("POST", "/v1/responses/input_tokens", responses.input_tokens),
    Route("POST", "/v1/responses/compact", responses.compact),
    Route("POST", "/v1/responses/{response_id}/submit_tool_outputs", responses.submit_tool_outputs),
    Route("GET", "/v1/responses/{response_id}", stored.get),
    Route("POST", "/v1/responses/{response_id}/cancel", stored.cancel),
    Route("DELETE", "/v1/responses/{response_id}", stored.delete),
    Route("GET", "/v1/responses/{response_id}/input_items", stored.input_items),
    # the Conversations API
    Route("POST", "/v1/conversations", conversations.create),
    Route("GET", "/v1/conversations/{conversation_id}", conversations.retrieve),
    Route("POST", "/v1/conversations/{conversation_id}", conversations.update),
    Route("DELETE", "/v1/conversations/{conversation_id}", conversations.delete),
    Route("POST", "/v1/conversations/{conversation_id}/items", conversations.add_items),
    Route("GET", "/v1/conversations/{conversation_id}/items", conversations.list_items),
    Route("GET", "/v1/conversations/{conversation_id}/items/{item_id}", conversations.get_item),
    Route("DELETE", "/v1/conversations/{conversation_id}/items/{item_id}", conversations.delete_item),
    # Chat Completions, and Anthropic's Messages API
    Route("POST", "/v1/chat/completions", chat.create, served="ahead", cost=_ROUTER_COST),
    Route("POST", "/v1/messages", messages.create, served="ahead", cost=_ROUTER_COST, dialect="anthropic"),
    Route("POST", "/v1/messages/count_tokens", messages.count_tokens, dialect="anthropic"),
    # models, and the relay of any other /v1 path
    Route("GET", "/v1/models", models.list_models),
    Route("GET", "/v1/models/{model_id:path}", models.retrieve_model),
    Route("*", "/v1/{passthrough:path}", relay.relay, unversioned=False),
    # the operator's
    Route("GET", "/", operator.root, unversioned=False),
    Route("GET", "/health", operator.health, unversioned=False, auth="anyone"),
    Route("GET", "/ready", operator.ready, unversioned=False, auth="anyone"),
    Route("GET", "/metrics", operator.metrics, unversioned=False, auth="own token"),
    # the operator console (gateway/console): each handler checks the operator's credential itself
    *(
        Route(method, path, handler, unversioned=False, auth="operator")
        for method, path, handler in (
            ("GET", "/console", console.overview),
            ("GET", "/console/login", console.login_form),
            ("POST", "/console/login", console.login),
            ("POST", "/console/logout", console.logout),
            ("GET", "/console/backends", console.backends),
            ("GET", "/console/keys", console.keys),
            ("POST", "/console/keys", console.create_key),
            ("POST", "/console/keys/{name}/revoke", console.revoke_key),
            ("POST", "/console/keys/{name}/limits", console.key_limits),
            ("GET", "/console/streams", console.streams),
            ("GET", "/console/responses", console.responses_page),
            ("GET", "/console/responses/{response_id}", console.response),
            ("GET", "/console/conversations", console.conversations),
            ("GET", "/console/conversations/{conversation_id}", console.conversation),
            ("GET", "/console/mcp", console.mcp),
            ("GET", "/console/playground", console.playground),
            ("POST", "/console/playground/{api}", console.playground_send),
            ("GET", "/console/static/{name}", console.static),
        )
    ),
)
