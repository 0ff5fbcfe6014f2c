"""`python -m devstack.kubeapi`: prints its URL, writes a kubeconfig, stops on SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import sys

import aiohttp
import yaml

from devstack.kubeapi import KubeEmulator


async def test_cli_serves_until_sigterm(crds_dir, tmp_path):
    kubeconfig = tmp_path / "kc" / "kubeconfig"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "devstack.kubeapi", "--port", "0", "--crds", str(crds_dir),
        "--kubeconfig-out", str(kubeconfig), stdout=asyncio.subprocess.PIPE)
    try:
        url = (await asyncio.wait_for(proc.stdout.readline(), 15)).decode().strip()
        assert url.startswith("http://127.0.0.1:")
        assert yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"] == url
        async with aiohttp.ClientSession(url) as http:
            async with http.get("/apis/inference.llmkube.dev/v1alpha1") as response:
                names = [r["name"] for r in (await response.json())["resources"]]
        assert {"modelpools", "modelpools/status", "inferenceservices/scale"} <= set(names)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 10) == 0


async def test_repeated_namespaces_are_created_once(crds_dir):
    emu = KubeEmulator([crds_dir], namespaces=("default", "ml", "default"))
    assert [ns["metadata"]["name"] for ns in emu.list("namespaces")] == ["default", "ml"]
    assert emu.get("namespaces", "ml")["status"] == {"phase": "Active"}
