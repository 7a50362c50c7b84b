"""The host guard for web tools: a model-chosen URL must not reach into the local network.

A research agent fetches URLs the model writes, and the model reads pages written by anyone, so
a page can ask it to fetch ``http://127.0.0.1:8080/admin`` or a cloud metadata address. The
guard resolves the host and refuses when any address it resolves to is loopback, private,
link-local, multicast, reserved, unspecified, a cloud metadata address or otherwise not
globally routable, unless the person running the agent named that host in ``allow_hosts``.
Addresses that carry an IPv4 address inside an IPv6 one (IPv4-mapped ``::ffff:0:0/96``, NAT64
``64:ff9b::/96``, 6to4 ``2002::/16``) are judged by the IPv4 address they carry.

The guard is applied where the connection is made, not beside it: `resolve_checked` looks the
host up once, through a `Resolver` Keel controls (injectable for tests), judges every address
of that answer, and returns those addresses for the caller to connect to (`keel.tools.pinned`).
Nothing looks the name up a second time, so a DNS server that answers a public address first
and 127.0.0.1 afterwards (DNS rebinding) gains nothing: the connection goes to the address that
was checked. `check_url` is the whole check on its own, for callers that cannot pin (a
caller-supplied HTTP client), and `vet_url` is the part that needs no lookup (scheme, host, an
address written in the URL).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Collection, Sequence
from urllib.parse import urlsplit

from keel.errors import ToolError

__all__ = [
    "HostNotFound",
    "HostRefused",
    "IPAddress",
    "Resolver",
    "check_url",
    "refusal",
    "resolve_checked",
    "system_resolver",
    "vet_url",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str], Awaitable[Sequence[IPAddress]]]
"""Host name to its addresses; called once per connection. The default is `system_resolver`."""

_DEFAULT_PORTS = {"http": 80, "https": 443}
_NAT64_PREFIX = int(ipaddress.IPv6Address("64:ff9b::")) >> 32
"""The well-known NAT64 prefix 64:ff9b::/96 (RFC 6052), which carries an IPv4 address."""
_LOCAL_NAT64 = ipaddress.IPv6Network("64:ff9b:1::/48")
"""Local-use NAT64 (RFC 8215): translated inside one network, so never public."""
_IETF_ASSIGNMENTS = ipaddress.IPv4Network("192.0.0.0/24")
"""Not global (IANA); some Python 3.11 releases call most of it global."""
_METADATA = frozenset(
    # Metadata services on addresses that look public. The others are refused by their range:
    # 169.254.169.254 (AWS, GCP, Azure IMDS, OpenStack) is link-local, fd00:ec2::254 (AWS over
    # IPv6) private, 100.100.100.200 (Alibaba) shared address space.
    {
        ipaddress.IPv4Address("168.63.129.16"),  # Azure WireServer
        ipaddress.IPv4Address("192.0.0.192"),  # Oracle Cloud
    }
)


class HostRefused(ToolError):
    """The guard refused a host; `reason` completes "refused to fetch URL: ..."."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

    def sentence(self, url: str) -> str:
        """The sentence the model reads."""
        return refusal(url, self.reason)


class HostNotFound(HostRefused):
    """The host's name could not be looked up (DNS): no guard refused it."""

    def sentence(self, url: str) -> str:
        return f"could not fetch {url!r}: {self.reason}"


def refusal(url: str, reason: str) -> str:
    """The sentence the model reads."""
    return f"refused to fetch {url!r}: {reason}"


