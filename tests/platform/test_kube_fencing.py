"""Fencing by preconditions: which version each write carries, against the API emulator.

The deposed-leader case on a real kube-apiserver is tests/kube_real/test_real_fencing.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kube_helpers import NS, Recorder, eventually, isvc, modelpool, running

from extproc.metrics import KUBE_REQUESTS
from extproc.platform.kube.actuator import Actuator
from extproc.platform.kube.fencing import (LEADER_ANNOTATION, FenceLost, HeldVersions,
                                           TakeoverFences)
from extproc.platform.kube.turns import WRITES_IN_FLIGHT
from extproc.platform.kube.platform import KubePlatform
from extproc.platform.kube.rest import ApiError
from extproc.platform.kube.status import StatusPublisher, StatusWriter
from extproc.platform.kube.watcher import ClusterWatcher
from extproc.policy.model import MemberObservation, PoolKey, PoolPhase, PoolView
from extproc.settings import Settings

KEY = PoolKey(NS, "slot")


def seed(emulator: Any) -> None:
    """Members a (resident, Ready) and b (Stopped) and pool slot."""
    emulator.create("inferenceservices", isvc("a", replicas=1, phase="Ready"))
    emulator.create("inferenceservices", isvc("b", replicas=0, phase="Stopped"))
    emulator.create("modelpools", modelpool("slot", ["a", "b"]))


def view(phase: PoolPhase = PoolPhase.READY, resident: str = "a", pending: str = "") -> PoolView:
    """A view of pool slot."""
    return PoolView(key=KEY, phase=phase, resident=resident, pending=pending, generation=1,
                    members=(MemberObservation("a", phase="Ready", replicas=1, pods=1),
                             MemberObservation("b", phase="Stopped")))


def version(emulator: Any, resource: str, name: str) -> str:
    """The object's resourceVersion in the emulator now."""
    return emulator.get(resource, name, NS)["metadata"]["resourceVersion"]


def status_bodies(emulator: Any) -> list[dict]:
    """The bodies of the pool status patches the emulator recorded, in order."""
    return [body for _caller, r, body in emulator.handler.callers
            if r.verb == "patch" and r.resource == "modelpools" and r.subresource == "status"]


def conflicts(resource: str) -> float:
    """Patches of ``resource`` answered 409 so far (process-wide)."""
    return KUBE_REQUESTS.labels("patch", resource, "409")._value.get()


# --- which version is held -------------------------------------------------------------------

def test_held_version_follows_our_writes_until_the_watch_shows_them() -> None:
    held = HeldVersions()
    assert held.precondition("a", "5") == "5"  # nothing written: the cache's
    held.wrote("a", "5", "6")
    assert held.precondition("a", "5") == "6"  # the watch still shows the state we replaced
    held.wrote("a", "6", "7")
    assert held.precondition("a", "6") == "7"  # it shows our first write, not our second
    assert held.precondition("a", "7") == "7"  # caught up: the chain is dropped
    assert held.precondition("a", "6") == "6"  # ... so a lagging cache is believed again


def test_held_version_yields_to_a_write_that_is_not_ours() -> None:
    held = HeldVersions()
    held.wrote("a", "5", "6")
    assert held.precondition("a", "9") == "9"  # someone wrote after us: the cache is fresher
    assert held.precondition("a", "5") == "5"  # and the chain is gone
    held.wrote("a", "9", "10")
    held.forget("a")
    assert held.precondition("a", "9") == "9"


# --- the emulator honours preconditions on merge patches --------------------------------------

async def test_a_stale_version_is_refused_on_scale_and_status(emulator: Any, api: Any) -> None:
    seed(emulator)
    stale_member = version(emulator, "inferenceservices", "a")
    stale_pool = version(emulator, "modelpools", "slot")
    emulator.patch("inferenceservices", "a", {"metadata": {"annotations": {"x": "1"}}}, NS)
    emulator.patch("modelpools", "slot", {"status": {"phase": "Ready"}}, NS, subresource="status")
    with pytest.raises(ApiError) as scale:
        await Actuator(api).scale(NS, "a", 0, stale_member)
    with pytest.raises(ApiError) as status:
        await StatusWriter(api).publish(view(PoolPhase.SWAPPING, pending="b"), {},
                                        resource_version=stale_pool)
    assert scale.value.status == status.value.status == 409
    assert emulator.get("inferenceservices", "a", NS)["spec"]["replicas"] == 1
    assert emulator.get("modelpools", "slot", NS)["status"] == {"phase": "Ready"}
    # with the current versions the same writes land, and answer the versions they made
    answered = await Actuator(api).scale(NS, "a", 0, version(emulator, "inferenceservices", "a"))
    assert answered == version(emulator, "inferenceservices", "a")


# --- the status publisher ------------------------------------------------------------------

