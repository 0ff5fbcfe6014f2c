"""Whether a request's header block is well formed (RFC 9113 §8.1.1, §8.2, §8.3.1).

A malformed request is a stream error of type PROTOCOL_ERROR: the connection resets that
stream and keeps the others. Values are not judged here beyond what the framing needs; the
gRPC layer above refuses what is well formed but not gRPC.
"""

from __future__ import annotations

_REQUEST_PSEUDO = frozenset({b":method", b":scheme", b":authority", b":path"})
# §8.2.2: hop-by-hop fields have no meaning in HTTP/2
_CONNECTION_SPECIFIC = frozenset({b"connection", b"keep-alive", b"proxy-connection",
                                  b"transfer-encoding", b"upgrade"})


def malformed(headers: list[tuple[bytes, bytes]]) -> str:
    """Why a request's fields are malformed ("" when they are not)."""
    seen: set[bytes] = set()
    regular = False
    for name, value in headers:
        if name.startswith(b":"):
            if regular:
                return f"pseudo-header {name!r} after a regular field"
            if name not in _REQUEST_PSEUDO:
                return f"pseudo-header {name!r} is not a request's"
            if name in seen:
                return f"pseudo-header {name!r} twice"
            seen.add(name)
            continue
        regular = True
        if name.lower() != name:
            return f"field name {name!r} has upper-case letters"
        if name in _CONNECTION_SPECIFIC:
            return f"connection-specific field {name!r}"
        if name == b"te" and value != b"trailers":
            return "te other than trailers"
    if b":method" not in seen:
        return "no :method"
    if b":path" not in seen and b":scheme" not in seen:
        return ""  # CONNECT (§8.5) names only :authority; refused above as not gRPC
    if b":scheme" not in seen or b":path" not in seen:
        return "no :scheme or :path"
    if any(name == b":path" and not value for name, value in headers):
        return "empty :path"
    return ""


def content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    """The declared content-length (None when absent or not a number)."""
    for name, value in headers:
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None