def vet_url(url: str, allow_hosts: Collection[str]) -> str | None:
    """The checks that need no lookup: an http(s) URL with a host, and, when the host is an
    address, that address. None when the URL may go on to a connection (which checks again)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return refusal(url, f"not a valid URL ({exc})")
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        return refusal(url, "only http and https URLs can be fetched")
    host = parts.hostname
    if not host:
        return refusal(url, "the URL names no host")
    literal = _literal(host)
    if literal is None or _is_allowed(host, port or _DEFAULT_PORTS[scheme], allow_hosts):
        return None
    reason = _judge(host, [literal])
    return None if reason is None else refusal(url, reason)


async def check_url(
    url: str, allow_hosts: Collection[str], resolver: Resolver | None = None
) -> str | None:
    """Return None when `url` may be fetched, else a refusal the model can read. The answer
    holds only for this lookup: a connection that resolves again may get another one."""
    early = vet_url(url, allow_hosts)
    if early is not None:
        return early
    parts = urlsplit(url)
    port = parts.port or _DEFAULT_PORTS[parts.scheme.lower()]
    try:
        await resolve_checked(parts.hostname or "", port, allow_hosts, resolver)
    except HostRefused as exc:
        return exc.sentence(url)
    return None


async def resolve_checked(
    host: str, port: int, allow_hosts: Collection[str], resolver: Resolver | None = None
) -> list[IPAddress]:
    """Look `host` up once and return the addresses to connect to, or raise HostRefused.

    Every address of the answer is judged (one non-public address refuses the host), unless
    the host is allowed, in which case the answer is used as it is.
    """
    literal = _literal(host)
    if literal is not None:
        addresses: list[IPAddress] = [literal]
    else:
        try:
            addresses = _unique(await (resolver or system_resolver)(host))
        except UnicodeError as exc:  # no name a lookup could answer: refused as it is spelled
            raise HostRefused(f"the host {host!r} could not be resolved ({exc})") from None
        except OSError as exc:
            raise HostNotFound(
                f"the host {host!r} was not found: its DNS lookup failed ({exc}); check its "
                "spelling and this machine's network (Keel's host guard refused nothing)"
            ) from None
    if not addresses:
        raise HostRefused(f"the host {host!r} resolved to no address")
    if not _is_allowed(host, port, allow_hosts):
        reason = _judge(host, addresses)
        if reason is not None:
            raise HostRefused(reason)
    return addresses


async def system_resolver(host: str) -> list[IPAddress]:
    """The operating system's resolver (getaddrinfo), as every other program on the host."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    addresses: list[IPAddress] = []
    for family, _type, _proto, _name, sockaddr in infos:
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        text = str(sockaddr[0])
        scope = sockaddr[3] if len(sockaddr) == 4 else 0
        if scope and "%" not in text:
            text = f"{text}%{scope}"  # keep the scope: fe80::1 means nothing without it
        addresses.append(ipaddress.ip_address(text))
    return addresses


def _literal(host: str) -> IPAddress | None:
    """The address written in the URL, if the host is one (scope ids kept)."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _unique(addresses: Sequence[IPAddress]) -> list[IPAddress]:
    unique: list[IPAddress] = []
    for address in addresses:
        if address not in unique:
            unique.append(address)
    return unique


def _is_allowed(host: str, port: int, allow_hosts: Collection[str]) -> bool:
    """Match `host` or `host:port` (IPv6 with or without brackets), ignoring case."""
    if not allow_hosts:
        return False
    allowed = {entry.strip().lower() for entry in allow_hosts}
    host = host.lower()
    bracketed = f"[{host}]" if ":" in host else host
    return bool({host, bracketed, f"{bracketed}:{port}"} & allowed)


def _judge(host: str, addresses: Sequence[IPAddress]) -> str | None:
    """Why `host` may not be reached at `addresses`, or None when all of them are public."""
    for address in addresses:
        category = _category(address)
        if category is not None:
            return (
                f"the host {host!r} resolves to {address}, a {category} address; web tools only "
                "reach public hosts unless the host is allowed (allow_hosts)"
            )
    return None


def _category(address: IPAddress) -> str | None:
    """What kind of non-public address this is, or None for a public one."""
    embedded = _embedded_ipv4(address)
    if embedded is not None:
        kind, inner = embedded
        category = _category(inner)
        return None if category is None else f"{category} ({kind} of {inner})"
    if address in _METADATA:
        return "cloud metadata"
    if _within(address, _LOCAL_NAT64):
        return "private (local-use NAT64)"
    checks = (
        ("unspecified", address.is_unspecified),
        ("loopback", address.is_loopback),
        ("link-local", address.is_link_local),
        ("multicast", address.is_multicast),
        ("private", address.is_private),
        ("reserved", address.is_reserved),
        ("reserved (IETF protocol assignments)", _within(address, _IETF_ASSIGNMENTS)),
        ("non-public", not address.is_global),
    )
    for name, hit in checks:
        if hit:
            return name
    return None


def _within(address: IPAddress, network: ipaddress.IPv4Network | ipaddress.IPv6Network) -> bool:
    """Membership by number, so a scope id (``%eth0``) does not hide an address."""
    if address.version != network.version:
        return False
    first = int(network.network_address)
    return first <= int(address) < first + network.num_addresses


def _embedded_ipv4(address: IPAddress) -> tuple[str, ipaddress.IPv4Address] | None:
    """The IPv4 address an IPv6 address stands for: ``::ffff:127.0.0.1`` is 127.0.0.1 to the
    kernel, ``64:ff9b::7f00:1`` to a NAT64 gateway, ``2002:7f00:1::`` to a 6to4 relay."""
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return "IPv4-mapped form", address.ipv4_mapped
    if int(address) >> 32 == _NAT64_PREFIX:
        return "NAT64 form", ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address.sixtofour is not None:
        return "6to4 form", address.sixtofour
    return None
