"""Credentials: kubeconfig users of every plain kind, in-cluster with a rotating token, and
exec plugins (run again when their credential expires), each making real calls to the API
emulator; an auth-provider user without the kubernetes package says which extra it needs."""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import os
import ssl
import stat
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from exec_plugins import counting_plugin, exec_user
from extproc.platform.kube import credentials as creds_module
from extproc.platform.kube.client import make_api_client
from extproc.platform.kube.credentials import CredentialsError, from_kubeconfig, in_cluster
from extproc.platform.kube.rest import KubeClient
from extproc.settings import ConfigError, Settings

PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def kubeconfig(path: Path, server: str, user: dict, cluster: dict | None = None) -> Path:
    """Write a one-context kubeconfig for ``user`` at ``server``."""
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "here",
        "clusters": [{"name": "c", "cluster": {"server": server, **(cluster or {})}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "here", "context": {"cluster": "c", "user": "u"}}]}))
    return path


async def caller_of_a_call(emulator: Any, client: KubeClient) -> str:
    """List pools with ``client`` and return who the emulator says called."""
    try:
        status, body = await client.call("GET", "/apis/inference.llmkube.dev/v1alpha1/modelpools")
    finally:
        await client.close()
    assert status == 200 and body["kind"] == "ModelPoolList"
    return emulator.handler.callers[-1][0]


async def test_token_file_relative_to_the_kubeconfig(emulator: Any, tmp_path: Path) -> None:
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "token").write_text("from-file-token\n")
    path = kubeconfig(tmp_path / "kc", emulator.url, {"tokenFile": "secrets/token"})
    assert await caller_of_a_call(emulator, KubeClient(await from_kubeconfig(str(path)))) == \
        "from-file"


