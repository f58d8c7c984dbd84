"""Which addresses a URL a client names may reach: the guard against server-side request forgery.

A client can make the gateway connect to a URL it chose: a hosted MCP server
(`gateway.mcp.remote`), a page its model asks to read (`gateway.builtins.fetch`).
`check_url_allowed_async` decides beforehand whether it may be contacted at
all (http or https; no loopback, private, link-local, multicast, reserved or
otherwise non-public address, unless an allow-list names it), and
`address_allowed` judges the address a connection actually reached (a name
that resolves differently the second time cannot slip past).  Pure but for
the resolver.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable, Sequence
from urllib.parse import urlsplit

import trio

__all__ = ["address_allowed", "check_url_allowed", "check_url_allowed_async"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def check_url_allowed(url: str, allow: Sequence[str], *, addresses: Iterable[str] = (), what: str = "URL") -> None:
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
    host, port = _host_and_port(url, what)
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
            f"the {what} {url!r} points to a {reason} address ({shown}); "
            "add the host or its network to the allow-list to permit it"
        )


async def check_url_allowed_async(url: str, allow: Sequence[str], *, what: str = "URL") -> None:
    """`check_url_allowed`, resolving the host (`getaddrinfo` in a thread).

    Raises:
        ValueError: the URL is refused, or its host does not resolve.
    """
    check_url_allowed(url, allow, what=what)  # scheme, IP literals and the allow-list, without DNS
    host, port = _host_and_port(url, what)
    if _ip(host) is not None or _host_allowed(host, port, allow):
        return
    try:
        infos = await trio.to_thread.run_sync(
            socket.getaddrinfo, host, port, 0, socket.SOCK_STREAM, abandon_on_cancel=True
        )
    except (socket.gaierror, UnicodeError):
        raise ValueError(f"the {what} host {host!r} does not resolve") from None
    check_url_allowed(url, allow, addresses=[str(info[4][0]) for info in infos], what=what)


def _host_and_port(url: str, what: str = "URL") -> tuple[str, int]:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise ValueError(f"the {what} {url!r} is not a valid URL") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"the {what} {url!r} must use http or https")
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise ValueError(f"the {what} {url!r} has no host")
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


def address_allowed(address: str, allow: Sequence[str]) -> bool:
    """Whether a connection may have reached `address` (an IP, as the socket reports its peer)."""
    ip = _ip(address)
    if ip is None:
        return False
    embedded = _embedded_ipv4(ip)
    judged = ip if embedded is None else embedded
    if _non_public(judged) is None:
        return True
    return any(_within(ip, n) or _within(judged, n) for n in _allowed_networks(allow)) or str(ip) in {a.strip() for a in allow}
