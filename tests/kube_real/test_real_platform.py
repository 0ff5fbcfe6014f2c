"""The service's Kubernetes platform (watcher, actuator, status writer, event recorder) against
a real kube-apiserver: watch with bookmarks, a 410 Gone after a real etcd compaction, 409s on
stale resourceVersions, the status and scale subresources, Events.

Faults a real server cannot be made to play on cue (outages, injected 409s, truncated watches)
stay with the emulator in tests/platform.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes.aio import config as kconfig
from kubernetes.aio.client import CoreV1Api, CustomObjectsApi
from kubernetes.aio.client.exceptions import ApiException

from control_plane import ControlPlane
from platform_entry import (
    Actuator,
    ApiError,
    EventRecorder,
    LatestReports,
    MemberObservation,
    PoolKey,
    PoolPhase,
    PoolView,
    StatusWriter,
    api_client,
    restarts,
    until,
    watching,
)

pytestmark = pytest.mark.kube_real

GROUP, VERSION = "inference.llmkube.dev", "v1alpha1"
SERVICE_LABEL = "inference.llmkube.dev/service"


@pytest.fixture
async def client(control_plane: ControlPlane) -> Any:
    """The real ``kubernetes`` asyncio client, as the admin: sets the scene."""
    api = await kconfig.new_client_from_config(config_file=str(control_plane.kubeconfig))
    try:
        yield api
    finally:
        await api.close()


@pytest.fixture
async def service(control_plane: ControlPlane) -> Any:
    """The service's own API client, as the admin: the platform under test uses it."""
    async with api_client(control_plane.kubeconfig) as api:
        yield api


def _isvc(name: str, replicas: int) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "InferenceService",
            "metadata": {"name": name}, "spec": {"modelRef": name, "replicas": replicas}}


def _pool(name: str, members: list[str]) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ModelPool", "metadata": {"name": name},
            "spec": {"members": [{"inferenceServiceRef": {"name": m}} for m in members],
                     "default": members[0]}}


def _pod(name: str, member: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {SERVICE_LABEL: member}},
            "spec": {"containers": [{"name": "server", "image": "llama"}]}}


async def _seed(client: Any, namespace: str) -> CustomObjectsApi:
    """Members a (replicas 1, phase Ready) and b (0, Stopped) and pool slot over them."""
    custom = CustomObjectsApi(client)
    for name, replicas, phase in (("a", 1, "Ready"), ("b", 0, "Stopped")):
        await custom.create_namespaced_custom_object(GROUP, VERSION, namespace,
                                                     "inferenceservices", _isvc(name, replicas))
        await _set_phase(custom, namespace, name, phase)
    await custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "modelpools",
                                                 _pool("slot", ["a", "b"]))
    return custom


async def _set_phase(custom: CustomObjectsApi, namespace: str, name: str, phase: str) -> None:
    await custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace,
                                                       "inferenceservices", name,
                                                       {"status": {"phase": phase}})


async def test_watch_reports_members_and_pods(client: Any, service: Any,
                                              namespace: str) -> None:
    await _seed(client, namespace)
    reports = LatestReports()
    async with watching(service, namespace, reports, watch_timeout=5):
        key = PoolKey(namespace, "slot")
        assert reports.specs[key].members == ("a", "b")
        # created by the python client: its User-Agent names the field manager of replicas
        assert reports.observed["a"] == MemberObservation("a", phase="Ready", replicas=1,
                                                          replicas_by="OpenAPI-Generator")
        await CoreV1Api(client).create_namespaced_pod(namespace, _pod("a-0", "a"))
        await until(lambda: reports.observed["a"].pods == 1, what="pod a-0 counted")
        # no nodeName: nothing runs it, so the real server deletes it at once (no grace)
        await CoreV1Api(client).delete_namespaced_pod("a-0", namespace)
        await until(lambda: reports.observed["a"].pods == 0, what="pod a-0 gone")


