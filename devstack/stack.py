"""`LocalStack`: the whole product on loopback, one process per piece, for the demo and e2e tests.

What runs (each a ManagedProcess with its log under ``<workdir>/logs``):

- the Kubernetes API emulator (``python -m devstack.kubeapi``) serving crds/, with the
  stack's manifests applied through kubectl, as a user would;
- the member simulator (``python -m devstack.simulator``) playing LLMKube for the members;
- with ``actuation="llmkube"``, the stand-in for LLMKube's ModelPool reconciler
  (``python -m devstack.reconciler``), which then owns member replicas and pool status, and the
  ext_proc runs with ``--actuation llmkube`` (its activator role);
- the ext_proc (``python -m extproc serve --kubeconfig ...``), the thing under test: with
  ``replicas=N``, N processes (``replica(i)``, devstack/stack_replicas.py), each through its own
  fault proxy to the API server with ``api_proxies=True``;
- Envoy, from envoy/envoy.yaml rendered with the stack's ports and one cluster per member (and
  the ext_proc cluster listing every replica).

With one replica the ext_proc's log is ``extproc.log`` and `start_extproc` / `kill_extproc` /
`restart_extproc` / `metrics()` / `debug_pools()` mean that replica. With several, the logs are
``extproc-replica-<i>.log``; those calls act on every replica (the service as a whole), except
`metrics()` and `debug_pools()`, which read replica 0 (`replica(i).metrics()` reads another),
and `metric()`, which sums over the replicas that answer.

Each client of the API server gets its own kubeconfig user (devstack/stack_api.py: kubectl and
GETs as the ``stack`` user, the request record).
Everything is synchronous: the pieces are processes, and tests call in from any thread.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
from pathlib import Path
from typing import Any, Callable, Iterable

from devstack import proberouter
from devstack import stack_manifests as manifests
from devstack.envoyproc import EnvoyProcess
from devstack.picker_envoy import picker_config
from devstack.procs import LOCALHOST, PROJECT_ROOT, ManagedProcess, await_ready, free_port, \
    kill_member_server, wait_for_http, writing_into
from devstack.reconciler import USER as RECONCILER_USER
from devstack.simulator_timeline import read_timeline
from devstack.stack_api import StackApi
from devstack.stack_ports import Ports
from devstack.stack_replicas import STOP_GRACE, Replica, Samples, metric_sum, serve_args, \
    through_proxy

CRDS = PROJECT_ROOT / "crds"
# Kinds only the local stack needs: LLMKube's Model, which its reconciler (the stand-in) reads.
DEVSTACK_CRDS = PROJECT_ROOT / "devstack" / "crds"
START_TIMEOUT = 60.0
ACTUATIONS = ("own", "llmkube")
# With a ModelPool reconciler, a Deployment's hops before a pod exists are the window in which
# it holds an activator's early trigger at 0; the simulator plays them only in llmkube mode.
ROLLOUT_DELAY = 0.5
# llama.cpp members' generated models, kept in the clone's tools (written once, by size)
LLAMA_MODELS = PROJECT_ROOT / ".tools" / "llama.cpp" / "models"


class LocalStack(StackApi):
    """Emulator, simulator, ext_proc and Envoy on loopback; `stop()` leaves no process behind."""

    def __init__(self, workdir: Path | str, docs: list[dict[str, Any]], ports: Ports, *,
                 load_delay: float = 3.0, unload_delay: float = 1.0,
                 extproc_args: Iterable[str] = (), actuation: str = "own",
                 reconciler: bool | None = None, replicas: int = 1, api_proxies: bool = False,
                 lease_namespace: str | None = None, endpoint_picker: bool = False,
                 gateway: Callable[[LocalStack], EnvoyProcess] | None = None,
                 extra_clusters: dict[str, int] | None = None, runtime: str = "fake") -> None:
        if actuation not in ACTUATIONS:
            raise ValueError(f"actuation must be one of {', '.join(ACTUATIONS)}: {actuation!r}")
        if replicas < 1:
            raise ValueError(f"replicas must be at least 1: {replicas}")
        self.actuation = actuation
        # LLMKube's reconciler stand-in: always in llmkube mode; in own mode only to show what
        # happens when both run (the conflict the service must detect)
        self.reconciler = actuation == "llmkube" if reconciler is None else reconciler
        self.workdir = Path(workdir).resolve()
        self.docs = docs
        self.ports = ports
        ports.ensure_replicas(replicas)
        # The addresses, fixed by the ports: Envoy's listener is the OpenAI-compatible endpoint;
        # the (first) ext_proc's metrics port serves Prometheus and a JSON view of its pools.
        self.url = f"http://{LOCALHOST}:{ports.envoy}"
        self.metrics_url = f"http://{LOCALHOST}:{ports.metrics}/metrics"
        self.debug_url = f"http://{LOCALHOST}:{ports.metrics}/debug/pools"
        self.kubeapi_url = f"http://{LOCALHOST}:{ports.kubeapi}"  # the API emulator
        self.probe_port = ports.probe or free_port()  # devstack.proberouter: the idle probe
        self.load_delay, self.unload_delay = load_delay, unload_delay
        # the members' servers: devstack/fakemember.py's fake (a process per pod, or with
        # "fake-in-process" all in the simulator's process, for fleets), or the real
        # llama-server (devstack/llamacpp.py), whose own load is the load (the simulated delay
        # on top)
        self.runtime = runtime
        self.extproc_args = list(extproc_args)
        self.namespaces = manifests.namespaces_of(docs)
        self.members = manifests.members_of(docs)
        # Behind an endpoint picker (an InferencePool's gateway), members' pods share one port
        # on addresses of their own, 127.0.0.2, 127.0.0.3, ... as pods in a cluster do; Envoy
        # goes to the pod the picker names (devstack/picker_envoy.py).
        self.endpoint_picker = endpoint_picker
        # the Envoy in front of a picker stack (default: devstack/picker_envoy.py's)
        self._gateway = gateway or LocalStack._picker_envoy
        self.pod_hosts = {m: f"127.0.0.{2 + i}" for i, (_, m) in enumerate(self.members)} \
            if endpoint_picker else {}
        if endpoint_picker:
            shared = next(iter(ports.members.values()), 0) or free_port()
            ports.members = {m: shared for _, m in self.members}
            self.extproc_args = ["--endpoint-picker", "--endpoint-port", str(shared),
                                 *self.extproc_args]
        self.pools = manifests.pools_of(docs)
        self.log_dir = self.workdir / "logs"
        self.kubeconfig = self.workdir / "kubeconfig"  # the `stack` user's: kubectl, helpers
        self.timeline_path = self.workdir / "timeline.jsonl"
        self._procs: dict[str, ManagedProcess] = {}
        self.envoy: EnvoyProcess | None = None
        # Leases live beside the pools (the demo's `kubectl get leases -n demo` shows them).
        self.lease_namespace = lease_namespace or (self.namespaces or ["default"])[0]
        self.api_proxies = api_proxies
        # Envoy clusters beside the members' (name -> loopback port): a pool's IfIdle fallbacks
        self.extra_clusters = dict(extra_clusters or {})
        self.replicas: list[Replica] = []
        for i in range(replicas):
            piece = "extproc" if replicas == 1 else f"extproc-replica-{i}"
            self.replicas.append(Replica(i, piece, *ports.replica(i), self.log_path(piece),
                                         self.pools))

    def log_path(self, name: str) -> Path:
        """Log file of one piece: kubeapi, simulator, extproc (Envoy logs under envoy/)."""
        return self.log_dir / f"{name}.log"

    def pid(self, name: str) -> int | None:
        """The process id of one piece (simulator, reconciler, extproc, ...; None: not running)."""
        proc = self._procs.get(name)
        return proc.pid if proc is not None and proc.running else None

    def replica(self, index: int) -> Replica:
        """Ext_proc replica ``index`` (0 is the only one unless ``replicas`` said more)."""
        return self.replicas[index]

    # ---- lifecycle -------------------------------------------------------------------------

    def start(self, timeout: float = START_TIMEOUT) -> LocalStack:
        """Bring every piece up in order and wait until `GET /v1/models` answers 200."""
        atexit.register(self.stop)
        try:
            self._start_kubeapi(timeout)
            self.apply(self.docs)
            self._start_simulator(timeout)
            # before the reconciler: it dials the members' /slots through it
            self._start_probe_router(timeout)
            if self.reconciler:
                self._start_reconciler(timeout)
            self.start_extproc(timeout)
            self.envoy = self._gateway(self) if self.endpoint_picker else EnvoyProcess(
                [r.grpc_port for r in self.replicas],
                {f"{m}.{ns}": self.ports.members[m] for ns, m in self.members}
                | self.extra_clusters,
                workdir=self.workdir / "envoy", listen_port=self.ports.envoy,
                admin_port=self.ports.envoy_admin)
            self.envoy.start(timeout)
            wait_for_http(f"{self.url}/v1/models", timeout=timeout, expect_status=200)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop Envoy, the ext_proc, the reconciler, the probe router, the simulator and its
        servers, the emulator."""
        if self.envoy is not None:
            self.envoy.stop()
        for replica in self.replicas:
            if replica.process is not None:
                replica.terminate(STOP_GRACE)
            if replica.proxy is not None:
                replica.proxy.stop()
        self._stop("reconciler")
        self._stop("proberouter")
        self._stop("simulator")
        # The simulator stops its member servers on SIGTERM, but one it could not stop (it was
        # SIGKILLed after its grace, or crashed earlier) outlives it in its own session.
        for pid in writing_into(self.log_dir / "members"):
            kill_member_server(pid)
        self._stop("kubeapi")
        atexit.unregister(self.stop)

    def envoy_sends_to(self) -> dict[str, bool]:
        """Replica name -> whether Envoy sends it new streams now (its health checks' view)."""
        assert self.envoy is not None, "the stack is not started"
        health = self.envoy.extproc_health()
        return {r.name: health[r.grpc_port] for r in self.replicas}

    def exited(self) -> list[str]:
        """Pieces that were started and are no longer running (a crash, or stop())."""
        gone = [name for name, proc in self._procs.items() if not proc.running]
        if self.envoy is not None and not self.envoy.process.running:
            gone.append("envoy")
        return gone

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start_extproc(self, timeout: float = START_TIMEOUT) -> None:
        """Start every ext_proc replica not running; wait until each lists every pool."""
        for replica in self._configured():
            if not replica.running:
                replica.start(timeout)

    def kill(self, name: str) -> None:
        """SIGKILL one piece (extproc: every replica; extproc-replica-<i>, reconciler, simulator,
        kubeapi): a crash, no clean-up."""
        replica = next((r for r in self.replicas if r.piece == name), None)
        if name == "extproc":
            self.kill_extproc()
        elif replica is not None and replica.process is not None:
            replica.kill()  # through the handle, which knows a paused process is gone too
        elif name in self._procs:
            self._procs[name].kill()

    def pause(self, name: str) -> None:
        """SIGSTOP one piece (reconciler, simulator, kubeapi, proberouter): it hangs, its
        connections stay open, and what it would have seen waits in them until `resume`."""
        self._procs[name].send_signal(signal.SIGSTOP)

    def resume(self, name: str) -> None:
        """SIGCONT a piece `pause` stopped."""
        self._procs[name].send_signal(signal.SIGCONT)

    def kill_extproc(self) -> None:
        """SIGKILL every ext_proc replica (a crash: no drain, no status write on the way out)."""
        for replica in self.replicas:
            if replica.process is not None:
                replica.kill()

    def restart_extproc(self, timeout: float = START_TIMEOUT) -> None:
        """Stop each replica gracefully (if running) and start it again on the same ports, one
        after the other (a rolling restart when there are several)."""
        for replica in self._configured():
            replica.restart(timeout, grace=STOP_GRACE)

    # ---- what the pieces recorded --------------------------------------------------------

    def timeline(self) -> list[dict[str, Any]]:
        """The simulator's timeline (pod created/terminating/deleted, ready, ...) so far."""
        return read_timeline(self.timeline_path) if self.timeline_path.exists() else []

    def swap_notices(self) -> list[dict[str, Any]]:
        """The ext_proc's swap notices (SwapStarted, SwapCompleted, ...) so far, all runs and
        all replicas, oldest first."""
        if len(self.replicas) == 1:
            return self.replicas[0].swap_notices()
        merged = [n for r in self.replicas for n in r.swap_notices()]
        return sorted(merged, key=lambda n: str(n.get("ts", "")))  # stable: log order per ts

    def debug_pools(self) -> list[dict[str, Any]]:
        """The (first) ext_proc's /debug/pools views."""
        return self.replicas[0].debug_pools()

    def metrics(self) -> Samples:
        """Every sample of the (first) ext_proc's /metrics: (name, labels) -> value."""
        return self.replicas[0].metrics()

    def metric(self, name: str, **labels: str) -> float:
        """The sum of the samples called `name` whose labels include `labels`, over every
        replica that answers (one: the ext_proc's; a killed or paused replica is left out)."""
        if len(self.replicas) == 1:
            return metric_sum(self.metrics(), name, labels)
        return sum(r.metric(name, **labels) for r in self.replicas if r.live)

    # ---- internals -------------------------------------------------------------------------

    def _launch(self, name: str, args: list[str]) -> ManagedProcess:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        proc = ManagedProcess(args, self.log_path(name), env=env, cwd=PROJECT_ROOT).start()
        self._procs[name] = proc
        return proc

    def _configured(self) -> list[Replica]:
        """The replicas, each given its command line (and proxy) the first time."""
        for replica in self.replicas:
            if replica.process is not None:
                continue
            kubeconfig = self._user_kubeconfig("modelpool-extproc")
            if self.api_proxies:
                kubeconfig = through_proxy(replica, kubeconfig)
            # the members' idle probe through the stand-in for cluster DNS (a later
            # --idle-probe-url in extproc_args wins)
            probe = ["--idle-probe-url", proberouter.template(self.probe_port)]
            replica.configure(serve_args(replica, kubeconfig, self.namespaces,
                                         self.lease_namespace, self.actuation,
                                         probe + self.extproc_args))
            # In the stack's piece list after the simulator (and reconciler), before Envoy.
            assert replica.process is not None
            self._procs[replica.piece] = replica.process
        return self.replicas

    def member_address(self, member: str) -> str:
        """``host:port`` of the member's pod (its server, while it runs)."""
        return f"{self.pod_hosts.get(member, LOCALHOST)}:{self.ports.members[member]}"

    def _picker_envoy(self) -> EnvoyProcess:
        """Envoy as an InferencePool's gateway, full duplex as the protocol asks, on the
        stack's ports (every replica a picker endpoint, as the picker's Service is)."""
        grpc = [r.grpc_port for r in self.replicas]
        return EnvoyProcess.from_config(
            lambda listen, admin, log: picker_config(listen, admin, str(log), grpc,
                                                     "FULL_DUPLEX_STREAMED"),
            workdir=self.workdir / "envoy", listen_port=self.ports.envoy,
            admin_port=self.ports.envoy_admin)

    def _start_probe_router(self, timeout: float) -> None:
        """The members' /slots on loopback, as the idle probe finds them in a cluster."""
        routes = [f"{ns}/{m}={self.member_address(m) if self.pod_hosts else self.ports.members[m]}"
                  for ns, m in self.members]
        proc = self._launch("proberouter", [
            sys.executable, "-m", "devstack.proberouter", "--port", str(self.probe_port),
            *[arg for route in routes for arg in ("--member", route)]])
        wait_for_http(f"http://{LOCALHOST}:{self.probe_port}/healthz", timeout=timeout,
                      expect_status=200)
        assert proc.running

    def _stop(self, name: str) -> None:
        proc = self._procs.get(name)
        if proc is not None:
            proc.stop()

    def _start_kubeapi(self, timeout: float) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.kubeconfig.unlink(missing_ok=True)
        args = [sys.executable, "-m", "devstack.kubeapi", "--port", str(self.ports.kubeapi),
                "--crds", str(CRDS), "--crds", str(DEVSTACK_CRDS),
                "--kubeconfig-out", str(self.kubeconfig),
                "--namespace", "default"]
        for ns in self.namespaces:
            args += ["--namespace", ns]
        proc = self._launch("kubeapi", args)
        await_ready(proc, self.kubeconfig.exists, timeout, "the API emulator")
        self._user_kubeconfig("stack", path=self.kubeconfig)

    def _start_simulator(self, timeout: float) -> None:
        self.timeline_path.unlink(missing_ok=True)
        args = [sys.executable, "-m", "devstack.simulator",
                "--kubeconfig", str(self._user_kubeconfig("simulator")),
                "--load-delay", f"{self.load_delay}s", "--unload-delay", f"{self.unload_delay}s",
                "--timeline", str(self.timeline_path), "--log-dir", str(self.log_dir / "members")]
        for ns in self.namespaces:
            args += ["--namespace", ns]
        for member, port in self.ports.members.items():
            args += ["--port", f"{member}={port}"]
        for member, host in self.pod_hosts.items():
            args += ["--host", f"{member}={host}"]
        if self.reconciler:
            args += ["--rollout-delay", f"{ROLLOUT_DELAY}s"]
        if self.runtime != "fake":
            args += ["--runtime", self.runtime]
        if self.runtime == "llama.cpp":
            args += ["--models", str(LLAMA_MODELS)]
        proc = self._launch("simulator", args)
        # Every member reports a phase once the simulator has reconciled it (Stopped at 0).
        await_ready(proc, self._members_reported, timeout, "the simulator to report members")

    def _start_reconciler(self, timeout: float) -> None:
        args = [sys.executable, "-m", "devstack.reconciler",
                "--kubeconfig", str(self._user_kubeconfig(RECONCILER_USER)),
                "--probe-proxy", f"http://{LOCALHOST}:{self.probe_port}"]
        for ns in self.namespaces:
            args += ["--namespace", ns]
        proc = self._launch("reconciler", args)
        # It writes every pool's status at once, MetalSupported included (LLMKube's mark).
        await_ready(proc, self._pools_reconciled, timeout, "the reconciler to write pool status")
