"""Who else wrote a member's replicas, named from the real API server's managedFields.

The watcher reads the field manager that owns ``spec.replicas``; the policy (own mode) reports
a foreign one at the first watch event that shows its write. A ``kubectl patch`` that sends no
fieldManager is named from kubectl's User-Agent ("kubectl/v1.35.4 ..."), and so is a ``kubectl
scale`` through the CRD's /scale subresource, to any count but 0: the autoscaling/v1 Scale
omits a zero replicas, so a scale to 0 leaves ``spec.replicas`` with no manager at all on this
kube-apiserver (1.35.4). The policy reports that one as a write through /scale whose writer
the server did not record (policy/writers.py, ``SCALE_UNRECORDED``).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.aio import config as kconfig
from kubernetes.aio.client import CustomObjectsApi

from control_plane import ControlPlane
from platform_entry import LatestReports, MemberObservation, PoolKey, api_client, until, watching

from extproc.policy import writers
from extproc.policy.events import MemberObserved, Notice, StatusObserved
from extproc.policy.machine import PoolMachine
from extproc.policy.model import Actuation, PoolSpec, PoolStatus
from extproc.platform.kube.actuator import Actuator

sys.path.insert(0, str(Path(__file__).parents[1] / "policy"))
from harness import limits  # noqa: E402 - tests/policy's machine limits

pytestmark = pytest.mark.kube_real

GROUP, VERSION = "inference.llmkube.dev", "v1alpha1"
KUBECTL_AGENT = "kubectl/v1.35.4 (linux/amd64) kubernetes/6c1cd99"


class Observed(LatestReports):
    """Every member observation in order, each fed to an own-mode machine as the runtime does."""

    def __init__(self, machine: PoolMachine) -> None:
        super().__init__()
        self.machine, self.seen, self.notices = machine, [], []
        self.t = 1.0

    def member_changed(self, key: PoolKey, obs: MemberObservation) -> None:
        """Record the observation and what the machine says to it."""
        super().member_changed(key, obs)
        self.t += 0.01
        out = self.machine.handle(MemberObserved(obs), self.t)
        self.seen.append(obs)
        self.notices.append([c for c in out if isinstance(c, Notice)])


@pytest.fixture
async def custom(control_plane: ControlPlane, namespace: str) -> Any:
    """The admin's client with members a (1, Ready) and b (0, Stopped) and pool slot."""
    api = await kconfig.new_client_from_config(config_file=str(control_plane.kubeconfig))
    objects = CustomObjectsApi(api)
    for name, replicas, phase in (("a", 1, "Ready"), ("b", 0, "Stopped")):
        await objects.create_namespaced_custom_object(GROUP, VERSION, namespace,
                                                      "inferenceservices", {
                                                          "apiVersion": f"{GROUP}/{VERSION}",
                                                          "kind": "InferenceService",
                                                          "metadata": {"name": name},
                                                          "spec": {"modelRef": name,
                                                                   "replicas": replicas}})
        await objects.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, "inferenceservices", name, {"status": {"phase": phase}})
    await objects.create_namespaced_custom_object(GROUP, VERSION, namespace, "modelpools", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "ModelPool", "metadata": {"name": "slot"},
        "spec": {"members": [{"inferenceServiceRef": {"name": m}} for m in ("a", "b")],
                 "default": "a"}})
    try:
        yield objects
    finally:
        await api.close()


def _machine(namespace: str) -> PoolMachine:
    m = PoolMachine(PoolSpec(PoolKey(namespace, "slot"), ("a", "b"), fairness_window=0),
                    limits(), 0.0, actuation=Actuation.OWN)
    m.handle(StatusObserved(PoolStatus()), 0.0)
    return m


@contextlib.asynccontextmanager
async def _scaled_by_us(control_plane: ControlPlane, namespace: str, member: str,
                        replicas: int | None) -> AsyncIterator[Observed]:
    """Watch the namespace, feeding an own-mode machine, after our scale of ``member`` (None:
    none, ``member`` only seen)."""
    reports = Observed(_machine(namespace))
    async with api_client(control_plane.kubeconfig) as service:
        async with watching(service, namespace, reports, watch_timeout=5):
            if replicas is not None:
                await Actuator(service).scale(namespace, member, replicas)
            await until(lambda: member in reports.observed and (
                replicas is None or reports.observed[member].replicas == replicas),
                        what=f"{member} seen scaled to {replicas}")
            yield reports


def _first(reports: Observed, mark: int, member: str, replicas: int) -> int:
    """The first observation after ``mark`` that shows ``member`` at ``replicas``."""
    return next(i for i in range(mark, len(reports.seen))
                if reports.seen[i].name == member and reports.seen[i].replicas == replicas)


