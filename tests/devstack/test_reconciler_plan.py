"""The stand-in's owner resolution (devstack.reconciler_plan), case by case, without I/O."""

from __future__ import annotations

from typing import Any

import pytest

from devstack import stack_manifests as manifests
from devstack.reconciler_plan import PoolView, needs_idle_check, plan, resolve_owner, \
    scaled_up_outside

NOW = "2026-01-01T00:00:00Z"


def member(name: str, replicas: int, phase: str) -> dict[str, Any]:
    """A member with its spec.replicas and status.phase (Ready ones have a ready pod)."""
    obj = manifests.member(name, "ns")
    obj["spec"]["replicas"] = replicas
    obj["status"] = {"phase": phase, "readyReplicas": int(phase == "Ready")}
    return obj


def view(members: dict[str, tuple[int, str]], resident: str = "", pending: str = "",
         pods: tuple[str, ...] = ()) -> PoolView:
    """A pool judge/coder/writer (default judge) with the given members and status."""
    pool = manifests.pool("gpu", "ns", members, default="judge")
    pool["status"] = {"residentMember": resident, "pendingMember": pending}
    return PoolView(pool, {n: member(n, *m) for n, m in members.items()},
                    {n: 1 for n in pods})


@pytest.mark.parametrize("members, resident, pending, owner", [
    ({"judge": (0, "Stopped"), "coder": (0, "Stopped")}, "", "", "judge"),  # cold: the default
    ({"judge": (1, "Ready"), "coder": (1, "Creating")}, "judge", "", "coder"),  # a request
    ({"judge": (1, "Ready"), "coder": (0, "Stopped")}, "judge", "coder", "coder"),  # held at 0
    ({"judge": (0, "Stopped"), "coder": (0, "Stopped")}, "judge", "", "judge"),  # never cold
    # a newer scale-up takes over from a pending owner held at 0
    ({"judge": (1, "Ready"), "coder": (0, "Stopped"), "writer": (1, "Creating")},
     "judge", "coder", "writer"),
    # ... but the pending one wins while it is still scaled up itself
    ({"judge": (1, "Ready"), "coder": (1, "Creating"), "writer": (1, "Creating")},
     "judge", "coder", "coder"),
    # a Failed pending member is not special: it keeps the slot
    ({"judge": (0, "Stopped"), "coder": (1, "Failed"), "writer": (1, "Creating")},
     "judge", "coder", "coder"),
    ({"judge": (1, "Creating"), "coder": (1, "Failed")}, "judge", "coder", "coder"),
    # a cold pool continues its pending member, else the default if asked, else the first asked
    ({"judge": (0, "Stopped"), "coder": (0, "Stopped")}, "", "coder", "coder"),
    ({"judge": (1, "Creating"), "coder": (1, "Creating")}, "", "", "judge"),
    ({"judge": (0, "Stopped"), "coder": (1, "Creating")}, "", "", "coder"),
])
def test_owner_resolution(members, resident, pending, owner):
    assert resolve_owner(view(members, resident, pending)) == owner


def test_an_early_trigger_is_held_at_zero_while_the_incumbent_has_pods():
    decided = plan(view({"judge": (1, "Ready"), "coder": (1, "Creating")}, "judge",
                        pods=("judge",)), {"judge": True}, NOW)
    assert decided.replicas == {"judge": 0, "coder": 0}
    assert decided.status["pendingMember"] == "coder" and decided.status["phase"] == "Swapping"
    assert decided.requeue  # pods are not watched: look again


def test_the_target_is_scaled_up_once_the_incumbent_s_pods_are_gone():
    decided = plan(view({"judge": (0, "Stopped"), "coder": (0, "Stopped")}, "judge", "coder"),
                   {}, NOW)
    assert decided.replicas == {"coder": 1}
    assert decided.status["residentMember"] == "judge"  # until coder is Ready


def reclaim_down(v: PoolView, released: bool = False) -> PoolView:
    """``v`` under swapPolicy reclaim-down; ``released``: its resident was idle long enough."""
    pool = {**v.pool, "spec": {**v.pool["spec"], "swapPolicy": "reclaim-down"}}
    return PoolView(pool, v.members, v.pods, released=released)


