"""Every loop that talks to the API backs off while the API is unreachable or refusing.

Each test drives one of the service's API loops (the watch, the status publisher, the scale
and trigger workers, the leader Lease, the membership Lease's start and its renew loop) through
a fault window: the API emulator stopped (its port closed: connection refused) or answering 503
to everything. It counts the API calls the loop made in the window from the service's own
``KUBE_REQUESTS`` counter and holds them to what ``Backoff`` guarantees (each delay at least
half its ceiling), while pressure that wants more calls (new views, new wishes, urgent writes,
new announcements) keeps arriving; then it checks that the loop recovers once the fault ends.
A hot loop (a retry without a delay) makes thousands of calls in such a window.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from kube_helpers import NS, eventually, isvc, modelpool

from extproc.metrics import KUBE_REQUESTS
from extproc.platform.kube.actuator import Actuator
from extproc.platform.kube.leader import LeaderLease
from extproc.platform.kube.leases import LeaseClient
from extproc.platform.kube.membership import Load, Membership
from extproc.platform.kube.status import StatusPublisher, StatusWriter
from extproc.platform.kube.watchloop import CollectionWatch
from extproc.policy.model import MemberObservation, PoolKey, PoolPhase, PoolView
from extproc.runtime.scaling import Retry, Scaler
from extproc.settings import Settings

KEY = PoolKey(NS, "slot")
WINDOW = 3.0  # seconds of fault
RETRY = Settings(api_retry_initial=0.2, api_retry_max=1.0, leader_retry=1.0,
                 leader_renew_deadline=4.0, leader_lease_duration=6.0,
                 membership_lease_duration=6.0, membership_renew=1.0, lease_margin=0.5,
                 membership_write_interval=0.05, namespaces=[NS])


def most_attempts(initial: float, maximum: float, window: float) -> int:
    """The most attempts a Backoff(initial, maximum) loop can make in ``window`` seconds: one
    at once, then one after each delay, every delay at least half its ceiling."""
    attempts, spent = 1, 0.0
    for k in itertools.count():
        spent += min(maximum, initial * 2 ** k) / 2
        if spent > window:
            return attempts
        attempts += 1
    raise AssertionError("unreachable")


def api_calls() -> float:
    """Every API call the service has counted so far (any verb, resource, status)."""
    return sum(s.value for m in KUBE_REQUESTS.collect() for s in m.samples
               if s.name.endswith("_total"))


class Fault:
    """The API unreachable (the emulator stopped, its port closed) or refusing (503)."""

    def __init__(self, emulator: Any, kind: str) -> None:
        self._emulator, self.kind = emulator, kind
        self._port = int(emulator.url.rsplit(":", 1)[1])

    async def begin(self) -> None:
        """Cut the API off."""
        if self.kind == "unreachable":
            await self._emulator.stop()
        else:
            self._emulator.set_unavailable(True)

    async def end(self) -> None:
        """Bring the API back on the same address."""
        if self.kind == "unreachable":
            await self._emulator.start(port=self._port)
        else:
            self._emulator.set_unavailable(False)


@pytest.fixture(params=["unreachable", "refusing"])
def fault(request: pytest.FixtureRequest, emulator: Any) -> Fault:
    """Each test once against a closed port and once against a 503 to everything."""
    return Fault(emulator, request.param)


async def calls_during(fault: Fault, pressure: Callable[[], None] | None = None) -> float:
    """The API calls made while ``fault`` lasts WINDOW seconds, ``pressure`` applied every
    50 ms meanwhile; the fault has ended when this returns."""
    await fault.begin()
    before = api_calls()
    try:
        for _ in range(int(WINDOW / 0.05)):
            if pressure is not None:
                pressure()
            await asyncio.sleep(0.05)
        return api_calls() - before
    finally:
        await fault.end()


@contextlib.asynccontextmanager
async def background(run: Awaitable[Any]) -> AsyncIterator[asyncio.Task[Any]]:
    """Run ``run`` as a task for the block; cancel and reap it after."""
    task = asyncio.ensure_future(run)
    try:
        yield task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def assert_backed_off(calls: float, per_attempt: int, initial: float, maximum: float) -> None:
    """At least two calls (it kept trying) and no more than the backoff lets through; one
    more attempt is allowed for the pressure's first wake-up."""
    bound = per_attempt * (most_attempts(initial, maximum, WINDOW) + 1)
    assert 2 <= calls <= bound, f"{calls} API calls in {WINDOW} s (backoff allows {bound})"


def seed(emulator: Any) -> None:
    """Members a and b (a at 1) and pool slot."""
    emulator.create("inferenceservices", isvc("a", replicas=1, phase="Ready"))
    emulator.create("inferenceservices", isvc("b", replicas=0, phase="Stopped"))
    emulator.create("modelpools", modelpool("slot", ["a", "b"]))


async def test_the_watch_backs_off(emulator: Any, api: Any, fault: Fault) -> None:
    seed(emulator)
    listed: list[int] = []
    seen: list[str] = []
    watch = CollectionWatch(api, "inferenceservices",
                            f"/apis/inference.llmkube.dev/v1alpha1/namespaces/{NS}/inferenceservices",
                            RETRY, on_list=lambda items: listed.append(len(items)),
                            on_event=lambda kind, obj: seen.append(obj["metadata"]["name"]))
    async with background(watch.run()):
        await eventually(lambda: listed, 5)
        calls = await calls_during(fault)
        assert_backed_off(calls, 1, RETRY.api_retry_initial, RETRY.api_retry_max)
        # and it watches again: a member made after the fault is seen
        emulator.create("inferenceservices", isvc("c", replicas=0, phase="Stopped"))
        await eventually(lambda: "c" in seen, 10)