async def test_watch_gets_bookmarks(client: Any, service: Any, namespace: str) -> None:
    """ModelPools go through the watch cache, which sends a bookmark 2 s before the timeout
    once its version has moved past the watch's (etcd's progress notifications move it)."""
    custom = await _seed(client, namespace)
    listed = await custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "modelpools")
    resp = await custom.list_namespaced_custom_object_without_preload_content(
        GROUP, VERSION, namespace, "modelpools", watch=True, allow_watch_bookmarks=True,
        resource_version=listed["metadata"]["resourceVersion"], timeout_seconds=8,
        _request_timeout=30)
    try:
        # etcd moves on (another kind changes) while the pools stay as they are: the bookmark
        # tells the watch so, carrying a version past the one it started from
        await CoreV1Api(client).create_namespaced_config_map(namespace,
                                                             {"metadata": {"name": "elsewhere"}})
        events = [json.loads(line) async for line in resp.content if line.strip()]
    finally:
        resp.close()
    bookmarks = [e for e in events if e["type"] == "BOOKMARK"]
    assert bookmarks, events
    assert int(bookmarks[-1]["object"]["metadata"]["resourceVersion"]) > \
        int(listed["metadata"]["resourceVersion"])
    # the service's watcher (which asks for bookmarks) resumes after each watch timeout
    # from the version it holds, and still sees the next change
    reports, before = LatestReports(), restarts("modelpools", "timeout")
    async with watching(service, namespace, reports, watch_timeout=2):
        await until(lambda: restarts("modelpools", "timeout") >= before + 2, what="2 timeouts")
        await custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, "modelpools",
                                                    "slot", {"spec": {"default": "b"}})
        await until(lambda: reports.specs[PoolKey(namespace, "slot")].default == "b")


async def test_watch_relists_after_a_real_compaction(control_plane: ControlPlane, client: Any,
                                                     service: Any, namespace: str) -> None:
    """Pods are watched straight from etcd (see control_plane), so compaction shows there."""
    await _seed(client, namespace)
    core, reports = CoreV1Api(client), LatestReports()
    # watches end every second, so the next one resumes from the version held before
    async with watching(service, namespace, reports, watch_timeout=1):
        await core.create_namespaced_pod(namespace, _pod("a-0", "a"))
        await until(lambda: reports.observed["a"].pods == 1, what="pod a-0 counted")
        gone = restarts("pods", "gone")
        await core.delete_namespaced_pod("a-0", namespace)
        # move etcd two writes past the watcher's version (compacting at revision R keeps R,
        # so a watch resuming at R+1 would still be served), then drop all history up to now
        for bump in ("bump-1", "bump-2"):
            await core.create_namespaced_config_map(namespace, {"metadata": {"name": bump}})
        control_plane.compact_etcd()
        await until(lambda: restarts("pods", "gone") > gone, what="a 410 Gone on the pod watch")
        await until(lambda: reports.observed["a"].pods == 0, what="pod a-0 gone")
        # after the re-list the watch goes on from a version the server still has
        await core.create_namespaced_pod(namespace, _pod("a-1", "a"))
        await until(lambda: reports.observed["a"].pods == 1, what="a pod created after the 410")


async def test_stale_resource_version_conflicts(client: Any, service: Any,
                                                namespace: str) -> None:
    custom = await _seed(client, namespace)
    read = await custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "modelpools",
                                                     "slot")
    read["spec"]["default"] = "b"
    await custom.replace_namespaced_custom_object(GROUP, VERSION, namespace, "modelpools",
                                                  "slot", read)
    with pytest.raises(ApiException) as conflict:
        await custom.replace_namespaced_custom_object(GROUP, VERSION, namespace, "modelpools",
                                                      "slot", read)  # same, now stale, version
    assert conflict.value.status == 409
    # the actuator's merge patch names the version it was decided on: once someone else
    # wrote the member, that version is refused and the replicas stay; the current one lands
    seen = await custom.get_namespaced_custom_object(GROUP, VERSION, namespace,
                                                     "inferenceservices", "b")
    await custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, "inferenceservices",
                                                "b", {"metadata": {"labels": {"moved": "yes"}}})
    with pytest.raises(ApiError) as refused:
        await Actuator(service).scale(namespace, "b", 1, seen["metadata"]["resourceVersion"])
    assert refused.value.status == 409
    stored = await custom.get_namespaced_custom_object(GROUP, VERSION, namespace,
                                                       "inferenceservices", "b")
    assert stored["spec"]["replicas"] == 0
    answered = await Actuator(service).scale(namespace, "b", 1,
                                             stored["metadata"]["resourceVersion"])
    stored = await custom.get_namespaced_custom_object(GROUP, VERSION, namespace,
                                                       "inferenceservices", "b")
    assert stored["spec"]["replicas"] == 1 and answered == stored["metadata"]["resourceVersion"]


