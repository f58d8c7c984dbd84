"""The MCP servers file: parsing and validation, nothing else.

The format is the one open-responses-server (and most MCP clients) use:

    {"mcpServers": {
        "files": {"type": "stdio", "command": "npx", "args": ["-y", "..."], "env": {"KEY": "value"}},
        "remote": {"type": "sse", "url": "http://example.com/sse", "headers": {"Authorization": "..."}},
        "http": {"type": "streamable-http", "url": "http://example.com/mcp"}
    }}

`type` defaults to `stdio`; `http` is accepted as another spelling of
`streamable-http`.  Unknown keys are ignored (other clients put their own
settings there).  Server order in the file is kept: it decides which server
keeps a tool name when two offer the same one (see `gateway.mcp.manager`).

This module knows nothing about sessions or transports.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["ServerConfig", "ServerType", "load_mcp_config", "parse_mcp_config"]

ServerType = Literal["stdio", "sse", "streamable-http"]

_TYPES: dict[str, ServerType] = {
    "stdio": "stdio",
    "sse": "sse",
    "streamable-http": "streamable-http",
    "http": "streamable-http",
}


_CREDENTIAL_NAME = re.compile(r"KEY|TOKEN|SECRET|PASS|AUTH|CREDENTIAL", re.IGNORECASE)


@dataclass(frozen=True)
class ServerConfig:
    """One configured MCP server.

    `command`, `args` and `env` apply to stdio servers; `url` and `headers`
    to SSE and streamable-HTTP servers.  `env` is added to a small inherited
    environment (PATH, HOME, ...), as the MCP SDK does.
    """

    name: str
    type: ServerType = "stdio"
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict, hash=False)
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict, hash=False)

    def secrets(self) -> list[str]:
        """Values to keep out of logs and client messages: header values, and
        environment values whose names say they are credentials."""
        found = list(self.headers.values())
        found += [value for name, value in self.env.items() if _CREDENTIAL_NAME.search(name)]
        # A header is often "Bearer <token>": the token alone is the secret too.
        found += [value.split(None, 1)[1] for value in self.headers.values() if " " in value.strip()]
        return found


def load_mcp_config(path: str | os.PathLike[str]) -> dict[str, ServerConfig]:
    """Read the MCP servers file at `path`, in file order.

    Raises:
        ValueError: the file cannot be read, is not JSON, or a server entry is
            invalid; the message names the file, the server and the field.
    """
    try:
        with open(path, encoding="utf-8") as file:
            text = file.read()
    except OSError as exc:
        raise ValueError(f"cannot read the MCP servers file {os.fspath(path)!r}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"the MCP servers file {os.fspath(path)!r} is not valid JSON: {exc.msg} (line {exc.lineno})"
        ) from None
    try:
        return parse_mcp_config(data)
    except ValueError as exc:
        raise ValueError(f"{os.fspath(path)}: {exc}") from None


def parse_mcp_config(data: Any) -> dict[str, ServerConfig]:
    """Validate an already decoded MCP servers document.

    Raises:
        ValueError: naming the server and the field at fault.
    """
    if not isinstance(data, dict):
        raise ValueError("the MCP servers config must be a JSON object with an 'mcpServers' object")
    servers = data.get("mcpServers")
    if not isinstance(servers, dict):
        raise ValueError("'mcpServers' must be an object mapping server names to their settings")
    return {name: _server(name, entry) for name, entry in servers.items()}


def _server(name: str, entry: Any) -> ServerConfig:
    if not name:
        raise ValueError("MCP server names must not be empty")
    where = f"MCP server {name!r}"
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: the entry must be an object")
    raw_type = entry.get("type", "stdio")
    if raw_type not in _TYPES:
        raise ValueError(f"{where}: field 'type' must be one of 'stdio', 'sse', 'streamable-http' (got {raw_type!r})")
    type_ = _TYPES[raw_type]
    if type_ == "stdio":
        command = entry.get("command")
        if not isinstance(command, str) or not command:
            hint = " (set 'type' to 'sse' or 'streamable-http' for a URL)" if "url" in entry else ""
            raise ValueError(f"{where}: field 'command' is required for a stdio server and must be a string{hint}")
        args = entry.get("args", [])
        if not isinstance(args, list) or not all(isinstance(arg, str) for arg in args):
            raise ValueError(f"{where}: field 'args' must be a list of strings")
        return ServerConfig(
            name=name,
            type=type_,
            command=command,
            args=tuple(args),
            env=_string_map(where, "env", entry.get("env", {})),
        )
    url = entry.get("url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ValueError(f"{where}: field 'url' is required for a {type_} server and must be an http(s) URL")
    return ServerConfig(name=name, type=type_, url=url, headers=_string_map(where, "headers", entry.get("headers", {})))


def _string_map(where: str, field_name: str, value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{where}: field {field_name!r} must be an object of strings")
    for key, item in value.items():
        if not isinstance(item, str):
            raise ValueError(f"{where}: field '{field_name}.{key}' must be a string")
    return dict(value)
