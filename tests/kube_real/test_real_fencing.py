"""Fencing by preconditions on a real kube-apiserver: a deposed leader's late writes do not land.

Two replicas (two KubePlatforms, each with its own client and Leases) share pool slot. The
leader's client is cut off mid-write: every request it sends from then on is held before it
leaves (a partition whose packets arrive late), among them a scale-down of the incumbent and
a status patch it decided while it still led. Its Lease runs out, the other replica takes the
lead (stamping the pool and every member), and writes the status or not. Then the held
requests go out: the real API server answers both of the old leader's patches 409 Conflict,
and neither lands.
"""

from __future__ import annotations

import asyncio
import time
import urllib.error
from typing import Any

import pytest

from control_plane import ControlPlane
from platform_entry import (
    LEADER_ANNOTATION,
    ApiError,
    KubeClient,
    KubePlatform,
    LatestReports,
    MemberObservation,
    PoolKey,
    PoolPhase,
    PoolView,
    Settings,
    from_kubeconfig,
    until,
)

pytestmark = pytest.mark.kube_real

GROUP, VERSION = "inference.llmkube.dev", "v1alpha1"
HOLD_LIMIT = 60.0  # a held request waits at most this long for the release (bounded test)


class HeldClient(KubeClient):
    """The service's client with a switch: while ``held``, each request waits before it is
    sent, until ``release``; the answers to the requests that waited are recorded."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._open = asyncio.Event()
        self._open.set()
        self.answers: list[tuple[str, str, int]] = []  # (method, path, status) of held ones

    def hold(self) -> None:
        """From now on, hold every request before it leaves."""
        self._open.clear()

    def release(self) -> None:
        """Send the held requests (in the order they were made) and every new one."""
        self._open.set()

    async def open(self, method: str, path: str, **kwargs: Any) -> Any:
        """Send the request, after the release if held; record how a held one was answered."""
        if self._open.is_set():
            return await super().open(method, path, **kwargs)
        async with asyncio.timeout(HOLD_LIMIT):
            await self._open.wait()
        resp = await super().open(method, path, **kwargs)
        self.answers.append((method, path, resp.status))
        return resp


def _settings(namespace: str, replica: str) -> Settings:
    """Short Leases (the defaults' ratios), the pools and the Leases in ``namespace``."""
    return Settings(namespaces=[namespace], lease_namespace=namespace, replica_name=replica,
                    leader_lease_duration=4.0, leader_renew_deadline=3.0, leader_retry=0.5,
                    membership_lease_duration=4.0, membership_renew=0.5, lease_margin=0.5,
                    api_retry_initial=0.05, api_retry_max=0.5, watch_timeout=30)


def _view(key: PoolKey, phase: PoolPhase, pending: str = "",
          idle_since: float | None = None) -> PoolView:
    return PoolView(key, phase, "a", pending, (
        MemberObservation("a", phase="Ready", replicas=1, pods=1),
        MemberObservation("b", phase="Stopped")), generation=1, resident_idle_since=idle_since)


def _seed(plane: ControlPlane, namespace: str) -> None:
    """Members a (replicas 1) and b (0), and pool slot over them, as the admin."""
    base = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}"
    for name, replicas in (("a", 1), ("b", 0)):
        plane.request("POST", f"{base}/inferenceservices", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "InferenceService",
            "metadata": {"name": name}, "spec": {"modelRef": name, "replicas": replicas}})
    plane.request("POST", f"{base}/modelpools", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "ModelPool", "metadata": {"name": "slot"},
        "spec": {"members": [{"inferenceServiceRef": {"name": m}} for m in ("a", "b")],
                 "default": "a"}})


