"""Member simulator: plays LLMKube's controller for InferenceServices in the local stack and tests.

It watches InferenceServices (``inference.llmkube.dev/v1alpha1``) in the given namespaces and,
for each member, keeps a Pod object, ``status`` and a real fake upstream process in line with
``spec.replicas``. It talks to the API server only through ``kubernetes.aio`` over HTTP, so it
works against ``devstack.kubeapi`` or any real API server.

Lifecycle of one member (phases written through the ``/status`` subresource, merge patch):

- ``spec.replicas`` ≥ 1 (absent counts as 1), no pod: create Pod ``<member>-<5 chars>``
  (labels ``app=<member>``, ``inference.llmkube.dev/service=<member>``), phase ``Creating``
  (replicas 1, readyReplicas 0). With the pod, the member's server ``python -m
  devstack.fakemember --name <member> --port <port>`` binds and answers 503 while it "loads"
  (as llama-server does); once the load delay has passed since the pod's creation it is told
  the load is over, and when its ``/health`` answers 200 the pod's phase becomes ``Running``,
  then the member's ``Ready`` (replicas 1, readyReplicas 1, ``endpoint:
  http://127.0.0.1:<port>``).
  With ``rollout_delay`` (default 0) the pod appears only that long after the scale-up, as a
  Deployment's controllers take a moment; a member scaled back to 0 meanwhile gets no pod.
- ``spec.replicas`` 0 with a pod: the pod is deleted but held by the finalizer
  ``sim.llmkube.dev/unload``, so it stays visible with ``metadata.deletionTimestamp`` (a
  terminating pod still holds the GPU), and phase ``Progressing`` (replicas 1, readyReplicas
  0). The upstream process stops first, and once the unload delay has passed since the
  deletion the finalizer goes and the Pod object with it; only then phase ``Stopped``
  (replicas 0, readyReplicas 0). ``Stopped`` therefore means "fully torn down", as LLMKube
  reports it. A 1→0→1 flip finishes the unload before the new pod appears.
- A pod that dies out of band (``kill-pod`` below, or ``kubectl delete pod``) goes at once: its
  process is SIGKILLed, the pod removed, phase ``Progressing`` (replicas 0), and since
  ``spec.replicas`` is still 1 a replacement pod is created and loads again (``Creating``).
- An upstream process that dies on its own (checked every 0.5 s while serving) is a container
  restart: the pod stays, phase ``Progressing``, then ``Creating`` and the load again.

Per-member controls, annotations on the InferenceService, read live (``kubectl annotate isvc
<m> key=value --overwrite`` takes effect at once, even mid-load):

- ``sim.llmkube.dev/load-delay``: duration ("3s", "500ms", "1.5"), default ``--load-delay``.
- ``sim.llmkube.dev/unload-delay``: duration, default ``--unload-delay`` (1 s).
- ``sim.llmkube.dev/fail: "true"``: a load ends in phase ``Failed`` (no server, pod kept);
  clearing it retries the load, as a crash-looping container would.
- ``sim.llmkube.dev/kill-pod: <any new value>``: the running pod dies out of band (above). The
  value a pod was created under is stored on the pod (``sim.llmkube.dev/kill-pod-seen``), so
  only a change kills and a simulator restart does not re-kill.
- ``sim.llmkube.dev/stuck: "true"``: loading never finishes, phase stays ``Creating``; clearing
  it lets the load finish (its delay counted from the start of the load).

Restart safety: on start every member is reconciled from what the API holds. A member with
``spec.replicas`` 1, a pod and phase ``Ready`` but no process of ours gets its server started
again and ``Ready`` re-reported without a load delay (the model "survived" in the pod); a pod
caught mid-load loads again; a pod left terminating is finished.

The simulator keeps a timeline (``devstack.simulator_timeline``) in ``sim.timeline`` and, with
``timeline_path``, as JSON lines. Ports come from the ``ports`` mapping; unmapped members get a
free port, and ``sim.ports`` shows the full mapping.

CLI: ``python -m devstack.simulator --kubeconfig K --namespace demo --port judge=18081
--port coder=18082 --load-delay 3s [--unload-delay 1s] [--rollout-delay 0.5s] [--timeline F]
[--log-dir D]``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable

from kubernetes.aio import client

from devstack.llamacpp import LlamaRuntime
from devstack.procs import LOCALHOST, free_port
from devstack.simulator_kube import GROUP, PLURAL, SERVICE_LABEL, VERSION, ApiSource, Kube, \
    await_first_lists, connect, controller_parser, disconnect, duration_arg, \
    parse_controller_args, run_controller, watch_forever
from devstack.simulator_member import MemberActor, SimContext
from devstack.simulator_timeline import Timeline

log = logging.getLogger("devstack.simulator")

# fake-in-process: the fake, every member's server in the simulator's own process
RUNTIMES = ("fake", "fake-in-process", "llama.cpp")
START_TIMEOUT = 30.0  # start() gives up if the first listing does not arrive by then


class MemberSimulator:
    """Plays LLMKube's controller for every InferenceService in the given namespaces."""

    def __init__(self, api: ApiSource,
                 namespaces: Iterable[str] | str, ports: dict[str, int] | None = None,
                 default_load_delay: float = 3.0, default_unload_delay: float = 1.0,
                 timeline_path: str | os.PathLike[str] | None = None,
                 log_dir: str | os.PathLike[str] | None = None,
                 rollout_delay: float = 0.0, hosts: dict[str, str] | None = None,
                 runtime: str = "fake", models: str | os.PathLike[str] | None = None) -> None:
        self._api_arg = api
        if runtime not in RUNTIMES:
            raise ValueError(f"runtime must be one of {RUNTIMES}: {runtime!r}")
        self.runtime = runtime
        self._models = models
        self._hosts = dict(hosts or {})  # member -> its pod's loopback address (127.0.0.1)
        self.namespaces = [namespaces] if isinstance(namespaces, str) else list(namespaces)
        self._ports = dict(ports or {})
        self.default_load_delay = default_load_delay
        self.default_unload_delay = default_unload_delay
        self.rollout_delay = rollout_delay
        self.timeline = Timeline(timeline_path)
        self.log_dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="simulator-"))
        self.actors: dict[tuple[str, str], MemberActor] = {}
        self._api: client.ApiClient | None = None
        self._ctx: SimContext | None = None
        self._watchers: list[asyncio.Task] = []

    @property
    def ports(self) -> dict[str, int]:
        """Member → loopback port, including ports allocated for unmapped members."""
        return dict(self._ports)

    def port_for(self, member: str) -> int:
        """The member's port, allocating a free one the first time an unmapped member asks."""
        if member not in self._ports:
            self._ports[member] = free_port()
        return self._ports[member]

    def host_for(self, member: str) -> str:
        """The member's pod address: its own loopback address (--host), else 127.0.0.1."""
        return self._hosts.get(member, LOCALHOST)

    async def start(self) -> None:
        """Connect, list every namespace once, and start watching and reconciling."""
        self._api = await connect(self._api_arg)
        kube = Kube(self._api)
        llama = None
        if self.runtime == "llama.cpp":
            llama = await asyncio.to_thread(
                LlamaRuntime.create, Path(self._models or self.log_dir / "models"),
                self.log_dir / "slot-save")
        self._ctx = SimContext(kube, self.timeline, self.default_load_delay,
                               self.default_unload_delay, self.port_for, self.log_dir,
                               self.rollout_delay, self.host_for, llama,
                               self.runtime == "fake-in-process")
        listed: list[asyncio.Event] = []
        for ns in self.namespaces:
            done = asyncio.Event()
            listed.append(done)
            self._watchers.append(asyncio.create_task(watch_forever(
                kube, kube.custom.list_namespaced_custom_object,
                (GROUP, VERSION, ns, PLURAL), f"{ns}/{PLURAL}",
                lambda items, ns=ns, done=done: self._on_isvc_list(ns, items, done),
                lambda kind, obj, ns=ns: self._on_isvc(ns, kind, obj))))
            self._watchers.append(asyncio.create_task(watch_forever(
                kube, kube.core.list_namespaced_pod, (ns,), f"{ns}/pods",
                lambda items, ns=ns: self._poke_namespace(ns),
                lambda kind, obj, ns=ns: self._on_pod(ns, obj),
                label_selector=SERVICE_LABEL)))
        await await_first_lists(listed, START_TIMEOUT, self.stop)

    async def stop(self) -> None:
        """Stop watching and reconciling and stop every upstream process started; no leftovers."""
        for task in self._watchers:
            task.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)
        self._watchers.clear()
        await asyncio.gather(*(actor.stop() for actor in self.actors.values()))
        self.actors.clear()
        await disconnect(self._api, self._api_arg)
        self._api = None

    # -- watch callbacks (synchronous: they only hand objects to the member tasks) -----------

    def _actor(self, ns: str, name: str) -> MemberActor:
        actor = self.actors.get((ns, name))
        if actor is None:
            assert self._ctx is not None
            actor = self.actors[(ns, name)] = MemberActor(self._ctx, ns, name)
            actor.start()
        return actor

    def _on_isvc_list(self, ns: str, items: list[dict[str, Any]], done: asyncio.Event) -> None:
        names = {item["metadata"]["name"] for item in items}
        for item in items:
            self._actor(ns, item["metadata"]["name"]).observe(item)
        # deleted while the watch was down: tear down what those members left behind
        for (actor_ns, name), actor in self.actors.items():
            if actor_ns == ns and name not in names:
                actor.observe(None)
        done.set()

    def _on_isvc(self, ns: str, kind: str, obj: dict[str, Any]) -> None:
        self._actor(ns, obj["metadata"]["name"]).observe(None if kind == "DELETED" else obj)

    def _poke_namespace(self, ns: str) -> None:
        for (actor_ns, _), actor in self.actors.items():
            if actor_ns == ns:
                actor.poke()

    def _on_pod(self, ns: str, pod: dict[str, Any]) -> None:
        member = (pod["metadata"].get("labels") or {}).get(SERVICE_LABEL)
        actor = self.actors.get((ns, member)) if member else None
        if actor:
            actor.poke()


