"""Throwaway key material for the real control plane, made with the `cryptography` package:
a CA, the API server's serving certificate, the ServiceAccount token signing key."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class ServerPki:
    """Paths of the PEM files the API server is started with."""

    ca_cert: Path
    serving_cert: Path
    serving_key: Path
    sa_private_key: Path
    sa_public_key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))


def make_server_pki(directory: Path) -> ServerPki:
    """A one-day CA, a serving certificate for 127.0.0.1/localhost, and an RSA SA key pair."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=1)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (x509.CertificateBuilder().subject_name(_name("kube-real-ca"))
               .issuer_name(_name("kube-real-ca")).public_key(ca_key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(start)
               .not_valid_after(end)
               .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                            crl_sign=True, content_commitment=False,
                                            key_encipherment=False, data_encipherment=False,
                                            key_agreement=False, encipher_only=False,
                                            decipher_only=False), critical=True)
               .sign(ca_key, hashes.SHA256()))

    leaf_key = ec.generate_private_key(ec.SECP256R1())
    alt_names = x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                             x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    leaf = (x509.CertificateBuilder().subject_name(_name("kube-apiserver"))
            .issuer_name(ca_cert.subject).public_key(leaf_key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(start)
            .not_valid_after(end).add_extension(alt_names, critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))

    # The API server signs ServiceAccount tokens with RS256 by default: an RSA key.
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pki = ServerPki(directory / "ca.crt", directory / "apiserver.crt", directory / "apiserver.key",
                    directory / "sa.key", directory / "sa.pub")
    pki.ca_cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    pki.serving_cert.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    _write_key(pki.serving_key, leaf_key)
    _write_key(pki.sa_private_key, sa_key)
    pki.sa_public_key.write_bytes(sa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return pki
