"""The LLMKube stand-in (devstack.reconciler) against the emulator and the member simulator.

Each test pins one way LLMKube's real ModelPoolReconciler behaves (docs/design/llmkube.md,
checked against its source), read back from the API, the emulator's event history and its
request record. The fixture and readers are in reconciler_kit.py; the lost-activation fault
and the command line are in test_reconciler_fault.py.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import aiohttp
import pytest

from devstack.reconciler import POOLS, SCALED_OUTSIDE, USER
from devstack.simulator_kube import GROUP, MERGE_PATCH, PLURAL, VERSION
from devstack.fakemember import TOKEN_DELAY_ENV
from devstack_cluster import NS, Cluster, eventually
from reconciler_kit import POOL, SWAP_TIMEOUT, calls, condition, deferred_by, make_pod, \
    message, passes_after, pending_is, phase_is, pod_history, poke, pool_history, \
    pool_status, replica_history, replicas, replicas_are, report, resident_is, status_patches, \
    version_now, warm


async def test_a_cold_pool_says_swapping_to_its_default_and_never_degraded(cluster: Cluster,
                                                                           llmkube):
    since = version_now(cluster)
    await llmkube()
    status = await eventually(lambda: resident_is(cluster, "judge"), SWAP_TIMEOUT, "warm judge")

    assert await replicas(cluster, "judge") == 1 and await replicas(cluster, "coder") == 0
    pool = await cluster.custom.get_namespaced_custom_object(GROUP, VERSION, NS, POOLS, POOL)
    assert status["observedGeneration"] == pool["metadata"]["generation"]
    # as LLMKube serializes them: a false `resident` is left out
    assert status["members"] == [{"name": "judge", "resident": True, "phase": "Ready"},
                                 {"name": "coder", "phase": "Stopped"}]
    assert {c["type"]: (c["status"], c["reason"], c["message"])
            for c in status["conditions"]} == {
        "SlotAllocated": ("True", "Resident", 'Member "judge" owns the shared GPU slot'),
        "MembersValid": ("True", "AllResolved", "All member references resolve"),
        "SwapDeferred": ("False", "NotDeferred", "No swap is being deferred"),
        "MetalSupported": ("True", "KubernetesGPU", "All members are k8s GPU-gated")}
    seen = [s for s in await pool_history(cluster, since) if s]  # the first: created, bare
    # the warm-up is a swap to the default, never Pending; its caches were synced before its
    # first pass, so no member ever looked missing
    assert [s.get("phase") for s in seen] == ["Swapping"] * (len(seen) - 1) + ["Ready"]
    assert seen[0]["pendingMember"] == "judge" and "residentMember" not in seen[0]
    assert message(seen[0], "SlotAllocated") == "No member resident yet"
    assert all(condition(s, "MembersValid") in (None, ("True", "AllResolved")) for s in seen)

    # as LLMKube: its own user, merge patches on replicas and status, no pod watch, and no
    # Events (no member was scaled up outside LLMKube)
    assert calls(cluster, USER, "patch", PLURAL) and calls(cluster, USER, "patch", POOLS, "status")
    mine = cluster.emu.requests_of(USER)
    assert not [r for r in mine if r.resource == "events"]
    assert not [r for r in mine if r.resource == "pods" and r.verb == "watch"]
    assert {r.resource for r in mine if r.verb == "watch"} == {POOLS, PLURAL, "models",
                                                              "horizontalpodautoscalers"}


async def test_an_autoscaled_member_is_refused_and_the_rest_serves_on(cluster: Cluster,
                                                                      llmkube) -> None:
    stack = await warm(cluster, llmkube)
    hpa = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
           "metadata": {"name": "coder-hpa"},
           "spec": {"scaleTargetRef": {"apiVersion": f"{GROUP}/{VERSION}",
                                       "kind": "InferenceService", "name": "coder"},
                    "minReplicas": 1, "maxReplicas": 2}}
    await cluster.custom.create_namespaced_custom_object("autoscaling", "v2", NS,
                                                         "horizontalpodautoscalers", hpa)
    refused = await eventually(lambda: _members_valid_is(cluster, "AutoscaledMembers"),
                               SWAP_TIMEOUT, "coder refused")
    assert "coder(HorizontalPodAutoscaler/coder-hpa)" in message(refused, "MembersValid")
    await cluster.scale("coder", 1)  # a trigger (or the HPA) for the refused member
    await passes_after(stack.reconciler, 2)
    status = await pool_status(cluster)
    assert status["residentMember"] == "judge" and status["phase"] == "Ready"
    assert await replicas(cluster, "coder") == 1  # left alone: the autoscaler's
    await cluster.custom.delete_namespaced_custom_object("autoscaling", "v2", NS,
                                                         "horizontalpodautoscalers", "coder-hpa")
    await eventually(lambda: resident_is(cluster, "coder"), SWAP_TIMEOUT, "coder served again")


async def _members_valid_is(cluster: Cluster, reason: str) -> dict | None:
    status = await pool_status(cluster)
    found = condition(status, "MembersValid")
    return status if found is not None and found[1] == reason else None


async def test_an_activator_trigger_swaps_through_pending_member(cluster: Cluster, llmkube):
    await warm(cluster, llmkube)
    since = version_now(cluster)

    await cluster.scale("coder", 1)  # the activator's only write
    swapping = await eventually(lambda: pending_is(cluster, "coder"), SWAP_TIMEOUT, "pending")
    assert swapping["phase"] == "Swapping" and swapping["residentMember"] == "judge"
    assert condition(swapping, "SlotAllocated") == ("False", "Swapping")
    assert message(swapping, "SlotAllocated") == "No member resident yet"
    status = await eventually(lambda: resident_is(cluster, "coder"), SWAP_TIMEOUT, "coder")

    assert await replicas(cluster, "judge") == 0 and await replicas(cluster, "coder") == 1
    assert status["members"] == [{"name": "judge", "phase": "Stopped"},
                                 {"name": "coder", "resident": True, "phase": "Ready"}]
    assert message(status, "SlotAllocated") == 'Member "coder" owns the shared GPU slot'
    # the early trigger was patched back to 0 while judge's pods existed, then up again
    assert await replica_history(cluster, "coder", since) == [1, 0, 1]
    assert await replica_history(cluster, "judge", since) == [0]
    holding = await pod_history(cluster, since)
    assert holding and all(len(members) <= 1 for members in holding), holding
    assert holding[-1] == {"coder"}


async def test_it_patches_only_the_status_fields_that_changed(cluster: Cluster, llmkube):
    await warm(cluster, llmkube)
    # someone else's condition and field (the ext_proc keeps its own beside LLMKube's)
    foreign = {"type": "Foreign", "status": "True", "reason": "Mine", "message": "kept",
               "lastTransitionTime": "2026-01-01T00:00:00Z"}
    conditions = (await pool_status(cluster))["conditions"] + [foreign]
    await cluster.custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, NS, POOLS, POOL, {"status": {"conditions": conditions, "other": "x"}},
        _content_type=MERGE_PATCH)
    before = len(status_patches(cluster))

    await cluster.scale("coder", 1)
    status = await eventually(lambda: resident_is(cluster, "coder"), SWAP_TIMEOUT, "coder")

    patches = status_patches(cluster)[before:]
    assert patches
    # the write that recorded the activation named only what changed: not the resident
    first = patches[0]
    assert first["pendingMember"] == "coder" and first["phase"] == "Swapping"
    assert "residentMember" not in first and "observedGeneration" not in first
    assert all("other" not in p for p in patches)
    # the resident changes once, with pendingMember removed in the same patch
    residents = [p for p in patches if "residentMember" in p]
    assert residents == [r for r in residents if r["residentMember"] == "coder"
                         and r["pendingMember"] is None] and len(residents) == 1
    assert foreign in status["conditions"] and status["other"] == "x"


async def test_a_newer_scale_up_takes_over_from_a_pending_owner_held_at_zero(cluster: Cluster,
                                                                            llmkube):
    stack = await warm(cluster, llmkube, members=("judge", "coder", "writer"))
    server = stack.sim.actors[(NS, "judge")].server
    assert server is not None
    os.kill(server.process.pid, signal.SIGSTOP)  # judge hangs: its swap is deferred
    try:
        await cluster.scale("coder", 1)
        await eventually(lambda: deferred_by(cluster, "IdleCheckFailed"), SWAP_TIMEOUT,
                         "coder's swap deferred")
        assert (await pool_status(cluster))["pendingMember"] == "coder"
        assert await replicas(cluster, "coder") == 0  # held at 0: the trigger is gone from spec
        await cluster.scale("writer", 1)
        await eventually(lambda: pending_is(cluster, "writer"), SWAP_TIMEOUT, "writer pending")
        await eventually(lambda: replicas_are(cluster, "writer", 0), SWAP_TIMEOUT,
                         "writer held at 0")
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
    await eventually(lambda: resident_is(cluster, "writer"), SWAP_TIMEOUT, "writer")
    assert await replicas(cluster, "coder") == 0


async def test_a_failed_pending_member_keeps_the_slot(cluster: Cluster, llmkube):
    # LLMKube has no case for it: the failed target stays the owner, a new request is held
    stack = await warm(cluster, llmkube, members=("judge", "coder", "writer"))
    await cluster.annotate("coder", "sim.llmkube.dev/fail", "true")
    await cluster.scale("coder", 1)
    await cluster.wait_phase("coder", "Failed", SWAP_TIMEOUT)
    since = version_now(cluster)

    await cluster.scale("writer", 1)
    await eventually(lambda: replicas_are(cluster, "writer", 0), SWAP_TIMEOUT, "writer at 0")
    await passes_after(stack.reconciler, 3)  # requeues later: still so
    status = await pool_status(cluster)
    assert status["pendingMember"] == "coder" and status["phase"] == "Swapping"
    assert await replica_history(cluster, "writer", since) == [1, 0]
    assert await replicas(cluster, "coder") == 1


async def warm_by_hand(cluster: Cluster, llmkube, **options) -> object:
    """No simulator: judge is brought up by the test, reported Ready with no ready pod."""
    stack = await llmkube(simulate=False, **options)
    await eventually(lambda: replicas_are(cluster, "judge", 1), SWAP_TIMEOUT, "judge at 1")
    # LLMKube's own controller would say Progressing here; its pool reconciler reads the
    # phase alone, so Ready with readyReplicas 0 is Ready
    await report(cluster, "judge", "Ready", ready=0)
    await report(cluster, "coder", "Stopped")
    await eventually(lambda: resident_is(cluster, "judge"), SWAP_TIMEOUT, "judge resident")
    return stack


async def test_ready_is_the_phase_alone(cluster: Cluster, llmkube):
    await warm_by_hand(cluster, llmkube)
    status = await pool_status(cluster)
    assert status["members"][0] == {"name": "judge", "resident": True, "phase": "Ready"}


async def test_the_serving_resident_is_held_at_zero_while_another_member_has_pods(
        cluster: Cluster, llmkube):
    stack = await warm_by_hand(cluster, llmkube)
    # pods that only look like coder's: LLMKube selects on both labels
    await make_pod(cluster, "coder-app-only", {"app": "coder"})
    await make_pod(cluster, "coder-label-only", {"inference.llmkube.dev/service": "coder"})
    mark = stack.reconciler.passes
    await poke(cluster, "1")
    await passes_after(stack.reconciler, 1, mark)
    assert await replicas(cluster, "judge") == 1

    # a real coder pod (a leftover, or one still terminating): even the resident waits for it
    await make_pod(cluster, "coder-abcde", {"app": "coder",
                                            "inference.llmkube.dev/service": "coder"})
    await poke(cluster, "2")
    await eventually(lambda: replicas_are(cluster, "judge", 0), SWAP_TIMEOUT, "judge held")
    await cluster.core.delete_namespaced_pod("coder-abcde", NS)
    await eventually(lambda: replicas_are(cluster, "judge", 1), SWAP_TIMEOUT, "judge back")


async def test_every_ready_non_owner_is_probed_even_at_zero_replicas(cluster: Cluster,
                                                                    llmkube):
    stack = await warm_by_hand(cluster, llmkube)
    # coder still says Ready at 0 replicas (its controller lags): it is probed; nothing
    # answers at its name, so the swap-less pool is deferred and the resident held at 0
    await report(cluster, "coder", "Ready", ready=1)
    await eventually(lambda: deferred_by(cluster, "IdleCheckFailed"), SWAP_TIMEOUT, "deferred")
    assert stack.router.hosts.get(f"{NS}/coder"), stack.router.hosts
    assert message(await pool_status(cluster), "SwapDeferred") == \
        "Swap deferred: incumbent idleness could not be established (fail-closed)"
    await eventually(lambda: replicas_are(cluster, "judge", 0), SWAP_TIMEOUT, "judge held")


async def test_the_idle_probe_dials_the_member_service_on_its_port(cluster: Cluster, llmkube):
    members = ("judge", "coder", "writer")
    for name in members:
        await cluster.create(name, replicas=0)
    await cluster.patch("judge", {"spec": {"endpoint": {"port": 9000}, "containerPort": 7001}})
    await cluster.patch("coder", {"spec": {"containerPort": 7000}})
    stack = await warm(cluster, llmkube, members=(), pool_members=members)  # they exist
    for target in ("coder", "writer", "judge"):
        await cluster.scale(target, 1)
        await eventually(lambda t=target: resident_is(cluster, t), SWAP_TIMEOUT, target)
    hosts = {key: set(asked) for key, asked in stack.router.hosts.items()}
    assert hosts == {f"{NS}/judge": {"judge.sim.svc.cluster.local:9000"},
                     f"{NS}/coder": {"coder.sim.svc.cluster.local:7000"},
                     f"{NS}/writer": {"writer.sim.svc.cluster.local:8080"}}


async def test_a_busy_incumbent_defers_the_swap_until_it_is_idle(
        cluster: Cluster, llmkube, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(TOKEN_DELAY_ENV, "100")  # a 200-token stream lasts 20 s: busy for sure
    sim = (await warm(cluster, llmkube)).sim
    url = f"http://127.0.0.1:{sim.ports['judge']}/v1/chat/completions"
    body = {"model": "judge", "stream": True, "max_tokens": 200,
            "messages": [{"role": "user", "content": "write at length"}]}
    async with aiohttp.ClientSession() as session:
        async with session.post(url, json=body) as stream:
            await stream.content.readline()  # the generation is under way
            await cluster.scale("coder", 1)
            deferred = await eventually(lambda: deferred_by(cluster, "PodsBusy"), SWAP_TIMEOUT,
                                        "SwapDeferred PodsBusy")
            assert deferred["pendingMember"] == "coder" and deferred["phase"] == "Swapping"
            assert message(deferred, "SwapDeferred") == \
                "Swap deferred: incumbent still serving in-flight requests"
            # the incumbent is left serving; the target waits at 0 without a pod
            assert await replicas(cluster, "judge") == 1
            assert (await cluster.status("judge"))["phase"] == "Ready"
            assert await replicas(cluster, "coder") == 0 and await cluster.pods("coder") == []
            assert not stream.content.at_eof()
        # the client is done: the next probe finds judge idle and the swap goes ahead
    status = await eventually(lambda: resident_is(cluster, "coder"), SWAP_TIMEOUT, "coder")
    assert condition(status, "SwapDeferred") == ("False", "NotDeferred")


async def test_an_unanswered_idle_probe_defers_the_swap(cluster: Cluster, llmkube):
    sim = (await warm(cluster, llmkube)).sim
    server = sim.actors[(NS, "judge")].server
    assert server is not None
    os.kill(server.process.pid, signal.SIGSTOP)  # judge hangs: /slots does not answer
    try:
        await cluster.scale("coder", 1)
        deferred = await eventually(lambda: deferred_by(cluster, "IdleCheckFailed"),
                                    SWAP_TIMEOUT, "SwapDeferred IdleCheckFailed")
        assert deferred["pendingMember"] == "coder"
        assert await replicas(cluster, "judge") == 1  # fail closed: never a forced unload
        assert await replicas(cluster, "coder") == 0 and await cluster.pods("coder") == []
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
    await eventually(lambda: resident_is(cluster, "coder"), SWAP_TIMEOUT, "coder")


async def test_a_resident_scaled_down_by_someone_else_is_scaled_back(cluster: Cluster, llmkube):
    await warm(cluster, llmkube)
    since = version_now(cluster)
    patches_before = len(calls(cluster, USER, "patch", PLURAL))

    await cluster.scale("judge", 0)  # what an own-mode service does to drain the incumbent
    await eventually(lambda: replicas_are(cluster, "judge", 1), SWAP_TIMEOUT, "judge back at 1")
    await eventually(lambda: resident_is(cluster, "judge"), SWAP_TIMEOUT, "judge Ready again")

    assert await replica_history(cluster, "judge", since) == [0, 1]
    scaled = calls(cluster, USER, "patch", PLURAL)[patches_before:]
    assert [r.name for r in scaled] == ["judge"]  # the reconciler undid it, and did nothing else
    assert await replicas(cluster, "coder") == 0


@pytest.mark.parametrize("fault", ["metal Model", "missing member"])
async def test_a_pool_it_cannot_manage_is_degraded_and_left_alone(cluster: Cluster, llmkube,
                                                                  fault: str):
    if fault == "metal Model":
        await cluster.create("mac", replicas=0)  # spec.modelRef: mac
        await cluster.custom.create_namespaced_custom_object(GROUP, VERSION, NS, "models", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "Model", "metadata": {"name": "mac"},
            "spec": {"hardware": {"accelerator": "metal"}}})
        await llmkube(pool_members=("judge", "mac"))
        expected = ("MetalSupported", "False", "MetalMembersUnsupported",
                    "Metal-backed members are not supported in v1 (k8s GPU gating only): [mac]")
    else:
        await llmkube(pool_members=("judge", "ghost"))
        expected = ("MembersValid", "False", "MissingMembers",
                    "Member InferenceServices not found: [ghost]")
    status = await eventually(lambda: phase_is(cluster, "Degraded"), SWAP_TIMEOUT, "Degraded")

    kind = expected[0]
    assert (kind, *condition(status, kind), message(status, kind)) == expected
    # only its own condition is set on a refusal: no other was ever written
    assert [c["type"] for c in status["conditions"]] == [kind]
    assert not status.get("residentMember") and not status.get("pendingMember")
    assert calls(cluster, USER, "patch", PLURAL) == []  # not even the default is warmed
    assert await replicas(cluster, "judge") == 0


async def test_a_member_whose_model_is_missing_is_not_metal(cluster: Cluster, llmkube):
    # the member says metal itself, but only its Model counts, and there is no Model
    await cluster.create("mac", replicas=0)
    await cluster.patch("mac", {"spec": {"accelerator": "metal"}})
    await llmkube(members=("judge",), pool_members=("judge", "mac"))
    status = await eventually(lambda: resident_is(cluster, "judge"), SWAP_TIMEOUT, "judge")
    assert condition(status, "MetalSupported") == ("True", "KubernetesGPU")


async def cold(cluster: Cluster) -> dict[str, Any] | None:
    """The pool's status once no member is resident or pending and none has replicas."""
    status = await pool_status(cluster)
    idle = not status.get("residentMember") and not status.get("pendingMember") \
        and status.get("phase") == "Pending"
    down = all([await replicas(cluster, m) == 0 for m in ("judge", "coder")])
    return status if idle and down else None


