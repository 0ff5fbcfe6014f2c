"""What a ModelPool needs behind an InferencePool gateway: the pool, its route, its pod label.

With ``--endpoint-picker`` any gateway that implements the Gateway API inference extension
routes a ModelPool without policy of ours: an HTTPRoute whose backend is an InferencePool,
and the InferencePool naming this service as its endpoint picker. The InferencePool's
selector must cover the pods of *all* the pool's members (the picker names a pod of the
resident one, and the gateway only accepts pods its InferencePool selects). LLMKube labels a
pod with its own member's name only, so each member InferenceService gets the pool label
through ``spec.podLabels``: ``modelpool.inference.llmkube.dev/pool: <ModelPool name>``.

``modelpool-extproc render-routes --format inferencepool`` prints all of it; the chart and
``deploy/overlays/inference-pool`` render the same objects.
"""

from __future__ import annotations

import json
from typing import Any

import yaml
from extproc.names import POOL_LABEL

#: The label every member's pods carry (spec.podLabels) and the InferencePool selects.
API_VERSION = "inference.networking.k8s.io/v1"
PICKER_SERVICE, PICKER_PORT = "modelpool-extproc", 9002  # the base's Service and gRPC port


def inference_pool(name: str, namespace: str, target_port: int,
                   picker: str = PICKER_SERVICE) -> dict[str, Any]:
    """The ModelPool's InferencePool: its members' pods, this service as the picker."""
    return {"apiVersion": API_VERSION, "kind": "InferencePool",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"selector": {"matchLabels": {POOL_LABEL: name}},
                     "targetPorts": [{"number": target_port}],
                     "endpointPickerRef": {"name": picker, "port": {"number": PICKER_PORT},
                                           "failureMode": "FailClose"}}}


def pool_route(name: str, namespace: str, gateway: str) -> dict[str, Any]:
    """The HTTPRoute sending all of the OpenAI API to the InferencePool."""
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"parentRefs": [{"name": gateway}], "rules": [{
                "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                "backendRefs": [{"group": "inference.networking.k8s.io",
                                 "kind": "InferencePool", "name": name}],
                # no route timeout: a long generation must not be cut
                "timeouts": {"request": "0s"}}]}}


def label_patch(pool: str) -> str:
    """The merge patch that puts a member's pods into the pool's InferencePool."""
    return json.dumps({"spec": {"podLabels": {POOL_LABEL: pool}}}, separators=(",", ":"))


def render(pools: list[tuple[str, str, tuple[str, ...]]], gateway: str,
           target_port: int) -> str:
    """``render-routes --format inferencepool``: the commands to label each member, as YAML
    comments, then every pool's InferencePool and HTTPRoute. ``pools``: (namespace, name,
    members)."""
    lines = ["# Label each member's pods for its pool's InferencePool (LLMKube applies "
             "spec.podLabels to the pods it creates):"]
    documents: list[dict[str, Any]] = []
    for namespace, name, members in pools:
        lines += [f"#   kubectl -n {namespace} patch inferenceservice {m} --type merge "
                  f"-p '{label_patch(name)}'" for m in members]
        documents += [inference_pool(name, namespace, target_port),
                      pool_route(name, namespace, gateway)]
    lines.append("# Run the service with --endpoint-picker "
                 f"--endpoint-port {target_port} (env MODELPOOL_ENDPOINT_PICKER=true).")
    return "\n".join(lines) + "\n" + yaml.safe_dump_all(documents, sort_keys=False)



def unpooled(pools: list[tuple[str, str]], rendered: list[dict[str, Any]]) -> list[str]:
    """``check-config --routes`` behind a picker: a warning per pool ((namespace, name)) that
    the rendered manifests give no InferencePool selecting its pool label."""
    selected = {((d.get("metadata") or {}).get("namespace", ""),
                 ((d.get("spec") or {}).get("selector") or {}).get("matchLabels", {})
                 .get(POOL_LABEL)) for d in rendered if d.get("kind") == "InferencePool"}
    return [f"pool {ns}/{name} has no InferencePool selecting {POOL_LABEL}: {name} in the "
            "rendered manifests; print one with: modelpool-extproc render-routes POOL.yaml "
            "--format inferencepool" for ns, name in pools if (ns, name) not in selected]
