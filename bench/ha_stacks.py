"""The stacks part 5 runs side by side: the local stack with 1 and with 3 ext_proc replicas.

Each is a whole ``devstack.stack.LocalStack`` (API emulator, member simulator, the replicas,
its own Envoy) with pool ``pool`` over members ``a`` (the default) and ``b``; the 1-replica
stack lives in namespace ``ha1``, the 3-replica one in ``ha3``. In front of them the bench adds
Envoys rendered the way part 1 renders its own (``bench.envoycfg``):

- ``envoy``: one per stack, its ext_proc cluster listing every replica of the stack
  (round-robin and gRPC health checks with several, exactly as the local stack renders them);
- ``preferred``: for the 3-replica stack, the same but one Envoy priority per replica, so the
  first replica takes every stream while it is healthy and the other two stand by;
- ``direct``: no ext_proc filter, straight to the 1-replica stack's member ``a`` (part 1's
  baseline, so "added p50" means the same thing here);
- ``per_replica``: for the 3-replica stack, one Envoy per replica whose ext_proc cluster is that
  replica alone, so a request is decided (held, released) by the replica chosen for it.

Both stacks' replicas run with ``--idle-probe-url`` naming ``devstack.proberouter`` (the cluster
DNS stand-in that lets the probe reach a member's ``/slots`` on loopback) and
``--lost-replica-wait 60s`` (a bound only: if the probe cannot answer, a swap after a lost
replica waits 60 s instead of 600 s, well past the target, so it shows as missed).
"""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path
from typing import Any

from devstack.envoyproc import EnvoyProcess
from devstack.procs import LOCALHOST, PROJECT_ROOT, ManagedProcess, free_port, wait_for_http
from devstack.stack import LocalStack
from devstack.stack_manifests import pool_with_members
from devstack.stack_ports import Ports
from devstack.stack_replicas import Replica, metric_sum

from devstack import proberouter

from . import envoycfg, services

POOL = "pool"
MEMBERS = ("a", "b")
NAMESPACE = {1: "ha1", 3: "ha3"}
EXTPROC_USER = "modelpool-extproc"
KUBE_CALLS = "modelpool_extproc_kube_requests_total"
WRITE_VERBS = ("create", "update", "patch", "delete")
LOST_REPLICA_WAIT = "60s"


def leader_lease(namespace: str) -> str:
    """The name of the replica set's leader Lease (the service's default; one for every pool,
    whatever ``namespace``)."""
    return "modelpool-extproc-leader"


class HaStack:
    """One LocalStack of ``n`` replicas and the bench's Envoys in front of it."""

    def __init__(self, workdir: Path, n: int, ports: Ports, extproc_args: list[str],
                 load_delay: float, unload_delay: float) -> None:
        self.n = n
        self.namespace = NAMESPACE[n]
        self.workdir = workdir
        docs = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.namespace}}]
        docs += pool_with_members(POOL, self.namespace, MEMBERS, default=MEMBERS[0],
                                  swap_budget="120s")
        self.stack = LocalStack(workdir / "stack", docs, ports, load_delay=load_delay,
                                unload_delay=unload_delay, extproc_args=extproc_args,
                                replicas=n, api_proxies=False)
        self.members = {f"{m}.{self.namespace}": ports.members[m] for m in MEMBERS}
        self.envoy: EnvoyProcess | None = None
        self.preferred: EnvoyProcess | None = None
        self.per_replica: dict[str, EnvoyProcess] = {}

    # ---- lifecycle -------------------------------------------------------------------------

    def start(self) -> HaStack:
        """Start the stack, then its Envoys; wait until member ``a`` serves through them."""
        self.stack.start()
        ports = [r.grpc_port for r in self.stack.replicas]
        self.envoy = envoycfg.bench_envoy(self.workdir / "envoy", ports, self.members).start()
        if self.n > 1:
            self.preferred = envoycfg.bench_envoy(self.workdir / "envoy-preferred", ports,
                                                  self.members, prefer_first=True).start()
            for r in self.stack.replicas:
                self.per_replica[r.name] = envoycfg.bench_envoy(
                    self.workdir / f"envoy-{r.name}", r.grpc_port, self.members).start()
        body = chat("a")
        urls = [self.url()] + [self.url(name) for name in self.per_replica]
        for url in urls + ([self.preferred_url] if self.preferred else []):
            services.wait_routed(url, body, timeout=60)
        return self

    def stop(self) -> None:
        """Stop the bench's Envoys, then the stack (which stops every process it started)."""
        for envoy in [*self.per_replica.values(), self.preferred, self.envoy]:
            if envoy is not None:
                envoy.stop()
        self.stack.stop()

    # ---- addresses and state ---------------------------------------------------------------

    def url(self, replica: str | None = None) -> str:
        """Chat URL of the Envoy over every replica, or of the one over ``replica`` alone."""
        envoy = self.per_replica[replica] if replica else self.envoy
        assert envoy is not None, "not started"
        return f"{envoy.url}/v1/chat/completions"

    @property
    def preferred_url(self) -> str:
        """Chat URL of the Envoy that sends every stream to the first replica while it is
        healthy (the others stand by)."""
        assert self.preferred is not None, "not started"
        return f"{self.preferred.url}/v1/chat/completions"

    def replica(self, name: str) -> Replica:
        """The stack's handle of replica ``name``."""
        return next(r for r in self.stack.replicas if r.name == name)

    def leases(self) -> dict[str, dict[str, Any]]:
        """The Leases in the stack's Lease namespace, by name."""
        listing = self.stack.get(f"/apis/coordination.k8s.io/v1/namespaces/"
                                 f"{self.stack.lease_namespace}/leases")
        return {item["metadata"]["name"]: item for item in listing["items"]}

    def leader(self) -> str:
        """The replica holding the pool's leader Lease ("" if none)."""
        lease = self.leases().get(leader_lease(self.namespace)) or {}
        return (lease.get("spec") or {}).get("holderIdentity") or ""

    def followers(self) -> list[str]:
        """The replicas that do not hold the leader Lease, by name."""
        boss = self.leader()
        return [r.name for r in self.stack.replicas if r.name != boss]

    def status(self) -> dict[str, Any]:
        """The pool's status as the API holds it."""
        return self.stack.pool(POOL, self.namespace).get("status") or {}

    def settled_on(self, member: str) -> bool:
        """The status names ``member`` resident, phase Ready, nothing pending."""
        st = self.status()
        return (st.get("residentMember") == member and st.get("phase") == "Ready"
                and not st.get("pendingMember"))

    def replicas_of(self, member: str) -> int:
        """A member's spec.replicas as the API holds it."""
        return int((self.stack.isvc(member, self.namespace).get("spec") or {})
                   .get("replicas") or 0)

    # ---- API writes ------------------------------------------------------------------------

    def write_counts(self) -> dict[str, dict[str, float]]:
        """Per live replica, its API writes so far by "verb resource" (its own counter)."""
        out: dict[str, dict[str, float]] = {}
        for r in self.stack.replicas:
            if not r.live:
                continue
            samples = r.metrics()
            kinds = {(dict(labels)["verb"], dict(labels)["resource"])
                     for (name, labels) in samples if name == KUBE_CALLS}
            out[r.name] = {f"{verb} {resource}": metric_sum(samples, KUBE_CALLS,
                                                            {"verb": verb, "resource": resource})
                           for verb, resource in sorted(kinds) if verb in WRITE_VERBS}
        return out

    def reset_api_record(self) -> None:
        """Empty the emulator's request record."""
        request = urllib.request.Request(f"{self.stack.kubeapi_url}/_emulator/reset-record",
                                         data=b"{}", method="POST")
        with urllib.request.urlopen(request, timeout=10) as resp:
            resp.read()

    def recorded_writes(self) -> int:
        """The service's writes (every replica: they share one API user) in the emulator's
        request record since the last reset."""
        return sum(1 for entry in self.stack.api_requests(EXTPROC_USER)
                   if entry["verb"] in WRITE_VERBS)


