"""Fifty watched namespaces on a real kube-apiserver: three watches each hold a connection for
as long as they stream, and the service's writes (its Lease renewals first) must not wait
behind them.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import pytest

from control_plane import ControlPlane
from platform_entry import KubeClient, KubePlatform, PoolKey, Settings, from_kubeconfig

from devstack.testkit import eventually

from extproc.runtime.hub import Hub

pytestmark = pytest.mark.kube_real

GROUP, VERSION = "inference.llmkube.dev", "v1alpha1"
SCOPES = 50
_SERIAL = itertools.count()


def _namespaces(plane: ControlPlane) -> list[str]:
    """SCOPES fresh namespaces."""
    serial = next(_SERIAL)
    names = [f"wide-{serial}-{i}" for i in range(SCOPES)]
    for name in names:
        plane.ensure_namespace(name)
    return names


def _collections(namespace: str) -> list[str]:
    """What the service watches in one namespace: pools, members, pods."""
    return [f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/modelpools",
            f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/inferenceservices",
            f"/api/v1/namespaces/{namespace}/pods"]


async def _watch(client: KubeClient, path: str) -> Any:
    """One watch's open response; a 429 (the server paces watch starts) is tried again."""
    for _ in range(50):
        resp = await client.open("GET", path, params={"watch": True, "timeoutSeconds": 120},
                                 timeout=150.0)
        if resp.status != 429:
            return resp
        resp.release()
        await asyncio.sleep(0.2)
    return resp


async def test_a_write_completes_while_150_watches_stream(control_plane: ControlPlane,
                                                          namespace: str) -> None:
    """150 watches open at once on the service's client, then a Lease write: it is answered
    within its request timeout, and every watch is streaming."""
    scopes = _namespaces(control_plane)
    client = KubeClient(await from_kubeconfig(str(control_plane.kubeconfig)), 10.0)
    watches = [asyncio.get_running_loop().create_task(_watch(client, path))
               for scope in scopes for path in _collections(scope)]
    try:
        done, _ = await asyncio.wait(watches, timeout=30.0)
        assert len(done) == len(watches) == 3 * SCOPES, f"{len(done)} watches answered"
        assert {task.result().status for task in done} == {200}
        started = time.monotonic()
        await client.call("POST", f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases",
                          body={"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                                "metadata": {"name": "beside-watches"},
                                "spec": {"holderIdentity": "test"}},
                          content_type="application/json")
        assert time.monotonic() - started < 10.0
    finally:
        for task in watches:
            task.cancel()
        results = await asyncio.gather(*watches, return_exceptions=True)
        for result in results:
            if not isinstance(result, BaseException):
                result.close()
        await client.close()


async def test_the_service_keeps_its_lease_and_admits_with_50_namespaces(
        control_plane: ControlPlane, namespace: str) -> None:
    """The service watching 50 namespaces (151 watches with the Leases') syncs, leads the
    pool in the last one, and keeps renewing its membership Lease: it goes on admitting."""
    scopes = _namespaces(control_plane)
    last = scopes[-1]
    base = f"/apis/{GROUP}/{VERSION}/namespaces/{last}"
    control_plane.request("POST", f"{base}/inferenceservices", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "InferenceService",
        "metadata": {"name": "a"}, "spec": {"modelRef": "a", "replicas": 0}})
    control_plane.request("POST", f"{base}/modelpools", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "ModelPool", "metadata": {"name": "slot"},
        "spec": {"members": [{"inferenceServiceRef": {"name": "a"}}]}})
    settings = Settings(namespaces=scopes, lease_namespace=namespace, replica_name="r1",
                        leader_lease_duration=8.0, leader_renew_deadline=6.0, leader_retry=1.0,
                        membership_lease_duration=8.0, membership_renew=1.0, lease_margin=1.0,
                        api_retry_initial=0.05, api_retry_max=0.5, watch_timeout=60,
                        api_request_timeout=10.0)
    platform = KubePlatform(KubeClient(await from_kubeconfig(str(control_plane.kubeconfig)),
                                       10.0), settings)
    hub = Hub(settings, platform)
    task = asyncio.get_running_loop().create_task(platform.run(hub))
    lease = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/" \
        f"{platform.replicas.membership.name}"

    def renewed() -> str:
        return control_plane.request("GET", lease)["spec"]["renewTime"]

    try:
        # 151 watches start against one API server: generous bounds for a loaded machine
        await eventually(lambda: platform.synced.is_set() or task.done(), 60.0,
                         "synced in 50 namespaces")
        await eventually(lambda: platform.replicas.leads(PoolKey(last, "slot")), 60.0,
                         "the pool in the 50th namespace is led")
        assert hub.resolve("a") is not None
        # every watch is open now; the membership Lease goes on being renewed and admission
        # stays open, for two Lease durations
        deadline = time.monotonic() + 2 * settings.membership_lease_duration
        seen: set[str] = set()
        while time.monotonic() < deadline:
            seen.add(await asyncio.to_thread(renewed))
            assert hub.admit_until > time.monotonic(), "admission ran out"
            await asyncio.sleep(0.5)
        assert len(seen) >= 4, seen
        assert not task.done(), task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        hub.close()
        await platform.stop()
