"""MCP servers named by a request: the hosted `mcp` tool of the Responses API.

A request may carry `{"type": "mcp", "server_label": ..., "server_url": ...}`;
the gateway then connects to that URL for the duration of the request.
`open_remote_session` connects (streamable HTTP, falling back to SSE) and
yields a `RemoteSession`; `check_url_allowed_async` decides beforehand
whether the URL may be contacted at all, since a client-supplied URL could
otherwise reach the gateway's own network (SSRF).

The session runs in a task of its own: a transport failure marks it closed
and turns later calls into `is_error` results; it never cancels the
caller's code.  Connecting takes no timeout: wrap it in `trio.fail_after`.

This module knows nothing of configuration files or the HTTP API.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import socket
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

import trio
from mcp.client._transport import TransportStreams

from ..errors import GatewayError
from ._connection import Connection, MCPResult, MCPTool, assign_tool_names, describe_error, open_transport
from .config import ServerConfig, ServerType

__all__ = [
    "RemoteMCPError",
    "RemoteSession",
    "check_url_allowed",
    "check_url_allowed_async",
    "open_remote_session",
]

logger = logging.getLogger("gateway.mcp")

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class RemoteMCPError(GatewayError):
    """A request's MCP server could not be reached or listed (OpenAI answers 424)."""

    status = 424
    type = "external_connector_error"
    code = "mcp_server_unavailable"

    def __init__(self, message: str, *, detail: str | None = None) -> None:
        super().__init__(message, param="tools")
        self.detail = detail  # what went wrong, for logs only


class RemoteSession:
    """A connected MCP server: list its tools, call them.

    `tools()` returns the last listing without I/O, so a session can serve
    where a manager would (`gateway.turn.tools.ToolSource`).
    """

    def __init__(self, connection: Connection, server_label: str, transport: ServerType) -> None:
        self._connection = connection
        self._label = server_label
        self.transport = transport  # which transport connected: "streamable-http" or "sse"
        self._tools: list[MCPTool] = []
        self._original: dict[str, str] = {}

    async def list_tools(self) -> list[MCPTool]:
        """The server's tools, named for the model (`server` is the label given, default "").

        Raises:
            RemoteMCPError: the listing failed or the connection is gone.
        """
        try:
            listing = await self._connection.list_tools()
        except Exception as exc:
            detail = describe_error(exc)
            logger.warning("listing the tools of remote MCP server %r failed: %s", self._label, detail)
            raise RemoteMCPError(f"could not list the tools of the MCP server {self._label!r}", detail=detail) from None
        self._tools = assign_tool_names([(self._label, listing)])
        self._original = {tool.name: tool.original_name for tool in self._tools}
        return list(self._tools)

    def tools(self) -> list[MCPTool]:
        """The tools of the last `list_tools` (no I/O)."""
        return list(self._tools)

    async def call(self, name: str, arguments: dict[str, Any]) -> MCPResult:
        """Call a tool by the name `list_tools` gave it (or by the server's own name).

        Never raises for a failure of the tool or the server: those come back
        as `MCPResult(is_error=True)`.  Cancellation returns at once.
        """
        return await self._connection.call(self._original.get(name, name), arguments)


@asynccontextmanager
async def open_remote_session(
    url: str, headers: Mapping[str, str], *, server_label: str = "", connect_timeout: float = math.inf
) -> AsyncIterator[RemoteSession]:
    """Connect to the MCP server at `url` (streamable HTTP, then SSE) and initialize.

    Check the URL with `check_url_allowed_async` first.  Leaving the block
    closes the session.  `connect_timeout` bounds connecting and the
    handshake, both transports together: the session's task outlives any
    cancel scope a caller could put around entering this block, so the bound
    is taken here.

    Raises:
        RemoteMCPError: neither transport could connect and initialize in time.
    """
    failure: RemoteMCPError | None = None
    body_error: Exception | None = None
    async with trio.open_nursery() as nursery:
        failures: list[str] = []
        transports: tuple[ServerType, ...] = ("streamable-http", "sse")
        deadline = trio.current_time() + connect_timeout
        connected = False
        for transport in transports:
            config = ServerConfig(name=server_label, type=transport, url=url, headers=dict(headers))
            connection = Connection(server_label)
            try:
                with trio.move_on_at(deadline):
                    await nursery.start(_run_contained, connection, open_transport(config))
                    connected = True
            except Exception as exc:
                failures.append(f"{transport}: {describe_error(exc)}")
                continue
            if not connected:  # out of time: a server that accepts and never answers
                failures.append(f"{transport}: no answer within {connect_timeout:g} s")
            break
        if not connected:
            detail = "; ".join(failures)
            logger.warning("connecting to remote MCP server %r at %s failed: %s", server_label, url, detail)
            failure = RemoteMCPError(f"could not connect to the MCP server {server_label or url!r}", detail=detail)
        if failure is None:
            try:
                yield RemoteSession(connection, server_label, transport)
            except Exception as exc:
                # The caller's own error: raised below, outside our nursery, so
                # that it is not wrapped in an ExceptionGroup.
                body_error = exc
            finally:
                nursery.cancel_scope.cancel()
    if failure is not None:
        raise failure
    if body_error is not None:
        raise body_error


