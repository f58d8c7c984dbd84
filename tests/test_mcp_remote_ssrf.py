"""The SSRF check of hosted `mcp` tools: IPv6 forms that embed an IPv4 address are judged by it."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable

import pytest

from gateway.mcp import check_url_allowed


def sixtofour(v4: str) -> str:
    return str(ipaddress.IPv6Address((0x2002 << 112) | (int(ipaddress.IPv4Address(v4)) << 80)))


def nat64(v4: str) -> str:
    return str(ipaddress.IPv6Address(int(ipaddress.IPv6Address("64:ff9b::")) | int(ipaddress.IPv4Address(v4))))


def teredo(v4: str, server: str = "65.54.227.120") -> str:
    client = int(ipaddress.IPv4Address(v4)) ^ 0xFFFF_FFFF  # Teredo stores the client address inverted
    return str(ipaddress.IPv6Address((0x2001_0000 << 96) | (int(ipaddress.IPv4Address(server)) << 64) | client))


def compatible(v4: str) -> str:
    return f"::{v4}"


FORMS = [sixtofour, nat64, teredo, compatible]
NON_PUBLIC = ["169.254.169.254", "127.0.0.1", "10.0.0.1"]


def test_the_helpers_build_the_forms_ipaddress_recognises() -> None:
    assert sixtofour("169.254.169.254") == "2002:a9fe:a9fe::"
    assert ipaddress.IPv6Address(teredo("10.0.0.1")).teredo == (
        ipaddress.IPv4Address("65.54.227.120"),
        ipaddress.IPv4Address("10.0.0.1"),
    )
    assert nat64("127.0.0.1") == "64:ff9b::7f00:1"


def test_the_6to4_form_of_the_metadata_address_is_refused() -> None:
    with pytest.raises(ValueError, match="link-local"):
        check_url_allowed("http://[2002:a9fe:a9fe::]/", [])


@pytest.mark.parametrize("form", FORMS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("v4", NON_PUBLIC)
def test_an_ipv6_literal_embedding_a_non_public_ipv4_is_refused(form: Callable[[str], str], v4: str) -> None:
    with pytest.raises(ValueError, match=v4.replace(".", r"\.")):
        check_url_allowed(f"http://[{form(v4)}]:8000/mcp", [])


@pytest.mark.parametrize("form", FORMS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("v4", NON_PUBLIC)
def test_a_resolved_address_embedding_a_non_public_ipv4_is_refused(form: Callable[[str], str], v4: str) -> None:
    with pytest.raises(ValueError):
        check_url_allowed("https://tricky.example/mcp", [], addresses=["93.184.216.34", form(v4)])


@pytest.mark.parametrize("form", [sixtofour, nat64, teredo], ids=lambda f: f.__name__)
def test_the_same_forms_of_a_public_ipv4_are_allowed(form: Callable[[str], str]) -> None:
    check_url_allowed(f"http://[{form('8.8.8.8')}]/mcp", [])
    check_url_allowed("https://public.example/mcp", [], addresses=[form("8.8.8.8")])


def test_the_local_use_nat64_prefix_is_refused_whatever_it_embeds() -> None:
    with pytest.raises(ValueError, match="NAT64"):
        check_url_allowed("http://[64:ff9b:1::808:808]/mcp", [])
    with pytest.raises(ValueError, match="NAT64"):
        check_url_allowed("https://nat.example/mcp", [], addresses=["64:ff9b:1:a9fe:a9fe::"])
    check_url_allowed("http://[64:ff9b:1::808:808]/mcp", ["64:ff9b:1::/48"])


def test_loopback_and_unspecified_ipv6_are_not_read_as_ipv4_compatible() -> None:
    for url in ("http://[::1]/mcp", "http://[::]/mcp"):
        with pytest.raises(ValueError, match="loopback|unspecified"):
            check_url_allowed(url, [])


@pytest.mark.parametrize("form", FORMS, ids=lambda f: f.__name__)
def test_the_allow_list_permits_an_embedded_form_by_its_ipv4_network_or_its_ipv6_literal(form: Callable[[str], str]) -> None:
    literal = form("10.0.0.1")
    check_url_allowed(f"http://[{literal}]/mcp", ["10.0.0.0/8"])
    check_url_allowed(f"http://[{literal}]/mcp", [literal])
    check_url_allowed(f"http://[{literal}]:8000/mcp", [f"[{literal}]:8000"])
    check_url_allowed("https://internal.example/mcp", ["10.0.0.0/8"], addresses=[literal])
    check_url_allowed("https://internal.example/mcp", [f"{literal}/128"], addresses=[literal])
    with pytest.raises(ValueError):
        check_url_allowed(f"http://[{literal}]/mcp", ["192.168.0.0/16"])
    with pytest.raises(ValueError):
        check_url_allowed(f"http://[{literal}]:9000/mcp", [f"[{literal}]:8000"])
