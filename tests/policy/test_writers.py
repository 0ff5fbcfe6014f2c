"""Other writers named by their field manager (policy/writers.py, modes.note_writer): a
controller that will write a member's replicas again hands the pool off at once, a person's
kubectl scale is reported and undone (a scale to 0, which leaves no field manager, as a write
through the /scale subresource), and every hands-off notice names who wrote."""

from __future__ import annotations

import pytest

from extproc.policy import writers
from extproc.policy.events import (MemberObserved, Notice, Reject, RequestArrived, RequestEnded,
                                   Scale, StatusObserved)
from extproc.policy.machine import PoolMachine
from extproc.policy.model import Actuation, PoolKey, PoolSpec, PoolStatus
from extproc.policy.model import MemberObservation as Obs
from harness import limits

KEY = PoolKey("ns", "pool")
READY = dict(phase="Ready", replicas=1, pods=1)
STOPPED = dict(phase="Stopped", replicas=0, pods=0)
OURS = writers.OUR_MANAGER


def machine(*, auto: bool = False) -> PoolMachine:
    """Own mode, a resident and Ready, b scaled down by us."""
    m = PoolMachine(PoolSpec(KEY, ("a", "b"), fairness_window=0), limits(), 0.0,
                    actuation=Actuation.OWN, auto=auto)
    m.handle(StatusObserved(PoolStatus()), 0.0)
    m.handle(MemberObserved(Obs("a", **READY, replicas_by=OURS)), 0.0)
    m.handle(MemberObserved(Obs("b", **STOPPED, replicas_by=OURS)), 0.0)
    return m


def notices(out: list, kind: str) -> list[Notice]:
    return [c for c in out if isinstance(c, Notice) and c.kind == kind]


@pytest.mark.parametrize("manager,label", [
    ("argocd-controller", "argocd"), ("kustomize-controller", "flux"), ("helm", "helm"),
    ("kube-controller-manager", "autoscaler")])
def test_a_controller_scaling_a_member_hands_the_pool_off_at_once_naming_it(
        manager: str, label: str) -> None:
    m = machine()
    out = m.handle(MemberObserved(Obs("b", phase="Creating", replicas=1, pods=1,
                                      replicas_by=manager)), 1.0)
    [changed] = notices(out, "ActuationChanged")
    assert changed.target == "hands-off" and changed.writer == manager
    assert repr(manager) in changed.message and writers.classify(manager).remedy in changed.message
    assert m.actuation is Actuation.HANDS_OFF and not [c for c in out if isinstance(c, Scale)]
    assert writers.label(manager) == label


def test_argo_cds_notice_says_to_ignore_the_replicas_difference() -> None:
    m = machine()
    out = m.handle(MemberObserved(Obs("a", **STOPPED, replicas_by="argocd-controller")), 1.0)
    [changed] = notices(out, "ActuationChanged")
    assert "ignoreDifferences" in changed.message and "/spec/replicas" in changed.message


def test_a_kubectl_scale_is_reported_at_once_and_undone_without_a_hand_off() -> None:
    m = machine()
    out = m.handle(MemberObserved(Obs("b", phase="Creating", replicas=1, pods=1,
                                      replicas_by="kubectl")), 1.0)
    [written] = notices(out, "ReplicasWritten")
    assert written.writer == "kubectl" and written.source == "b"
    assert "'kubectl'" in written.message and "a person" in written.message
    assert not notices(out, "ActuationChanged") and m.actuation is Actuation.OWN
    assert Scale("b", 0) in out  # a person's one-off: the pool's rule stands


def test_our_own_writes_and_unknown_owners_are_not_reported() -> None:
    m = machine()
    m.handle(RequestArrived(1, "b"), 1.0)
    out = m.handle(MemberObserved(Obs("b", phase="Creating", replicas=1, pods=1,
                                      replicas_by=OURS)), 1.1)
    out += m.handle(MemberObserved(Obs("a", phase="Ready", replicas=2, pods=1)), 1.2)
    assert not notices(out, "ReplicasWritten") and not notices(out, "ActuationChanged")


def test_a_scale_to_zero_that_left_no_field_manager_is_reported_as_a_scale_write() -> None:
    m = machine()
    out = m.handle(MemberObserved(Obs("a", phase="Ready", replicas=0, pods=1)), 1.0)
    [written] = notices(out, "ReplicasWritten")
    assert written.writer == writers.SCALE_UNRECORDED and written.source == "a"
    assert "kubectl scale or another /scale client to 0 left no field manager" in written.message
    assert writers.label(written.writer) == "unrecorded"
    assert not notices(out, "ActuationChanged") and m.actuation is Actuation.OWN
    # a person's one-off: the pool's rule stands, a request for a brings it back
    assert Scale("a", 1) in m.handle(RequestArrived(1, "a"), 2.0)


