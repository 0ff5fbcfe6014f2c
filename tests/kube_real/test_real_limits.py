"""Names and texts at the API server's limits: a replica identity long enough that its
membership Lease's templated name passes 253 characters, a condition message longer than the CRD allows, and an
InferenceService big enough that its watch event outgrows an HTTP client's line buffer. The
real server's validation and encoding are the judge."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.aio import config as kconfig
from kubernetes.aio.client import CustomObjectsApi

from control_plane import ControlPlane
from platform_entry import (
    MESSAGE_LIMIT,
    TRUNCATED,
    LatestReports,
    LeaseClient,
    Load,
    MemberObservation,
    Membership,
    PoolKey,
    PoolPhase,
    PoolView,
    Settings,
    StatusWriter,
    api_client,
    until,
    watching,
)

pytestmark = pytest.mark.kube_real

GROUP, VERSION = "inference.llmkube.dev", "v1alpha1"
# A valid ModelPool name (a DNS-1123 subdomain of 253 characters)
LONG_POOL = ".".join(["p" * 62] * 4) + ".x"


@pytest.fixture
async def service(control_plane: ControlPlane) -> Any:
    """The service's own API client, as the admin."""
    async with api_client(control_plane.kubeconfig) as api:
        yield api


async def test_the_membership_lease_of_a_long_identity_is_written(service: Any,
                                                                  namespace: str) -> None:
    identity = LONG_POOL  # a pod name may be as long as this
    member = Membership(service, namespace, identity, Load, Settings())
    assert len(member.name) <= 253
    await member.start()
    try:
        lease = await LeaseClient(service, namespace).get(member.name)
        assert lease is not None and lease.holder == identity
    finally:
        await member.stop()
    assert await LeaseClient(service, namespace).get(member.name) is None  # a clean leave


async def test_a_condition_message_over_the_crd_limit_is_cut_not_refused(
        control_plane: ControlPlane, service: Any, namespace: str) -> None:
    api = await kconfig.new_client_from_config(config_file=str(control_plane.kubeconfig))
    try:
        custom = CustomObjectsApi(api)
        await custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "modelpools", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "ModelPool", "metadata": {"name": "slot"},
            "spec": {"members": [{"inferenceServiceRef": {"name": "a"}}], "default": "a"}})
        key = PoolKey(namespace, "slot")
        failure = "CUDA error: out of memory\n" + "at frame\n" * 5000  # 45,026 characters
        view = PoolView(key, PoolPhase.DEGRADED, "", "", (
            MemberObservation("a", phase="Failed", replicas=1, pods=1),),
            generation=1, failed_member="a", failed_message=failure)
        assert await StatusWriter(service).publish(view, {}) is not None  # no 422
        stored = await custom.get_namespaced_custom_object(GROUP, VERSION, namespace,
                                                           "modelpools", "slot")
    finally:
        await api.close()
    slot = next(c for c in stored["status"]["conditions"] if c["type"] == "SlotAllocated")
    assert len(slot["message"]) == MESSAGE_LIMIT and slot["message"].endswith(TRUNCATED)
    assert slot["message"].startswith("CUDA error: out of memory\n")


async def test_a_watch_event_over_a_line_buffer_is_read(control_plane: ControlPlane,
                                                        service: Any, namespace: str) -> None:
    # LLMKube's spec keeps unknown fields: 700 KB of them make a 700 KB watch event line, over
    # aiohttp's readline limit (512 KiB in 3.14) and under etcd's 1.5 MiB.
    api = await kconfig.new_client_from_config(config_file=str(control_plane.kubeconfig))
    try:
        custom = CustomObjectsApi(api)
        for name in ("a", "b"):
            await custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, "inferenceservices", {
                    "apiVersion": f"{GROUP}/{VERSION}", "kind": "InferenceService",
                    "metadata": {"name": name}, "spec": {"modelRef": name, "replicas": 0}})
        await custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "modelpools", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "ModelPool", "metadata": {"name": "slot"},
            "spec": {"members": [{"inferenceServiceRef": {"name": m}} for m in ("a", "b")],
                     "default": "a"}})
        reports = LatestReports()
        async with watching(service, namespace, reports, watch_timeout=30):
            await custom.patch_namespaced_custom_object(
                GROUP, VERSION, namespace, "inferenceservices", "b",
                {"spec": {"replicas": 1, "notes": "x" * 700_000}})
            await until(lambda: reports.observed["b"].replicas == 1, what="b's big event")
            await custom.patch_namespaced_custom_object(
                GROUP, VERSION, namespace, "inferenceservices", "a", {"spec": {"replicas": 1}})
            await until(lambda: reports.observed["a"].replicas == 1, what="the next event")
    finally:
        await api.close()
