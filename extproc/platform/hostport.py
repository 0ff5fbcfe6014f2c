"""Endpoints as ``ip:port`` strings, an IPv6 address in brackets: ``[fd00:10:244::5]:8000``.

This is the one spelling of an endpoint the service writes (the picker's
``x-gateway-destination-endpoint`` header and ``envoy.lb`` metadata, from a pools file or a
pod's IP): Envoy's ORIGINAL_DST cluster parses ``[v6]:port`` only, as Go's
``net.JoinHostPort`` writes it, and answers 503 "no healthy upstream" for anything else. A bare
``fd00::5:8000`` is refused, never guessed at: it is itself a valid IPv6 address.
Addresses are written canonically (``ipaddress``), so two spellings of one pod compare equal.
"""

from __future__ import annotations

import ipaddress


def join(ip: str, port: int) -> str:
    """``ip:port`` with an IPv6 ``ip`` in brackets, the address written canonically."""
    try:
        ip = str(ipaddress.ip_address(ip))
    except ValueError:
        pass  # not an address: bracketed all the same when it has a colon, as Go does
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def parse(text: str) -> str:
    """The canonical form of endpoint ``text`` (``v4:port`` or ``[v6]:port``); ValueError,
    one line, when it is neither."""
    host, _, port = text.rpartition(":")
    if not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        raise ValueError(f"{text!r} is not ip:port")
    bracketed = host.startswith("[") and host.endswith("]")
    try:
        address = ipaddress.ip_address(host[1:-1] if bracketed else host)
    except ValueError:
        raise ValueError(f"{text!r} is not ip:port") from None
    if bracketed and address.version != 6:
        raise ValueError(f"{text!r} is not ip:port (only an IPv6 address takes brackets)")
    if not bracketed and address.version == 6:
        raise ValueError(f"{text!r} is not ip:port: bracket an IPv6 address, "
                         f"as {join(host, int(port))}")
    return join(str(address), int(port))
