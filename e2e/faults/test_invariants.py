"""The invariant checker itself, on hand-made histories: it passes a correct swap and catches
each kind of breach (so a green fault suite means something)."""

from __future__ import annotations

from datetime import datetime, timezone

from invariants import ApiEvent, Outcome, exclusive_slot, misroutes, upstream_failures

POOLS = {("ns", "p"): ["a", "b"]}


def isvc(rv: int, member: str, replicas: int) -> ApiEvent:
    return ApiEvent(rv, "isvc", "MODIFIED", "ns", member, member, replicas)


def pod(rv: int, member: str, etype: str) -> ApiEvent:
    return ApiEvent(rv, "pod", etype, "ns", f"{member}-x", member)


def test_an_ordered_swap_keeps_the_slot_exclusive() -> None:
    history = [isvc(1, "a", 1), pod(2, "a", "ADDED"), isvc(3, "a", 0),
               pod(4, "a", "MODIFIED"), pod(5, "a", "DELETED"), isvc(6, "b", 1),
               pod(7, "b", "ADDED")]
    assert exclusive_slot(history, POOLS) == []


def test_scale_up_while_the_incumbent_pod_terminates_is_caught() -> None:
    history = [isvc(1, "a", 1), pod(2, "a", "ADDED"), isvc(3, "a", 0),
               pod(4, "a", "MODIFIED"), isvc(5, "b", 1), pod(6, "a", "DELETED")]
    [breach] = exclusive_slot(history, POOLS)
    assert "rv 5" in breach and "ns/b scaled up" in breach and "a (a-x)" in breach


def test_scale_up_before_the_incumbent_is_scaled_down_is_caught() -> None:
    # The incumbent's pod is gone (killed) but it still wants a replica: a new pod may come.
    history = [isvc(1, "a", 1), pod(2, "a", "ADDED"), pod(3, "a", "DELETED"), isvc(4, "b", 1)]
    [breach] = exclusive_slot(history, POOLS)
    assert "rv 4" in breach and breach.endswith("a still had pods or replicas")


def test_two_members_with_pods_are_caught() -> None:
    history = [pod(1, "a", "ADDED"), pod(2, "b", "ADDED")]
    assert len(exclusive_slot(history, POOLS)) == 1


def test_members_of_other_pools_do_not_count() -> None:
    pools = {("ns", "p"): ["a"], ("ns", "q"): ["b"]}
    assert exclusive_slot([pod(1, "a", "ADDED"), isvc(2, "b", 1), pod(3, "b", "ADDED")],
                          pools) == []


def test_upstream_failures_on_member_clusters() -> None:
    at = "2026-01-01T00:00:10.000Z"
    log = [{"upstream_cluster": "a.ns", "flags": "-", "status": 200, "start_time": at},
           {"upstream_cluster": None, "flags": "-", "status": 503, "start_time": at},
           {"upstream_cluster": "b.ns", "flags": "UF,URX", "status": 503, "start_time": at},
           {"upstream_cluster": "a.ns", "flags": "UC", "status": 503, "start_time": at,
            "duration_ms": 500}]
    assert len(upstream_failures(log)) == 2
    killed = datetime(2026, 1, 1, 0, 0, 11, tzinfo=timezone.utc).timestamp()
    assert len(upstream_failures(log, excused={"a.ns": [killed]})) == 1  # 0.5 s + margin
    assert len(upstream_failures(log, excused={"a.ns": [killed + 60]})) == 2  # another time


def test_misroutes() -> None:
    good = [Outcome("a", 200, "a", body_member="a"), Outcome("a", 503, code="swap_budget"),
            Outcome("b", gave_up=True)]
    assert misroutes(good) == []
    bad = [Outcome("a", 200, "b"), Outcome("a", 200, "a", body_member="b"),
           Outcome("a", 502), Outcome("a", error="reset")]
    assert len(misroutes(bad)) == 4
    assert len(misroutes(bad, allow_broken=True)) == 3