async def test_kubeconfig_env_list_uses_its_first_file(emulator: Any, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    first = kubeconfig(tmp_path / "first", emulator.url, {"token": "first-token"})
    second = kubeconfig(tmp_path / "second", "http://127.0.0.1:9", {"token": "second-token"})
    monkeypatch.setenv("KUBECONFIG", f"{first}{os.pathsep}{second}")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert await caller_of_a_call(emulator, await make_api_client(Settings())) == "first"


# run N's token: run<N>-token, which the emulator reports as caller run<N>
TOKEN_OF_RUN = '{"token": f"run{n}-token"'


async def test_exec_plugin_token_is_sent(emulator: Any, tmp_path: Path) -> None:
    plugin, _ = counting_plugin(tmp_path, TOKEN_OF_RUN + "}")
    path = kubeconfig(tmp_path / "kc", emulator.url, exec_user(plugin))
    assert await caller_of_a_call(emulator, KubeClient(await from_kubeconfig(str(path)))) == \
        "run1"


async def test_exec_plugin_runs_again_when_its_credential_expires(emulator: Any,
                                                                 tmp_path: Path) -> None:
    # EKS tokens last 15 minutes: the plugin says when, and is run again from then on, once.
    plugin, runs = counting_plugin(tmp_path, TOKEN_OF_RUN + ', "expirationTimestamp": '
                                   '"2000-01-01T00:00:00Z" if n == 1 else "2999-01-01T00:00:00Z"}')
    path = kubeconfig(tmp_path / "kc", emulator.url, exec_user(plugin))
    client = KubeClient(await from_kubeconfig(str(path)))
    try:
        for _ in range(3):
            await client.call("GET", "/apis/inference.llmkube.dev/v1alpha1/modelpools")
    finally:
        await client.close()
    assert [c[0] for c in emulator.handler.callers[-3:]] == ["run2"] * 3
    assert runs.read_text() == "2"


async def test_exec_plugin_failures_say_what_is_wrong(tmp_path: Path) -> None:
    failing = tmp_path / "failing.py"
    failing.write_text("import sys\nprint('no credentials: run aws sso login', "
                       "file=sys.stderr)\nsys.exit(3)\n")
    path = kubeconfig(tmp_path / "kc", "http://127.0.0.1:1", exec_user(failing))
    with pytest.raises(CredentialsError, match="exited 3: no credentials: run aws sso login"):
        await from_kubeconfig(str(path))
    path = kubeconfig(tmp_path / "kc", "http://127.0.0.1:1", {"exec": {
        "apiVersion": "client.authentication.k8s.io/v1", "command": "no-such-plugin-here",
        "installHint": "install it with brew"}})
    with pytest.raises(CredentialsError, match="cannot run.*install it with brew"):
        await from_kubeconfig(str(path))
    path = kubeconfig(tmp_path / "kc", "http://127.0.0.1:1",
                      exec_user(failing, interactiveMode="Always"))
    with pytest.raises(CredentialsError, match="interactiveMode Always"):
        await from_kubeconfig(str(path))


async def test_auth_provider_without_the_kubernetes_package_names_the_extra(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for module in ("kubernetes", "kubernetes.aio", "kubernetes.aio.client",
                   "kubernetes.aio.config"):
        monkeypatch.setitem(sys.modules, module, None)  # as if the extra were not installed
    path = kubeconfig(tmp_path / "kc", "https://127.0.0.1:1", {"auth-provider": {
        "name": "oidc", "config": {"id-token": "x", "idp-issuer-url": "https://127.0.0.1:2"}}})
    with pytest.raises(ConfigError) as error:
        await make_api_client(Settings(kubeconfig=str(path)))
    assert "pip install 'modelpool-extproc[auth-provider]'" in str(error.value)
    assert "\n" not in str(error.value)


async def test_certificates_and_basic_auth_are_read(tmp_path: Path) -> None:
    (tmp_path / "ca.crt").write_text(PEM)
    data = base64.b64encode(PEM.encode()).decode()
    path = kubeconfig(tmp_path / "kc", "https://127.0.0.1:6443",
                      {"client-certificate-data": data, "client-key-data": data},
                      {"certificate-authority": "ca.crt", "insecure-skip-tls-verify": True})
    found = await from_kubeconfig(str(path))
    assert found.ca_data == PEM and found.insecure
    for written in (found.cert_file, found.key_file):
        assert Path(written).read_text() == PEM
        assert stat.S_IMODE(os.stat(written).st_mode) == 0o600
    path = kubeconfig(tmp_path / "kc2", "http://127.0.0.1:1", {"username": "ann",
                                                               "password": "pw"})
    header = (await from_kubeconfig(str(path))).headers()["Authorization"]
    assert base64.b64decode(header.removeprefix("Basic ")) == b"ann:pw"


async def test_broken_kubeconfigs_say_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(CredentialsError, match="cannot read"):
        await from_kubeconfig(str(tmp_path / "absent"))
    path = kubeconfig(tmp_path / "kc", "", {"token": "t"})
    with pytest.raises(CredentialsError, match="no server"):
        await from_kubeconfig(str(path))
    config = yaml.safe_load(path.read_text())
    config["current-context"] = "elsewhere"
    path.write_text(json.dumps(config))
    with pytest.raises(CredentialsError, match="no context named 'elsewhere'"):
        await from_kubeconfig(str(path))


def test_in_cluster_token_is_re_read_as_the_kubelet_rotates_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(CredentialsError):
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        in_cluster()
    (tmp_path / "token").write_text("one")
    (tmp_path / "ca.crt").write_text(PEM)
    monkeypatch.setattr(creds_module, "SERVICE_ACCOUNT", tmp_path)
    monkeypatch.setattr(creds_module, "TOKEN_REREAD_S", 0.0)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    found = in_cluster()
    assert found.server == "https://[fd00::1]:443" and found.ca_data == PEM
    assert found.headers() == {"Authorization": "Bearer one"}
    (tmp_path / "token").write_text("two\n")
    assert found.headers() == {"Authorization": "Bearer two"}


def _pem_pair(ca: Any, ca_key: Any, common_name: str) -> tuple[str, str]:
    """A one-day client certificate for ``common_name`` signed by ``ca``: (cert, key) PEM."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    builder = (x509.CertificateBuilder().subject_name(name).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=1)))
    if ca is None:  # self-signed CA
        cert = builder.issuer_name(name).add_extension(
            x509.BasicConstraints(ca=True, path_length=None), critical=True).sign(
            key, hashes.SHA256())
    else:
        if common_name == "127.0.0.1":  # the server: its address as the name to verify
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address(common_name))]), critical=False)
        cert = builder.issuer_name(ca.subject).sign(ca_key, hashes.SHA256())
    pem_key = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    return cert.public_bytes(serialization.Encoding.PEM).decode(), pem_key


async def test_exec_plugin_client_certificates_are_renewed_for_new_connections(
        tmp_path: Path) -> None:
    from aiohttp import web
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    ca_pem, ca_key_pem = _pem_pair(None, None, "test-ca")
    ca = x509.load_pem_x509_certificate(ca_pem.encode())
    ca_key = serialization.load_pem_private_key(ca_key_pem.encode(), None)
    server_cert, server_key = _pem_pair(ca, ca_key, "127.0.0.1")
    for name, text in (("ca.crt", ca_pem), ("server.crt", server_cert),
                       ("server.key", server_key)):
        (tmp_path / name).write_text(text)
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=tmp_path / "ca.crt")
    served.load_cert_chain(tmp_path / "server.crt", tmp_path / "server.key")
    served.verify_mode = ssl.CERT_REQUIRED

    async def whoami(request: web.Request) -> web.Response:
        subject = dict(x[0] for x in request.transport.get_extra_info("peercert")["subject"])
        # one request per connection: the next request makes a new TLS handshake
        return web.json_response({"cn": subject["commonName"]},
                                 headers={"Connection": "close"})

    app = web.Application()
    app.router.add_get("/whoami", whoami)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=served)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    # the plugin hands out run1 (expired), run2 (expired), then run3 (valid)
    certs = {n: _pem_pair(ca, ca_key, f"run{n}") for n in (1, 2, 3)}
    (tmp_path / "certs.json").write_text(json.dumps(certs))
    plugin, _ = counting_plugin(tmp_path, (
        f'dict(zip(("clientCertificateData", "clientKeyData"), json.loads(pathlib.Path('
        f'{str(tmp_path / "certs.json")!r}).read_text())[str(min(n, 3))]), '
        f'expirationTimestamp="2000-01-01T00:00:00Z" if n < 3 else "2999-01-01T00:00:00Z")'))
    path = kubeconfig(tmp_path / "kc", f"https://127.0.0.1:{port}", exec_user(plugin),
                      {"certificate-authority": "ca.crt"})
    client = KubeClient(await from_kubeconfig(str(path)))
    try:
        seen = [(await client.call("GET", "/whoami"))[1]["cn"] for _ in range(3)]
    finally:
        await client.close()
        await runner.cleanup()
    assert seen == ["run2", "run3", "run3"]