async def test_reclaim_down_releases_the_idle_resident_and_the_pool_stays_cold(
        cluster: Cluster, llmkube):
    await warm(cluster, llmkube)
    await cluster.custom.patch_namespaced_custom_object(
        GROUP, VERSION, NS, POOLS, POOL, {"spec": {"swapPolicy": "reclaim-down",
                                                   "reclaimAfter": "1s"}},
        _content_type=MERGE_PATCH)
    status = await eventually(lambda: cold(cluster), SWAP_TIMEOUT, "the pool released")
    assert condition(status, "SlotAllocated") == ("False", "Swapping")
    # cold, the default is not warmed again; a trigger loads its member from cold
    await cluster.scale("coder", 1)
    await eventually(lambda: resident_is(cluster, "coder"), SWAP_TIMEOUT, "coder from cold")
    assert await replicas(cluster, "judge") == 0


async def test_a_member_scaled_up_outside_llmkube_is_reported_naming_the_manager(
        cluster: Cluster, llmkube) -> None:
    await warm(cluster, llmkube)
    await cluster.custom.patch_namespaced_custom_object(  # a person's kubectl patch
        GROUP, VERSION, NS, PLURAL, "coder", {"spec": {"replicas": 1}},
        field_manager="kubectl-patch", _content_type=MERGE_PATCH)
    await eventually(lambda: resident_is(cluster, "coder"), SWAP_TIMEOUT, "the swap it asks for")

    async def warnings() -> list[Any]:
        listed = await cluster.core.list_namespaced_event(NS)
        return [e for e in listed.items if e.reason == SCALED_OUTSIDE]

    [event] = await eventually(warnings, SWAP_TIMEOUT, "the Warning Event")
    assert event.type == "Warning" and event.involved_object.name == POOL
    assert event.involved_object.kind == "ModelPool"
    assert '"kubectl-patch"' in event.message and '"coder"' in event.message
    assert [r for r in cluster.emu.requests_of(USER) if r.resource == "events"]
