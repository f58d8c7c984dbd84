"""MCP: tools from configured servers, and from servers a request names.

    config.py    the servers file (`load_mcp_config`)
    manager.py   `MCPManager`: one supervised session per configured server,
                 cached tool lists, calls (see its docstring for tool naming)
    remote.py    `open_remote_session` for the hosted `mcp` tool, and the
                 URL allow-list (`check_url_allowed_async`)
    cli.py       `gateway mcp list`

Tool failures and unreachable servers come back as `MCPResult(is_error=True)`:
they are data for the model, not exceptions.  Nothing here reads settings or
the environment.
"""

from ._connection import MCPResult, MCPTool
from .config import ServerConfig, load_mcp_config, parse_mcp_config
from .manager import MCPManager, ServerState, ServerStatus
from .remote import (
    RemoteMCPError,
    RemoteSession,
    check_url_allowed,
    check_url_allowed_async,
    open_remote_session,
)

__all__ = [
    "MCPManager",
    "MCPResult",
    "MCPTool",
    "RemoteMCPError",
    "RemoteSession",
    "ServerConfig",
    "ServerState",
    "ServerStatus",
    "check_url_allowed",
    "check_url_allowed_async",
    "load_mcp_config",
    "open_remote_session",
    "parse_mcp_config",
]