async def test_status_subresource(client: Any, service: Any, namespace: str) -> None:
    custom = await _seed(client, namespace)
    key = PoolKey(namespace, "slot")
    view = PoolView(key, PoolPhase.READY, "a", "", (
        MemberObservation("a", phase="Ready", replicas=1, pods=1),
        MemberObservation("b", phase="Stopped")), generation=1)
    writer = StatusWriter(service)
    assert await writer.publish(view, {}) is not None  # the real schema accepts what we write
    stored = await custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "modelpools",
                                                       "slot")
    assert stored["status"] == writer.written(key)
    assert stored["spec"]["members"] and stored["metadata"]["generation"] == 1
    # a write to the main resource cannot touch status, one to /status cannot touch spec
    await custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, "modelpools", "slot",
                                                {"status": {"phase": "Failed"}})
    await custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, "modelpools", "slot",
        {"spec": {"default": "b"}, "status": {"pendingMember": "b"}})
    stored = await custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "modelpools",
                                                       "slot")
    assert stored["status"]["phase"] == "Ready" and stored["spec"]["default"] == "a"
    assert await writer.publish(view, stored["status"]) is not None  # converges back
    stored = await custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "modelpools",
                                                       "slot")
    assert stored["status"]["pendingMember"] == ""


async def test_scale_subresource(client: Any, service: Any, namespace: str) -> None:
    custom = await _seed(client, namespace)
    reports = LatestReports()
    async with watching(service, namespace, reports, watch_timeout=5):
        await Actuator(service).scale(namespace, "b", 1)
        scale = await custom.get_namespaced_custom_object_scale(GROUP, VERSION, namespace,
                                                                "inferenceservices", "b")
        assert scale["spec"]["replicas"] == 1
        # `kubectl scale` (the /scale subresource) writes the field the watcher reads
        await custom.patch_namespaced_custom_object_scale(GROUP, VERSION, namespace,
                                                          "inferenceservices", "b",
                                                          {"spec": {"replicas": 0}})
        await until(lambda: reports.observed["b"].replicas == 0, what="scaled to 0")
        await custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace,
                                                           "inferenceservices", "a",
                                                           {"status": {"replicas": 1}})
        scale = await custom.get_namespaced_custom_object_scale(GROUP, VERSION, namespace,
                                                                "inferenceservices", "a")
        assert (scale["spec"]["replicas"], scale["status"]["replicas"]) == (1, 1)


async def test_events_on_the_pool(control_plane: ControlPlane, client: Any, service: Any,
                                  namespace: str) -> None:
    custom = await _seed(client, namespace)
    pool = await custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "modelpools",
                                                     "slot")
    uid = pool["metadata"]["uid"]
    recorder = EventRecorder(service, uids=lambda key: uid)
    key = PoolKey(namespace, "slot")
    await recorder.record(key, "SwapStarted", "swapping from a to b")
    await recorder.record(key, "SwapFailed", "b did not load", warning=True)
    events = await CoreV1Api(client).list_namespaced_event(
        namespace, field_selector=f"involvedObject.uid={uid}")
    assert sorted((e.reason, e.type) for e in events.items) == \
        [("SwapFailed", "Warning"), ("SwapStarted", "Normal")]
    described = control_plane.kubectl("describe", "mpool", "slot", "-n", namespace).stdout
    assert "SwapStarted" in described and "b did not load" in described
