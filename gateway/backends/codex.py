"""A model catalog for Codex CLI, which knows no metadata of a custom provider's models.

Codex takes metadata for models it does not ship with from a file named by
`model_catalog_json` in its config; without it, it warns "Model metadata for
… not found" and guesses.  `gateway config codex-catalog` writes one entry
per model: its name, its context window, and the few fields every entry must
have (checked against `codex debug models`, Codex CLI 0.169).  The base
instructions are the gateway's own short brief for a coding agent; replace
them with `--instructions FILE`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["BASE_INSTRUCTIONS", "codex_catalog"]

BASE_INSTRUCTIONS = """\
You are a coding agent working in the user's repository through the tools you are given.
Read the code before you change it, keep changes small and in the style of the code around them,
and run the project's tests or build after a change when you can.
Use the shell tool to inspect files and run commands, and the patch tool to edit files.
Ask before doing anything destructive or outside the repository.
When you are done, say briefly what you changed and what you checked."""


def codex_catalog(
    models: Iterable[tuple[str, int]], *, instructions: str = BASE_INSTRUCTIONS
) -> dict[str, Any]:
    """`{"models": [...]}` for (name, context window) pairs, in Codex's catalog shape."""
    entries = []
    for priority, (name, context_window) in enumerate(models, start=1):
        entries.append(
            {
                "slug": name,
                "display_name": name,
                "context_window": context_window,
                "supported_reasoning_levels": [],
                "shell_type": "shell_command",
                "visibility": "list",
                "supported_in_api": True,
                "priority": priority,
                "support_verbosity": False,
                "truncation_policy": {"mode": "tokens", "limit": 10000},
                "experimental_supported_tools": [],
                "base_instructions": instructions,
            }
        )
    return {"models": entries}
