"""The local stack's ext_proc replicas: one process each, with its own name, ports and log, and
what a test does to one (kill, terminate, pause, resume, restart, cut it off the API).

A replica's name (``replica-<i>``) is its identity in the Leases (``--replica-name``); a
restart keeps it and its ports, as a restarted pod keeps its name. Every replica calls the API
as the stack's ``modelpool-extproc`` user (the RBAC record is the union of their calls) and
puts its Leases in the stack's Lease namespace (``--lease-namespace``).

With ``api_proxies`` each replica reaches the API server through its own `FaultProxy`, named
by a kubeconfig of its own, so a test can cut one replica off while the others keep the API.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import urllib.request
from pathlib import Path
from typing import Any, Iterable
from urllib.parse import urlsplit, urlunsplit

import yaml
from prometheus_client.parser import text_string_to_metric_families

from devstack.faultproxy import FaultProxy
from devstack.procs import LOCALHOST, PROJECT_ROOT, ManagedProcess, await_ready
from devstack.stack_swaps import read_log, swap_notices

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

# SIGTERM -> exit: the service lets open streams finish for --shutdown-grace (30 s by
# default), then stops; a few seconds more for the rest of its shutdown.
TERMINATE_GRACE = 35.0
STOP_GRACE = 5.0  # the stack's own stop(): nothing is worth waiting for any longer


def replica_name(index: int) -> str:
    """The identity of replica ``index`` in its Leases and in the demo's lines."""
    return f"replica-{index}"


