"""Credentials: kubeconfig users of every plain kind, in-cluster with a rotating token, and an
exec plugin (handed to the kubernetes package), each making real calls to the API emulator."""

from __future__ import annotations

import base64
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from extproc.platform.kube import credentials as creds_module
from extproc.platform.kube.client import make_api_client
from extproc.platform.kube.credentials import CredentialsError, from_kubeconfig, in_cluster
from extproc.platform.kube.rest import KubeClient
from extproc.settings import Settings

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


async def test_exec_plugin_goes_through_the_kubernetes_package(emulator: Any,
                                                               tmp_path: Path) -> None:
    plugin = tmp_path / "plugin.py"
    plugin.write_text("import json\nprint(json.dumps({'apiVersion': "
                      "'client.authentication.k8s.io/v1beta1', 'kind': 'ExecCredential', "
                      "'status': {'token': 'plugin-token'}}))\n")
    path = kubeconfig(tmp_path / "kc", emulator.url, {"exec": {
        "apiVersion": "client.authentication.k8s.io/v1beta1", "command": sys.executable,
        "args": [str(plugin)], "interactiveMode": "Never"}})
    assert await caller_of_a_call(emulator, KubeClient(await from_kubeconfig(str(path)))) == \
        "plugin"


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
