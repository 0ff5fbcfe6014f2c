"""Test-side access to the Kubernetes emulator with the real client, for the devstack tests."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Awaitable, Callable

import aiohttp
from kubernetes.aio import client

from devstack import testkit
from devstack.kubeapi import KubeEmulator
from devstack.procs import PROJECT_ROOT
from devstack.simulator_kube import GROUP, MERGE_PATCH, PLURAL, VERSION

CRDS = PROJECT_ROOT / "crds"
# with the local stack's own kinds (LLMKube's Model, read by the reconciler stand-in)
CRD_FILES = sorted(CRDS.glob("*.yaml")) + sorted((PROJECT_ROOT / "devstack" / "crds").glob(
    "*.yaml")) if CRDS.is_dir() else []

NS = "sim"
LOAD = 0.3
UNLOAD = 0.3
# Bound of every positive wait (it returns as soon as the condition holds): an upstream process
# starting on a loaded 2-core machine can take seconds, so the margin is wide.
TIMEOUT = 30.0


async def eventually(check: Callable[[], Awaitable[Any]], timeout: float = TIMEOUT,
                     what: str = "condition") -> Any:
    """Poll the async ``check`` until it returns something truthy; fail after ``timeout`` s."""
    return await testkit.eventually(check, timeout, what)


class Cluster:
    """Test-side access to the emulator with the real client."""

    def __init__(self, emu: KubeEmulator, api: client.ApiClient, kubeconfig: Path) -> None:
        self.emu, self.api, self.kubeconfig = emu, api, kubeconfig
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)

    def kubeconfig_for(self, user: str) -> Path:
        """A kubeconfig whose token names `user` in the emulator's request record."""
        return self.emu.write_kubeconfig(self.kubeconfig.with_name(f"{user}.kubeconfig"),
                                         user=user)

    async def create(self, name: str, replicas: int = 0, **annotations: str) -> None:
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "InferenceService",
                "metadata": {"name": name, "annotations": annotations},
                "spec": {"replicas": replicas, "modelRef": name}}
        await self.custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, body)

    async def patch(self, name: str, body: dict[str, Any]) -> None:
        await self.custom.patch_namespaced_custom_object(
            GROUP, VERSION, NS, PLURAL, name, body, _content_type=MERGE_PATCH)

    async def scale(self, name: str, replicas: int) -> None:
        await self.patch(name, {"spec": {"replicas": replicas}})

    async def annotate(self, name: str, key: str, value: str | None) -> None:
        await self.patch(name, {"metadata": {"annotations": {key: value}}})

    async def isvc(self, name: str) -> dict[str, Any]:
        return await self.custom.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name)

    async def status(self, name: str) -> dict[str, Any]:
        return (await self.isvc(name)).get("status") or {}

    async def pods(self, member: str) -> list[Any]:
        listing = await self.core.list_namespaced_pod(
            NS, label_selector=f"inference.llmkube.dev/service={member}")
        return listing.items

    async def wait_phase(self, name: str, phase: str, timeout: float = TIMEOUT) -> dict:
        async def check() -> dict | None:
            status = await self.status(name)
            return status if status.get("phase") == phase else None
        return await eventually(check, timeout, f"{name} phase {phase}")


async def health(port: int) -> int | None:
    """Status of GET /health on the port, None when nothing answers."""
    try:
        async with aiohttp.ClientSession() as session:
            # nothing listening is refused at once; the bound is for a live server slowed by load
            async with session.get(f"http://127.0.0.1:{port}/health",
                                   timeout=aiohttp.ClientTimeout(total=5)) as resp:
                return resp.status
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return None