def _read(plane: ControlPlane, namespace: str, plural: str, name: str) -> dict[str, Any]:
    return plane.request("GET", f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{plural}/{name}")


def _stamp(plane: ControlPlane, namespace: str, plural: str, name: str) -> str:
    meta = _read(plane, namespace, plural, name)["metadata"]
    return (meta.get("annotations") or {}).get(LEADER_ANNOTATION, "")


@pytest.mark.parametrize("new_leader_writes_status", [True, False],
                         ids=["new-leader-writes-status", "stamp-only"])
async def test_a_deposed_leaders_late_writes_are_refused(control_plane: ControlPlane,
                                                        namespace: str,
                                                        new_leader_writes_status: bool) -> None:
    """Stamp-only: the new leader writes neither the incumbent nor the status (both are
    already right); its stamps alone refuse the old leader's late patches."""
    _seed(control_plane, namespace)
    key = PoolKey(namespace, "slot")
    credentials = await from_kubeconfig(str(control_plane.kubeconfig))
    old_client = HeldClient(credentials)
    old = KubePlatform(old_client, _settings(namespace, "r1"), lease_client=old_client)
    new = KubePlatform(KubeClient(credentials), _settings(namespace, "r2"))
    tasks = [asyncio.get_running_loop().create_task(old.run(LatestReports()))]
    try:
        await until(lambda: old.replicas.leads(key), "r1 leads pool slot")
        await until(lambda: all(_stamp(control_plane, namespace, "inferenceservices", m)
                                .startswith("r1 ") for m in ("a", "b")),
                    "r1 stamped both members")
        old.publish(_view(key, PoolPhase.READY))
        await until(lambda: _read(control_plane, namespace, "modelpools", "slot")
                    .get("status", {}).get("phase") == "Ready", "r1's status written")
        tasks.append(asyncio.get_running_loop().create_task(new.run(LatestReports())))
        await until(lambda: new.synced.is_set(), "r2 synced, following")
        assert not new.replicas.leads(key)

        # r1, still the leader by its own clock, decides to unload a and to say so; both
        # patches leave r1 only after its Lease ran out and r2 took over
        old_client.hold()
        scale = asyncio.get_running_loop().create_task(old.scale(key, "a", 0))
        old.publish(_view(key, PoolPhase.SWAPPING, pending="b"))
        await until(lambda: not old.replicas.leads(key), "r1 stops leading (renew deadline)")
        await until(lambda: new.replicas.leads(key), "r2 takes the lead after the duration")
        assert not scale.done()  # r1's scale-down is still held, sent while it led
        await until(lambda: all(_stamp(control_plane, namespace, *where).startswith("r2 ")
                                for where in (("inferenceservices", "a"),
                                              ("inferenceservices", "b"),
                                              ("modelpools", "slot"))),
                    "r2 stamped the pool and both members")
        if new_leader_writes_status:
            new.publish(_view(key, PoolPhase.READY, idle_since=time.time()))
            await until(lambda: "residentIdleSince" in _read(
                control_plane, namespace, "modelpools", "slot").get("status", {}),
                "r2's status written")
        before = _read(control_plane, namespace, "modelpools", "slot")["status"]

        old_client.release()
        with pytest.raises(ApiError) as refused:
            await asyncio.wait_for(scale, 20)
        assert refused.value.status == 409
        status_path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/modelpools/slot/status"
        await until(lambda: ("PATCH", status_path, 409) in old_client.answers,
                    "r1's held status patch answered")
        answers = [a for a in old_client.answers if a[0] == "PATCH"]
        assert [status for _, _, status in answers] == [409, 409], answers

        # neither landed: a still has its replica, the status is r2's, and r1 wrote no more
        await asyncio.sleep(1.0)  # r1's publisher re-read after the 409 and saw it no longer leads
        assert _read(control_plane, namespace, "inferenceservices", "a")["spec"]["replicas"] == 1
        after = _read(control_plane, namespace, "modelpools", "slot")["status"]
        assert after == before and after["phase"] == "Ready" and not after["pendingMember"]
        assert [a for a in old_client.answers if a[0] == "PATCH"] == answers
    finally:
        old_client.release()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await old.stop()
        await new.stop()


def test_a_stale_version_is_refused_on_status_merge_patches(control_plane: ControlPlane,
                                                           namespace: str) -> None:
    """What the emulator copies (tests/kubeapi/test_objects.py): a /status merge patch naming
    a stale resourceVersion is 409, also when it would change nothing; a metadata-only patch
    (the leader's stamp) moves the version the status patches are checked against."""
    _seed(control_plane, namespace)
    status = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/modelpools/slot/status"
    merge = "application/merge-patch+json"
    first = control_plane.request("PATCH", status, {"status": {"phase": "Ready"}},
                                  content_type=merge)
    stale = first["metadata"]["resourceVersion"]
    control_plane.request("PATCH", status[: -len("/status")],
                          {"metadata": {"annotations": {LEADER_ANNOTATION: "r2 x"}}},
                          content_type=merge)
    for phase in ("Swapping", "Ready"):  # a change, then what is already there
        with pytest.raises(urllib.error.HTTPError) as refused:
            control_plane.request("PATCH", status, {"metadata": {"resourceVersion": stale},
                                                    "status": {"phase": phase}},
                                  content_type=merge)
        assert refused.value.code == 409
    current = _read(control_plane, namespace, "modelpools", "slot")
    assert current["status"]["phase"] == "Ready" and current["metadata"]["generation"] == 1
    landed = control_plane.request(
        "PATCH", status, {"metadata": {"resourceVersion": current["metadata"]["resourceVersion"]},
                          "status": {"phase": "Swapping"}}, content_type=merge)
    assert landed["status"]["phase"] == "Swapping"
