"""Fixtures: an emulator on loopback serving the project's CRDs, its kubeconfig, clients and kubectl."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import kubernetes
import pytest
from kubernetes.aio import client as aclient
from kubernetes.aio import config as aconfig

from devstack import stack_manifests as manifests
from devstack.kubeapi import KubeEmulator
from devstack.testkit import finish_within

CRDS = Path(__file__).resolve().parents[2] / "crds"
GROUP, VERSION = "inference.llmkube.dev", "v1alpha1"


@pytest.fixture
def crds_dir() -> Path:
    """The project's CRD directory; tests that need it skip when the CRDs are not written yet."""
    if not (CRDS / "inference.llmkube.dev_modelpools.yaml").exists():
        pytest.skip(f"project CRDs missing in {CRDS}")
    return CRDS


@pytest.fixture
async def emulator(crds_dir: Path):
    """A running emulator with the project's CRDs and quick bookmarks."""
    emu = KubeEmulator([crds_dir], bookmark_interval=0.2)
    await emu.start()
    try:
        yield emu
    finally:
        await finish_within(emu.stop(), 15, "the API emulator to stop")


@pytest.fixture
def kubeconfig(emulator: KubeEmulator, tmp_path: Path) -> Path:
    """A kubeconfig file pointing at the emulator."""
    return emulator.write_kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
def sync_client(kubeconfig: Path):
    """The official synchronous client; call it through `asyncio.to_thread` so the emulator keeps serving."""
    api = kubernetes.config.new_client_from_config(config_file=str(kubeconfig))
    try:
        yield api
    finally:
        api.close()


@pytest.fixture
async def aio_client(kubeconfig: Path):
    """The official asyncio client (`kubernetes.aio`), configured by its `load_kube_config`."""
    configuration = aclient.Configuration()
    await aconfig.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    api = aclient.ApiClient(configuration=configuration)
    try:
        yield api
    finally:
        await api.close()


@pytest.fixture
def custom(aio_client) -> aclient.CustomObjectsApi:
    """CustomObjectsApi on the asyncio client."""
    return aclient.CustomObjectsApi(aio_client)


def modelpool(name: str, **spec) -> dict:
    """A minimal valid ModelPool over members a and b (``spec``: raw camelCase fields)."""
    return manifests.pool(name, "", ["a", "b"], **spec)


def isvc(name: str, replicas: int = 0) -> dict:
    """A minimal InferenceService."""
    return manifests.member(name, model=name, replicas=replicas)


class Kubectl:
    """kubectl as a subprocess against the emulator, bounded by a timeout."""

    def __init__(self, kubeconfig: Path):
        self.env = {**os.environ, "KUBECONFIG": str(kubeconfig)}

    async def __call__(self, *args: str, stdin: str | None = None, check: bool = True,
                       timeout: float = 15.0, stderr: bool = False) -> str:
        """Run kubectl; its stdout (with ``stderr=True``, stdout and stderr together)."""
        proc = await asyncio.create_subprocess_exec(
            "kubectl", *args, env=self.env, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(stdin.encode() if stdin else None), timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({proc.returncode}): {err.decode()}")
        return (out + err).decode() if stderr else out.decode()


@pytest.fixture
def kubectl(kubeconfig: Path) -> Kubectl:
    """Run kubectl against the emulator; skips when kubectl is not installed."""
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not on PATH")
    return Kubectl(kubeconfig)
