"""`gateway doctor`: each configured backend tried the way Claude Code, Codex and opencode will use
it through the gateway, a verdict per check and a fix for each that is not ok.

    checks.py   what is asked; each check's verdict and fix from what was observed (pure)
    render.py   the table, the JSON document, the exit status (pure)
    probes.py   the HTTP probes, each bounded, through the gateway's own adapters (the async shell)
    cli.py      the options, the routes chosen, the run

It reads the backends as the gateway does (`GATEWAY_CONFIG`, else `OPENAI_BASE_URL_INTERNAL`) and
changes nothing: no route, setting or store is touched.
"""

from .cli import add_arguments, main

__all__ = ["add_arguments", "main"]