def _port_pair(text: str) -> tuple[str, int]:
    member, sep, port = text.partition("=")
    if not sep or not member or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected MEMBER=PORT, got {text!r}")
    return member, int(port)


def _host_pair(text: str) -> tuple[str, str]:
    member, sep, host = text.partition("=")
    if not sep or not member or not host.startswith("127."):
        raise argparse.ArgumentTypeError(f"expected MEMBER=127.x.y.z, got {text!r}")
    return member, host


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line of ``python -m devstack.simulator``."""
    parser = controller_parser("python -m devstack.simulator",
                               "Simulate LLMKube members for the local stack.")
    parser.add_argument("--port", action="append", type=_port_pair, default=[],
                        metavar="MEMBER=PORT", help="fixed upstream port of a member (repeatable)")
    parser.add_argument("--host", action="append", type=_host_pair, default=[],
                        metavar="MEMBER=IP", help="a member's pod address on loopback, e.g. "
                        "127.0.0.2 (repeatable; default 127.0.0.1)")
    parser.add_argument("--load-delay", type=duration_arg, default=3.0, help="default load delay")
    parser.add_argument("--unload-delay", type=duration_arg, default=1.0,
                        help="default unload delay")
    parser.add_argument("--rollout-delay", type=duration_arg, default=0.0,
                        help="from spec.replicas 1 to the pod object (default 0: at once)")
    parser.add_argument("--runtime", choices=RUNTIMES, default="fake",
                        help="members' servers: fake (devstack/fakemember.py, a process per "
                        "pod), fake-in-process (the same, served from this process: for many "
                        "members) or llama.cpp (the real llama-server on a generated model; "
                        "`make llama-server`)")
    parser.add_argument("--models", help="llama.cpp: the models' directory (default: "
                        "<log-dir>/models, the tiny model written there)")
    parser.add_argument("--timeline", help="append the timeline here as JSON lines")
    parser.add_argument("--log-dir", help="upstream process logs (default: a temp dir)")
    return parse_controller_args(parser, argv)


def main(argv: list[str] | None = None) -> None:
    """Run the simulator until SIGINT or SIGTERM."""
    args = parse_args(argv)
    sim = MemberSimulator(args.kubeconfig, args.namespaces, dict(args.port), args.load_delay,
                          args.unload_delay, args.timeline, args.log_dir, args.rollout_delay,
                          dict(args.host), args.runtime, args.models)
    run_controller(sim, lambda: f"simulator running: namespaces={sim.namespaces} "
                   f"ports={sim.ports} log_dir={sim.log_dir}")


if __name__ == "__main__":
    main()
