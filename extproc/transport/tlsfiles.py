"""The gRPC listener's TLS files, re-read when they change (certificate rotation).

cert-manager, a Secret volume or any renewal job rewrites ``--tls-cert``, ``--tls-key`` and
``--tls-client-ca`` in place (a Secret volume swaps a symlink, so the inode changes). Each new
TLS handshake compares the files' (inode, mtime, size) with those last loaded, a few stat calls,
and loads them anew when one differs: new connections get the new certificate and CA while
open ones keep the session they negotiated. A half-written pair (a certificate whose key is
not there yet) fails to load; the previous one stays in use and the next handshake tries again.

The native server swaps the connection's SSLContext in OpenSSL's servername callback, which
runs on every ClientHello (with or without SNI); grpcio asks a certificate fetcher per
handshake. Both go through ``TlsFiles.refresh``.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import grpc

from ..logs import get_logger
from .listener import tls_context as server_context

log = get_logger(__name__)

T = TypeVar("T")
# (inode, mtime in ns, size) of each file; None for one that cannot be read
Signature = tuple[tuple[int, int, int] | None, ...]


class TlsFiles:
    """A certificate, its key and an optional client CA, re-loaded when a file changes."""

    def __init__(self, cert: str, key: str, client_ca: str = "") -> None:
        self.paths = tuple(p for p in (cert, key, client_ca) if p)
        self.cert, self.key, self.client_ca = cert, key, client_ca
        self._seen = self._signature()
        self._failed: Signature | None = None

    def _signature(self) -> Signature:
        """(inode, mtime, size) of each file (stat follows a Secret volume's symlinks)."""
        out: list[tuple[int, int, int] | None] = []
        for path in self.paths:
            try:
                st = os.stat(path)
            except OSError:
                out.append(None)
                continue
            out.append((st.st_ino, st.st_mtime_ns, st.st_size))
        return tuple(out)

    def refresh(self, load: Callable[[], T]) -> T | None:
        """``load()``'s result when the files changed since the last load, else None.

        A load that fails (files half-written, unreadable) is logged once per change and
        returns None: the caller keeps what it has.
        """
        now = self._signature()
        if now == self._seen or now == self._failed:
            return None
        try:
            loaded = load()
        except (OSError, ssl.SSLError, ValueError) as exc:
            self._failed = now
            log.warning("tls files changed but do not load; keeping the previous ones",
                        files=list(self.paths), error=str(exc))
            return None
        self._seen, self._failed = now, None
        log.info("tls files reloaded", files=list(self.paths))
        return loaded

    def native_context(self) -> ssl.SSLContext:
        """A context for the native server whose handshakes pick up rotated files."""
        state = {"current": server_context(self.cert, self.key, self.client_ca)}

        def on_hello(conn: ssl.SSLObject | ssl.SSLSocket, _name: str | None,
                     _ctx: ssl.SSLContext) -> None:
            fresh = self.refresh(
                lambda: server_context(self.cert, self.key, self.client_ca))
            if fresh is not None:
                state["current"] = fresh
            if conn.context is not state["current"]:
                conn.context = state["current"]

        first = state["current"]
        first.sni_callback = on_hello
        return first

    def grpc_credentials(self) -> grpc.ServerCredentials:
        """grpcio server credentials whose handshakes pick up rotated files."""
        return grpc.dynamic_ssl_server_credentials(
            self._grpc_config(), lambda: self.refresh(self._grpc_config),
            require_client_authentication=bool(self.client_ca))

    def _grpc_config(self) -> Any:
        """grpcio's certificate configuration from the files as they are now."""
        cert, key = Path(self.cert).read_bytes(), Path(self.key).read_bytes()
        ca = Path(self.client_ca).read_bytes() if self.client_ca else None
        # a key that does not match the certificate must fail here, not in the handshake
        server_context(self.cert, self.key)
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)
