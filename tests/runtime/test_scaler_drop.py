"""What the scaler says when it is stopped (runtime/scaling.py ``cancel``): per member, the
latest wish whose scale-up may have reached the API server. A refused call changed nothing; a
call cut off on the wire, or one that failed without an answer, may still land. The policy
settles a wish the scaler never sent (policy/landing.py); these tests pin the runtime's half."""

from __future__ import annotations

import asyncio

from dataclasses import replace

from devstack.testkit import eventually
from extproc.platform.contract import WriteRefused
from extproc.policy.model import MemberObservation, PoolKey, PoolStatus
from extproc.runtime.scaling import Retry, Scaler
from test_driver import STOPPED, ScriptedPlatform, driver

KEY = PoolKey("rt", "pool")
RETRY = Retry(5.0, 5.0)  # a long backoff: the tests stop the scaler while it waits


class Platform:
    """Each scale call takes the next behaviour from ``script``: "ok", "refuse", "fail" (no
    answer: it may have landed) or "hang" (on the wire until cancelled)."""

    def __init__(self, *script: str) -> None:
        self.script = list(script)
        self.calls: list[tuple[str, int]] = []

    async def scale(self, key: PoolKey, member: str, replicas: int) -> None:
        """Record the call, then do what the script says."""
        self.calls.append((member, replicas))
        match self.script.pop(0):
            case "refuse":
                raise WriteRefused("409 the object has been modified")
            case "fail":
                raise ConnectionResetError("connection reset while awaiting the answer")
            case "hang":
                await asyncio.Event().wait()


class RefusingB(ScriptedPlatform):
    """The driver tests' platform, whose API server refuses every scale of b (a 409)."""

    async def scale(self, key: PoolKey, member: str, replicas: int) -> None:
        """Record the call; refuse it for b."""
        await super().scale(key, member, replicas)
        if member == "b":
            raise WriteRefused("409 the object has been modified")


async def _stopped_after(platform: Platform, wishes: list[tuple[str, int]],
                         calls: int) -> tuple[tuple[str, int], ...]:
    scaler = Scaler(platform, KEY, RETRY)
    for member, replicas in wishes:
        scaler.want(member, replicas)
        await asyncio.sleep(0)
    await eventually(lambda: len(platform.calls) == calls, 5, f"{calls} scale calls")
    await asyncio.sleep(0.01)  # the last call's outcome is taken in
    return scaler.cancel()


async def test_a_scale_up_refused_then_dropped_in_its_backoff_reached_nothing() -> None:
    assert await _stopped_after(Platform("refuse"), [("b", 1)], 1) == ()


async def test_a_scale_up_that_failed_without_an_answer_may_land() -> None:
    assert await _stopped_after(Platform("fail"), [("b", 1)], 1) == (("b", 1),)


async def test_a_scale_up_cut_off_on_the_wire_may_land() -> None:
    assert await _stopped_after(Platform("hang"), [("b", 1)], 1) == (("b", 1),)


async def test_the_latest_wish_a_scale_up_carried_is_named_by_its_number() -> None:
    # ask 1 (up) lands, ask 2 (down) lands, ask 3 (up) is refused: ask 1 is the latest that
    # reached the API server, so an entry the policy opened with ask 3 is settled
    platform = Platform("ok", "ok", "refuse")
    scaler = Scaler(platform, KEY, RETRY)
    for replicas in (1, 0):
        scaler.want("b", replicas)
        await asyncio.wait_for(scaler.settled(), 5)
    scaler.want("b", 1)
    await eventually(lambda: platform.calls == [("b", 1), ("b", 0), ("b", 1)], 5, "3 calls")
    await asyncio.sleep(0.01)
    assert scaler.cancel() == (("b", 1),)


async def test_a_scale_down_reaches_nothing_that_could_bring_a_member_up() -> None:
    assert await _stopped_after(Platform("hang"), [("a", 0)], 1) == ()


async def test_the_driver_tells_the_machine_which_wishes_died_with_a_hands_off_switch() -> None:
    """End to end in the runtime: b's scale-up is refused and retried when another writer
    rewrites the status (hands-off); once an operator resumes the pool, a swap back to a
    loads a at once, not after the write-landing bound (60 s) for b's write never landed."""
    platform = RefusingB()
    d = driver(platform)
    d.arrive("b")
    await eventually(lambda: ("a", 0) in platform.scales, 5, "a scaled down")
    d.observe(MemberObservation("a", **STOPPED))
    await eventually(lambda: platform.scales.count(("b", 1)) >= 2, 5, "b refused, retried")
    d.observe_status(PoolStatus(resident="a", foreign=True))
    assert [n.target for n in platform.notices if n.kind == "ActuationChanged"] == ["hands-off"]
    d.respec(replace(d.spec, resume="1"))
    d.arrive("a")
    await eventually(lambda: ("a", 1) in platform.scales, 5, "a asked up at once")
    assert ("b", 0) not in platform.scales  # nothing to withdraw: b's wish never landed
    d.close()