class Cache:
    """The status publisher's view of the cache: the pool exists, its status as written."""

    def __init__(self, emulator: Any) -> None:
        self._emulator = emulator

    def has_pool(self, key: PoolKey) -> bool:
        """Always."""
        return True

    def pool_status(self, key: PoolKey) -> dict:
        """What the emulator holds ({} while it is down)."""
        return ((self._emulator.get("modelpools", key.name, key.namespace) or {})
                .get("status") or {})

    def pool_resource_version(self, key: PoolKey) -> str:
        """No precondition."""
        return ""

    def spec_problems(self, key: PoolKey) -> tuple[str, ...]:
        """None."""
        return ()


def view(phase: PoolPhase, generation: int) -> PoolView:
    """Pool slot in ``phase`` with a as its resident."""
    return PoolView(key=KEY, phase=phase, resident="a", pending="", generation=generation,
                    members=(MemberObservation("a", phase="Ready", replicas=1, pods=1),
                             MemberObservation("b", phase="Stopped")))


async def test_the_status_publisher_backs_off(emulator: Any, api: Any, fault: Fault) -> None:
    seed(emulator)
    publisher = StatusPublisher(StatusWriter(api), Cache(emulator),
                                backoff_initial=RETRY.api_retry_initial,
                                backoff_max=RETRY.api_retry_max)
    phases = itertools.cycle([PoolPhase.SWAPPING, PoolPhase.READY])
    generations = itertools.count(2)
    try:
        calls = await calls_during(
            fault, lambda: publisher.submit(view(next(phases), next(generations))))
        assert_backed_off(calls, 1, RETRY.api_retry_initial, RETRY.api_retry_max)
        last = next(generations)
        publisher.submit(view(PoolPhase.DEGRADED, last))
        await asyncio.wait_for(publisher.idle(), 10)
        assert emulator.get("modelpools", "slot", NS)["status"]["phase"] == "Degraded"
    finally:
        await publisher.close()


class Members:
    """The two Platform calls the scale worker makes, straight to the actuator."""

    def __init__(self, api: Any) -> None:
        self._actuator = Actuator(api)

    async def scale(self, key: PoolKey, member: str, replicas: int) -> None:
        """Patch the member's replicas."""
        await self._actuator.scale(key.namespace, member, replicas)

    async def trigger(self, key: PoolKey, member: str) -> None:
        """Ask for the member, LLMKube's way."""
        await self._actuator.trigger(key.namespace, member, "")


@pytest.mark.parametrize("verb", ["scale", "trigger"])
async def test_the_scale_workers_back_off(emulator: Any, api: Any, fault: Fault,
                                          verb: str) -> None:
    seed(emulator)
    scaler = Scaler(Members(api), KEY, Retry(RETRY.api_retry_initial, RETRY.api_retry_max))
    wishes = itertools.cycle([1, 0])
    pressure = (lambda: scaler.want("b", next(wishes))) if verb == "scale" \
        else (lambda: scaler.trigger("b"))
    try:
        calls = await calls_during(fault, pressure)
        assert_backed_off(calls, 1, RETRY.api_retry_initial, RETRY.api_retry_max)
        if verb == "scale":
            scaler.want("b", 1)
        await asyncio.wait_for(scaler.settled(), 10)
        assert emulator.get("inferenceservices", "b", NS)["spec"]["replicas"] == 1
    finally:
        scaler.cancel()


async def test_the_leader_lease_backs_off(emulator: Any, api: Any, fault: Fault) -> None:
    leader = LeaderLease(api, NS, "replica-a", RETRY)
    leader.add_pool(str(KEY))
    targets = itertools.cycle(["a", "b"])
    async with background(leader.run()):
        await eventually(leader.is_leader, 5)
        # A new announcement each 50 ms, while a leader that is not at rest would retry at once
        calls = await calls_during(fault, lambda: leader.announce(str(KEY), next(targets)))
        # (get + write per attempt, one more attempt per announcement's wake-up at most)
        assert_backed_off(calls, 2 * 2, RETRY.api_retry_initial, RETRY.leader_retry)
        leader.announce(str(KEY), "b")
        await eventually(lambda: leader.is_leader() and leader.at_rest(str(KEY)), 10)
        lease = await LeaseClient(api, NS).get(leader.name)
        assert lease is not None and lease.payload["drains"][str(KEY)][1] == "b"


async def test_the_membership_start_backs_off(emulator: Any, api: Any, fault: Fault) -> None:
    membership = Membership(api, NS, "replica-a", Load, RETRY)
    await fault.begin()
    before = api_calls()
    started = asyncio.ensure_future(membership.start())
    try:
        await asyncio.sleep(WINDOW)
        calls = api_calls() - before
        await fault.end()
        assert_backed_off(calls, 1, RETRY.api_retry_initial, RETRY.membership_renew)
        await asyncio.wait_for(started, 10)
        assert membership.is_valid()
    finally:
        started.cancel()
        await asyncio.gather(started, return_exceptions=True)
        await membership.stop()


async def test_the_membership_renewals_back_off(emulator: Any, api: Any, fault: Fault) -> None:
    membership = Membership(api, NS, "replica-a", Load, RETRY)
    await membership.start()
    try:
        renewed = membership.valid_until
        # urgent writes asked for every 50 ms (a swap waiting on each) during the outage
        calls = await calls_during(fault, lambda: membership.request_write(urgent=True))
        assert_backed_off(calls, 1, RETRY.api_retry_initial, RETRY.membership_renew)
        await eventually(lambda: membership.valid_until > renewed + WINDOW, 10)
    finally:
        await membership.stop()