async def _run_contained(
    connection: Connection,
    transport: AbstractAsyncContextManager[TransportStreams],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    # Failures before started() go to the caller of nursery.start; after it,
    # they only close the connection (the caller's code must not be cancelled).
    try:
        await connection.run(transport, task_status=task_status)
    except* Exception as group:
        if not connection.started:
            raise
        logger.info("remote MCP server %r closed: %s", connection.label, describe_error(group))


# --- which URLs may be contacted ----------------------------------------------------


def check_url_allowed(url: str, allow: Sequence[str], *, addresses: Iterable[str] = ()) -> None:
    """Refuse a URL that is not http(s) or that points into a non-public network.

    `addresses` are the host's resolved addresses (`check_url_allowed_async`
    resolves them); an IP-literal host is checked itself, and `localhost`
    counts as loopback.  Loopback, private, link-local, multicast, reserved,
    unspecified and other non-global addresses are refused unless the
    allow-list names the host, `host:port`, the address or a network
    containing it (entries like `"mcp.internal"`, `"localhost:8765"`,
    `"127.0.0.1"`, `"10.0.0.0/8"`).  A host name given without addresses is
    not judged by its addresses.

    An IPv6 address that embeds an IPv4 address (IPv4-mapped, 6to4, Teredo,
    NAT64 `64:ff9b::/96`, IPv4-compatible) is judged by that IPv4 address,
    since it can route to it; an allow-list entry may name either form.  The
    local-use NAT64 prefix `64:ff9b:1::/48` is refused unless allow-listed.

    Raises:
        ValueError: saying why the URL is refused.
    """
    host, port = _host_and_port(url)
    if _host_allowed(host, port, allow):
        return
    literal = _ip(host)
    if literal is not None:
        candidates: list[IPAddress] = [literal]
    else:
        candidates = [ip for ip in (_ip(address) for address in addresses) if ip is not None]
        if not candidates and (host == "localhost" or host.endswith(".localhost")):
            candidates = [ipaddress.IPv4Address("127.0.0.1")]
    networks = _allowed_networks(allow)
    for address in candidates:
        embedded = _embedded_ipv4(address)
        judged = address if embedded is None else embedded
        reason = _non_public(judged)
        if reason is None:
            continue
        if any(_within(address, network) or _within(judged, network) for network in networks):
            continue
        shown = str(address) if embedded is None else f"{embedded} embedded in {address}"
        raise ValueError(
            f"the MCP server URL {url!r} points to a {reason} address ({shown}); "
            "add the host or its network to the allow-list to permit it"
        )


async def check_url_allowed_async(url: str, allow: Sequence[str]) -> None:
    """`check_url_allowed`, resolving the host (`getaddrinfo` in a thread).

    Raises:
        ValueError: the URL is refused, or its host does not resolve.
    """
    check_url_allowed(url, allow)  # scheme, IP literals and the allow-list, without DNS
    host, port = _host_and_port(url)
    if _ip(host) is not None or _host_allowed(host, port, allow):
        return
    try:
        infos = await trio.to_thread.run_sync(
            socket.getaddrinfo, host, port, 0, socket.SOCK_STREAM, abandon_on_cancel=True
        )
    except (socket.gaierror, UnicodeError):
        raise ValueError(f"the MCP server host {host!r} does not resolve") from None
    check_url_allowed(url, allow, addresses=[str(info[4][0]) for info in infos])


def _host_and_port(url: str) -> tuple[str, int]:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise ValueError(f"the MCP server URL {url!r} is not a valid URL") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"the MCP server URL {url!r} must use http or https")
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise ValueError(f"the MCP server URL {url!r} has no host")
    return host, port if port is not None else (443 if parts.scheme == "https" else 80)


def _host_allowed(host: str, port: int, allow: Sequence[str]) -> bool:
    names = {host, f"{host}:{port}", f"[{host}]:{port}"}
    return any(entry.strip().lower().rstrip(".") in names for entry in allow)


def _allowed_networks(allow: Sequence[str]) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    networks = []
    for entry in allow:
        try:
            networks.append(ipaddress.ip_network(entry.strip(), strict=False))
        except ValueError:
            continue  # a host name or host:port entry
    return networks


def _ip(text: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(text.split("%", 1)[0])  # drop an IPv6 zone id
    except ValueError:
        return None


_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")  # RFC 6052 well-known prefix: the last 32 bits
_NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")  # RFC 8215: the IPv4 part may sit anywhere
_IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")  # deprecated `::a.b.c.d`


def _embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address routes to, if it embeds one."""
    if isinstance(address, ipaddress.IPv4Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]  # (server, client): traffic goes to the client
    if address in _NAT64 or (address in _IPV4_COMPATIBLE and int(address) > 1):  # not :: or ::1
        return ipaddress.IPv4Address(int(address) & 0xFFFF_FFFF)
    return None


def _within(address: IPAddress, network: ipaddress.IPv4Network | ipaddress.IPv6Network) -> bool:
    return address.version == network.version and address in network


def _non_public(address: IPAddress) -> str | None:
    if address.version == 6 and address in _NAT64_LOCAL:
        return "local-use NAT64"
    if address.is_unspecified:
        return "unspecified"
    if address.is_loopback:
        return "loopback"
    if address.is_link_local:
        return "link-local"
    if address.is_multicast:
        return "multicast"
    if address.is_private:
        return "private"
    if address.is_reserved:
        return "reserved"
    if not address.is_global:
        return "non-public"
    return None