def test_reclaim_down_releases_an_idle_resident_and_leaves_the_pool_cold():
    warm = view({"judge": (1, "Ready"), "coder": (0, "Stopped")}, "judge")
    assert resolve_owner(reclaim_down(warm)) == "judge"  # not idle long enough yet
    assert resolve_owner(reclaim_down(warm, released=True)) is None
    decided = plan(reclaim_down(warm, released=True), {"judge": True}, NOW)
    assert decided.replicas == {"judge": 0}
    assert decided.status["phase"] == "Pending" and "residentMember" not in decided.status
    # cold under reclaim-down: the default is not warmed again, a request still is served
    cold = view({"judge": (0, "Stopped"), "coder": (0, "Stopped")})
    assert resolve_owner(reclaim_down(cold)) is None and resolve_owner(cold) == "judge"
    asked = view({"judge": (0, "Stopped"), "coder": (1, "Creating")})
    assert resolve_owner(reclaim_down(asked)) == "coder"


def resident_since(v: PoolView, since: str, delay: str = "3s") -> PoolView:
    """``v`` with ``spec.swapDelay`` and its resident holding the slot since ``since``."""
    pool = {**v.pool, "spec": {**v.pool["spec"], "swapDelay": delay},
            "status": {**v.status, "conditions": [
                {"type": "SlotAllocated", "status": "True", "reason": "Resident",
                 "lastTransitionTime": since}]}}
    return PoolView(pool, v.members, v.pods)


def test_swap_delay_holds_a_swap_until_the_resident_has_held_the_slot_that_long():
    asked = view({"judge": (1, "Ready"), "coder": (1, "Creating")}, "judge", pods=("judge",))
    held = resident_since(asked, "2025-12-31T23:59:58Z")  # resident 2 s ago, swapDelay 3 s
    assert needs_idle_check(held, "coder", NOW) == []  # not probed while it holds the slot
    decided = plan(held, {}, NOW)
    assert decided.replicas == {"coder": 0}  # the judge keeps its replica, coder waits at 0
    assert decided.deferred == "SwapDelay" and decided.requeue
    status = decided.status
    assert (status["phase"], status["residentMember"], status["pendingMember"]) == \
        ("Swapping", "judge", "coder")
    slot = next(c for c in status["conditions"] if c["type"] == "SlotAllocated")
    assert (slot["status"], slot["lastTransitionTime"]) == ("True", "2025-12-31T23:59:58Z")
    # the next pass, the hold over: the swap goes on as any other
    again = PoolView({**held.pool, "status": status}, held.members, held.pods)
    later = "2026-01-01T00:00:01Z"
    assert needs_idle_check(again, "coder", later) == ["judge"]
    decided = plan(again, {"judge": True}, later)
    assert decided.replicas == {"judge": 0, "coder": 0} and decided.deferred == ""


def test_swap_delay_does_not_hold_a_cold_pool_the_resident_itself_or_a_bad_value():
    asked = view({"judge": (1, "Ready"), "coder": (1, "Creating")}, "judge")
    assert plan(resident_since(asked, "2025-12-31T23:59:58Z", "0s"), {"judge": True},
                NOW).replicas == {"judge": 0}  # (no pod left: coder keeps its 1)
    assert plan(resident_since(asked, "2025-12-31T23:59:58Z", "soon"), {"judge": True},
                NOW).deferred == ""
    warm = view({"judge": (1, "Ready"), "coder": (0, "Stopped")}, "judge")
    assert plan(resident_since(warm, "2025-12-31T23:59:58Z"), {}, NOW).deferred == ""
    cold = view({"judge": (0, "Stopped"), "coder": (1, "Creating")})
    assert plan(resident_since(cold, "2025-12-31T23:59:58Z"), {}, NOW).replicas == {}


def written(replicas: int, manager: str) -> dict[str, Any]:
    """A member whose spec.replicas ``manager`` set (as managedFields record it)."""
    obj = member("coder", replicas, "Stopped")
    obj["metadata"]["managedFields"] = [
        {"manager": manager, "operation": "Update", "apiVersion": "inference.llmkube.dev/v1alpha1",
         "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1",
         "fieldsV1": {"f:spec": {"f:replicas": {}}}}]
    return obj


@pytest.mark.parametrize("before, after, outsider", [
    (written(0, "manager"), written(1, "kubectl"), "kubectl"),  # a person's kubectl scale
    (written(0, "manager"), written(1, "argocd-controller"), "argocd-controller"),
    (written(1, "manager"), written(2, "kubectl"), "kubectl"),
    (written(0, "manager"), written(1, "manager"), ""),  # LLMKube's own
    (written(0, "manager"), written(1, "modelpool-extproc"), ""),  # the activator's trigger
    (written(1, "manager"), written(0, "kubectl"), ""),  # a scale-down is not reported
    (None, written(1, "kubectl"), ""),  # created so: nothing to compare with
])
def test_a_scale_up_outside_llmkube_names_its_field_manager(before, after, outsider):
    assert scaled_up_outside(before, after) == outsider
