"""Throwaway certificates for TLS tests, made with the openssl CLI (no Python crypto package)."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pair:
    """A certificate and its private key, as PEM files."""

    cert: Path
    key: Path

    def read(self) -> tuple[bytes, bytes]:
        """(cert PEM, key PEM)."""
        return self.cert.read_bytes(), self.key.read_bytes()


def available() -> bool:
    """Whether the openssl CLI is on PATH."""
    return shutil.which("openssl") is not None


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, timeout=30)


def make_ca(directory: Path, name: str) -> Pair:
    """A self-signed CA (P-256, valid one day)."""
    pair = Pair(directory / f"{name}.crt", directory / f"{name}.key")
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", pair.key, "-out", pair.cert, "-days", "1", "-subj", f"/CN={name}",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    return pair


def make_leaf(directory: Path, name: str, ca: Pair, usage: str) -> Pair:
    """A leaf for localhost/127.0.0.1 signed by ``ca``; usage is serverAuth or clientAuth."""
    pair = Pair(directory / f"{name}.crt", directory / f"{name}.key")
    csr, extensions = directory / f"{name}.csr", directory / f"{name}.ext"
    extensions.write_text("basicConstraints=CA:FALSE\n"
                          "subjectAltName=DNS:localhost,IP:127.0.0.1\n"
                          f"extendedKeyUsage={usage}\n")
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", pair.key, "-out", csr, "-subj", f"/CN={name}")
    _openssl("x509", "-req", "-in", csr, "-CA", ca.cert, "-CAkey", ca.key, "-CAcreateserial",
             "-out", pair.cert, "-days", "1", "-extfile", extensions)
    return pair
