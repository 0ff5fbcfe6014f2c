"""ClusterWatcher against the API emulator with the service's own API client."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kube_helpers import NS, Recorder, eventually, isvc, modelpool, pod, running

from extproc.metrics import WATCH_RESTARTS
from extproc.platform.kube import watchloop
from extproc.platform.kube import watcher as watcher_module
from extproc.policy.model import MemberObservation, PoolKey

KEY = PoolKey(NS, "slot")
SERVICE = "inference.llmkube.dev/service"


def seed(emulator: Any) -> None:
    """Members a (resident, one pod) and b (stopped), and pool slot over them."""
    emulator.create("inferenceservices", isvc("a", replicas=1, phase="Ready"))
    emulator.create("inferenceservices", isvc("b", replicas=0, phase="Stopped"))
    emulator.create("pods", pod("a-0", {SERVICE: "a", "app": "a"}))
    emulator.create("modelpools", modelpool(
        "slot", ["a", "b"], default="a", swapBudget="5m",
        annotations={"modelpool.inference.llmkube.dev/aliases": "gpt=a,x=nobody",
                     "modelpool.inference.llmkube.dev/fairness-window": "45s"}))


async def test_initial_sync_reports_pool_then_each_member(emulator: Any, api: Any) -> None:
    seed(emulator)
    emulator.patch("modelpools", "slot", {"status": {"residentMember": "a"}}, NS,
                   subresource="status")
    recorder = Recorder()
    async with running(api, recorder) as watcher:
        calls = recorder.take()
        assert [c[0] for c in calls] == ["pool_changed", "member_changed", "member_changed"]
        spec, hints = calls[0][1], calls[0][2]
        assert spec.key == KEY and spec.members == ("a", "b") and spec.default == "a"
        assert spec.swap_budget == 300.0 and spec.fairness_window == 45.0
        assert spec.aliases == {"gpt": "a"}  # x names no member: dropped
        assert spec.generation >= 1
        assert hints.resident == "a"
        assert calls[1][2] == MemberObservation("a", exists=True, phase="Ready", replicas=1,
                                                pods=1)
        assert calls[2][2] == MemberObservation("b", exists=True, phase="Stopped", replicas=0,
                                                pods=0)
        assert watcher.pools() == [spec]
        assert watcher.pool_status(KEY)["residentMember"] == "a"
        assert watcher.pool_uid(KEY)
        assert any("nobody" in p for p in watcher.spec_problems(KEY))
        assert watcher.observation(KEY, "b").phase == "Stopped"


async def test_changes_are_reported_once_and_only_when_they_matter(emulator: Any,
                                                                   api: Any) -> None:
    seed(emulator)
    recorder = Recorder()
    async with running(api, recorder) as watcher:
        recorder.take()
        # a member's phase moves: exactly one member_changed
        emulator.patch("inferenceservices", "b", {"status": {"phase": "Progressing"}}, NS,
                       subresource="status")
        await eventually(lambda: recorder.calls)
        await asyncio.sleep(0.3)
        assert recorder.take() == [("member_changed", KEY, MemberObservation(
            "b", phase="Progressing", replicas=0, pods=0))]
        # a change the observation does not carry: no call at all
        emulator.patch("inferenceservices", "b", {"metadata": {"labels": {"x": "y"}}}, NS)
        # the pool's status changes (our own writes): no call, but the cache follows
        emulator.patch("modelpools", "slot", {"status": {"phase": "Ready"}}, NS,
                       subresource="status")
        await eventually(lambda: watcher.pool_status(KEY).get("phase") == "Ready")
        await asyncio.sleep(0.3)
        assert recorder.take() == []
        # replicas absent means 1, as LLMKube's CRD defaults it
        emulator.patch("inferenceservices", "b", {"spec": {"replicas": None}}, NS)
        await eventually(lambda: recorder.calls)
        assert recorder.take()[0][2].replicas == 1
        # a spec edit: pool_changed, then every member once
        emulator.patch("modelpools", "slot", {"spec": {"swapBudget": "90s"}}, NS)
        await eventually(lambda: len(recorder.calls) >= 3)
        calls = recorder.take()
        assert [c[0] for c in calls] == ["pool_changed", "member_changed", "member_changed"]
        assert calls[0][1].swap_budget == 90.0
        # a member disappears, then the pool does
        emulator.delete("inferenceservices", "b", NS)
        await eventually(lambda: recorder.calls)
        assert recorder.take() == [("member_changed", KEY, MemberObservation(
            "b", exists=False, phase="", replicas=0, pods=0))]
        emulator.delete("modelpools", "slot", NS)
        await eventually(lambda: recorder.calls)
        assert recorder.take() == [("pool_removed", KEY)]
        assert watcher.pools() == [] and not watcher.has_pool(KEY)


async def test_unparsable_budget_falls_back_and_is_noted(emulator: Any, api: Any) -> None:
    emulator.create("inferenceservices", isvc("a", replicas=0, phase="Stopped"))
    emulator.create("modelpools", modelpool("slot", ["a"], swapBudget="soon"))
    recorder = Recorder()
    async with running(api, recorder) as watcher:
        spec = recorder.calls[0][1]
        assert spec.swap_budget == 111.0 and spec.fairness_window == 22.0
        assert "swapBudget" in " ".join(watcher.spec_problems(KEY))


async def test_pods_counted_including_terminating(emulator: Any, api: Any) -> None:
    seed(emulator)
    recorder = Recorder()
    async with running(api, recorder) as watcher:
        recorder.take()
        # a second pod that finalizers keep in Terminating after its deletion
        emulator.create("pods", pod("a-1", {SERVICE: "a"}, finalizers=["test/hold"]))
        await eventually(lambda: watcher.observation(KEY, "a").pods == 2)
        emulator.delete("pods", "a-1", NS)
        assert emulator.get("pods", "a-1", NS)["metadata"]["deletionTimestamp"]
        await asyncio.sleep(0.3)
        assert watcher.observation(KEY, "a").pods == 2  # terminating: still holds the GPU
        emulator.patch("pods", "a-1", {"metadata": {"finalizers": None}}, NS)
        await eventually(lambda: watcher.observation(KEY, "a").pods == 1)
        # a pod of a finished run holds nothing
        emulator.patch("pods", "a-0", {"status": {"phase": "Failed"}}, NS,
                       subresource="status")
        await eventually(lambda: watcher.observation(KEY, "a").pods == 0)
        assert [o.pods for o in recorder.members()] == [2, 1, 0]
        # pods of other namespaces never count
        emulator.create("pods", pod("a-x", {SERVICE: "a"}, namespace="other"))
        await asyncio.sleep(0.3)
        assert watcher.observation(KEY, "a").pods == 0


async def test_app_label_fallback_needs_the_wide_pod_selector(emulator: Any, api: Any) -> None:
    seed(emulator)
    emulator.create("pods", pod("b-0", {"app": "b"}))
    async with running(api, Recorder()) as watcher:
        assert watcher.observation(KEY, "b").pods == 0  # default: service-labelled pods only
    async with running(api, Recorder(), pod_selector="") as watcher:
        assert watcher.observation(KEY, "b").pods == 1


async def test_relists_after_410_without_missing_changes(emulator: Any, api: Any) -> None:
    seed(emulator)
    recorder = Recorder()
    gone_before = WATCH_RESTARTS.labels("inferenceservices", "gone")._value.get()
    async with running(api, recorder) as watcher:
        recorder.take()
        # While the watches are cut off, b changes, a loses its pod and the history that would
        # replay those changes is compacted away: resuming must answer 410 and re-list.
        emulator.set_unavailable(True)
        await asyncio.sleep(0.3)
        emulator.patch("inferenceservices", "b", {"spec": {"replicas": 1}}, NS)
        emulator.delete("pods", "a-0", NS)
        emulator.compact()
        emulator.set_unavailable(False)
        await eventually(lambda: watcher.observation(KEY, "b").replicas == 1
                         and watcher.observation(KEY, "a").pods == 0, timeout=8)
        reported = {o.name: o for o in recorder.members()}
        assert reported["b"].replicas == 1 and reported["a"].pods == 0
        # and a compaction under an open watch: the stream ends with 410, the change survives
        emulator.patch("inferenceservices", "a", {"status": {"phase": "Stopped"}}, NS,
                       subresource="status")
        emulator.compact()
        await eventually(lambda: watcher.observation(KEY, "a").phase == "Stopped")
        emulator.patch("inferenceservices", "a", {"spec": {"replicas": 0}}, NS)
        await eventually(lambda: watcher.observation(KEY, "a").replicas == 0)
    assert WATCH_RESTARTS.labels("inferenceservices", "gone")._value.get() > gone_before


async def test_pool_recreated_while_blind_is_a_new_pool(emulator: Any, api: Any) -> None:
    seed(emulator)
    recorder = Recorder()
    async with running(api, recorder) as watcher:
        old_uid = watcher.pool_uid(KEY)
        recorder.take()
        emulator.set_unavailable(True)
        await asyncio.sleep(0.3)
        emulator.delete("modelpools", "slot", NS)
        emulator.create("modelpools", modelpool(
            "slot", ["a", "b"], default="a", swapBudget="5m",
            annotations={"modelpool.inference.llmkube.dev/aliases": "gpt=a,x=nobody",
                         "modelpool.inference.llmkube.dev/fairness-window": "45s"}))
        emulator.compact()
        emulator.set_unavailable(False)
        await eventually(lambda: watcher.pool_uid(KEY) != old_uid, timeout=8)
        calls = recorder.take()
        assert [c[0] for c in calls] == ["pool_removed", "pool_changed", "member_changed",
                                         "member_changed"]


async def test_survives_the_api_server_going_away(emulator: Any, api: Any) -> None:
    seed(emulator)
    recorder = Recorder()
    async with running(api, recorder) as watcher:
        recorder.take()
        port = int(emulator.url.rsplit(":", 1)[1])
        await emulator.stop()
        emulator.patch("inferenceservices", "b", {"status": {"phase": "Ready"}}, NS,
                       subresource="status")
        await asyncio.sleep(1.5)  # connection refused a few times, with backoff
        await emulator.start(port=port)
        await eventually(lambda: watcher.observation(KEY, "b").phase == "Ready", timeout=8)
        assert recorder.take()[-1][2].phase == "Ready"
        # and an API that answers 503 to everything for a while
        emulator.set_unavailable(True)
        emulator.patch("inferenceservices", "a", {"status": {"phase": "Failed"}}, NS,
                       subresource="status")
        await asyncio.sleep(3)
        emulator.set_unavailable(False)
        await eventually(lambda: watcher.observation(KEY, "a").phase == "Failed", timeout=8)


@pytest.mark.parametrize("namespaces", [[], [NS, "other"]])
async def test_members_resolve_in_the_pool_namespace(emulator: Any, api: Any,
                                                     namespaces: list[str]) -> None:
    seed(emulator)
    other = {**isvc("a", replicas=0, phase="Stopped")}
    other["metadata"] = {"name": "a", "namespace": "other"}
    emulator.create("inferenceservices", other)
    emulator.create("modelpools", {**modelpool("slot", ["a"]),
                                   "metadata": {"name": "slot", "namespace": "other"}})
    async with running(api, Recorder(), namespaces=tuple(namespaces)) as watcher:
        assert {str(s.key) for s in watcher.pools()} == {"ml/slot", "other/slot"}
        assert watcher.observation(KEY, "a").phase == "Ready"
        assert watcher.observation(PoolKey("other", "slot"), "a").phase == "Stopped"


async def test_paced_release_reads_a_ready_members_slot_count_once(emulator: Any,
                                                                   api: Any) -> None:
    from devstack.fakemember import start_upstream

    member = await start_upstream("a", token_delay_ms=0, slots=3)
    try:
        seed(emulator)
        recorder = Recorder()
        async with running(api, recorder, paced_release=True,
                           idle_probe_url=f"{member.url}/slots") as watcher:
            # unpaced until llama.cpp's answer is in, then its 3 slots
            await eventually(lambda: watcher.observation(KEY, "a").capacity == 3)
            assert any(c[0] == "member_changed" and c[2].name == "a" and c[2].capacity == 3
                       for c in recorder.take())
            assert watcher.observation(KEY, "b").capacity == 0  # not Ready: not asked
            # the annotation wins over the runtime's count
            emulator.patch("inferenceservices", "a", {"metadata": {"annotations": {
                "modelpool.inference.llmkube.dev/capacity": "2"}}}, NS)
            await eventually(lambda: watcher.observation(KEY, "a").capacity == 2)
        assert member.stats.by_path.get("/slots") == 1  # read once for this load
    finally:
        await member.stop()


async def test_a_watch_event_longer_than_a_read_buffer_arrives(emulator: Any, api: Any) -> None:
    # A 1 MB annotation makes one event line over aiohttp's readline limit (its read buffer:
    # 512 KiB in 3.14, 128 KiB before).
    seed(emulator)
    recorder = Recorder()
    async with running(api, recorder) as watcher:
        recorder.take()
        emulator.patch("inferenceservices", "b",
                       {"metadata": {"annotations": {"notes": "x" * 1_000_000}}}, NS)
        emulator.patch("inferenceservices", "b", {"status": {"phase": "Progressing"}}, NS,
                       subresource="status")
        await eventually(lambda: watcher.observation(KEY, "b").phase == "Progressing",
                         timeout=8)
        # and the watch goes on
        emulator.patch("inferenceservices", "a", {"spec": {"replicas": 0}}, NS)
        await eventually(lambda: watcher.observation(KEY, "a").replicas == 0, timeout=8)


async def test_a_watch_event_over_the_limit_costs_a_relist_not_the_watch(
        emulator: Any, api: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watchloop, "EVENT_LIMIT", 50_000)
    seed(emulator)
    too_long = WATCH_RESTARTS.labels("inferenceservices", "too-long")
    before = too_long._value.get()
    async with running(api, Recorder()) as watcher:
        emulator.patch("inferenceservices", "b",
                       {"metadata": {"annotations": {"notes": "x" * 100_000}},
                        "spec": {"replicas": 3}}, NS)
        await eventually(lambda: watcher.observation(KEY, "b").replicas == 3, timeout=8)
        assert too_long._value.get() > before
        emulator.patch("inferenceservices", "a", {"spec": {"replicas": 0}}, NS)
        await eventually(lambda: watcher.observation(KEY, "a").replicas == 0, timeout=8)


async def test_a_name_two_pools_claim_is_reported_on_the_later_and_passes_on(
        emulator: Any, api: Any) -> None:
    """Pools first and second created in one second: first (by name) holds chat; second's
    alias chat is unrouted and a problem naming first, until first is deleted."""
    for name in ("chat", "other"):
        emulator.create("inferenceservices", isvc(name, replicas=0, phase="Stopped"))
    emulator.create("modelpools", modelpool("first", ["chat"]))
    emulator.create("modelpools", modelpool(
        "second", ["other"], annotations={"modelpool.inference.llmkube.dev/aliases":
                                          "chat=other"}))
    first, second = PoolKey(NS, "first"), PoolKey(NS, "second")
    recorder = Recorder()
    async with running(api, recorder) as watcher:
        specs = {s.key: s for s in watcher.pools()}
        assert specs[first].unrouted == () and watcher.spec_problems(first) == ()
        assert specs[second].unrouted == ("chat",)
        assert any(f"ModelPool {NS}/first" in p for p in watcher.spec_problems(second))
        recorder.take()
        emulator.delete("modelpools", "first", NS)
        await eventually(lambda: any(c[0] == "pool_changed" and c[1].key == second
                                     and c[1].unrouted == () for c in recorder.calls))
        assert watcher.spec_problems(second) == ()


def _hpa(name: str, target: str, kind: str = "InferenceService") -> dict:
    return {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"scaleTargetRef": {"apiVersion": "inference.llmkube.dev/v1alpha1",
                                        "kind": kind, "name": target},
                     "minReplicas": 1, "maxReplicas": 2}}


async def test_an_autoscaler_aimed_at_a_member_is_in_its_observation(emulator: Any,
                                                                     api: Any) -> None:
    """HPAs are watched (KEDA's ScaledObjects too where installed: the emulator has no KEDA,
    its 404 is an empty collection and the cache still syncs)."""
    seed(emulator)
    emulator.create("horizontalpodautoscalers", _hpa("other", "b", kind="Deployment"))
    recorder = Recorder()
    async with running(api, recorder) as watcher:
        assert watcher.observation(KEY, "b").autoscaled_by == ""  # not aimed at the member
        emulator.create("horizontalpodautoscalers", _hpa("b-hpa", "b"))
        await eventually(lambda: watcher.observation(KEY, "b").autoscaled_by
                         == "HorizontalPodAutoscaler/b-hpa", what="b autoscaled")
        assert watcher.observation(KEY, "a").autoscaled_by == ""
        emulator.delete("horizontalpodautoscalers", "b-hpa", NS)
        await eventually(lambda: watcher.observation(KEY, "b").autoscaled_by == "",
                         what="the autoscaler gone")


async def test_the_first_sync_of_many_pools_lets_the_loop_turn(emulator: Any, api: Any) -> None:
    """Reporting a thousand pools at once would hold the Lease renews back (issue 46): the
    first sync reports them a batch at a time, and other tasks run in between."""
    for i in range(3 * watcher_module.ANNOUNCE_BATCH):
        emulator.create("modelpools", modelpool(f"p{i}", [f"p{i}-a"]))
    turns = 0

    async def turning() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    class Turns(Recorder):
        def pool_changed(self, spec: Any, hints: Any) -> None:
            self.calls.append(("pool_changed", turns))

        def status_changed(self, key: Any, status: Any) -> None:
            """Not what this test looks at."""

    recorder = Turns()
    other = asyncio.create_task(turning())
    try:
        async with running(api, recorder):
            seen = [c[1] for c in recorder.take() if c[0] == "pool_changed"]
    finally:
        other.cancel()
    assert len(seen) == 3 * watcher_module.ANNOUNCE_BATCH
    assert seen[-1] > seen[0]  # the other task ran while the pools were reported
