"""What each coding agent needs to run on the gateway: its environment and its files.

A pure core: given the gateway's URL, a key, its models and the one chosen, the user's
environment and the current text of the files it manages, `plan` says which environment
variables to set and unset and which files to write.  It reads no file, asks no server and
starts nothing: the shell (`launch/cli.py`) finds the gateway, makes the key, writes the files
and runs the program.

Each client's configuration lives in a directory of its own (`client_home`), never the
user's `~/.claude`, `~/.codex` or opencode's own config, and stays between sessions so that
the client's history does.  Every variable and setting named here is one the installed
client reads (tests/test_launch.py looks for each in the client's own program), and
docs/clients.md says what each does.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import tomlkit

from ..backends.codex import codex_catalog

__all__ = [
    "CLIENTS",
    "KEY_REFERENCE",
    "KEY_VARIABLE",
    "Client",
    "Model",
    "Plan",
    "Session",
    "choose_model",
    "client_home",
    "managed_files",
    "output_tokens",
    "plan",
    "render",
    "routable",
    "state_home",
    "tiers",
]


@dataclass(frozen=True)
class Client:
    """A coding agent: its command, and the npm package that installs it."""

    name: str
    program: str
    package: str
    title: str


CLIENTS: dict[str, Client] = {
    "claude": Client("claude", "claude", "@anthropic-ai/claude-code", "Claude Code"),
    "codex": Client("codex", "codex", "@openai/codex", "Codex CLI"),
    "opencode": Client("opencode", "opencode", "opencode-ai", "opencode"),
}

# The variable Codex's provider (`env_key`) and opencode's (`{env:…}`) read the key from, so that
# no file holds it; the same name `gateway launch --url` takes a key from.
KEY_VARIABLE = "GATEWAY_API_KEY"
# What stands for the key in `--print`'s output, which never shows a secret.
KEY_REFERENCE = "$" + KEY_VARIABLE
PROVIDER = "gateway"  # the provider's id in Codex's and opencode's configuration
PROVIDER_NAME = "Responses gateway"

# Output tokens a client asks for when the user has not said: Claude Code and opencode ask for
# up to 32,000 otherwise, minutes of generation a small local model spends on one turn.
DEFAULT_OUTPUT_TOKENS = 8192
# A model's context window when the gateway does not know it (as `gateway config codex-catalog`).
DEFAULT_CONTEXT_WINDOW = 32768

# Claude Code's tiers, and the words a route's name may carry to take one: a route named
# `haiku`, `small` or `qwen3-coder-mini` serves Claude Code's small, fast tier.
TIER_WORDS: dict[str, tuple[str, ...]] = {
    "opus": ("opus", "large"),
    "sonnet": ("sonnet", "medium"),
    "haiku": ("haiku", "small", "fast", "mini"),
}

# What keeps Claude Code on this machine (each checked against the installed program).
CLAUDE_QUIET = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",  # the umbrella: no telemetry, error reports, updates
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_BUG_COMMAND": "1",  # /bug would send the session to Anthropic
    "DISABLE_GROWTHBOOK": "1",  # no feature-flag fetches
    "CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY": "1",
}
# What would send Claude Code past the gateway: a real Anthropic key beside the session's token,
# or a cloud provider of its own.
CLAUDE_UNSET = ("ANTHROPIC_API_KEY", "CLAUDE_CODE_USE_BEDROCK", "CLAUDE_CODE_USE_VERTEX", "CLAUDE_CODE_USE_FOUNDRY")
OPENCODE_QUIET = {
    "OPENCODE_DISABLE_MODELS_FETCH": "1",  # no models.dev index
    "OPENCODE_DISABLE_AUTOUPDATE": "1",
    "OPENCODE_DISABLE_SHARE": "1",
    "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",  # no language servers fetched on demand
}
_GLOB = re.compile(r"[*?\[]")


@dataclass(frozen=True)
class Model:
    """A model the gateway lists, with its context window when it says."""

    name: str
    context_window: int | None = None


@dataclass(frozen=True)
class Session:
    """What a client is launched with."""

    client: str  # a key of CLIENTS
    url: str  # the gateway's root, without /v1
    key: str | None  # what the client presents; None: the user's $GATEWAY_API_KEY (`--print`)
    model: str
    models: tuple[Model, ...]
    home: pathlib.Path  # the client's own directory (client_home)
    environ: Mapping[str, str] = field(default_factory=dict)  # the user's environment


@dataclass(frozen=True)
class Plan:
    """What the shell does before it runs the client: variables set and unset, files written."""

    env: dict[str, str]
    unset: tuple[str, ...]
    files: dict[pathlib.Path, str]
    directories: tuple[pathlib.Path, ...]


def state_home(environ: Mapping[str, str]) -> pathlib.Path:
    """`$XDG_STATE_HOME/responses-gateway/launch` (XDG's default `~/.local/state`)."""
    base = environ.get("XDG_STATE_HOME", "")
    if not os.path.isabs(base):  # unset, empty or relative: ignored, as the XDG spec says
        home = environ.get("HOME") or os.path.expanduser("~")
        base = os.path.join(home, ".local", "state")
    return pathlib.Path(base) / "responses-gateway" / "launch"


def client_home(client: str, environ: Mapping[str, str]) -> pathlib.Path:
    """The directory a client's configuration and history live in between sessions."""
    return state_home(environ) / client


def output_tokens(context_window: int | None) -> int:
    """Output tokens a turn may ask for: a quarter of a known context window, at most
    DEFAULT_OUTPUT_TOKENS, so that a long prompt still leaves room for the answer."""
    if context_window is None:
        return DEFAULT_OUTPUT_TOKENS
    return max(256, min(DEFAULT_OUTPUT_TOKENS, context_window // 4))


def choose_model(models: Sequence[Model], wanted: str | None) -> str:
    """The model a session uses: `wanted`, or the first the gateway lists.

    Raises:
        ValueError: `wanted` is not one of a non-empty list (the message lists them), or the
            list is empty and nothing was asked for.
    """
    names = [model.name for model in models]
    if wanted is not None:
        if names and wanted not in names:
            raise ValueError(f"the gateway has no model {wanted!r}; it has: {', '.join(names)}")
        return wanted
    if not names:
        raise ValueError("the gateway lists no models: name one with --model")
    return names[0]


def routable(models: Sequence[Model]) -> tuple[Model, ...]:
    """The models a client can ask for by name: not a route's glob (`claude-*`), each once."""
    seen: dict[str, Model] = {}
    for model in models:
        if not _GLOB.search(model.name):
            seen.setdefault(model.name, model)
    return tuple(seen.values())


def _named_like(name: str, words: tuple[str, ...]) -> bool:
    return any(part in words for part in re.split(r"[-_./: ]+", name.lower()))


def tiers(chosen: str, names: Sequence[str]) -> dict[str, str]:
    """Claude Code's tiers (opus, sonnet, haiku) as routes: a route named like a tier takes it,
    every other tier the chosen model."""
    return {tier: next((name for name in names if _named_like(name, words)), chosen) for tier, words in TIER_WORDS.items()}


def managed_files(client: str, home: pathlib.Path) -> tuple[pathlib.Path, ...]:
    """The files whose current text `plan` keeps what the client wrote in (the shell reads them)."""
    if client == "claude":
        return (home / ".claude.json",)
    if client == "codex":
        return (home / "config.toml",)
    return (home / "config" / "opencode" / "package-lock.json",)


def plan(session: Session, existing: Mapping[pathlib.Path, str] | None = None) -> Plan:
    """The environment and files `session.client` runs with.

    `existing` holds the current text of `managed_files`: the client's own settings there are
    kept, the gateway's set.

    Raises:
        ValueError: a managed file is not valid JSON or TOML (the message names it).
    """
    existing = existing or {}
    models = routable(session.models) or (Model(session.model),)
    if session.model not in {model.name for model in models}:
        models = (Model(session.model), *models)
    builders = {"claude": _claude, "codex": _codex, "opencode": _opencode}
    return builders[session.client](session, models, existing)


def _window(session: Session, models: Sequence[Model]) -> int | None:
    return next((model.context_window for model in models if model.name == session.model), None)


def _key(session: Session) -> dict[str, str]:
    return {} if session.key is None else {KEY_VARIABLE: session.key}


def _claude(session: Session, models: Sequence[Model], existing: Mapping[pathlib.Path, str]) -> Plan:
    tier = tiers(session.model, [model.name for model in models])
    env = {
        "ANTHROPIC_BASE_URL": session.url,
        # A Bearer token rather than ANTHROPIC_API_KEY: Claude Code asks before it uses a key
        # from the environment, and never for a token.
        "ANTHROPIC_AUTH_TOKEN": session.key if session.key is not None else KEY_REFERENCE,
        "ANTHROPIC_MODEL": session.model,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": tier["opus"],
        "ANTHROPIC_DEFAULT_SONNET_MODEL": tier["sonnet"],
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": tier["haiku"],
        "ANTHROPIC_SMALL_FAST_MODEL": tier["haiku"],
        "CLAUDE_CONFIG_DIR": str(session.home),
        **CLAUDE_QUIET,
    }
    if "CLAUDE_CODE_MAX_OUTPUT_TOKENS" not in session.environ:
        env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(output_tokens(_window(session, models)))
    path = session.home / ".claude.json"
    state = _json_object(path, existing.get(path))
    files = {}
    if state.get("hasCompletedOnboarding") is not True:  # else its first-run screens, every new HOME
        files[path] = json.dumps({**state, "hasCompletedOnboarding": True}, indent=2) + "\n"
    return Plan(env=env, unset=CLAUDE_UNSET, files=files, directories=(session.home,))


def _codex(session: Session, models: Sequence[Model], existing: Mapping[pathlib.Path, str]) -> Plan:
    catalog_path = session.home / "gateway-models.json"
    catalog = codex_catalog((model.name, model.context_window or DEFAULT_CONTEXT_WINDOW) for model in models)
    path = session.home / "config.toml"
    text = existing.get(path)
    try:
        document = tomlkit.parse(text) if text else tomlkit.document()
    except tomlkit.exceptions.ParseError as error:
        raise ValueError(f"{path} is not TOML: {error}") from None
    if not text:
        document.add(tomlkit.comment("Codex's configuration for `gateway launch codex`: the gateway sets the keys below"))
        document.add(tomlkit.comment("at every launch; what Codex or you add stays."))
    document["model"] = session.model
    document["model_provider"] = PROVIDER
    document["model_catalog_json"] = str(catalog_path)  # the models' metadata: nothing fetched, no guess
    document["check_for_update_on_startup"] = False
    _table(document, "analytics")["enabled"] = False
    _table(document, "feedback")["enabled"] = False
    provider = _table(_table(document, "model_providers", super_table=True), PROVIDER)
    provider["name"] = PROVIDER_NAME
    provider["base_url"] = session.url + "/v1"
    provider["env_key"] = KEY_VARIABLE
    provider["wire_api"] = "responses"
    files = {path: tomlkit.dumps(document), catalog_path: json.dumps(catalog, indent=2) + "\n"}
    return Plan(env={"CODEX_HOME": str(session.home), **_key(session)}, unset=(), files=files, directories=(session.home,))


def _opencode(session: Session, models: Sequence[Model], existing: Mapping[pathlib.Path, str]) -> Plan:
    small = tiers(session.model, [model.name for model in models])["haiku"]
    config = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            PROVIDER: {
                # The AI SDK's OpenAI provider speaks the Responses API (bundled in opencode: nothing fetched).
                "npm": "@ai-sdk/openai",
                "name": PROVIDER_NAME,
                "options": {"baseURL": session.url + "/v1", "apiKey": "{env:%s}" % KEY_VARIABLE},
                "models": {
                    model.name: {
                        "name": model.name,
                        "limit": {
                            "context": model.context_window or DEFAULT_CONTEXT_WINDOW,
                            "output": output_tokens(model.context_window),
                        },
                    }
                    for model in models
                },
            }
        },
        "model": f"{PROVIDER}/{session.model}",
        "small_model": f"{PROVIDER}/{small}",  # session titles
        "enabled_providers": [PROVIDER],  # not another provider a key in the environment enables
        "autoupdate": False,
        "share": "disabled",
    }
    config_home = session.home / "config"
    own = config_home / "opencode"
    env = {
        "OPENCODE_CONFIG": str(session.home / "opencode.json"),
        # opencode keeps its sessions, caches and global config under the XDG directories only.
        "XDG_CONFIG_HOME": str(config_home),
        "XDG_DATA_HOME": str(session.home / "data"),
        "XDG_CACHE_HOME": str(session.home / "cache"),
        "XDG_STATE_HOME": str(session.home / "state"),
        **OPENCODE_QUIET,
        **_key(session),
    }
    files = {session.home / "opencode.json": json.dumps(config, indent=2) + "\n"}
    lock = own / "package-lock.json"
    if lock not in existing:
        # At every start opencode installs `@opencode-ai/plugin` (types for plugins, from npm) into its
        # config directory unless a lock file there already names it; this one does, so nothing is fetched.
        files[lock] = json.dumps({"packages": {"": {"dependencies": {"@opencode-ai/plugin": "*"}}}}, indent=2) + "\n"
    return Plan(env=env, unset=(), files=files, directories=(session.home, own, own / "node_modules"))


def _json_object(path: pathlib.Path, text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        raise ValueError(f"{path} is not JSON") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path} is not a JSON object")
    return value


def _table(parent: Any, name: str, *, super_table: bool = False) -> Any:
    found = parent.get(name)
    if not isinstance(found, dict):
        found = tomlkit.table(is_super_table=super_table) if super_table else tomlkit.table()
        parent[name] = found
        found = parent[name]
    return found


def render(built: Plan, command: Sequence[str]) -> str:
    """`built` as a shell would use it: `unset`/`export` lines, each file (path, then its text),
    and the command to run."""
    lines = [f"unset {name}" for name in built.unset]
    for name, value in built.env.items():
        quoted = f'"{KEY_REFERENCE}"' if value == KEY_REFERENCE else shlex.quote(value)
        lines.append(f"export {name}={quoted}")
    for path, text in built.files.items():
        lines.append(f"# --- {path}")
        lines.extend(text.rstrip("\n").splitlines())
    lines.append(f"# --- then run: {shlex.join(command)}")
    return "\n".join(lines) + "\n"
