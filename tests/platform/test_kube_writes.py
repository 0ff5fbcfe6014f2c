"""Actuator, StatusWriter/StatusPublisher and EventRecorder against the API emulator."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from collections.abc import Callable
from typing import Any

import pytest
from kube_helpers import NS, Recorder, eventually, isvc, modelpool, running
from extproc.platform.kube.rest import ApiError

from extproc.metrics import KUBE_REQUESTS
from extproc.platform.kube.actuator import Actuator, MemberMissing
from extproc.platform.kube.recorder import EventRecorder
from extproc.names import LEADER_ANNOTATION
from extproc.platform.kube.platform import KubePlatform
from extproc.platform.kube.turns import WRITES_IN_FLIGHT, WriteTurns
from extproc.platform.kube.status import StatusPublisher, StatusWriter
from extproc.policy.model import MemberObservation, PoolKey, PoolPhase, PoolView
from extproc.runtime.scaling import Retry, Scaler
from extproc.settings import Settings

KEY = PoolKey(NS, "slot")
READY_A = MemberObservation("a", phase="Ready", replicas=1, pods=1)
STOPPED_B = MemberObservation("b", phase="Stopped", replicas=0, pods=0)


def patches(emulator: Any, resource: str, subresource: str | None = None) -> int:
    """How many patch requests the emulator recorded for ``resource``/``subresource``."""
    return sum(1 for r in emulator.requests if r.verb == "patch" and r.resource == resource
               and r.subresource == subresource)


def scale_bodies(emulator: Any) -> list[dict]:
    """The bodies of the replicas patches the emulator recorded (not the leader's stamps)."""
    return [body for _caller, r, body in emulator.handler.callers
            if r.verb == "patch" and r.resource == "inferenceservices"
            and isinstance(body, dict) and "spec" in body]


def stamped_by(emulator: Any, identity: str) -> bool:
    """Whether every member of pool slot carries the leader stamp of ``identity``."""
    return all(((emulator.get("inferenceservices", m, NS) or {}).get("metadata", {})
                .get("annotations") or {}).get(LEADER_ANNOTATION, "").startswith(identity + " ")
               for m in ("a", "b"))


def ready_view(**kw: Any) -> PoolView:
    """Pool slot with a resident and Ready."""
    base = dict(key=KEY, phase=PoolPhase.READY, resident="a", pending="",
                members=(READY_A, STOPPED_B), generation=1)
    base.update(kw)
    return PoolView(**base)


def seed(emulator: Any) -> None:
    """Members a and b and pool slot."""
    emulator.create("inferenceservices", isvc("a", replicas=1, phase="Ready"))
    emulator.create("inferenceservices", isvc("b", replicas=0, phase="Stopped"))
    emulator.create("modelpools", modelpool("slot", ["a", "b"]))


# --- actuator --------------------------------------------------------------------------------

async def test_scale_sets_spec_replicas(emulator: Any, api: Any) -> None:
    seed(emulator)
    before = KUBE_REQUESTS.labels("patch", "inferenceservices", "200")._value.get()
    await Actuator(api).scale(NS, "b", 1)
    assert emulator.get("inferenceservices", "b", NS)["spec"]["replicas"] == 1
    assert emulator.get("inferenceservices", "b", NS)["spec"]["modelRef"] == "b"  # merged
    assert KUBE_REQUESTS.labels("patch", "inferenceservices", "200")._value.get() == before + 1


async def leading(emulator: Any) -> tuple[KubePlatform, asyncio.Task[None]]:
    """A running KubePlatform that holds pool slot's leader Lease (only a leader scales)."""
    settings = Settings(kubeconfig=str(emulator.kubeconfig), namespaces=[NS])
    platform = await KubePlatform.create(settings)
    task = asyncio.get_running_loop().create_task(platform.run(Recorder()))
    await eventually(lambda: platform.replicas.leads(KEY), 10)
    # the new leader's stamps land before its first scale: wait, so faults meet the scale
    await eventually(lambda: stamped_by(emulator, platform.replicas.identity), 10)
    return platform, task


async def _scaled_by_the_runtime(emulator: Any, member: str, replicas: int, *,
                                 fault: Callable[[], None]) -> None:
    """Scale through the runtime's one retry loop (Scaler) and the KubePlatform, the API
    failing as ``fault`` makes it once this replica leads the pool."""
    platform, task = await leading(emulator)
    try:
        fault()
        scaler = Scaler(platform, KEY, Retry(0.05, 0.2))
        scaler.want(member, replicas)
        await asyncio.wait_for(scaler.settled(), 10)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await platform.stop()


async def test_scale_retries_conflicts(emulator: Any, api: Any) -> None:
    seed(emulator)
    await _scaled_by_the_runtime(emulator, "a", 0,
                                 fault=lambda: emulator.fail_writes("inferenceservices", 2))
    assert emulator.get("inferenceservices", "a", NS)["spec"]["replicas"] == 0
    bodies = scale_bodies(emulator)
    assert len(bodies) == 3
    # every attempt names the version it was decided on, and a 409 is re-read before the next
    assert all(b["metadata"]["resourceVersion"] for b in bodies), bodies
    lists = [r for r in emulator.requests if r.verb == "list" and r.resource ==
             "inferenceservices"]
    assert len(lists) == 1 + 2, lists  # the watch's first list, then one re-read per 409


async def test_scale_retries_while_the_api_is_unavailable(emulator: Any, api: Any) -> None:
    seed(emulator)

    def outage() -> None:
        emulator.set_unavailable(True)
        asyncio.get_running_loop().call_later(0.5, emulator.set_unavailable, False)
    await _scaled_by_the_runtime(emulator, "b", 1, fault=outage)
    assert emulator.get("inferenceservices", "b", NS)["spec"]["replicas"] == 1


async def test_scale_retries_connection_errors(emulator: Any, api: Any) -> None:
    seed(emulator)
    port = int(emulator.url.rsplit(":", 1)[1])

    def restart() -> None:
        asyncio.ensure_future(emulator.stop())  # noqa: RUF006  (the test waits for its effect)
        later = asyncio.get_running_loop().create_task(asyncio.sleep(0.5))
        later.add_done_callback(lambda _: asyncio.ensure_future(emulator.start(port=port)))
    await _scaled_by_the_runtime(emulator, "b", 1, fault=restart)
    assert emulator.get("inferenceservices", "b", NS)["spec"]["replicas"] == 1


async def test_one_scale_attempt_per_call_reports_the_api_error(emulator: Any, api: Any) -> None:
    seed(emulator)
    emulator.set_unavailable(True)
    with pytest.raises(ApiError) as caught:
        await Actuator(api).scale(NS, "b", 1)
    assert caught.value.status == 503
    assert patches(emulator, "inferenceservices") == 1


async def test_scale_of_a_missing_member_fails_at_once(emulator: Any, api: Any) -> None:
    seed(emulator)
    with pytest.raises(MemberMissing):
        await Actuator(api).scale(NS, "ghost", 1)
    assert patches(emulator, "inferenceservices") == 1


async def test_scale_can_be_cancelled(emulator: Any, api: Any) -> None:
    seed(emulator)
    platform, task = await leading(emulator)
    emulator.set_unavailable(True)
    try:
        scaler = Scaler(platform, PoolKey(NS, "slot"), Retry(0.05, 0.2))
        scaler.want("b", 1)
        await asyncio.sleep(0.3)
        scaler.cancel()
        await asyncio.wait_for(scaler.settled(), 10)  # every worker ended
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        emulator.set_unavailable(False)
        await platform.stop()
    assert emulator.get("inferenceservices", "b", NS)["spec"]["replicas"] == 0


# --- status --------------------------------------------------------------------------------

async def test_publish_patches_once_then_not_again(emulator: Any, api: Any) -> None:
    seed(emulator)
    writer = StatusWriter(api)
    assert await writer.publish(ready_view(), {}) is not None
    stored = emulator.get("modelpools", "slot", NS)
    assert stored["status"]["phase"] == "Ready"
    assert stored["status"]["residentMember"] == "a"
    assert stored["spec"]["members"]  # the /status subresource left the spec alone
    assert patches(emulator, "modelpools", "status") == 1
    assert await writer.publish(ready_view(), stored["status"]) is None
    assert patches(emulator, "modelpools", "status") == 1


async def test_publish_removes_fields_it_does_not_own(emulator: Any, api: Any) -> None:
    seed(emulator)
    emulator.patch("modelpools", "slot", {"status": {"pendingMember": "b", "phase": "Swapping"}},
                   NS, subresource="status")
    writer = StatusWriter(api)
    await writer.publish(ready_view(), emulator.get("modelpools", "slot", NS)["status"])
    status = emulator.get("modelpools", "slot", NS)["status"]
    assert status["pendingMember"] == "" and status["phase"] == "Ready"
    assert await writer.publish(ready_view(), status) is None


async def test_publisher_coalesces_and_skips_unchanged(emulator: Any, api: Any) -> None:
    seed(emulator)
    async with running(api) as watcher:
        publisher = StatusPublisher(StatusWriter(api), watcher)
        cold = ready_view(phase=PoolPhase.PENDING, resident="",
                          members=(MemberObservation("a", phase="Stopped"), STOPPED_B))
        swapping = ready_view(phase=PoolPhase.SWAPPING, resident="", pending="a")
        for view in (cold, swapping, ready_view(generation=1)):
            publisher.submit(view)  # three views before the first write lands
        await publisher.idle()
        assert patches(emulator, "modelpools", "status") <= 2
        assert emulator.get("modelpools", "slot", NS)["status"]["phase"] == "Ready"
        written = patches(emulator, "modelpools", "status")
        # the same view again, before and after the watch caught up: no write
        publisher.submit(ready_view())
        await publisher.idle()
        await eventually(lambda: watcher.pool_status(KEY).get("phase") == "Ready")
        publisher.submit(ready_view())
        await publisher.idle()
        assert patches(emulator, "modelpools", "status") == written
        # a flip and a flip back faster than the watch: both written
        publisher.submit(swapping)
        await publisher.idle()
        publisher.submit(ready_view())
        await publisher.idle()
        assert emulator.get("modelpools", "slot", NS)["status"]["phase"] == "Ready"
        await publisher.close()


async def test_publisher_retries_and_drops_deleted_pools(emulator: Any, api: Any) -> None:
    seed(emulator)
    async with running(api) as watcher:
        publisher = StatusPublisher(StatusWriter(api), watcher, backoff_initial=0.05)
        emulator.fail_writes("modelpools", 2)
        publisher.submit(ready_view())
        await asyncio.wait_for(publisher.idle(), 5)
        assert emulator.get("modelpools", "slot", NS)["status"]["phase"] == "Ready"
        emulator.delete("modelpools", "slot", NS)
        await eventually(lambda: not watcher.has_pool(KEY))
        before = patches(emulator, "modelpools", "status")
        publisher.submit(ready_view(phase=PoolPhase.DEGRADED))
        await publisher.idle()
        assert patches(emulator, "modelpools", "status") == before  # no call for a gone pool
        await publisher.close()


# --- events --------------------------------------------------------------------------------

async def test_events_show_in_kubectl_describe(emulator: Any, api: Any) -> None:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not on PATH")
    seed(emulator)
    uid = emulator.get("modelpools", "slot", NS)["metadata"]["uid"]
    recorder = EventRecorder(api, uids=lambda key: uid)
    await recorder.record(KEY, "SwapStarted", "swapping from a to b")
    await recorder.record(KEY, "SwapFailed", "b did not become Ready", warning=True)
    events = emulator.list("events", NS)
    assert {e["reason"] for e in events} == {"SwapStarted", "SwapFailed"}
    first = next(e for e in events if e["reason"] == "SwapStarted")
    assert first["metadata"]["name"].startswith("slot.")
    assert first["involvedObject"] == {"apiVersion": "inference.llmkube.dev/v1alpha1",
                                       "kind": "ModelPool", "name": "slot", "namespace": NS,
                                       "uid": uid}
    assert first["count"] == 1 and first["source"]["component"] == "modelpool-extproc"
    out = await asyncio.to_thread(
        subprocess.run, ["kubectl", "--kubeconfig", str(emulator.kubeconfig), "describe",
                         "mpool", "slot", "-n", NS],
        capture_output=True, text=True, timeout=30, env={**os.environ, "NO_COLOR": "1"})
    assert out.returncode == 0, out.stderr
    assert "SwapStarted" in out.stdout and "swapping from a to b" in out.stdout
    assert "Warning" in out.stdout and "SwapFailed" in out.stdout


async def test_event_failures_are_swallowed(emulator: Any, api: Any) -> None:
    emulator.set_unavailable(True)
    await EventRecorder(api).record(KEY, "SwapStarted", "x")  # must not raise
    emulator.set_unavailable(False)
    assert emulator.list("events", NS) == []


async def test_a_burst_of_status_writes_goes_out_a_few_at_a_time() -> None:
    """A lead over many pools writes every status: a bounded few in flight at once, so the
    Lease renews are not queued behind them all at the API server (issue 46)."""
    pools = 3 * WRITES_IN_FLIGHT
    gate, in_flight, most, written = asyncio.Event(), [0], [0], []

    class Writer(StatusWriter):
        async def publish(self, view: PoolView, current_status: dict, *,
                          resource_version: str = "", spec_problems: Any = ()) -> str | None:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
            await gate.wait()
            in_flight[0] -= 1
            written.append(view.key)
            return None

    class Source:
        def has_pool(self, key: PoolKey) -> bool:
            return True

        def pool_status(self, key: PoolKey) -> dict:
            return {}

        def pool_resource_version(self, key: PoolKey) -> str:
            return ""

        def spec_problems(self, key: PoolKey) -> tuple[str, ...]:
            return ()

    publisher = StatusPublisher(Writer(None), Source())  # type: ignore[arg-type]
    for i in range(pools):
        publisher.submit(ready_view(key=PoolKey(NS, f"p{i}")))
    await eventually(lambda: in_flight[0] == WRITES_IN_FLIGHT)
    for _ in range(10):
        await asyncio.sleep(0)  # turns of the loop for more to start, were they allowed to
    gate.set()
    await publisher.idle()
    assert most[0] == WRITES_IN_FLIGHT and len(written) == pools


async def test_a_status_write_takes_its_turn_before_a_waiting_fence() -> None:
    turns, order = WriteTurns(1), []

    async def write(name: str, first: bool) -> None:
        async with turns.turn(first):
            order.append(name)

    async with turns.turn():  # every turn taken
        fence = asyncio.create_task(write("fence", False))
        cancelled = asyncio.create_task(write("cancelled", True))
        status = asyncio.create_task(write("status", True))
        for _ in range(3):
            await asyncio.sleep(0)
        cancelled.cancel()  # a waiter that gave up: its place is no one's
    await asyncio.wait_for(asyncio.gather(fence, status), 5)
    assert order == ["status", "fence"] and cancelled.cancelled()
    async with turns.turn():  # and the turn came back
        pass
