"""The Hub over many pools: what each report costs the pools it does not concern, and the
model-name index kept pool by pool. The platform is the scripted one of test_driver.py; the
drivers and machines are the product's, with the machines' passes counted."""

from __future__ import annotations

import math

from extproc.platform.contract import Peer, PoolLoad
from extproc.policy.model import PoolKey, PoolSpec, StartHints
from extproc.runtime.hub import Hub
from extproc.settings import Settings
from tests.runtime.test_driver import ScriptedPlatform

POOLS = 40


def fleet(pools: int = POOLS) -> Hub:
    """A hub serving ``pools`` pools p0..p<n> of members p<i>-a and p<i>-b."""
    hub = Hub(Settings(), ScriptedPlatform())
    for i in range(pools):
        hub.pool_changed(PoolSpec(PoolKey("ns", f"p{i}"), (f"p{i}-a", f"p{i}-b")), StartHints())
    return hub


def peer(silent_since: float, pools: dict[str, PoolLoad] | None = None,
         lost: bool = False) -> Peer:
    return Peer("r1", "lease-r1", lost, silent_since, None if lost else pools or {})


async def test_a_peers_renew_with_the_same_counts_reaches_no_pool(passes) -> None:
    hub = fleet()
    hub.peers_changed((peer(1.0),))
    passes.clear()
    hub.peers_changed((peer(2.0),))  # renewed: a new silent_since, the same counts
    hub.peers_changed((peer(3.0, {"ns/p9": PoolLoad()}),))  # an idle pool written out
    assert passes == {}
    hub.peers_changed((peer(4.0, {"ns/p7": PoolLoad(held={"p7-b": 1})}),))
    assert passes == {"p7": 1}
    hub.close()


async def test_a_peer_lost_or_gone_reaches_every_pool(passes) -> None:
    hub = fleet()
    hub.peers_changed((peer(1.0),))
    passes.clear()
    hub.peers_changed((peer(1.0, lost=True),))
    assert sorted(passes) == sorted(f"p{i}" for i in range(POOLS))
    passes.clear()
    hub.peers_changed(())
    assert len(passes) == POOLS
    hub.close()


async def test_an_admission_renew_reaches_no_pool_until_its_next_event(passes) -> None:
    hub = fleet()
    hub.admission_changed(-math.inf)
    hub.admission_changed(1e12)  # from lapsed to admitting: every pool hears it now
    assert len(passes) == POOLS
    passes.clear()
    hub.admission_changed(2e12)  # only further: no decision changes before an event
    assert passes == {}
    hub.stop_admitting()  # shortened: every pool hears it now
    assert len(passes) == POOLS
    hub.close()


async def test_names_are_routed_refused_and_listed_as_pools_come_and_go() -> None:
    hub = fleet(3)
    shared = PoolSpec(PoolKey("ns", "p1"), ("p1-a", "p1-b"), aliases={"chat": "p1-b"})
    hub.pool_changed(shared, StartHints())
    assert hub.resolve("chat").member == "p1-b"
    hub.pool_changed(PoolSpec(PoolKey("ns", "p0"), ("p0-a",), aliases={"chat": "p0-a"}),
                     StartHints())
    assert hub.resolve("chat") is None and hub.ambiguity("chat") == ["ns/p0", "ns/p1"]
    assert hub.resolve("p0-b") is None and hub.resolve("p0-a").driver.key.name == "p0"
    hub.pool_removed(PoolKey("ns", "p0"))
    assert hub.ambiguity("chat") == [] and hub.resolve("chat").member == "p1-b"
    assert [(m.id, m.pool) for m in hub.models] == [
        ("p1-a", "p1"), ("p1-b", "p1"), ("chat", "p1"), ("p2-a", "p2"), ("p2-b", "p2")]
    hub.close()