class _Snapshot:
    """A StatusSource whose watch never delivers anything after the first read: the worst
    lag, to show that our own writes do not conflict with each other meanwhile."""

    def __init__(self, emulator: Any) -> None:
        self._obj = emulator.get("modelpools", "slot", NS)

    def has_pool(self, key: PoolKey) -> bool:
        """The pool exists."""
        return True

    def pool_status(self, key: PoolKey) -> dict:
        """As first read."""
        return self._obj.get("status") or {}

    def pool_resource_version(self, key: PoolKey) -> str:
        """As first read."""
        return self._obj["metadata"]["resourceVersion"]

    def spec_problems(self, key: PoolKey) -> tuple[str, ...]:
        """None."""
        return ()


async def test_our_own_writes_do_not_conflict_while_the_watch_lags(emulator: Any,
                                                                   api: Any) -> None:
    seed(emulator)
    before, initial = conflicts("modelpools/status"), version(emulator, "modelpools", "slot")
    publisher = StatusPublisher(StatusWriter(api), _Snapshot(emulator))
    for each in (view(), view(PoolPhase.SWAPPING, pending="b"), view()):
        publisher.submit(each)
        await asyncio.wait_for(publisher.idle(), 5)
    bodies = status_bodies(emulator)
    assert [b["status"]["phase"] for b in bodies] == ["Ready", "Swapping", "Ready"]
    assert conflicts("modelpools/status") == before
    # each write named the version the previous one made, not the lagging cache's
    sent = [b["metadata"]["resourceVersion"] for b in bodies]
    assert sent[0] == initial and len(set(sent)) == 3, sent
    assert emulator.get("modelpools", "slot", NS)["status"]["phase"] == "Ready"
    await publisher.close()


async def test_a_status_conflict_is_re_read_and_decided_again(emulator: Any, api: Any) -> None:
    seed(emulator)
    async with running(api) as watcher:
        publisher = StatusPublisher(StatusWriter(api), watcher, backoff_initial=0.05,
                                    reread=lambda key: watcher.reread("modelpools",
                                                                      key.namespace, key.name))
        emulator.fail_writes("modelpools", 1)
        lists = sum(1 for r in emulator.requests if r.verb == "list" and r.resource == "modelpools")
        publisher.submit(view())
        await asyncio.wait_for(publisher.idle(), 5)
        first, second = status_bodies(emulator)[-2:]
        assert emulator.get("modelpools", "slot", NS)["status"]["phase"] == "Ready"
        assert sum(1 for r in emulator.requests
                   if r.verb == "list" and r.resource == "modelpools") == lists + 1  # re-read
        assert first["metadata"] == second["metadata"]  # nobody else wrote: same version again
        await publisher.close()


# --- a new leader fences every member ---------------------------------------------------------

async def test_a_new_leader_stamps_the_pool_and_every_member_so_older_decisions_fail(
        emulator: Any, api: Any) -> None:
    seed(emulator)
    before = {m: version(emulator, "inferenceservices", m) for m in ("a", "b")}
    pool_before = version(emulator, "modelpools", "slot")
    platform = await KubePlatform.create(Settings(kubeconfig=str(emulator.kubeconfig),
                                                  namespaces=[NS], replica_name="r1"))
    task = asyncio.get_running_loop().create_task(platform.run(Recorder()))
    try:
        await eventually(lambda: platform.replicas.leads(KEY), 10)

        def stamp(name: str, resource: str = "inferenceservices") -> str:
            obj = emulator.get(resource, name, NS)
            return (obj["metadata"].get("annotations") or {}).get(LEADER_ANNOTATION, "")

        await eventually(lambda: all(stamp(*where).startswith("r1 ") for where in (
            ("a",), ("b",), ("slot", "modelpools"))), 10, "the pool and both members stamped")
        assert emulator.get("modelpools", "slot", NS)["metadata"]["generation"] == 1
        with pytest.raises(ApiError) as late_status:
            await StatusWriter(api).publish(view(PoolPhase.SWAPPING, pending="b"), {},
                                            resource_version=pool_before)
        assert late_status.value.status == 409
        for member in ("a", "b"):
            assert emulator.get("inferenceservices", member, NS)["spec"]["replicas"] == \
                (1 if member == "a" else 0)  # the stamp touched metadata only
        # what a previous leader decided on the versions before the stamp can no longer land
        with pytest.raises(ApiError) as late:
            await Actuator(api).scale(NS, "a", 0, before["a"])
        assert late.value.status == 409
        assert emulator.get("inferenceservices", "a", NS)["spec"]["replicas"] == 1
        await platform.scale(KEY, "b", 1)  # the leader's own scale goes through
        assert emulator.get("inferenceservices", "b", NS)["spec"]["replicas"] == 1
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await platform.stop()


