"""free_port hands out loopback ports below the kernel's ephemeral range, each once per process.

Ports in the ephemeral range are what every outgoing connection's source port is drawn from,
so one handed out there could be taken by any client's connect before the server bound it
(Envoy then died with "Address already in use" on a machine shared with other test runs).
"""

from __future__ import annotations

import socket

from devstack import procs


def test_ports_are_below_the_ephemeral_range_distinct_and_bindable() -> None:
    low, _ = procs._ephemeral_range()
    ports = [procs.free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    assert all(procs.PORT_FLOOR <= p < low for p in ports)
    for port in ports[:20]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((procs.LOCALHOST, port))


def test_a_port_in_use_is_not_handed_out(monkeypatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as spare:
        spare.bind((procs.LOCALHOST, 0))
        free = spare.getsockname()[1]  # free again once closed (no listener, no TIME_WAIT)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((procs.LOCALHOST, 0))
        sock.listen()
        taken = sock.getsockname()[1]
        # the first draw lands on the port in use, every later one on the free port
        draws = iter([taken])
        monkeypatch.setattr(procs, "_ephemeral_range", lambda: (65000, 65535))
        monkeypatch.setattr(procs._RANDOM, "randrange", lambda a, b, step: next(draws, free))
        assert procs.free_port() == free


def test_test_workers_draw_disjoint_ports(monkeypatch) -> None:
    # pytest-xdist's workers are separate processes, each checking only its own hand-outs: a
    # residue each keeps two of them from handing out the same port at the same moment
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "3")
    drawn = {}
    for worker in ("gw0", "gw1", "gw2"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        drawn[worker] = {procs.free_port() for _ in range(50)}
    assert all((p - procs.PORT_FLOOR) % 3 == int(w[2]) for w, ports in drawn.items() for p in ports)
    assert not (drawn["gw0"] & drawn["gw1"] or drawn["gw1"] & drawn["gw2"])
