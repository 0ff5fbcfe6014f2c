"""The local stack (devstack.stack.LocalStack) with the real kube-apiserver in the emulator's
place: simulator, ext_proc and Envoy as in the e2e suite, the API server from the session.

The stack's kubeconfig users map onto the control plane's static tokens (`stack`,
`simulator`), except the ext_proc's, which can be a ServiceAccount token from TokenRequest so
that RBAC, not system:masters, decides what it may do. The emulator's request record has no
counterpart here: the API server's audit log is the record.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from control_plane import ControlPlane
from devstack.procs import PROJECT_ROOT
from devstack.stack import LocalStack
from devstack.stack_ports import Ports
from downward import as_flags, downward_env, service_container

EXTPROC_USER = "modelpool-extproc"
# deploy/base's identity for the service: its ServiceAccount, its Roles (the pools', the
# Leases') and their RoleBindings
RBAC_KINDS = ("ServiceAccount", "Role", "RoleBinding")


class RealApiStack(LocalStack):
    """LocalStack against ``plane``; the ext_proc authenticates with ``extproc_token``."""

    def __init__(self, plane: ControlPlane, workdir: Path, docs: list[dict[str, Any]], *,
                 extproc_token: str, **kwargs: Any) -> None:
        members = [d["metadata"]["name"] for d in docs if d["kind"] == "InferenceService"]
        super().__init__(workdir, docs, Ports.free(members), **kwargs)
        self.plane = plane
        self.extproc_token = extproc_token
        self.kubeapi_url = plane.url  # the real API server, not an emulator

    def _start_kubeapi(self, timeout: float) -> None:
        """Nothing to start: write the `stack` user's kubeconfig and create the namespaces."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.plane.write_kubeconfig(self.kubeconfig, token=self.plane.token_of("stack"),
                                    namespace=self.namespaces[0])
        for namespace in self.namespaces:
            self.plane.ensure_namespace(namespace)

    def _user_kubeconfig(self, user: str, path: Path | None = None) -> Path:
        """A kubeconfig for one of the stack's users (the ext_proc's carries its own token)."""
        token = self.extproc_token if user == EXTPROC_USER else self.plane.token_of(user)
        return self.plane.write_kubeconfig(path or self.workdir / f"{user}.kubeconfig",
                                           token=token, namespace=self.namespaces[0])

    def get(self, path: str) -> Any:
        """GET an API path as the `stack` user; parsed JSON."""
        return self.plane.request("GET", path, token=self.plane.token_of("stack"))


def deploy_base_rbac(plane: ControlPlane) -> list[dict[str, Any]]:
    """The service's ServiceAccount, Role and RoleBinding as `kubectl kustomize deploy/base`
    renders them (namespace `llm`)."""
    rendered = plane.kubectl("kustomize", str(PROJECT_ROOT / "deploy" / "base")).stdout
    return [d for d in yaml.safe_load_all(rendered) if d and d["kind"] in RBAC_KINDS]


def deploy_base_pod_args(plane: ControlPlane, namespace: str) -> list[str]:
    """The flags that stand for what deploy/base's pod gets from the downward API (its name as
    the replica name, its namespace as the Lease namespace), for a pod in ``namespace``."""
    rendered = plane.kubectl("kustomize", str(PROJECT_ROOT / "deploy" / "base")).stdout
    container = service_container([d for d in yaml.safe_load_all(rendered) if d])
    return as_flags(downward_env(container, namespace))


def service_account_token(plane: ControlPlane, namespace: str, name: str) -> str:
    """A one-hour token for the ServiceAccount, from the TokenRequest API."""
    answer = plane.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
                           {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                            "spec": {"expirationSeconds": 3600}})
    return answer["status"]["token"]


def audit_requests(plane: ControlPlane, username: str) -> list[dict[str, Any]]:
    """The audited requests of ``username`` as tests/deploy/rbac.py records, plus the code."""
    found = []
    for event in plane.audit_events():
        if event.get("user", {}).get("username") != username:
            continue
        ref = event.get("objectRef") or {}
        found.append({"verb": event["verb"], "group": ref.get("apiGroup") or "",
                      "resource": ref.get("resource") or "",
                      "subresource": ref.get("subresource") or "",
                      "namespace": ref.get("namespace") or "", "name": ref.get("name") or "",
                      "code": (event.get("responseStatus") or {}).get("code"),
                      "uri": event.get("requestURI", "")})
    return found