class HaBench:
    """The probe router, both stacks and the direct Envoy; ``stop()`` leaves nothing behind."""

    def __init__(self, workdir: Path, load_delay: float, unload_delay: float) -> None:
        self.workdir = workdir
        self.router_port = free_port()
        ports = {n: Ports.free(list(MEMBERS), replicas=n) for n in NAMESPACE}
        routes = [f"{NAMESPACE[n]}/{m}={p.members[m]}" for n, p in ports.items() for m in MEMBERS]
        self.router = ManagedProcess(
            [sys.executable, "-m", "devstack.proberouter", "--port", str(self.router_port),
             *[arg for route in routes for arg in ("--member", route)]],
            workdir / "proberouter.log", cwd=PROJECT_ROOT)
        self.extproc_args = ["--idle-probe-url", proberouter.template(self.router_port),
                             "--lost-replica-wait", LOST_REPLICA_WAIT]
        self.stacks = {n: HaStack(workdir / f"replicas{n}", n, ports[n], self.extproc_args,
                                  load_delay, unload_delay) for n in NAMESPACE}
        self.direct: EnvoyProcess | None = None

    @property
    def direct_url(self) -> str:
        """Chat URL of the Envoy without the ext_proc, straight to the 1-replica stack's a."""
        assert self.direct is not None, "not started"
        return f"{self.direct.url}/v1/chat/completions"

    def probes_asked(self) -> dict[str, int]:
        """Idle probes the router has answered so far, by "namespace/member"."""
        with urllib.request.urlopen(f"http://{LOCALHOST}:{self.router_port}/asked",
                                    timeout=5) as resp:
            return json.loads(resp.read())

    def start(self) -> HaBench:
        """Start everything (stopped again if any piece fails)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self.router.start()
            wait_for_http(f"http://{LOCALHOST}:{self.router_port}/healthz", timeout=20,
                          expect_status=200)
            for ha in self.stacks.values():
                ha.start()
            one = self.stacks[1]
            member = f"a.{one.namespace}"
            self.direct = envoycfg.bench_envoy(self.workdir / "envoy-direct",
                                               one.stack.replicas[0].grpc_port, one.members,
                                               direct_to=member).start()
            services.wait_routed(self.direct_url, chat("a"))
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the direct Envoy, both stacks, the router."""
        if self.direct is not None:
            self.direct.stop()
        for ha in self.stacks.values():
            ha.stop()
        self.router.stop()


def chat(member: str, *, tokens: int = 4, stream: bool = False) -> bytes:
    """A small chat request naming ``member``."""
    return json.dumps({"model": member, "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": tokens, "stream": stream}).encode()
