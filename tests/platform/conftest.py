"""Fixtures for the platform tests: the Kubernetes API emulator with our CRDs, a real client."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from kube_helpers import NS

from extproc.platform.kube.client import make_api_client
from extproc.settings import Settings

CRDS = Path(__file__).resolve().parents[2] / "crds"


@pytest.fixture
async def emulator(tmp_path: Path) -> AsyncIterator[Any]:
    """A KubeEmulator serving our CRDs on a free loopback port (namespaces ml and other)."""
    kubeapi = pytest.importorskip("devstack.kubeapi", reason="the API emulator is not written yet")
    if not (CRDS / "inference.llmkube.dev_modelpools.yaml").exists():
        pytest.skip("crds/ has no ModelPool CRD yet")
    emu = kubeapi.KubeEmulator([CRDS], namespaces=("default", NS, "other"),
                               bookmark_interval=0.2)
    await emu.start()
    emu.kubeconfig = emu.write_kubeconfig(tmp_path / "kubeconfig", namespace=NS)
    try:
        yield emu
    finally:
        await emu.stop()


@pytest.fixture
async def api(emulator: Any) -> AsyncIterator[Any]:
    """The service's API client talking to the emulator through its kubeconfig."""
    client = await make_api_client(Settings(kubeconfig=str(emulator.kubeconfig)))
    try:
        yield client
    finally:
        await client.close()
