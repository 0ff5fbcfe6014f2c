"""Envoy Gateway's own translation of deploy/overlays/envoy-gateway, through its `egctl`.

`egctl x translate --from gateway-api --to gateway-api,xds` runs Envoy Gateway's translator
(the code its controller runs) on a file of objects and prints the objects with their status
plus the xDS it would serve. The input is the overlay as `kubectl kustomize` renders it, a
GatewayClass for its `eg` class (a cluster has one; the overlay does not ship it), and one
Service per member of the example pool (deploy/examples/), as LLMKube creates them, and one per
IfIdle fallback it names.
"""

from __future__ import annotations

import copy
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from devstack.procs import PROJECT_ROOT, tool_binary
from extproc.platform.kube.activation import fallback_backends

EGCTL_ENV = "MODELPOOL_EGCTL_BIN"
EXAMPLE_POOL = PROJECT_ROOT / "deploy/examples/shared-gpu.yaml"
EXTPROC_SERVICE = "modelpool-extproc"
MEMBER_PORT = 8080  # LLMKube's Service port for an InferenceService
GATEWAY_CLASS = {
    "apiVersion": "gateway.networking.k8s.io/v1",
    "kind": "GatewayClass",
    "metadata": {"name": "eg"},
    "spec": {"controllerName": "gateway.envoyproxy.io/gatewayclass-controller"},
}


def egctl_binary() -> Path:
    """Path of egctl: $MODELPOOL_EGCTL_BIN, else the one `make egctl` links into .tools/."""
    return tool_binary(EGCTL_ENV, ".tools/envoy-gateway/egctl",
                       "run `make egctl` (builds Envoy Gateway's egctl from the Go module "
                       "proxy; minutes the first time)")


@dataclass(frozen=True)
class ExamplePool:
    """The example ModelPool the overlay routes for: where it lives and who its members are."""

    namespace: str
    name: str
    members: tuple[str, ...]
    default: str
    swap_budget: str
    fallbacks: tuple[str, ...] = ()  # the IfIdle fallbacks' Services (its annotation)

    @classmethod
    def load(cls, path: Path = EXAMPLE_POOL) -> "ExamplePool":
        """Read deploy/examples/shared-gpu.yaml."""
        pool = yaml.safe_load(path.read_text(encoding="utf-8"))
        spec = pool["spec"]
        members = tuple(m["inferenceServiceRef"]["name"] for m in spec["members"])
        backends = fallback_backends(pool["metadata"].get("annotations") or {}, members, [])
        return cls(pool["metadata"]["namespace"], pool["metadata"]["name"], members,
                   spec.get("default", ""), spec.get("swapBudget", "300s"),
                   tuple(dict.fromkeys(service for service, _ in backends.values())))

    def pools_file(self) -> str:
        """The same pool as a static pools file for the service (no Kubernetes here)."""
        return yaml.safe_dump({"pools": [{
            "namespace": self.namespace, "name": self.name, "members": list(self.members),
            "default": self.default, "swapBudget": self.swap_budget}]})


@dataclass
class TranslationInput:
    """The objects handed to egctl, and which Service address stands for which backend.

    Envoy Gateway routes a Service backend to its ClusterIP when endpoint routing is off (as
    egctl translates): each Service here gets its own ClusterIP, so an endpoint in the xDS
    output names its backend unambiguously, whatever cluster name the translator chose.
    """

    objects: list[dict[str, Any]]
    backends: dict[tuple[str, int], tuple[str, int]]  # (ClusterIP, port) -> (Service, port)


def translation_input(overlay: list[dict[str, Any]], pool: ExamplePool) -> TranslationInput:
    """GatewayClass + the overlay's objects + the pool's member (and fallback) Services, with
    ClusterIPs."""
    objects = [GATEWAY_CLASS]
    backends: dict[tuple[str, int], tuple[str, int]] = {}
    services = 0
    for doc in overlay:
        doc = copy.deepcopy(doc)
        if doc["kind"] == "Service":
            ip, services = _cluster_ip(services), services + 1
            doc["spec"]["clusterIP"] = ip
            backends.update({(ip, p["port"]): (doc["metadata"]["name"], p["port"])
                             for p in doc["spec"]["ports"]})
        objects.append(doc)
    for member in pool.members + pool.fallbacks:
        ip, services = _cluster_ip(services), services + 1
        objects.append({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": member, "namespace": pool.namespace},
            "spec": {"clusterIP": ip, "selector": {"app": member},
                     "ports": [{"name": "http", "port": MEMBER_PORT, "targetPort": MEMBER_PORT}]},
        })
        backends[(ip, MEMBER_PORT)] = (member, MEMBER_PORT)
    return TranslationInput(objects, backends)


def _cluster_ip(index: int) -> str:
    return f"10.96.0.{10 + index}"


@dataclass
class Translation:
    """egctl's answer: the objects with the status Envoy Gateway gave them, and its xDS."""

    objects: dict[str, list[dict[str, Any]]]  # egctl's resource lists, e.g. "httpRoutes"
    xds: dict[str, Any]  # one config dump per Gateway, keyed "<namespace>/<name>"

    def status_of(self, kind_list: str, name: str) -> dict[str, Any]:
        """The .status of one translated object (kind_list as egctl names it)."""
        found = [o for o in self.objects.get(kind_list) or [] if o["metadata"]["name"] == name]
        assert len(found) == 1, f"{kind_list}/{name}: {len(found)} objects in egctl's output"
        return found[0].get("status") or {}


def translate(given: TranslationInput, workdir: Path) -> Translation:
    """Run `egctl x translate` on the input; raise with egctl's stderr if it fails."""
    workdir.mkdir(parents=True, exist_ok=True)
    source = workdir / "gateway-input.yaml"
    source.write_text(yaml.safe_dump_all(given.objects), encoding="utf-8")
    args = [str(egctl_binary()), "x", "translate", "--from", "gateway-api",
            "--to", "gateway-api,xds", "--type", "all", "--output", "json", "--file", str(source)]
    out = subprocess.run(args, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({out.returncode}):\n{out.stderr}")
    (workdir / "gateway-translation.json").write_text(out.stdout, encoding="utf-8")
    result = json.loads(out.stdout)
    xds = result.pop("xds", None) or {}
    return Translation(result, xds)