def test_replicas_with_no_manager_before_are_not_reported_as_a_scale_write() -> None:
    m = PoolMachine(PoolSpec(KEY, ("a", "b"), fairness_window=0), limits(), 0.0,
                    actuation=Actuation.OWN)
    m.handle(StatusObserved(PoolStatus()), 0.0)
    m.handle(MemberObserved(Obs("a", **READY)), 0.0)  # a server that records no manager
    out = m.handle(MemberObserved(Obs("a", phase="Ready", replicas=0, pods=1)), 1.0)
    assert not notices(out, "ReplicasWritten")


@pytest.mark.parametrize("before,after,replicas,writer", [
    (OURS, "", 0, writers.SCALE_UNRECORDED), ("kubectl", "", 0, writers.SCALE_UNRECORDED),
    (OURS, "kubectl", 0, "kubectl"), (OURS, "", 2, ""), ("", "", 0, "")])
def test_who_set_the_replicas_from_their_owners_before_and_after(
        before: str, after: str, replicas: int, writer: str) -> None:
    assert writers.replicas_writer(before, after, replicas) == writer


def test_repeated_kubectl_scales_end_in_a_hand_off_that_names_kubectl() -> None:
    m = machine()
    now, changed = 1.0, []
    for _ in range(4):  # the first undo starts the count (b was not asked down before)
        out = m.handle(MemberObserved(Obs("b", phase="Creating", replicas=1, pods=1,
                                          replicas_by="kubectl")), now)
        changed += notices(out, "ActuationChanged")
        m.handle(MemberObserved(Obs("b", **STOPPED, replicas_by=OURS)), now + 0.1)
        now += 1.0
    assert [n.target for n in changed] == ["hands-off"]
    assert changed[0].writer == "kubectl" and "'kubectl'" in changed[0].message


def test_a_status_written_by_another_manager_is_named_in_the_hand_off() -> None:
    m = machine()
    out = m.handle(StatusObserved(PoolStatus(resident="b", foreign=True,
                                             written_by="manager")), 1.0)
    [changed] = notices(out, "ActuationChanged")
    assert changed.writer == "manager" and "field manager 'manager'" in changed.message


def test_auto_mode_hands_a_named_controllers_fight_to_no_one_not_to_llmkube() -> None:
    m = machine(auto=True)
    m.handle(MemberObserved(Obs("b", phase="Creating", replicas=1, pods=1,
                                replicas_by="kustomize-controller")), 1.0)
    assert m.actuation is Actuation.HANDS_OFF


@pytest.mark.parametrize("manager,label", [
    ("kubectl", "kubectl"), ("kubectl-edit", "kubectl"), ("kubectl-client-side-apply", "kubectl"),
    ("argocd-application-controller", "argocd"), ("helm-controller", "flux"),
    ("keda-operator", "autoscaler"), (OURS, "ours"), (writers.SCALE_UNRECORDED, "unrecorded"),
    ("my-script", "other"), ("", "unknown")])
def test_metric_labels_are_a_fixed_set(manager: str, label: str) -> None:
    assert writers.label(manager) == label and label in writers.LABELS


def test_the_status_says_who_made_own_mode_stand_back_unless_the_status_is_fought_over() -> None:
    from extproc.policy.snapshot import view  # noqa: PLC0415
    m = machine()
    assert view(m).hands_off == ""
    m.handle(MemberObserved(Obs("a", **STOPPED, replicas_by="argocd-controller")), 1.0)
    shown = view(m).hands_off
    assert "'argocd-controller'" in shown and "ignoreDifferences" in shown
    m = machine()
    m.handle(StatusObserved(PoolStatus(resident="b", foreign=True, written_by="manager")), 1.0)
    assert m.actuation is Actuation.HANDS_OFF and view(m).hands_off == ""


# ---- autoscaled members (policy/autoscaled.py) ------------------------------------------


