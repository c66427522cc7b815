"""Whether a gRPC address stays on this machine: the client sends a token in the clear only to
such an address, and the server serves without TLS and tokens only on one (unless told
`--insecure`)."""

from __future__ import annotations

import ipaddress


def split_address(address: str) -> tuple[str, str]:
    """`host:port` (an IPv6 host in brackets) -> (host, port); a bare host gives port ''."""
    if address.startswith("["):
        host, _, rest = address[1:].partition("]")
        return host, rest.removeprefix(":")
    if address.count(":") == 1:
        host, _, port = address.partition(":")
        return host, port
    return address, ""


def is_loopback_host(host: str) -> bool:
    """`localhost`, 127.0.0.0/8 or ::1. Any other name is taken as reaching the network: it
    resolves elsewhere, and an empty host, 0.0.0.0 or :: mean every interface."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def is_unix_socket(address: str) -> bool:
    return address.startswith(("unix:", "unix-abstract:"))


def is_local_address(address: str) -> bool:
    """A Unix socket or a loopback `host:port`."""
    return is_unix_socket(address) or is_loopback_host(split_address(address)[0])
