"""The cluster-mode stack for parts 2 to 4, one process per piece, all on loopback.

API emulator with a commit log (``bench.apiserver``), the member simulator
(``devstack.simulator``), the ext_proc watching the emulator, and Envoy with the bench config.
Pool ``bench/pool`` has members ``a`` (the default, warmed at start) and ``b``.

With ``actuation="llmkube"`` the stand-in for LLMKube's ModelPool reconciler
(``devstack.reconciler``) runs too and the ext_proc runs ``--actuation llmkube``, as
``devstack.stack.LocalStack`` does (the simulator then plays a Deployment's rollout hops). Each
client has its own API user (``modelpool-extproc``, ``llmkube-controller``, ``simulator``), so
the commit log and the emulator's request record tell their writes apart.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from devstack import proberouter
from devstack.envoyproc import EnvoyProcess
from devstack.procs import LOCALHOST, PROJECT_ROOT, ManagedProcess, free_port, wait_for_http
from devstack.reconciler import USER as RECONCILER_USER
from devstack.stack import ACTUATIONS, DEVSTACK_CRDS, LLAMA_MODELS, ROLLOUT_DELAY
from devstack.stack_manifests import pool_with_members
from devstack.testkit import chat_body, wait_until

from . import envoycfg, services

NAMESPACE = "bench"
POOL = "pool"
MEMBERS = ("a", "b")
EXTPROC_USER = "modelpool-extproc"
SIMULATOR_USER = "simulator"


def _objects(load_delay: float, unload_delay: float,
             annotations: dict[str, str] | None = None) -> list[dict[str, Any]]:
    delays = {"sim.llmkube.dev/load-delay": f"{load_delay}s",
              "sim.llmkube.dev/unload-delay": f"{unload_delay}s", **(annotations or {})}
    return pool_with_members(POOL, NAMESPACE, MEMBERS, default=MEMBERS[0], swap_budget="120s",
                             member_annotations={m: delays for m in MEMBERS})


class ClusterStack:
    """Start with ``start()``, always ``stop()``; ``url`` is Envoy's chat endpoint."""

    def __init__(self, workdir: Path, load_delay: float, unload_delay: float,
                 sink_for: str | None = None, actuation: str = "own", *,
                 extproc_args: tuple[str, ...] = (),
                 member_annotations: dict[str, str] | None = None,
                 member_env: dict[str, str] | None = None, runtime: str = "fake") -> None:
        if actuation not in ACTUATIONS:
            raise ValueError(f"actuation must be one of {', '.join(ACTUATIONS)}: {actuation!r}")
        self.workdir = workdir
        self.load_delay, self.unload_delay = load_delay, unload_delay
        self.actuation = actuation
        self.kubeconfig = workdir / "kubeconfig"
        self.user_kubeconfigs = {user: workdir / f"{user}.kubeconfig" for user in (
            EXTPROC_USER, SIMULATOR_USER, RECONCILER_USER)}
        self.commits_path = workdir / "commits.jsonl"
        self.api_port = free_port()
        self.sim_ports = {m: free_port() for m in MEMBERS}
        # Envoy sends this member's traffic to a bare Envoy answering 200 over h2 instead of
        # the simulator's Python server (the scale test measures release, not that server).
        self.sink_for = sink_for
        # (the warm-swap part: every member's annotations, and its server's environment)
        self.member_annotations, self.member_env = member_annotations, member_env
        self.runtime = runtime  # "llama.cpp": the members are llama.cpp's own servers
        mode = ("--actuation", actuation) if actuation != "own" else ()
        # the idle probe and the slot client dial the members through the probe router
        self.probe_port = free_port()
        self.extproc = services.ExtProc(workdir, "extproc", services.EXTPROC,
                                        "--kubeconfig", str(self.user_kubeconfigs[EXTPROC_USER]),
                                        "--namespace", NAMESPACE, *mode, "--debug-endpoints",
                                        "--idle-probe-url",
                                        proberouter.template(self.probe_port), *extproc_args)
        self._procs: list[Any] = []
        self.envoy: EnvoyProcess | None = None

    @property
    def url(self) -> str:
        """Envoy's chat completions URL."""
        assert self.envoy is not None
        return f"{self.envoy.url}/v1/chat/completions"

    @property
    def api_url(self) -> str:
        """The emulator's base URL."""
        return f"http://{LOCALHOST}:{self.api_port}"

    def start(self) -> "ClusterStack":
        """Bring every piece up and wait until member ``a`` serves through Envoy."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.commits_path.unlink(missing_ok=True)
        self.kubeconfig.unlink(missing_ok=True)
        per_user = [arg for user, path in self.user_kubeconfigs.items()
                    for arg in ("--kubeconfig-for", f"{user}={path}")]
        self._procs.append(self._launch("apiserver", [
            sys.executable, "-m", "bench.apiserver", "--port", str(self.api_port),
            "--crds", str(PROJECT_ROOT / "crds"), "--crds", str(DEVSTACK_CRDS),
            "--kubeconfig-out", str(self.kubeconfig),
            "--commits", str(self.commits_path), "--namespace", NAMESPACE, *per_user]))
        wait_for_http(f"{self.api_url}/version", timeout=30)
        wait_until(self.kubeconfig.exists, 10, "kubeconfig")
        manifest = self.workdir / "objects.yaml"
        manifest.write_text(yaml.safe_dump_all(_objects(self.load_delay, self.unload_delay,
                                                        self.member_annotations)),
                            encoding="utf-8")
        self.kubectl("apply", "-f", str(manifest))
        sim = [sys.executable, "-m", "devstack.simulator",
               "--kubeconfig", str(self.user_kubeconfigs[SIMULATOR_USER]), "--namespace", NAMESPACE,
               "--load-delay", f"{self.load_delay}s", "--unload-delay", f"{self.unload_delay}s",
               "--log-dir", str(self.workdir / "members"),
               "--timeline", str(self.workdir / "timeline.jsonl")]
        for member, port in self.sim_ports.items():
            sim += ["--port", f"{member}={port}"]
        if self.actuation == "llmkube":
            sim += ["--rollout-delay", f"{ROLLOUT_DELAY}s"]
        if self.runtime != "fake":
            sim += ["--runtime", self.runtime, "--models", str(LLAMA_MODELS)]
        self._procs.append(self._launch("simulator", sim, self.member_env))
        # LLMKube's idle probe dials the members' cluster DNS names, ours the router's paths
        probe_port = self.probe_port
        self._procs.append(self._launch("proberouter", [
            sys.executable, "-m", "devstack.proberouter", "--port", str(probe_port),
            *[a for m, port in self.sim_ports.items()
              for a in ("--member", f"{NAMESPACE}/{m}={port}")]]))
        wait_for_http(f"http://{LOCALHOST}:{probe_port}/healthz", timeout=30)
        if self.actuation == "llmkube":  # it warms the default member; routed below once Ready
            self._procs.append(self._launch("reconciler", [
                sys.executable, "-m", "devstack.reconciler", "--namespace", NAMESPACE,
                "--kubeconfig", str(self.user_kubeconfigs[RECONCILER_USER]),
                "--probe-proxy", f"http://{LOCALHOST}:{probe_port}"]))
        self._procs.append(self.extproc.start())
        members = {f"{m}.{NAMESPACE}": port for m, port in self.sim_ports.items()}
        h2_members: tuple[str, ...] = ()
        if self.sink_for:
            sink, members[f"{self.sink_for}.{NAMESPACE}"] = services.start_sink(self.workdir)
            self._procs.append(sink)
            h2_members = (f"{self.sink_for}.{NAMESPACE}",)
        self.envoy = envoycfg.bench_envoy(self.workdir / "envoy", self.extproc.port, members,
                                          h2_members=h2_members)
        self._procs.append(self.envoy.start())
        services.wait_routed(self.url, body_for("a"), timeout=60)
        return self

    def stop(self) -> None:
        """Stop every piece, newest first."""
        for proc in reversed(self._procs):
            proc.stop()
        self._procs.clear()

    def kubectl(self, *args: str) -> str:
        """Run kubectl against the emulator (bounded in time)."""
        return subprocess.run(["kubectl", "--kubeconfig", str(self.kubeconfig), "-n", NAMESPACE,
                               *args], capture_output=True, text=True, check=True,
                              timeout=30).stdout

    def annotate(self, member: str, key: str, value: str | None) -> None:
        """Set (or with None remove) an annotation on a member InferenceService."""
        self.kubectl("annotate", "isvc", member, f"{key}-" if value is None else f"{key}={value}",
                     "--overwrite")

    def commits(self) -> list[dict[str, Any]]:
        """Every logged commit so far, oldest first."""
        text = self.commits_path.read_text(encoding="utf-8")
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def api_requests(self, user: str | None = None) -> list[dict[str, Any]]:
        """The emulator's request record since the last reset; only `user`'s (with the bodies
        of their writes) when given."""
        query = f"?user={user}" if user is not None else ""
        with urllib.request.urlopen(f"{self.api_url}/_emulator/requests{query}",
                                    timeout=10) as resp:
            return json.loads(resp.read())

    def reset_api_record(self) -> None:
        """Empty the emulator's request record."""
        request = urllib.request.Request(f"{self.api_url}/_emulator/reset-record", data=b"{}",
                                         method="POST")
        with urllib.request.urlopen(request, timeout=10) as resp:
            resp.read()

    def _launch(self, name: str, args: list[str],
                env: dict[str, str] | None = None) -> ManagedProcess:
        return ManagedProcess(args, self.workdir / f"{name}.log", cwd=PROJECT_ROOT,
                              env={**os.environ, **env} if env else None).start()


def body_for(member: str) -> bytes:
    """A small chat request naming ``member``."""
    return chat_body(member, tokens=4)
