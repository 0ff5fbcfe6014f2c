"""Kubernetes plumbing for the member simulator: resumable watches and the few API calls it makes.

Everything goes through the official ``kubernetes.aio`` client over HTTP, so the simulator
runs unchanged against the devstack emulator or a real API server.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import string
from typing import Any, Awaitable, Callable, Protocol

import aiohttp
from kubernetes.aio import client, config, watch
from kubernetes.aio.client.exceptions import ApiException

from devstack.signals import until_signalled
from extproc.settings import parse_duration

log = logging.getLogger("devstack.simulator")

GROUP = "inference.llmkube.dev"
VERSION = "v1alpha1"
PLURAL = "inferenceservices"
SERVICE_LABEL = "inference.llmkube.dev/service"
# Real API servers reject strategic merge patches on custom resources, and the client picks
# strategic merge for dict bodies unless told otherwise.
MERGE_PATCH = "application/merge-patch+json"
# Holds the Pod object in place (deletionTimestamp set) while the "model unloads", the way a
# kubelet keeps a terminating pod until its containers have exited.
FINALIZER = "sim.llmkube.dev/unload"
# The kill-pod annotation value a pod was created under: a pod whose value differs from the
# InferenceService's current one has been asked to die. Stored on the pod so it survives restarts.
KILL_SEEN = "sim.llmkube.dev/kill-pod-seen"

WATCH_SECONDS = 30  # server-side watch timeout; the watch then resumes from the last version
BACKOFF_MIN, BACKOFF_MAX = 0.2, 5.0
TRANSIENT = (aiohttp.ClientError, asyncio.TimeoutError, OSError)


def duration_arg(text: str) -> float:
    """An argparse ``type`` for durations ("3s", "250ms", "2m"), with argparse's error."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


ApiSource = client.ApiClient | str | os.PathLike[str]


async def connect(source: ApiSource, user_agent: str = "") -> client.ApiClient:
    """The given ApiClient, or a new one from the kubeconfig file at `source` (sending
    ``user_agent``, whose first word the API server records as its writes' field manager)."""
    if isinstance(source, client.ApiClient):
        return source
    made = await config.new_client_from_config(config_file=os.fspath(source),
                                               persist_config=False)
    if user_agent:
        made.user_agent = user_agent
    return made


async def disconnect(api: client.ApiClient | None, source: ApiSource) -> None:
    """Close an ApiClient that `connect` made (one handed in belongs to the caller)."""
    if api is not None and api is not source:
        await api.close()


async def wait_event(event: asyncio.Event, timeout: float | None) -> bool:
    """True if the event fired within the timeout (None waits without limit); cancellable."""
    # asyncio.timeout, not wait_for: Python 3.11's wait_for returns the inner result when a
    # cancel() meets an event set in the same loop turns, so a controller loop stopped right
    # after a watch event went on running and its stop() (a test's teardown) never returned.
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
        return True
    except TimeoutError:
        return False


async def await_first_lists(listed: list[asyncio.Event], timeout: float,
                            stop: Callable[[], Awaitable[None]]) -> None:
    """Wait until every watch has listed once; on a timeout (or cancel) `stop()`, then raise."""
    try:
        async with asyncio.timeout(timeout):  # not wait_for: see wait_event
            await asyncio.gather(*(e.wait() for e in listed))
    except BaseException:
        await stop()
        raise


def controller_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """A command line with the --kubeconfig and --namespace every devstack controller takes."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"),
                        help="kubeconfig file (default: $KUBECONFIG)")
    parser.add_argument("--namespace", action="append", dest="namespaces",
                        help="namespace to watch (repeatable; default: default)")
    return parser


def parse_controller_args(parser: argparse.ArgumentParser,
                          argv: list[str] | None) -> argparse.Namespace:
    """Parse, insisting on a kubeconfig, and default the namespaces to ``default``."""
    args = parser.parse_args(argv)
    if not args.kubeconfig:
        parser.error("--kubeconfig (or $KUBECONFIG) is required")
    args.namespaces = args.namespaces or ["default"]
    return args


class Controller(Protocol):
    """What `run_controller` drives: something that starts and stops."""

    async def start(self) -> None:
        """Connect and begin reconciling."""

    async def stop(self) -> None:
        """Stop, leaving nothing running."""


def run_controller(controller: Controller, describe: Callable[[], str]) -> None:
    """Run a controller in its own event loop until SIGINT or SIGTERM, logging `describe()`."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")

    async def serve() -> None:
        await controller.start()
        log.info("%s", describe())
        try:
            await until_signalled()
        finally:
            await controller.stop()

    asyncio.run(serve())


def pod_name(member: str) -> str:
    """``<member>-<5 random chars>``, as a Deployment's pods are named."""
    return f"{member}-" + "".join(random.choices(string.ascii_lowercase + string.digits, k=5))


def is_terminating(pod: dict[str, Any]) -> bool:
    """True once deletion of the pod has begun."""
    return bool(pod["metadata"].get("deletionTimestamp"))


