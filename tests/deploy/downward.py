"""A container's environment as the kubelet resolves it in one pod, and as service flags.

The manifests give the service its replica name and Lease namespace through the downward API
(`fieldRef` metadata.name / metadata.namespace). Tests that run the service outside a pod
(the e2e stack, the real-API-server stack) resolve the same entries for a pod of their choosing
and pass them as the flags the variables stand for, so the process runs as the pod would.
Loaded by path from e2e/ (tests/ is not a package).
"""

from __future__ import annotations

from typing import Any

#: The pod the tests pretend to be (a Deployment's pods get generated names like this one).
POD_NAME = "modelpool-extproc-7d9f8b6c5d-x2k4p"
#: The only downward-API fields the manifests use.
FIELDS = ("metadata.name", "metadata.namespace")


def pod_env(container: dict[str, Any], namespace: str, pod_name: str = POD_NAME) -> dict[str, str]:
    """``container``'s env in pod ``pod_name`` of ``namespace``: literal values and fieldRefs."""
    fields = {"metadata.name": pod_name, "metadata.namespace": namespace}
    env: dict[str, str] = {}
    for entry in container.get("env", []):
        if "valueFrom" in entry:
            assert set(entry) == {"name", "valueFrom"}, entry
            (source,) = entry["valueFrom"].values()
            assert set(entry["valueFrom"]) == {"fieldRef"}, entry
            assert source["fieldPath"] in FIELDS, entry
            env[entry["name"]] = fields[source["fieldPath"]]
        else:
            env[entry["name"]] = entry["value"]
    return env


def downward_env(container: dict[str, Any], namespace: str,
                 pod_name: str = POD_NAME) -> dict[str, str]:
    """Only the variables ``container`` takes from the downward API, resolved."""
    names = {e["name"] for e in container.get("env", []) if "valueFrom" in e}
    return {k: v for k, v in pod_env(container, namespace, pod_name).items() if k in names}


def as_flags(env: dict[str, str], prefix: str = "MODELPOOL_") -> list[str]:
    """``MODELPOOL_LEASE_NAMESPACE=llm`` as ``--lease-namespace llm`` (the service's own mapping
    between a setting's variable and its flag)."""
    flags: list[str] = []
    for name, value in env.items():
        assert name.startswith(prefix), name
        flags += ["--" + name.removeprefix(prefix).lower().replace("_", "-"), value]
    return flags


def service_container(objs: list[dict[str, Any]], name: str = "modelpool-extproc") -> dict[str, Any]:
    """The service's container in rendered manifests."""
    (dep,) = [o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == name]
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    return container
