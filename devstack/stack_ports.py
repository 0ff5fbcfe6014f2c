"""Port plans for the local stack: the demo's well-known ports, or free ones for tests."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from devstack.procs import free_port, port_is_free

DEMO_PORT_ENV = "MODELPOOL_DEMO_PORT"
DEMO_LISTEN_PORT = 8080
# The ports envoy/envoy.yaml names, so the demo matches the file a reader sees.
DEMO_PREFERRED = {"envoy_admin": 9901, "extproc": 9002, "metrics": 9090, "kubeapi": 16443}
DEMO_MEMBER_PORTS = {"judge": 18081, "coder": 18082, "writer": 18083}


def preferred_or_free(port: int) -> int:
    """`port` when it is free, else any free port (the demo prints the ports it uses)."""
    return port if port_is_free(port) else free_port()


@dataclass
class Ports:
    """Every loopback port the stack listens on; member ports keyed by member name.

    `extproc` and `metrics` are the first ext_proc replica's gRPC and metrics ports;
    `more_replicas` holds the (gRPC, metrics) pairs of the others.
    """

    envoy: int
    envoy_admin: int
    extproc: int
    metrics: int
    kubeapi: int
    members: dict[str, int] = field(default_factory=dict)
    more_replicas: list[tuple[int, int]] = field(default_factory=list)
    probe: int = 0  # devstack.proberouter (0: picked when the stack starts)

    @classmethod
    def free(cls, members: list[str], replicas: int = 1) -> Ports:
        """Kernel-picked ports for everything (tests: several stacks can run at once)."""
        ports = cls(free_port(), free_port(), free_port(), free_port(), free_port(),
                    {m: free_port() for m in members}, probe=free_port())
        ports.ensure_replicas(replicas)
        return ports

    @classmethod
    def demo(cls, members: list[str], listen: int | None = None, replicas: int = 1) -> Ports:
        """The demo's ports: Envoy on 8080 ($MODELPOOL_DEMO_PORT), the rest preferred-or-free.

        Clients and scripts rely on the listener port, so it never silently moves. Replicas
        after the first prefer the ports after the first's (9003 and 9091, ...).
        """
        if listen is None:
            listen = int(os.environ.get(DEMO_PORT_ENV) or DEMO_LISTEN_PORT)
        if not port_is_free(listen):
            raise RuntimeError(f"port {listen} is in use; set {DEMO_PORT_ENV} to another port")
        taken = {listen}
        chosen: dict[str, int] = {}
        for name, port in DEMO_PREFERRED.items():
            chosen[name] = _pick(port, taken)
        member_ports = {m: _pick(DEMO_MEMBER_PORTS.get(m, 0), taken) for m in members}
        more = [(_pick(DEMO_PREFERRED["extproc"] + i, taken),
                 _pick(DEMO_PREFERRED["metrics"] + i, taken)) for i in range(1, replicas)]
        return cls(listen, chosen["envoy_admin"], chosen["extproc"], chosen["metrics"],
                   chosen["kubeapi"], member_ports, more)

    def replica(self, index: int) -> tuple[int, int]:
        """The (gRPC, metrics) ports of replica `index` (0 is `extproc`, `metrics`)."""
        return (self.extproc, self.metrics) if index == 0 else self.more_replicas[index - 1]

    def ensure_replicas(self, count: int) -> None:
        """Add free ports for replicas up to `count` (a plan made for fewer stays as it is)."""
        while len(self.more_replicas) < count - 1:
            self.more_replicas.append((free_port(), free_port()))


def _pick(preferred: int, taken: set[int]) -> int:
    port = preferred_or_free(preferred) if preferred and preferred not in taken else free_port()
    while port in taken:
        port = free_port()
    taken.add(port)
    return port