def read_metrics(url: str) -> Samples:
    """Every sample of a Prometheus /metrics page: (name, labels) -> value."""
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def metric_sum(samples: Samples, name: str, labels: dict[str, str]) -> float:
    """The sum of the samples called ``name`` whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= ls)


class Replica:
    """One ext_proc process of the stack: name, ports, log, and the signals tests send it."""

    def __init__(self, index: int, piece: str, grpc_port: int, metrics_port: int,
                 log_path: Path, pools: list[tuple[str, str]]) -> None:
        self.index = index
        self.name = replica_name(index)
        self.piece = piece  # the stack's name for it: in exited(), kill(), its log file's name
        self.grpc_port, self.metrics_port = grpc_port, metrics_port
        self.grpc_address = f"{LOCALHOST}:{grpc_port}"
        self.metrics_url = f"http://{LOCALHOST}:{metrics_port}/metrics"
        self.debug_url = f"http://{LOCALHOST}:{metrics_port}/debug/pools"
        self.log_path = log_path
        self.proxy: FaultProxy | None = None  # between it and the API server, with api_proxies
        self.process: ManagedProcess | None = None  # set by configure()
        self.paused = False
        self._pools = pools

    def configure(self, args: list[str]) -> None:
        """Its command line (the stack builds it once the API server's address is known)."""
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.process = ManagedProcess(args, self.log_path, env=env, cwd=PROJECT_ROOT)

    @property
    def pid(self) -> int | None:
        """The process id of its current run (None before the first start)."""
        return self.process.pid if self.process else None

    @property
    def running(self) -> bool:
        """True while its process is alive (paused included)."""
        return self.process is not None and self.process.running

    @property
    def exit_code(self) -> int | None:
        """Its last run's exit code (None while it runs, or before it ever ran)."""
        proc = self.process.proc if self.process else None
        return None if proc is None else proc.poll()

    @property
    def live(self) -> bool:
        """Running and not paused: it answers (metrics, debug views, Envoy's health checks)."""
        return self.running and not self.paused

    def line(self) -> str:
        """The demo's line for it: name, pid, gRPC address, metrics URL."""
        return (f"replica {self.name} pid {self.pid} grpc {self.grpc_address} "
                f"metrics {self.metrics_url}")

    # ---- what tests do to it ---------------------------------------------------------------

    def start(self, timeout: float) -> None:
        """Start it and wait until it lists every pool of the stack."""
        process = self._process()
        self.paused = False
        process.start()
        await_ready(process, self.has_pools, timeout, f"{self.name} to sync its pools")

    def kill(self) -> int | None:
        """SIGKILL (a crash: no drain, no Lease released); returns the exit code."""
        self.paused = False  # SIGKILL ends a stopped process too
        return self._process().kill()

    def terminate(self, grace: float = TERMINATE_GRACE) -> int | None:
        """SIGTERM and wait for it to exit (SIGKILL after ``grace`` s); returns the exit code."""
        if self.paused:
            self.resume()  # a stopped process only acts on SIGTERM once continued
        return self._process().stop(grace)

    def pause(self) -> None:
        """SIGSTOP: it keeps its sockets and Leases but does nothing (a long GC pause, a
        frozen node)."""
        self._process().send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        """SIGCONT after pause()."""
        self._process().send_signal(signal.SIGCONT)
        self.paused = False

    def restart(self, timeout: float, grace: float = TERMINATE_GRACE) -> None:
        """terminate() if it runs, then start() again: same name, same ports."""
        if self.running:
            self.terminate(grace)
        self.start(timeout)

    # ---- what it says ----------------------------------------------------------------------

    def metrics(self) -> Samples:
        """Every sample of its /metrics."""
        return read_metrics(self.metrics_url)

    def metric(self, name: str, **labels: str) -> float:
        """The sum of its samples called ``name`` whose labels include ``labels``."""
        return metric_sum(self.metrics(), name, labels)

    def debug_pools(self) -> list[dict[str, Any]]:
        """Its /debug/pools views."""
        with urllib.request.urlopen(self.debug_url, timeout=5) as resp:
            return json.loads(resp.read())

    def has_pools(self) -> bool:
        """True once its /debug/pools lists every pool of the stack."""
        try:
            views = self.debug_pools()
        except OSError:
            return False
        seen = {(v["key"]["namespace"], v["key"]["name"]) for v in views}
        return all(p in seen for p in self._pools)

    def swap_notices(self) -> list[dict[str, Any]]:
        """The swap notices in its log so far (every run)."""
        return swap_notices(read_log(self.log_path))

    def _process(self) -> ManagedProcess:
        if self.process is None:
            raise RuntimeError(f"{self.name} was never configured (the stack did not start)")
        return self.process


def serve_args(replica: Replica, kubeconfig: Path, namespaces: Iterable[str],
               lease_namespace: str, actuation: str, extra: Iterable[str]) -> list[str]:
    """The command line of one replica."""
    args = [sys.executable, "-m", "extproc", "serve", "--kubeconfig", str(kubeconfig),
            "--listen", replica.grpc_address,
            "--metrics-listen", f"{LOCALHOST}:{replica.metrics_port}", "--debug-endpoints",
            "--replica-name", replica.name, "--lease-namespace", lease_namespace]
    for ns in namespaces:
        args += ["--namespace", ns]
    if actuation != "own":  # own mode keeps today's command line
        args += ["--actuation", actuation]
    return args + list(extra)


def through_proxy(replica: Replica, kubeconfig: Path) -> Path:
    """Start the replica's fault proxy to ``kubeconfig``'s API server; a copy of the kubeconfig
    that names the proxy instead."""
    config = yaml.safe_load(kubeconfig.read_text(encoding="utf-8"))
    cluster = config["clusters"][0]["cluster"]
    server = urlsplit(cluster["server"])
    default_port = 443 if server.scheme == "https" else 80
    if replica.proxy is None:
        replica.proxy = FaultProxy(server.hostname or LOCALHOST,
                                   server.port or default_port).start()
    # The proxy relays TLS untouched and the host stays 127.0.0.1, so a server certificate
    # that was valid for the API server is valid through the proxy.
    cluster["server"] = urlunsplit(server._replace(netloc=replica.proxy.address))
    target = kubeconfig.with_name(f"{kubeconfig.stem}.{replica.name}.kubeconfig")
    target.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return target
