"""Members' Ready pods as endpoints (--endpoint-picker), from the pod watch on the API emulator."""

from __future__ import annotations

from typing import Any

from kube_helpers import NS, Recorder, eventually, isvc, modelpool, pod, running

from extproc.platform.kube.endpoints import PodEndpoints, ready_ip
from extproc.policy.model import PoolKey

KEY = PoolKey(NS, "slot")
SERVICE = "inference.llmkube.dev/service"


def _status(ip: str, ready: bool) -> dict:
    return {"status": {"phase": "Running", "podIP": ip, "conditions": [
        {"type": "Ready", "status": "True" if ready else "False"}]}}


async def test_ready_pods_of_each_member_are_reported_with_the_target_port(
        emulator: Any, api: Any) -> None:
    emulator.create("inferenceservices", isvc("a", replicas=2, phase="Ready"))
    emulator.create("inferenceservices", isvc("b", replicas=0, phase="Stopped"))
    emulator.create("modelpools", modelpool("slot", ["a", "b"], default="a"))
    for name in ("a-0", "a-1"):
        emulator.create("pods", pod(name, {SERVICE: "a"}))
    emulator.patch("pods", "a-0", _status("10.0.0.5", True), NS, subresource="status")
    emulator.patch("pods", "a-1", _status("10.0.0.6", False), NS, subresource="status")
    recorder = Recorder()
    async with running(api, recorder, endpoint_port=8000):
        # the sync reports each member: a's Ready pod only, b none
        assert recorder.endpoints == {(KEY, "a"): ("10.0.0.5:8000",), (KEY, "b"): ()}
        emulator.patch("pods", "a-1", _status("10.0.0.6", True), NS, subresource="status")
        await eventually(lambda: recorder.endpoints[(KEY, "a")] ==
                         ("10.0.0.5:8000", "10.0.0.6:8000"), what="a-1 counted once Ready")
        emulator.delete("pods", "a-0", NS)
        await eventually(lambda: recorder.endpoints[(KEY, "a")] == ("10.0.0.6:8000",),
                         what="a deleted pod dropped")
        emulator.create("pods", pod("b-0", {SERVICE: "b"}))
        emulator.patch("pods", "b-0", _status("10.0.0.7", True), NS, subresource="status")
        await eventually(lambda: recorder.endpoints[(KEY, "b")] == ("10.0.0.7:8000",),
                         what="b's pod reported")


def test_a_terminating_or_unready_pod_is_no_endpoint() -> None:
    ready = {"metadata": {"name": "p"}, **_status("10.0.0.5", True)}
    assert ready_ip(ready) == "10.0.0.5"
    assert ready_ip({**ready, "metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}) == ""
    assert ready_ip({"metadata": {}, **_status("10.0.0.5", False)}) == ""
    assert ready_ip({"metadata": {}, "status": {"conditions": [
        {"type": "Ready", "status": "True"}]}}) == ""  # no IP yet


def test_the_index_reports_only_members_whose_set_changed() -> None:
    index = PodEndpoints(9000)
    assert index.apply(NS, "p", "a", "10.0.0.1") == ["a"]
    assert index.apply(NS, "p", "a", "10.0.0.1") == []
    assert index.apply(NS, "p", "b", "10.0.0.1") == ["a", "b"]  # relabelled
    assert index.of(NS, "a") == () and index.of(NS, "b") == ("10.0.0.1:9000",)
    assert index.apply(NS, "p", "b", "") == ["b"]  # not Ready any more
    assert index.of(NS, "b") == () and index.apply("other", "p", "b", "") == []


def test_an_ipv6_pod_is_named_in_brackets() -> None:
    # Envoy's ORIGINAL_DST cluster parses [v6]:port only: fd00:10:244::5:8000 is a 503
    pod = {"metadata": {"name": "p"}, **_status("fd00:10:244::5", True)}
    index = PodEndpoints(8000)
    assert index.apply(NS, "p", "a", ready_ip(pod)) == ["a"]
    assert index.apply(NS, "q", "a", "10.0.0.5") == ["a"]
    assert index.of(NS, "a") == ("10.0.0.5:8000", "[fd00:10:244::5]:8000")
