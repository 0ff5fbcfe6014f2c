"""Behind an InferencePool gateway (--endpoint-picker): does the pool's InferencePool select
exactly its members' pods?

Run by the route check (``route_check_interval``) in place of the HTTPRoute comparison: the
gateway only sends to pods its InferencePool selects, so a member whose pods it does not
select cannot be served, and a pod it selects that belongs to no member could be picked by
nothing but is still the gateway's to send to on a picker failure. Each finding is a Warning
Event on the ModelPool (RBAC: ``inference.networking.k8s.io`` ``inferencepools`` ``list``,
and ``pods`` ``list``, which the pod watch has already).
"""

from __future__ import annotations

from typing import Any

from extproc.names import POOL_LABEL, SERVICE_LABEL
from extproc.platform.kube._calls import counted, segment
from extproc.platform.kube.objects import pod_member
from extproc.platform.kube.rest import KubeClient
from extproc.policy.model import PoolSpec

POOL_GROUP, POOL_VERSION, POOL_PLURAL = "inference.networking.k8s.io", "v1", "inferencepools"
FOREIGN, UNSELECTED = "InferencePoolSelectsForeignPods", "MemberNotInInferencePool"


def _selector(inference_pool: dict[str, Any]) -> str:
    labels = ((inference_pool.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


async def findings(api: KubeClient, spec: PoolSpec,
                   inference_pools: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(reason, message) for each problem of the pool's InferencePools (those that select
    the pool label of this pool, or carry its name); none when there is no InferencePool."""
    key = spec.key
    ours = [p for p in inference_pools if p["metadata"]["name"] == key.name
            or ((p.get("spec") or {}).get("selector") or {}).get("matchLabels", {}).get(
                POOL_LABEL) == key.name]
    problems: list[tuple[str, str]] = []
    for inference_pool in ours:
        name, selector = inference_pool["metadata"]["name"], _selector(inference_pool)
        pods = (await counted("list", "pods", api.call(
            "GET", f"/api/v1/namespaces/{segment(key.namespace)}/pods",
            params={"labelSelector": selector}))).get("items") or [] if selector else []
        selected = {pod_member(p) for p in pods}
        foreign = sorted(p["metadata"]["name"] for p in pods
                         if pod_member(p) not in spec.members)
        if foreign:
            problems.append((FOREIGN, f"InferencePool {name} selects pods of no member of "
                             f"this pool: {', '.join(foreign)}; the gateway may send to them"))
        missing = [m for m in spec.members if m not in selected]
        running = [m for m in missing if await _has_pods(api, key.namespace, m)]
        if running:
            problems.append((UNSELECTED, f"InferencePool {name} does not select the pods of "
                             f"{', '.join(running)}: label them with spec.podLabels "
                             f"{POOL_LABEL}: {key.name} (modelpool-extproc render-routes "
                             "--format inferencepool)"))
    return problems


async def _has_pods(api: KubeClient, namespace: str, member: str) -> bool:
    listing = await counted("list", "pods", api.call(
        "GET", f"/api/v1/namespaces/{segment(namespace)}/pods",
        params={"labelSelector": f"{SERVICE_LABEL}={member}"}))
    return bool(listing.get("items"))


async def list_inference_pools(api: KubeClient, namespace: str) -> list[dict[str, Any]]:
    """The InferencePools of a namespace."""
    listing = await counted("list", POOL_PLURAL, api.call(
        "GET", f"/apis/{POOL_GROUP}/{POOL_VERSION}/namespaces/{segment(namespace)}/"
        f"{POOL_PLURAL}"))
    return listing.get("items") or []
