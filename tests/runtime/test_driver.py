"""The runtime's PoolDriver on a real event loop: timers, scale coalescing, disconnects,
shutdown and the broken-machine path. The platform here is scripted so each test controls
when a scale call returns; everything else (machine, driver, metrics) is the product's."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from devstack.testkit import eventually
from extproc import metrics
from extproc.policy.events import Admit, Notice, Reject
from extproc.policy.model import MemberObservation, PoolKey, PoolSpec, PoolView
from extproc.runtime.driver import PoolDriver
from extproc.runtime.hub import limits_from
from extproc.runtime.scaling import Retry, Scaler
from extproc.platform.contract import PoolLoad
from extproc.policy.model import PeerState, PoolStatus
from extproc.settings import Settings

KEY = PoolKey("rt", "pool")
READY = dict(phase="Ready", replicas=1, pods=1)
STOPPED = dict(phase="Stopped", replicas=0, pods=0)


class ScriptedPlatform:
    """Records every call; a scale call waits until the test opens ``gate``."""

    def __init__(self) -> None:
        self.scales: list[tuple[str, int]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail_next = 0
        self.views: list[PoolView] = []
        self.notices: list[Notice] = []
        self.announced: list[str] = []
        self.load_writes = 0
        self.synced = asyncio.Event()

    async def run(self, listener) -> None:
        """Nothing to watch: the tests feed observations themselves."""

    async def stop(self) -> None:
        """Nothing runs in the background."""

    async def scale(self, key: PoolKey, member: str, replicas: int) -> None:
        """Record, wait for the gate, then fail if told to."""
        self.scales.append((member, replicas))
        await self.gate.wait()
        if self.fail_next:
            self.fail_next -= 1
            raise RuntimeError("injected scale failure")

    async def probe_idle(self, key: PoolKey, member: str) -> bool | None:
        """Always idle."""
        return True

    def publish(self, view: PoolView) -> None:
        """Keep every view."""
        self.views.append(view)

    def notify(self, key: PoolKey, notice: Notice) -> None:
        """Keep every notice."""
        self.notices.append(notice)

    elects = False

    def announce(self, key: PoolKey, target: str) -> None:
        """Keep every drain announcement asked for."""
        self.announced.append(target)

    def load_changed(self, urgent: bool) -> None:
        """Count the early membership writes asked for."""
        self.load_writes += 1

    async def leave(self) -> None:
        """No leadership to hand over."""


def driver(platform: ScriptedPlatform, budget: float = 30.0, **settings) -> PoolDriver:
    """A driver for pool rt/pool (members a, b) with a Ready and b Stopped."""
    settings.setdefault("drain_linger", 0.0)
    d = PoolDriver(PoolSpec(KEY, ("a", "b"), swap_budget=budget, fairness_window=0),
                   limits_from(Settings(**settings)), platform, Retry(0.01, 0.05))
    d.observe(MemberObservation("a", **READY))
    d.observe(MemberObservation("b", **STOPPED))
    return d


def held_gauge() -> float:
    """Held requests of the pool, summed over its members (our gauge and LLMKube's agree)."""
    ours = sum(metrics.REGISTRY.get_sample_value(
        "modelpool_extproc_held_requests", {"namespace": KEY.namespace, "pool": KEY.name,
                                            "member": m}) or 0.0 for m in ("a", "b"))
    theirs = sum(metrics.REGISTRY.get_sample_value(
        "llmkube_modelpool_held_requests", {"router": "default", "pool": KEY.name,
                                            "member": m}) or 0.0 for m in ("a", "b"))
    assert ours == theirs
    return ours


def hold_count(outcome: str) -> float:
    return metrics.REGISTRY.get_sample_value("modelpool_extproc_hold_duration_seconds_count",
                                             {"namespace": KEY.namespace, "pool": KEY.name,
                                              "member": "b", "outcome": outcome}) or 0.0


async def test_a_resident_hit_is_decided_at_once_without_a_future() -> None:
    d = driver(ScriptedPlatform())
    ticket = d.arrive("a")
    assert isinstance(ticket.decision, Admit) and ticket.waiter is None
    d.end(ticket)
    d.close()


async def test_the_budget_timer_fires_without_any_other_event() -> None:
    platform = ScriptedPlatform()
    platform.gate.clear()  # b never loads: only the timer can end the wait
    d = driver(platform, budget=0.2)
    ticket = d.arrive("b")
    assert ticket.waiter is not None and held_gauge() == 1
    decision = await asyncio.wait_for(ticket.waiter, 5)
    assert isinstance(decision, Reject) and decision.code == "swap_budget_exceeded"
    assert decision.status == 503 and decision.retry_after >= 1
    assert held_gauge() == 0
    d.close()


async def test_scale_wishes_coalesce_and_the_latest_wins() -> None:
    platform = ScriptedPlatform()
    platform.gate.clear()
    scaler = Scaler(platform, KEY, Retry(0.01, 0.05))
    scaler.want("a", 0)
    await eventually(lambda: platform.scales == [("a", 0)], 10)
    for replicas in (1, 0, 1):  # changes of mind while the first call is under way
        scaler.want("a", replicas)
    platform.gate.set()
    await asyncio.wait_for(scaler.settled(), 5)
    # the call under way finishes, then only the latest wish is sent: never a stale one
    assert platform.scales == [("a", 0), ("a", 1)]


async def test_a_failed_scale_is_retried_by_the_one_retry_loop() -> None:
    platform = ScriptedPlatform()
    platform.fail_next = 2
    d = driver(platform)
    d.arrive("b")
    await eventually(lambda: platform.scales.count(("a", 0)) == 3, 5, "three attempts")
    await asyncio.wait_for(d._scaler.settled(), 5)
    d.close()


async def test_a_client_leaving_while_held_is_counted_and_forgotten() -> None:
    platform = ScriptedPlatform()
    platform.gate.clear()
    d = driver(platform)
    before = hold_count("disconnected")
    ticket = d.arrive("b")
    assert held_gauge() == 1
    d.end(ticket)
    assert held_gauge() == 0 and d.view().held == 0
    assert hold_count("disconnected") == before + 1
    d.end(ticket)  # ending twice is harmless
    d.close()


async def test_shutdown_answers_held_requests_and_refuses_new_holds() -> None:
    platform = ScriptedPlatform()
    platform.gate.clear()
    d = driver(platform)
    ticket = d.arrive("b")
    d.reject_held("shutting_down", "restarting")
    decision = await asyncio.wait_for(ticket.waiter, 10)
    assert isinstance(decision, Reject) and decision.code == "shutting_down"
    assert decision.status == 503 and decision.retry_after >= 1
    late = d.arrive("b")
    assert isinstance(late.decision, Reject) and late.decision.code == "shutting_down"
    d.close()
    calm = driver(ScriptedPlatform())
    calm.reject_held("shutting_down", "restarting")
    assert isinstance(calm.arrive("a").decision, Admit)  # a serving resident still serves
    calm.close()


async def test_a_broken_machine_refuses_its_requests_and_logs_once(caplog) -> None:
    platform = ScriptedPlatform()
    platform.gate.clear()
    d = driver(platform)
    ticket = d.arrive("b")
    caplog.set_level(logging.ERROR)
    d.observe(MemberObservation("ghost", **READY))  # not a member: PolicyError inside
    assert d.broken
    decision = await asyncio.wait_for(ticket.waiter, 10)
    assert isinstance(decision, Reject) and decision.code == "pool_unavailable"
    assert decision.status == 503 and decision.retry_after >= 1
    d.observe(MemberObservation("a", **STOPPED))  # later events change nothing, raise nothing
    refused = d.arrive("a")
    assert isinstance(refused.decision, Reject) and refused.decision.code == "pool_unavailable"
    failures = [r for r in caplog.records if "pool policy failed" in r.getMessage()]
    assert len(failures) == 1
    assert held_gauge() == 0
    d.close()


@pytest.mark.parametrize("phase", ["Ready", "Failed"])
async def test_released_or_failed_swaps_resolve_every_waiter(phase: str) -> None:
    platform = ScriptedPlatform()
    d = driver(platform)
    tickets = [d.arrive("b") for _ in range(3)]
    await eventually(lambda: ("a", 0) in platform.scales, 10)
    d.observe(MemberObservation("a", **STOPPED))
    await eventually(lambda: ("b", 1) in platform.scales, 10)
    d.observe(MemberObservation("b", phase="Creating", replicas=1, pods=1))
    d.observe(MemberObservation("b", phase=phase, replicas=1, pods=1))
    decisions = await asyncio.wait_for(asyncio.gather(*(t.waiter for t in tickets)), 10)
    wanted = Admit if phase == "Ready" else Reject
    assert all(isinstance(x, wanted) for x in decisions)
    assert held_gauge() == 0
    d.close()


async def test_the_status_is_published_again_exactly_when_what_it_shows_changes() -> None:
    platform = ScriptedPlatform()
    d = driver(platform)
    published = len(platform.views)
    assert published and platform.views[-1].resident == "a"
    d.end(d.arrive("a"))  # admitted and done: the held and in-flight gauges are not status
    assert len(platform.views) == published
    d.respec(PoolSpec(KEY, ("a", "b"), swap_budget=60.0, fairness_window=0))
    assert len(platform.views) == published + 1  # the same view, but the budget gauge moved
    assert d.arrive("b").waiter is not None  # held: a swap starts, the status says pending b
    assert len(platform.views) == published + 2 and platform.views[-1].pending == "b"
    d.close()


async def test_resident_idle_since_is_published_in_wall_clock_time() -> None:
    platform = ScriptedPlatform()
    d = driver(platform, idle_report=0.2)
    d.respec(PoolSpec(KEY, ("a", "b"), default="b", swap_policy="reclaim", reclaim_after=600))
    d.end(d.arrive("a"))  # a, not the default, served one request, then idles
    before = time.time()
    await eventually(lambda: platform.views and platform.views[-1].resident_idle_since)
    shown = platform.views[-1].resident_idle_since
    # The machine's clock is monotonic; what is published is Unix time, when a went idle.
    assert before - 5 < shown <= before
    d.close()


async def test_a_stalled_swap_and_the_held_bound_show_in_the_gauges() -> None:
    platform = ScriptedPlatform()
    d = driver(platform, stall_after=0.2, max_held=3)
    ticket = d.arrive("b")
    d.observe(MemberObservation("a", **STOPPED))  # a unloaded; b is asked up but never moves
    labels = {"namespace": KEY.namespace, "pool": KEY.name}
    assert metrics.REGISTRY.get_sample_value("modelpool_extproc_held_limit", labels) == 3
    await eventually(lambda: metrics.REGISTRY.get_sample_value(
        "modelpool_extproc_swap_stalled", labels) == 1)
    assert "b" in d.view().stalled
    assert [n.kind for n in platform.notices].count("SwapStalled") == 1
    d.observe(MemberObservation("b", phase="Creating", replicas=1, pods=1))
    assert metrics.REGISTRY.get_sample_value("modelpool_extproc_swap_stalled", labels) == 0
    d.end(ticket)
    d.close()


async def test_a_leader_announces_its_drain_and_publishes_what_peers_wait_for() -> None:
    platform = ScriptedPlatform()
    d = driver(platform)
    d.observe_status(PoolStatus(resident="a"))
    d.observe_peers((PeerState("r2", 0.0, False, 0, {"a": 1}, {}),))
    writes = platform.load_writes
    admitted = d.arrive("a")
    held = d.arrive("b")
    assert admitted.decision is not None and held.waiter is not None
    assert platform.announced == ["b"]  # the swap to b starts: announced to the peers
    assert platform.load_writes > writes  # held 0 -> 1 for b: published before the renew
    assert d.load() == PoolLoad(0, {"a": 1}, {"b": 1})
    assert platform.scales == []  # r2 has not acknowledged, and streams on a
    d.announced(3, "b")
    d.observe_peers((PeerState("r2", 1.0, False, 3, {}, {}),))
    d.end(admitted)
    await asyncio.sleep(0)
    assert ("a", 0) in platform.scales


async def test_only_a_follower_acknowledges_the_announcement() -> None:
    platform = ScriptedPlatform()
    d = driver(platform)
    d.announced(5, "b")
    assert d.load().acked == 0  # a leader (even a deposed one) obeys no announcement
    d.lead(False)
    assert d.load().acked == 5


async def test_a_lease_renewed_in_time_is_handed_to_the_machine_with_its_next_event(
        passes) -> None:
    now = [0.0]
    d = PoolDriver(PoolSpec(KEY, ("a", "b"), fairness_window=0),
                   limits_from(Settings(drain_linger=0.0)), ScriptedPlatform(),
                   Retry(0.01, 0.05), clock=lambda: now[0])
    d.observe(MemberObservation("a", **READY))
    d.observe(MemberObservation("b", **STOPPED))
    d.admission(10.0)
    passes.clear()
    now[0] = 5.0
    d.admission(20.0)  # still admitting, only for longer: no pass now
    assert passes == {}
    now[0] = 15.0  # past the Lease the machine last heard of, within the renewed one
    ticket = d.arrive("a")
    assert isinstance(ticket.decision, Admit)
    d.end(ticket)
    now[0] = 25.0
    passes.clear()
    d.admission(30.0)  # after a lapse: handed over at once (held requests may go now)
    assert passes == {"pool": 1}
    d.close()
