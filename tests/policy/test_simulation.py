"""Interleaved traffic through the machine for ten minutes of model time: swaps get batched.

Four clients each send a 2 s request every 4 s, offset by 1 s, alternately for members a and
b, so the arrival stream is a b a b ... one request a second: 600 requests and 599
cross-model switches. A swap costs 15 s (3 s unload + 12 s load), the fairness window is 30 s.
Run with ``pytest -s`` to see the numbers; last run:

    requests 600, cross-model switches 599, swaps 14, served 600, rejected 0
    max wait 60.0 s (requests waiting for their own swap: 46.0 s)

So 14 swaps serve what would be 599 swaps one request at a time. A request for the member that
is being drained, held once the window closed, waits for that swap and then for the swap
back, whose own window serves the other side first: up to window + 2 x (drain + swap) =
30 + 2 x (2 + 15) = 64 s. A request whose own member is being loaded waits at most
window + drain + swap = 47 s.
"""

from __future__ import annotations

from cluster_model import Cluster
from harness import Driver, limits, spec

MINUTES = 10
CLIENTS = 4
PERIOD = 4.0  # each client sends one request every PERIOD seconds
DURATION = 2.0
UNLOAD, LOAD = 3.0, 12.0
SWAP = UNLOAD + LOAD
WINDOW = 30.0


def test_interleaved_traffic_is_served_in_batches_with_bounded_waits() -> None:
    cluster = Cluster(("a", "b"), load_delay=LOAD, unload_delay=UNLOAD)
    cluster.warm("a")
    d = Driver(spec(("a", "b"), fairness_window=WINDOW), limits(), cluster)
    d.start()
    horizon = MINUTES * 60.0
    arrivals = []
    for client in range(CLIENTS):
        member = "ab"[client % 2]
        t = float(client)
        while t < horizon:
            arrivals.append((t, member))
            d.request(member, at=t, duration=DURATION)
            t += PERIOD
    d.run()

    arrivals.sort()
    switches = sum(1 for x, y in zip(arrivals, arrivals[1:]) if x[1] != y[1])
    swaps = len(d.notices("SwapCompleted"))
    reqs = list(d.requests.values())
    served = sum(r.state == "done" for r in reqs)
    rejected = sum(r.state == "rejected" for r in reqs)
    max_wait = max(r.waited for r in reqs)
    own_wait = max(r.waited for r in reqs if r.behind in ("", r.member))
    print(f"\nrequests {len(reqs)}, cross-model switches {switches}, swaps {swaps}, "
          f"served {served}, rejected {rejected}\n"
          f"max wait {max_wait:.1f} s (requests waiting for their own swap: {own_wait:.1f} s)")

    assert served == len(reqs) == 600 and switches == 599
    # Each swap buys the other side at least a full fairness window of service.
    assert swaps <= horizon / (WINDOW + SWAP) + 1
    assert swaps * 20 < switches
    assert own_wait <= WINDOW + DURATION + SWAP
    assert max_wait <= WINDOW + 2 * (DURATION + SWAP)
    assert d.machine.view().held == 0 and d.cluster.up() == [d.machine.resident]
