"""The host guard for web tools: a model-chosen URL must not reach into the local network.

A research agent fetches URLs the model writes, and the model reads pages written by anyone, so
a page can ask it to fetch ``http://127.0.0.1:8080/admin`` or a cloud metadata address. The
guard resolves the host and refuses when any address it resolves to is loopback, private,
link-local, multicast, reserved, unspecified or otherwise not globally routable, unless the
person running the agent named that host in ``allow_hosts``. Web tools call it before every
request, redirects included.

Limit: the check and the connection resolve the name separately, so a hostile DNS server that
answers differently the second time (DNS rebinding) is not stopped here.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Collection
from urllib.parse import urlsplit

__all__ = ["IPAddress", "check_url"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_DEFAULT_PORTS = {"http": 80, "https": 443}


async def check_url(url: str, allow_hosts: Collection[str]) -> str | None:
    """Return None when `url` may be fetched, else a refusal the model can read."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"refused to fetch {url!r}: not a valid URL ({exc})"
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        return f"refused to fetch {url!r}: only http and https URLs can be fetched"
    host = parts.hostname
    if not host:
        return f"refused to fetch {url!r}: the URL names no host"
    if _is_allowed(host, port or _DEFAULT_PORTS[scheme], allow_hosts):
        return None
    try:
        addresses = await _resolve(host)
    except (OSError, UnicodeError) as exc:
        return f"refused to fetch {url!r}: the host {host!r} could not be resolved ({exc})"
    if not addresses:
        return f"refused to fetch {url!r}: the host {host!r} resolved to no address"
    for address in addresses:
        category = _non_public_category(address)
        if category is not None:
            return (
                f"refused to fetch {url!r}: the host {host!r} resolves to {address}, a {category} "
                "address; web tools only reach public hosts unless the host is allowed "
                "(allow_hosts)"
            )
    return None


def _is_allowed(host: str, port: int, allow_hosts: Collection[str]) -> bool:
    """Match `host` or `host:port` (IPv6 with or without brackets), ignoring case."""
    if not allow_hosts:
        return False
    allowed = {entry.strip().lower() for entry in allow_hosts}
    host = host.lower()
    bracketed = f"[{host}]" if ":" in host else host
    return bool({host, bracketed, f"{bracketed}:{port}"} & allowed)


async def _resolve(host: str) -> list[IPAddress]:
    try:
        return [_unmap(ipaddress.ip_address(host))]
    except ValueError:
        pass
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    addresses: list[IPAddress] = []
    for _family, _type, _proto, _name, sockaddr in infos:
        text = str(sockaddr[0]).split("%", 1)[0]  # drop an IPv6 scope id
        address = _unmap(ipaddress.ip_address(text))
        if address not in addresses:
            addresses.append(address)
    return addresses


def _unmap(address: IPAddress) -> IPAddress:
    """``::ffff:127.0.0.1`` is 127.0.0.1 to the kernel, so judge it as that."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _non_public_category(address: IPAddress) -> str | None:
    checks = (
        ("unspecified", address.is_unspecified),
        ("loopback", address.is_loopback),
        ("link-local", address.is_link_local),
        ("multicast", address.is_multicast),
        ("private", address.is_private),
        ("reserved", address.is_reserved),
        ("non-public", not address.is_global),
    )
    for name, hit in checks:
        if hit:
            return name
    return None