async def test_a_re_read_reaches_the_cache_and_the_listener_without_the_watch(
        emulator: Any, api: Any) -> None:
    seed(emulator)
    recorder = Recorder()
    watcher = ClusterWatcher(api, Settings(namespaces=[NS]))
    task = asyncio.get_running_loop().create_task(watcher.run(recorder))
    await asyncio.wait_for(watcher.synced.wait(), 5)
    task.cancel()  # the watch stops: only the re-read can bring what changes next
    await asyncio.gather(task, return_exceptions=True)
    recorder.take()
    emulator.patch("inferenceservices", "b", {"spec": {"replicas": 1}}, NS)
    await watcher.reread("inferenceservices", NS, "b")
    assert watcher.member_replicas(KEY, "b") == (1, version(emulator, "inferenceservices", "b"))
    assert [c[2].replicas for c in recorder.take() if c[0] == "member_changed"] == [1]
    emulator.delete("inferenceservices", "b", NS)
    await watcher.reread("inferenceservices", NS, "b")
    assert watcher.member_replicas(KEY, "b") == (0, "")
    assert [c[2].exists for c in recorder.take() if c[0] == "member_changed"] == [False]


async def test_a_member_removed_from_the_spec_is_still_fenced(emulator: Any, api: Any) -> None:
    seed(emulator)
    async with running(api) as watcher:
        assert watcher.members_of(KEY) == ["a", "b"]
        emulator.patch("modelpools", "slot", {"spec": {"members": [
            {"inferenceServiceRef": {"name": "b"}}], "default": "b"}}, NS)
        await eventually(lambda: watcher.pools()[0].members == ("b",), 5)
        # a may still hold the GPU until the pool drained and unloaded it: stamped too
        assert watcher.members_of(KEY) == ["b", "a"]


class _HangingStamper:
    """Stamps that never answer (an API server that stopped answering mid-write)."""

    def __init__(self) -> None:
        self.started = asyncio.Event()

    async def stamp(self, namespace: str, member: str, annotation: str, value: str) -> str:
        """Never returns."""
        self.started.set()
        await asyncio.Event().wait()
        return ""

    async def stamp_pool(self, namespace: str, pool: str, annotation: str, value: str) -> str:
        """Never returns."""
        return await self.stamp(namespace, pool, annotation, value)


class _Members:
    """One pool, two members, versions unknown."""

    def member_replicas(self, key: PoolKey, member: str) -> tuple[int, str]:
        """Unknown."""
        return 0, ""

    def members_of(self, key: PoolKey) -> list[str]:
        """a and b."""
        return ["a", "b"]


async def test_a_lead_lost_while_fencing_fails_the_write_without_cancelling_its_caller() -> None:
    stamper = _HangingStamper()
    fences = TakeoverFences(stamper, _Members(), HeldVersions(), "r1")
    fences.lead_changed(KEY, True)
    waiting = asyncio.get_running_loop().create_task(fences.ready(KEY))
    await asyncio.wait_for(stamper.started.wait(), 5)
    assert not waiting.done()  # a scale waits for this lead's stamps
    fences.lead_changed(KEY, False)
    with pytest.raises(FenceLost):
        await asyncio.wait_for(waiting, 5)
    await fences.ready(KEY)  # not leading: nothing to wait for (the leadership check refuses)
    fences.close()


class _SlowStamper:
    """Each stamp takes a while; records which pools were stamped, in order."""

    def __init__(self) -> None:
        self.pools: list[str] = []

    async def stamp(self, namespace: str, member: str, annotation: str, value: str) -> str:
        """After a pause, a new version."""
        await asyncio.sleep(0.05)
        return "v"

    async def stamp_pool(self, namespace: str, pool: str, annotation: str, value: str) -> str:
        """After a pause, a new version."""
        self.pools.append(pool)
        return await self.stamp(namespace, pool, annotation, value)


async def test_a_lead_over_many_pools_stamps_a_few_at_a_time_and_a_waiting_scale_first() -> None:
    stamper = _SlowStamper()
    fences = TakeoverFences(stamper, _Members(), HeldVersions(), "r1")
    keys = [PoolKey("ml", f"p{i}") for i in range(40)]
    for key in keys:
        fences.lead_changed(key, True)  # one lead taken over every pool
    await asyncio.sleep(0.01)
    assert len(stamper.pools) <= WRITES_IN_FLIGHT
    await asyncio.wait_for(fences.ready(keys[-1]), 5)  # the last in line, asked for: next
    assert "p39" in stamper.pools and len(stamper.pools) < len(keys)
    await asyncio.wait_for(asyncio.gather(*(fences.ready(key) for key in keys)), 30)
    assert sorted(stamper.pools) == sorted(k.name for k in keys)  # each once
    fences.close()
