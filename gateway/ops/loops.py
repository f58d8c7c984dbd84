"""Loops: a backend URL that leads back to the gateway must not recurse without bound.

A backend URL that is the gateway itself (its own host and port) is refused
at start-up (`self_references`).  A loop the start-up check cannot see (a
backend behind a load balancer that leads back here, two gateways that are
each other's backend) is caught on the wire: every request the gateway
sends to a backend carries `x-gateway-hops`, the instances it has passed
through, this one last; a request that arrives naming this instance, or
that has passed `MAX_HOPS` gateways, is refused with 508 `loop_detected`.
The chain a request arrived with follows it to every backend call it makes
(a context variable, inherited by the tasks the request starts).

Knows headers, URLs and addresses; nothing of routes or the protocol.
"""

from __future__ import annotations

import contextvars
import ipaddress
import secrets
import socket
from collections.abc import Iterable
from urllib.parse import urlsplit

from ..errors import LoopDetected

__all__ = ["HOP_HEADER", "INSTANCE", "MAX_HOPS", "arrived", "outgoing_hops", "self_references"]

HOP_HEADER = "x-gateway-hops"
MAX_HOPS = 8
INSTANCE = "gw-" + secrets.token_hex(6)  # this process
_CHAIN: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("gateway_hops", default=())


def arrived(headers: Iterable[tuple[bytes, bytes]]) -> contextvars.Token[tuple[str, ...]] | None:
    """Note the gateways a request passed through (for its backend calls); a token to reset with.

    Raises:
        LoopDetected: the request has passed through this instance already, or through too many.
    """
    value = next((v for n, v in headers if n == b"x-gateway-hops"), None)
    if value is None:
        return None
    chain = tuple(hop.strip() for hop in value.decode("latin-1").split(",") if hop.strip())
    if INSTANCE in chain or len(chain) >= MAX_HOPS:
        raise LoopDetected(
            "The request came back through this gateway: a backend URL leads to the gateway itself.",
            cause=f"a request passed through {len(chain)} gateways and came back (hops: {', '.join(chain[-MAX_HOPS:])})",
        )
    return _CHAIN.set(chain)


def reset(token: contextvars.Token[tuple[str, ...]] | None) -> None:
    if token is not None:
        _CHAIN.reset(token)


def outgoing_hops() -> str:
    """The `x-gateway-hops` value of a request to a backend: where the current request has been, and here."""
    return ",".join((*_CHAIN.get(), INSTANCE))


def self_references(backend_urls: Iterable[str], binds: Iterable[str]) -> list[str]:
    """The backend URLs that are this gateway itself: the port of a bound address, on a host that
    resolves to that address (any local address, for a wildcard bind)."""
    bound: list[tuple[str, int]] = []
    for bind in binds:
        parts = urlsplit(bind if "://" in bind else "http://" + bind)
        if parts.hostname and parts.port:
            bound.append((parts.hostname, parts.port))
    found = []
    for url in backend_urls:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        if parts.hostname is None:
            continue
        addresses = _addresses(parts.hostname)
        for host, bound_port in bound:
            if port != bound_port:
                continue
            if _unspecified(host) and any(_local(address) for address in addresses):
                found.append(url)
                break
            if addresses & _addresses(host):
                found.append(url)
                break
    return found


def _addresses(host: str) -> set[str]:
    try:
        return {str(ipaddress.ip_address(info[4][0])) for info in socket.getaddrinfo(host, None)}
    except (OSError, ValueError):
        return set()


def _unspecified(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


def _local(address: str) -> bool:
    """An address of this machine: loopback, or one of its interfaces' (as far as the resolver knows)."""
    if ipaddress.ip_address(address).is_loopback:
        return True
    try:
        mine = {str(ipaddress.ip_address(info[4][0])) for info in socket.getaddrinfo(socket.gethostname(), None)}
    except (OSError, ValueError):
        return False
    return address in mine