async def test_a_kubectl_patch_is_reported_naming_kubectl_at_its_first_watch_event(
        control_plane: ControlPlane, custom: Any, namespace: str) -> None:
    async with _scaled_by_us(control_plane, namespace, "b", 1) as reports:
        # our own write names us (fieldManager modelpool-extproc on every write)
        assert reports.observed["b"].replicas_by == writers.OUR_MANAGER
        assert not [n for n in reports.notices[-1] if n.writer]  # nothing names a writer
        # a person's `kubectl patch` of b back to 0, with no fieldManager, as kubectl sends it
        mark = len(reports.seen)
        await asyncio.to_thread(
            control_plane.request, "PATCH",
            f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/inferenceservices/b",
            {"spec": {"replicas": 0}}, content_type="application/merge-patch+json",
            user_agent=KUBECTL_AGENT)
        await until(lambda: reports.observed["b"].replicas == 0, what="b scaled to 0")
    first = _first(reports, mark, "b", 0)
    assert reports.seen[first].replicas_by == "kubectl"
    [written] = [n for n in reports.notices[first] if n.kind == "ReplicasWritten"]
    assert written.writer == "kubectl" and "'kubectl'" in written.message
    assert reports.machine.actuation is Actuation.OWN  # a person's one-off: no hand-off


async def test_an_argo_cd_sync_of_replicas_hands_the_pool_off_naming_it(
        control_plane: ControlPlane, custom: Any, namespace: str) -> None:
    async with _scaled_by_us(control_plane, namespace, "a", 0) as reports:
        # Argo CD's server-side apply of the manifest's replicas: 1 (its self-heal)
        await asyncio.to_thread(
            control_plane.request, "PATCH",
            f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/inferenceservices/a"
            "?fieldManager=argocd-controller&force=true",
            {"apiVersion": f"{GROUP}/{VERSION}", "kind": "InferenceService",
             "metadata": {"name": "a"}, "spec": {"modelRef": "a", "replicas": 1}},
            content_type="application/apply-patch+yaml")
        await until(lambda: reports.observed["a"].replicas == 1, what="a synced to 1")
    assert reports.observed["a"].replicas_by == "argocd-controller"
    changed = [n for batch in reports.notices for n in batch if n.kind == "ActuationChanged"]
    assert [(n.target, n.writer) for n in changed] == [("hands-off", "argocd-controller")]
    assert "ignoreDifferences" in changed[0].message


NO_KUBECTL = pytest.mark.skipif(shutil.which("kubectl") is None,
                                reason="no kubectl on PATH to run as a person does")


@NO_KUBECTL
async def test_a_kubectl_scale_up_is_reported_naming_kubectl_at_its_first_watch_event(
        control_plane: ControlPlane, custom: Any, namespace: str) -> None:
    async with _scaled_by_us(control_plane, namespace, "b", None) as reports:
        mark = len(reports.seen)
        # a person scales the idle member up, through /scale as kubectl does
        await asyncio.to_thread(control_plane.kubectl, "scale", "-n", namespace,
                                "inferenceservice/b", "--replicas=1")
        await until(lambda: reports.observed["b"].replicas == 1, what="b scaled to 1")
    first = _first(reports, mark, "b", 1)
    assert reports.seen[first].replicas_by == "kubectl"
    [written] = [n for n in reports.notices[first] if n.kind == "ReplicasWritten"]
    assert written.writer == "kubectl" and "'kubectl'" in written.message
    assert reports.machine.actuation is Actuation.OWN


@NO_KUBECTL
async def test_a_kubectl_scale_to_zero_leaves_no_manager_and_is_reported_as_unrecorded(
        control_plane: ControlPlane, custom: Any, namespace: str) -> None:
    async with _scaled_by_us(control_plane, namespace, "b", 1) as reports:
        mark = len(reports.seen)
        await asyncio.to_thread(control_plane.kubectl, "scale", "-n", namespace,
                                "inferenceservice/b", "--replicas=0")
        await until(lambda: reports.observed["b"].replicas == 0, what="b scaled to 0")
    first = _first(reports, mark, "b", 0)
    assert reports.seen[first].replicas_by == ""  # the Scale omits replicas 0: no manager
    [written] = [n for n in reports.notices[first] if n.kind == "ReplicasWritten"]
    assert written.writer == writers.SCALE_UNRECORDED
    assert "kubectl scale or another /scale client to 0 left no field manager" in written.message
    assert reports.machine.actuation is Actuation.OWN