class Kube:
    """The simulator's handful of API calls, on one ``kubernetes.aio`` ApiClient."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)

    def to_dict(self, model: Any) -> Any:
        """A generated model as the plain camelCase dict the API sent."""
        return self.api_client.sanitize_for_serialization(model)

    async def list_pods(self, namespace: str, member: str) -> list[dict[str, Any]]:
        """The member's pods, oldest first."""
        listing = await self.core.list_namespaced_pod(
            namespace, label_selector=f"{SERVICE_LABEL}={member}")
        pods = [self.to_dict(p) for p in listing.items]
        return sorted(pods, key=lambda p: p["metadata"].get("creationTimestamp") or "")

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The pod, or None when it no longer exists."""
        try:
            return self.to_dict(await self.core.read_namespaced_pod(name, namespace))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def create_pod(self, namespace: str, member: str, kill_seen: str) -> dict[str, Any]:
        """Create the member's pod (Pending, holding the unload finalizer)."""
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod_name(member),
                "labels": {"app": member, SERVICE_LABEL: member},
                "annotations": {KILL_SEEN: kill_seen},
                "finalizers": [FINALIZER],
            },
            "spec": {"containers": [{"name": "llm", "image": "devstack/fake-llm:latest"}]},
        }
        return self.to_dict(await self.core.create_namespaced_pod(namespace, body))

    async def set_pod_phase(self, namespace: str, name: str, phase: str, ready: bool,
                            ip: str = "") -> None:
        """Write the pod's status phase, Ready condition (and podIP) through /status."""
        status: dict[str, Any] = {"phase": phase, "conditions": [
            {"type": "Ready", "status": "True" if ready else "False"}]}
        if ip:
            status["podIP"] = ip
        await self.core.patch_namespaced_pod_status(
            name, namespace, {"status": status}, _content_type=MERGE_PATCH)

    async def begin_delete_pod(self, namespace: str, name: str) -> None:
        """Ask for deletion; the finalizer keeps the object, now with a deletionTimestamp."""
        # No grace period: the finalizer alone holds the pod (we play its kubelet), so the
        # write that drops it ends the deletion on any API server (`release_pod`).
        try:
            await self.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        except ApiException as exc:
            if exc.status != 404:
                raise

    async def release_pod(self, namespace: str, name: str) -> None:
        """Let a pod deleted by `begin_delete_pod` go: drop the finalizer, the one write left."""
        try:
            await self.core.patch_namespaced_pod(
                name, namespace, {"metadata": {"finalizers": None}}, _content_type=MERGE_PATCH)
        except ApiException as exc:
            if exc.status != 404:
                raise

    async def remove_pod(self, namespace: str, name: str) -> None:
        """Make the pod disappear: drop the finalizer and delete (either order finishes it)."""
        await self.release_pod(namespace, name)
        await self.begin_delete_pod(namespace, name)

    async def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        """Merge-patch the InferenceService's status through the /status subresource."""
        await self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, name, {"status": status},
            _content_type=MERGE_PATCH)


class Backoff:
    """Exponential delay with jitter between reconnect attempts, capped at BACKOFF_MAX."""

    def __init__(self) -> None:
        self.delay = BACKOFF_MIN

    def reset(self) -> None:
        """Back to the shortest delay after a success."""
        self.delay = BACKOFF_MIN

    async def sleep(self) -> None:
        """Wait the current delay, then double it."""
        await asyncio.sleep(self.delay * random.uniform(0.8, 1.2))
        self.delay = min(self.delay * 2, BACKOFF_MAX)


ListFn = Callable[..., Awaitable[Any]]


async def watch_forever(kube: Kube, list_fn: ListFn, args: tuple, what: str,
                        on_list: Callable[[list[dict[str, Any]]], None],
                        on_event: Callable[[str, dict[str, Any]], None],
                        **list_kwargs: Any) -> None:
    """List, then watch from there; resume after timeouts, re-list on 410, back off on errors.

    ``on_list`` gets every object after each (re-)list, so objects deleted while the watch was
    down are noticed; ``on_event`` gets ADDED / MODIFIED / DELETED with the raw object.
    Runs until cancelled.
    """
    backoff = Backoff()
    version: str | None = None
    while True:
        try:
            if version is None:
                listing = kube.to_dict(await list_fn(*args, **list_kwargs))
                version = listing["metadata"].get("resourceVersion")
                on_list(listing.get("items") or [])
            stream = watch.Watch().stream(
                list_fn, *args, resource_version=version, allow_watch_bookmarks=True,
                timeout_seconds=WATCH_SECONDS, _request_timeout=WATCH_SECONDS + 10, **list_kwargs)
            async with stream:
                async for event in stream:
                    obj = event["raw_object"]
                    version = obj.get("metadata", {}).get("resourceVersion") or version
                    if event["type"] != "BOOKMARK":
                        on_event(event["type"], obj)
            backoff.reset()
        except ApiException as exc:
            if exc.status == 410:
                log.info("watch %s expired, re-listing", what)
                version = None
                continue
            log.warning("watch %s failed: %s", what, exc)
            await backoff.sleep()
        except TRANSIENT as exc:
            log.warning("watch %s lost its connection: %r", what, exc)
            await backoff.sleep()