def test_an_autoscaled_member_is_refused_naming_its_autoscaler_and_the_rest_serves() -> None:
    m = machine()
    out = m.handle(RequestArrived(1, "b"), 1.0)  # held: a swap to b starts
    out = m.handle(MemberObserved(Obs("b", **STOPPED, replicas_by=OURS,
                                      autoscaled_by="HorizontalPodAutoscaler/b-hpa")), 1.5)
    [warned] = notices(out, "MemberAutoscaled")
    assert "HorizontalPodAutoscaler/b-hpa" in warned.message and warned.source == "b"
    [refused] = [c for c in out if isinstance(c, Reject)]
    assert (refused.rid, refused.status, refused.code) == (1, 503, "member_autoscaled")
    assert "HorizontalPodAutoscaler/b-hpa" in refused.message
    out = m.handle(RequestArrived(2, "b"), 2.0)
    assert [(c.rid, c.code) for c in out if isinstance(c, Reject)] == [(2, "member_autoscaled")]
    assert not [c for c in out if isinstance(c, Scale) and c.replicas > 0]
    from extproc.policy.events import Admit  # noqa: PLC0415
    assert [c for c in m.handle(RequestArrived(3, "a"), 2.1) if isinstance(c, Admit)]
    # the autoscaler deleted: b is served again (a swap to it starts)
    m.handle(RequestEnded(3), 2.2)
    m.handle(MemberObserved(Obs("b", **STOPPED, replicas_by=OURS)), 3.0)
    out = m.handle(RequestArrived(4, "b"), 3.1)
    assert not [c for c in out if isinstance(c, Reject)] and m.swap is not None


def test_an_autoscaled_default_is_never_warmed() -> None:
    m = PoolMachine(PoolSpec(KEY, ("a", "b"), default="a", fairness_window=0), limits(), 0.0)
    m.handle(StatusObserved(PoolStatus()), 0.0)
    out = m.handle(MemberObserved(Obs("a", **STOPPED, autoscaled_by="ScaledObject/a")), 0.0)
    out += m.handle(MemberObserved(Obs("b", **STOPPED)), 0.0)
    assert not [c for c in out if isinstance(c, Scale)] and m.swap is None


def llmkube_machine() -> PoolMachine:
    """llmkube mode, a resident per LLMKube's status; LLMKube's reconciler set the replicas."""
    m = PoolMachine(PoolSpec(KEY, ("a", "b"), fairness_window=0), limits(), 0.0,
                    actuation=Actuation.LLMKUBE)
    m.handle(StatusObserved(PoolStatus(resident="a")), 0.0)
    m.handle(MemberObserved(Obs("a", **READY, replicas_by=writers.LLMKUBE_MANAGER)), 0.0)
    m.handle(MemberObserved(Obs("b", **STOPPED, replicas_by=writers.LLMKUBE_MANAGER)), 0.0)
    return m


@pytest.mark.parametrize("manager", ["kubectl", "argocd-controller", "someone-else"])
def test_llmkube_mode_reports_a_replicas_write_beside_llmkube_and_leaves_it(
        manager: str) -> None:
    m = llmkube_machine()
    out = m.handle(MemberObserved(Obs("b", phase="Creating", replicas=1, pods=1,
                                      replicas_by=manager)), 1.0)
    [written] = notices(out, "ReplicasWritten")
    assert written.writer == manager and written.source == "b"
    assert repr(manager) in written.message and "LLMKube's reconciler" in written.message
    # no undo, no hands-off: the replicas are LLMKube's reconciler's to judge
    assert not [c for c in out if isinstance(c, Scale)] and not notices(out, "ActuationChanged")
    assert m.actuation is Actuation.LLMKUBE


def test_llmkube_mode_reports_a_scale_to_zero_that_left_no_field_manager() -> None:
    m = llmkube_machine()
    out = m.handle(MemberObserved(Obs("a", phase="Ready", replicas=0, pods=1)), 1.0)
    [written] = notices(out, "ReplicasWritten")
    assert written.writer == writers.SCALE_UNRECORDED and m.actuation is Actuation.LLMKUBE


def test_llmkube_mode_does_not_report_llmkube_s_writes_nor_our_trigger() -> None:
    m = llmkube_machine()
    out = m.handle(MemberObserved(Obs("b", phase="Stopped", replicas=1, pods=0,
                                      replicas_by=OURS)), 1.0)
    out += m.handle(MemberObserved(Obs("b", phase="Stopped", replicas=0, pods=0,
                                       replicas_by=writers.LLMKUBE_MANAGER)), 1.1)
    out += m.handle(MemberObserved(Obs("a", phase="Ready", replicas=0, pods=1,
                                       replicas_by=writers.LLMKUBE_MANAGER)), 1.2)
    assert not notices(out, "ReplicasWritten")
