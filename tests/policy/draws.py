"""Hypothesis draws the random-pool tests share: members, their pool, a cluster, the requests."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import strategies as st

from cluster_model import FAILS, LOADS, Cluster
from extproc.policy.model import PoolSpec
from harness import Driver, spec


def member_names(draw: st.DrawFn) -> tuple[str, ...]:
    """Two or three members: a, b (and c)."""
    return ("a", "b", "c")[:draw(st.integers(2, 3))]


def random_pool(draw: st.DrawFn, members: tuple[str, ...], max_budget: float,
                **more: Any) -> PoolSpec:
    """A pool of ``members`` with a random default (or none), a swap budget of 5 s to
    ``max_budget`` and a fairness window (often 0 or 30 s); ``more`` as `spec` takes it."""
    return spec(members, default=draw(st.sampled_from(("",) + members)),
                swap_budget=draw(st.floats(5, max_budget)),
                fairness_window=draw(st.sampled_from([0.0, 30.0]) | st.floats(1, 60)), **more)


def random_cluster(draw: st.DrawFn, members: tuple[str, ...], max_capacity: int,
                   **more: Any) -> Cluster:
    """Random load (0.5-20 s) and unload (0-5 s) delays, a load that fails one time in three,
    a capacity of 0 (not paced) to ``max_capacity`` each, at most one member warm at the start;
    ``more`` as `Cluster` takes it."""
    cluster = Cluster(members, load_delay=draw(st.floats(0.5, 20)),
                      unload_delay=draw(st.floats(0, 5)),
                      outcome={m: draw(st.sampled_from([LOADS, LOADS, FAILS])) for m in members},
                      capacity={m: draw(st.integers(0, max_capacity)) for m in members}, **more)
    for m in draw(st.lists(st.sampled_from(members), max_size=1)):
        cluster.warm(m)
    return cluster


def random_requests(draw: st.DrawFn, d: Driver, horizon: float, *, min_size: int = 0,
                    max_size: int) -> None:
    """Between ``min_size`` and ``max_size`` requests for the pool's members at times in
    [0, ``horizon``), 0.1-15 s long, some abandoned by their client within 60 s."""
    requests = st.tuples(st.floats(0, horizon), st.sampled_from(d.spec.members),
                         st.floats(0.1, 15), st.none() | st.floats(0, 60))
    for at, member, duration, abandon in draw(st.lists(requests, min_size=min_size,
                                                       max_size=max_size)):
        d.request(member, at=at, duration=duration,
                  abandon_after=math.inf if abandon is None else abandon)
