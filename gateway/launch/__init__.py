"""`gateway launch`: Claude Code, Codex CLI or opencode started on the gateway, in one command.

    clients.py   the pure core: each client's environment and files for a gateway URL, a key,
                 the models and the one chosen (Claude Code's tiers mapped onto routes)
    cli.py       the shell: the gateway used or started in the background, a session key made
                 and revoked, the files written, the client run with the terminal

It knows the gateway only from outside, as its clients do (its URL, `GET /v1/models`, the key
store `gateway keys` uses): nothing here imports the app or the server.
"""

from __future__ import annotations

from .clients import CLIENTS, Client, Model, Plan, Session, plan

__all__ = ["CLIENTS", "Client", "Model", "Plan", "Session", "plan"]
