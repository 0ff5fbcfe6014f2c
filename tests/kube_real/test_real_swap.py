"""One end-to-end swap on the real API server, with the service running as deploy/base's
ServiceAccount: Envoy -> ext_proc -> real kube-apiserver <- member simulator (playing LLMKube).

The ext_proc authenticates with a TokenRequest token of the `modelpool-extproc` ServiceAccount,
bound by the RoleBindings to the Roles that `kubectl kustomize deploy/base` renders (the pools'
and the Leases'), so the real RBAC authorizer decides every call; it gets the replica name and
Lease namespace a pod of the base's Deployment would get from the downward API. After the swap
and a clean restart (a replica leaving deletes its Lease), the audit log shows that no call was
refused (nothing missing from the Roles) and that every verb they grant was used (nothing extra).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from control_plane import ControlPlane
from devstack import envoyproc
from devstack.stack import DEVSTACK_CRDS
from devstack.stack_manifests import dump, pool_with_members
from platform_entry import until
from rbac import rbac_covers, rbac_excess
from real_stack import (
    EXTPROC_USER,
    RealApiStack,
    audit_requests,
    deploy_base_pod_args,
    deploy_base_rbac,
    service_account_token,
)

pytestmark = pytest.mark.kube_real

NAMESPACE = "llm"  # deploy/base's namespace: its Roles and RoleBindings apply unchanged
POOL = "real-slot"
SERVICE_ACCOUNT = f"system:serviceaccount:{NAMESPACE}:{EXTPROC_USER}"


@pytest.fixture(scope="module")
def stack(control_plane: ControlPlane,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealApiStack]:
    """The stack on the real server, its ext_proc running as deploy/base's ServiceAccount."""
    try:
        envoyproc.envoy_binary()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    control_plane.ensure_namespace(NAMESPACE)
    # the local stack's ScaledObject CRD: the Role's list and watch of them are then used
    control_plane.apply_file(DEVSTACK_CRDS / "keda.sh_scaledobjects.yaml")
    control_plane.wait_established("scaledobjects.keda.sh")
    control_plane.kubectl("apply", "--server-side", "-f", "-",
                          stdin=dump(deploy_base_rbac(control_plane)))
    token = service_account_token(control_plane, NAMESPACE, EXTPROC_USER)
    docs = pool_with_members(POOL, NAMESPACE, ["judge", "coder"], default="judge")
    started = RealApiStack(control_plane, tmp_path_factory.mktemp("real-stack"), docs,
                           extproc_token=token, load_delay=0.8, unload_delay=0.3,
                           extproc_args=deploy_base_pod_args(control_plane, NAMESPACE))
    started.start()
    try:
        yield started
    finally:
        started.stop()


async def _chat(stack: RealApiStack, model: str) -> tuple[int, str]:
    """POST /v1/chat/completions through Envoy: (status, the member that answered)."""
    body = {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{stack.url}/v1/chat/completions", json=body,
                                timeout=aiohttp.ClientTimeout(total=60)) as resp:
            await resp.read()
            return resp.status, resp.headers.get("x-served-by", "")


def _member_pods(stack: RealApiStack, member: str) -> list[dict[str, Any]]:
    return stack.get(f"/api/v1/namespaces/{NAMESPACE}/pods"
                     f"?labelSelector=inference.llmkube.dev/service%3D{member}")["items"]


@pytest.fixture(scope="module")
def replies(stack: RealApiStack) -> list[tuple[int, str]]:
    """The swap both tests look at: a request for judge (the default), then one for coder."""
    async def swap() -> list[tuple[int, str]]:
        return [await _chat(stack, "judge"), await _chat(stack, "coder")]
    return asyncio.run(swap())


async def test_swap_end_to_end(stack: RealApiStack, replies: list[tuple[int, str]]) -> None:
    # the cross-model request was parked through the swap and served by the new resident
    assert replies == [(200, "judge"), (200, "coder")]
    await until(lambda: (stack.pool(POOL, NAMESPACE).get("status") or {}).get(
        "residentMember") == "coder", what="status names coder resident")
    status = stack.pool(POOL, NAMESPACE)["status"]
    assert status["phase"] == "Ready" and status["pendingMember"] == ""
    # the simulator's pods on a server with no kubelet: judge's is gone, coder's is up
    assert _member_pods(stack, "judge") == []
    (pod,) = _member_pods(stack, "coder")
    assert pod["status"]["phase"] == "Running"
    assert stack.isvc("judge")["spec"]["replicas"] == 0
    described = await asyncio.to_thread(stack.kubectl, "describe", "mpool", POOL,
                                        "-n", NAMESPACE)
    assert "SwapCompleted" in described.stdout


async def test_rbac_nothing_missing_nothing_extra(stack: RealApiStack,
                                                 replies: list[tuple[int, str]]) -> None:
    assert [code for code, _ in replies] == [200, 200]
    # the Events of the swap are written in the background: wait until they are in
    await until(lambda: any(c["verb"] == "create" and c["resource"] == "events"
                            for c in audit_requests(stack.plane, SERVICE_ACCOUNT)),
                what="the ext_proc's Events in the audit log")
    # a replica leaving (SIGTERM) deletes its membership Lease; the new process takes over
    await asyncio.to_thread(stack.restart_extproc)
    await until(lambda: any(c["verb"] == "delete" and c["resource"] == "leases"
                            for c in audit_requests(stack.plane, SERVICE_ACCOUNT)),
                what="the ext_proc's Lease delete (a clean leave) in the audit log")
    calls = audit_requests(stack.plane, SERVICE_ACCOUNT)
    refused = [c for c in calls if c["code"] in (401, 403)]
    assert refused == [], refused
    resource_calls = [c for c in calls if c["resource"]]
    assert [c["uri"] for c in calls if not c["resource"]] == []  # no discovery or /version
    # every Lease call in the base's namespace, where the Leases' Role is
    assert {c["namespace"] for c in resource_calls if c["resource"] == "leases"} == {NAMESPACE}
    roles = [d for d in deploy_base_rbac(stack.plane) if d["kind"] == "Role"]
    assert sorted(r["metadata"]["name"] for r in roles) == [EXTPROC_USER,
                                                            f"{EXTPROC_USER}-leases"]
    assert rbac_covers(roles, resource_calls) == []
    assert rbac_excess(roles, resource_calls) == []
