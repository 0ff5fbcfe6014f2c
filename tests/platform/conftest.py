"""Fixtures for the platform tests: the Kubernetes API emulator with our CRDs, a real client."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from kube_helpers import CRDS, started_emulator

from extproc.platform.kube.client import make_api_client
from extproc.settings import Settings


@pytest.fixture
async def emulator(tmp_path: Path) -> AsyncIterator[Any]:
    """A KubeEmulator serving our CRDs on a free loopback port (namespaces ml and other)."""
    async with started_emulator(tmp_path, [CRDS]) as emu:
        yield emu


@pytest.fixture
async def api(emulator: Any) -> AsyncIterator[Any]:
    """The service's API client talking to the emulator through its kubeconfig."""
    client = await make_api_client(Settings(kubeconfig=str(emulator.kubeconfig)))
    try:
        yield client
    finally:
        await client.close()
