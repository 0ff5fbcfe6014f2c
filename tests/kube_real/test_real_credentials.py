"""A cloud login's token that the real API server stops accepting: the exec plugin (or the
auth-provider) is run again on the 401 and the call goes through, as kubectl does (EKS tokens
last 15 minutes)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from control_plane import ADMIN, ControlPlane
from exec_plugins import counting_plugin, exec_user
from platform_entry import Credentials, KubeClient, credentials_module, from_kubeconfig

pytestmark = pytest.mark.kube_real

BETA = "client.authentication.k8s.io/v1beta1"


async def test_exec_plugin_runs_again_after_a_401(control_plane: ControlPlane,
                                                  tmp_path: Path) -> None:
    # no expiry: only the server can say the first token is over
    good = control_plane.token_of(ADMIN)
    plugin, runs = counting_plugin(
        tmp_path, f'{{"token": "expired-token" if n == 1 else {good!r}}}', BETA)
    path = control_plane.write_kubeconfig(tmp_path / "kc", token="unused")
    config = yaml.safe_load(path.read_text())
    config["users"][0]["user"] = exec_user(plugin, BETA)
    path.write_text(yaml.safe_dump(config))
    client = KubeClient(await from_kubeconfig(str(path)))
    try:
        status, body = await client.call("GET", "/api/v1/namespaces")
        assert status == 200 and body["kind"] == "NamespaceList"
        status, _ = await client.call("GET", "/api/v1/namespaces/default")
        assert status == 200
    finally:
        await client.close()
    assert runs.read_text() == "2"  # once at start, once for the 401, not per call


async def test_auth_provider_is_loaded_again_after_a_401(control_plane: ControlPlane,
                                                         tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # The kubernetes package's loader stands in for a provider whose cached token the server
    # no longer takes: the first load gives that token, the next a good one.
    assert control_plane.pki is not None
    tokens = ["expired-token", control_plane.token_of(ADMIN)]
    loads: list[str] = []

    async def load(path: str) -> Credentials:
        loads.append(path)
        return Credentials(server=control_plane.url,
                           ca_data=control_plane.pki.ca_cert.read_text(),  # type: ignore[union-attr]
                           token=tokens[min(len(loads), 2) - 1])

    monkeypatch.setattr(credentials_module, "_kubernetes_package_load", load)
    path = control_plane.write_kubeconfig(tmp_path / "kc", token="unused")
    config = yaml.safe_load(path.read_text())
    config["users"][0]["user"] = {"auth-provider": {"name": "oidc", "config": {}}}
    path.write_text(yaml.safe_dump(config))
    client = KubeClient(await from_kubeconfig(str(path)))
    try:
        status, _ = await client.call("GET", "/api/v1/namespaces")
    finally:
        await client.close()
    assert status == 200 and loads == [str(path)] * 2
