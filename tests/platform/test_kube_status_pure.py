"""desired_status: every field and condition in each pool situation, as a pure function."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from extproc.platform.kube.status import desired_status, spec_invalid_news
from extproc.policy.model import MemberObservation, PoolKey, PoolPhase, PoolView

KEY = PoolKey("ml", "slot")
T0 = datetime(2025, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
T1 = T0 + timedelta(minutes=1)
STAMP0, STAMP1 = "2025-01-02T03:04:05Z", "2025-01-02T03:05:05Z"

STOPPED_A = MemberObservation("a", phase="Stopped", replicas=0, pods=0)
STOPPED_B = MemberObservation("b", phase="Stopped", replicas=0, pods=0)
READY_A = MemberObservation("a", phase="Ready", replicas=1, pods=1)
LOADING_B = MemberObservation("b", phase="Progressing", replicas=1, pods=1)


def view(**kw) -> PoolView:
    """A PoolView with cold-pool defaults, overridden by ``kw``."""
    base = dict(key=KEY, phase=PoolPhase.PENDING, resident="", pending="",
                members=(STOPPED_A, STOPPED_B), generation=3)
    base.update(kw)
    return PoolView(**base)


def conditions(status: dict) -> dict[str, dict]:
    """Conditions by type."""
    return {c["type"]: c for c in status["conditions"]}


def test_cold_pool_is_pending_with_no_resident() -> None:
    status = desired_status(view(), {}, T0)
    assert status["phase"] == "Pending"
    assert status["residentMember"] == "" and status["pendingMember"] == ""
    assert status["observedGeneration"] == 3
    assert status["members"] == [{"name": "a", "phase": "Stopped", "resident": False},
                                 {"name": "b", "phase": "Stopped", "resident": False}]
    conds = conditions(status)
    assert set(conds) == {"SlotAllocated", "MembersValid", "SwapDeferred", "SpecValid",
                          "SwapStalled", "Actuating"}
    # None: the merge patch deletes a time left from an earlier idle spell
    assert status["residentIdleSince"] is None
    assert conds["SlotAllocated"]["status"] == "False"
    assert conds["SlotAllocated"]["reason"] == "NoResident"
    assert conds["MembersValid"]["status"] == "True"
    assert conds["SwapDeferred"]["status"] == "False"
    assert conds["SpecValid"]["status"] == "True"
    for cond in conds.values():
        assert cond["lastTransitionTime"] == STAMP0
        assert cond["observedGeneration"] == 3
        assert cond["reason"]  # the CRD requires a non-empty reason
        assert isinstance(cond["message"], str)


def test_ready_pool_marks_the_resident() -> None:
    status = desired_status(view(phase=PoolPhase.READY, resident="a",
                                 members=(READY_A, STOPPED_B)), {}, T0)
    assert status["phase"] == "Ready"
    assert status["residentMember"] == "a"
    assert status["members"][0] == {"name": "a", "phase": "Ready", "resident": True}
    assert status["members"][1]["resident"] is False
    slot = conditions(status)["SlotAllocated"]
    assert (slot["status"], slot["reason"]) == ("True", "MemberResident")
    assert "a" in slot["message"]


def test_swapping_reports_pending_member() -> None:
    status = desired_status(view(phase=PoolPhase.SWAPPING, resident="", pending="b",
                                 members=(STOPPED_A, LOADING_B)), {}, T0)
    assert status["phase"] == "Swapping"
    assert status["pendingMember"] == "b"
    slot = conditions(status)["SlotAllocated"]
    assert (slot["status"], slot["reason"]) == ("False", "Swapping")
    assert "b" in slot["message"]


def test_swapping_with_incumbent_still_resident_names_both() -> None:
    status = desired_status(view(phase=PoolPhase.SWAPPING, resident="a", pending="b",
                                 members=(MemberObservation("a", phase="Ready", replicas=0,
                                                            pods=1), STOPPED_B)), {}, T0)
    slot = conditions(status)["SlotAllocated"]
    assert slot["reason"] == "Swapping" and "from a to b" in slot["message"]


def test_degraded_names_missing_member() -> None:
    ghost = MemberObservation("ghost", exists=False)
    status = desired_status(view(phase=PoolPhase.DEGRADED, members=(STOPPED_A, ghost),
                                 missing_members=("ghost",)), {}, T0)
    assert status["phase"] == "Degraded"
    valid = conditions(status)["MembersValid"]
    assert (valid["status"], valid["reason"]) == ("False", "MemberNotFound")
    assert "ghost" in valid["message"] and "ml" in valid["message"]
    assert status["members"][1] == {"name": "ghost", "phase": "", "resident": False}


def test_missing_member_is_named_even_when_only_observed() -> None:
    ghost = MemberObservation("ghost", exists=False)
    valid = conditions(desired_status(view(members=(STOPPED_A, ghost)), {}, T0))["MembersValid"]
    assert valid["status"] == "False" and valid["message"].endswith("ghost")


def test_failed_member() -> None:
    status = desired_status(view(failed_member="b", failed_message="b crashed: OOM"), {}, T0)
    slot = conditions(status)["SlotAllocated"]
    assert (slot["status"], slot["reason"], slot["message"]) == ("False", "MemberFailed",
                                                                 "b crashed: OOM")


def test_resident_not_ready() -> None:
    status = desired_status(view(phase=PoolPhase.READY, resident="a",
                                 members=(MemberObservation("a", phase="Progressing",
                                                            replicas=1, pods=1), STOPPED_B)),
                            {}, T0)
    slot = conditions(status)["SlotAllocated"]
    assert (slot["status"], slot["reason"]) == ("False", "MemberNotReady")
    assert "Progressing" in slot["message"]


def test_swap_deferred_pods_busy_and_idle_check_failed() -> None:
    for reason in ("PodsBusy", "IdleCheckFailed"):
        status = desired_status(view(phase=PoolPhase.READY, resident="a", pending="b",
                                     members=(READY_A, STOPPED_B), deferred_reason=reason,
                                     deferred_message=f"a is {reason}"), {}, T0)
        deferred = conditions(status)["SwapDeferred"]
        assert (deferred["status"], deferred["reason"]) == ("True", reason)
        assert deferred["message"] == f"a is {reason}"


def test_spec_problems_make_spec_invalid() -> None:
    status = desired_status(view(), {}, T0, spec_problems=("spec.swapBudget 'soon' is bad",))
    spec = conditions(status)["SpecValid"]
    assert (spec["status"], spec["reason"]) == ("False", "InvalidSpec")
    assert "swapBudget" in spec["message"]


def test_transition_time_is_kept_while_status_unchanged() -> None:
    first = desired_status(view(), {}, T0)
    again = desired_status(view(), first, T1)
    assert again == first  # nothing moved, so nothing to write


def test_transition_time_kept_when_only_reason_changes() -> None:
    cold = desired_status(view(), {}, T0)
    swapping = desired_status(view(phase=PoolPhase.SWAPPING, pending="a"), cold, T1)
    slot = conditions(swapping)["SlotAllocated"]
    assert slot["reason"] == "Swapping" and slot["lastTransitionTime"] == STAMP0


def test_transition_time_moves_on_a_status_flip_only() -> None:
    cold = desired_status(view(), {}, T0)
    ready = desired_status(view(phase=PoolPhase.READY, resident="a",
                                members=(READY_A, STOPPED_B)), cold, T1)
    conds = conditions(ready)
    assert conds["SlotAllocated"]["lastTransitionTime"] == STAMP1
    assert conds["MembersValid"]["lastTransitionTime"] == STAMP0
    assert conds["SwapDeferred"]["lastTransitionTime"] == STAMP0


def test_observed_generation_follows_the_view() -> None:
    status = desired_status(view(generation=7), desired_status(view(), {}, T0), T1)
    assert status["observedGeneration"] == 7
    assert all(c["observedGeneration"] == 7 for c in status["conditions"])
    assert all(c["lastTransitionTime"] == STAMP0 for c in status["conditions"])


def test_offset_times_are_written_in_utc() -> None:
    plus2 = T0.astimezone(timezone(timedelta(hours=2)))
    status = desired_status(view(), {}, plus2)
    assert status["conditions"][0]["lastTransitionTime"] == STAMP0


def test_an_unsupported_swap_policy_makes_spec_valid_false_with_its_own_reason() -> None:
    status = desired_status(view(unsupported_policy="priority"), {}, T0,
                            spec_problems=("spec.swapBudget 'x' is not a valid duration",))
    spec_valid = conditions(status)["SpecValid"]
    assert (spec_valid["status"], spec_valid["reason"]) == ("False", "UnsupportedSwapPolicy")
    assert "priority" in spec_valid["message"] and "sticky" in spec_valid["message"]
    assert "spec.swapBudget" in spec_valid["message"]  # the other problems are still told


def test_a_stalled_swap_sets_swap_stalled_with_what_is_missing_until_it_moves() -> None:
    stalled = desired_status(view(phase=PoolPhase.SWAPPING, pending="b",
                                  stalled="target b has no pod after 120s"), {}, T0)
    cond = conditions(stalled)["SwapStalled"]
    assert (cond["status"], cond["reason"], cond["message"]) == \
        ("True", "NoProgress", "target b has no pod after 120s")
    moving = desired_status(view(phase=PoolPhase.SWAPPING, pending="b"), stalled, T1)
    cond = conditions(moving)["SwapStalled"]
    assert (cond["status"], cond["lastTransitionTime"]) == ("False", STAMP1)


def test_resident_idle_since_is_written_as_utc_time() -> None:
    status = desired_status(view(phase=PoolPhase.READY, resident="a",
                                 members=(READY_A, STOPPED_B),
                                 resident_idle_since=T0.timestamp()), {}, T1)
    assert status["residentIdleSince"] == STAMP0


MESSAGE_LIMIT = 32768  # the CRD's maxLength of a condition message


def test_a_message_over_the_crd_limit_is_cut_with_a_marker() -> None:
    failure = "CUDA error: out of memory\n" + "at frame\n" * 5000
    status = desired_status(view(failed_member="a", failed_message=failure), {}, T0,
                            spec_problems=("x" * 40_000,))
    for kind in ("SlotAllocated", "SpecValid"):
        message = conditions(status)[kind]["message"]
        assert len(message) == MESSAGE_LIMIT and message.endswith("[truncated]")
    assert conditions(status)["SlotAllocated"]["message"].startswith("CUDA error")
    exactly = "y" * MESSAGE_LIMIT  # at the limit: kept whole
    assert conditions(desired_status(view(failed_member="a", failed_message=exactly), {},
                                     T0))["SlotAllocated"]["message"] == exactly


def test_spec_invalid_news_only_when_it_turns_false_or_says_something_new() -> None:
    def status(state: str, message: str = "") -> dict:
        return {"conditions": [{"type": "SpecValid", "status": state, "message": message}]}

    assert spec_invalid_news({}, status("False", "x")) == "x"
    assert spec_invalid_news(status("True"), status("False", "x")) == "x"
    assert spec_invalid_news(status("False", "x"), status("False", "x")) is None
    assert spec_invalid_news(status("False", "x"), status("False", "x; y")) == "x; y"
    assert spec_invalid_news(status("False", "x"), status("True")) is None
    assert spec_invalid_news({}, {}) is None


def test_actuating_names_the_other_writer_while_own_mode_stands_back() -> None:
    said = ("actuation own -> hands-off: b's spec.replicas was set to 1 by field manager "
            "'argocd-controller' (Argo CD syncing the member from Git): add ignoreDifferences")
    cond = conditions(desired_status(view(hands_off=said), {}, T0))["Actuating"]
    assert (cond["status"], cond["reason"], cond["message"]) == ("False", "HandsOff", said)
    cond = conditions(desired_status(view(), {}, T0))["Actuating"]
    assert (cond["status"], cond["reason"]) == ("True", "Actuating")
