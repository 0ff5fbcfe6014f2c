"""kubectl (a subprocess with the written kubeconfig) against the emulator."""

from __future__ import annotations

import asyncio
import json
import re

import yaml

from tests.kubeapi.conftest import isvc, modelpool


async def test_get_mpool_prints_the_crd_columns(kubectl, emulator):
    emulator.create("mpool", {**modelpool("pool"), "status": {"phase": "Ready", "residentMember": "a"}})
    lines = (await kubectl("get", "mpool")).splitlines()
    assert lines[0].split() == ["NAME", "POLICY", "RESIDENT", "PHASE", "AGE"]
    assert lines[1].split()[:4] == ["pool", "sticky", "a", "Ready"]
    assert lines[1].split()[4].endswith("s")  # a human age such as "0s"
    emulator.create("isvc", isvc("a"), namespace="team")  # namespaces need not exist (lenient)
    everywhere = (await kubectl("get", "isvc", "--all-namespaces")).splitlines()
    assert everywhere[0].split()[:3] == ["NAMESPACE", "NAME", "PHASE"]
    assert everywhere[1].split()[:2] == ["team", "a"]


async def test_apply_creates_then_configures(kubectl, emulator):
    manifest = yaml.safe_dump(modelpool("pool"))
    assert "created" in await kubectl("apply", "-f", "-", stdin=manifest)
    changed = modelpool("pool", default="b")
    assert "configured" in await kubectl("apply", "-f", "-", stdin=yaml.safe_dump(changed))
    stored = emulator.get("mpool", "pool")
    assert stored["spec"]["default"] == "b" and stored["metadata"]["generation"] == 2
    assert "kubectl.kubernetes.io/last-applied-configuration" in stored["metadata"]["annotations"]
    assert "unchanged" in await kubectl("apply", "-f", "-", stdin=yaml.safe_dump(changed))


async def test_patch_status_subresource_and_annotate(kubectl, emulator):
    emulator.create("mpool", modelpool("pool"))
    await kubectl("patch", "mpool", "pool", "--subresource=status", "--type=merge",
                  "-p", json.dumps({"status": {"phase": "Swapping", "pendingMember": "b"}}))
    # kubectl's default patch type is strategic merge, which a real API server refuses for
    # custom resources (415); the emulator does the same, so clients with that bug fail here.
    refused = await kubectl("patch", "mpool", "pool", "--subresource=status", "-p",
                            json.dumps({"status": {"phase": "Failed"}}), check=False,
                            stderr=True)
    assert "application/strategic-merge-patch+json is not supported" in refused
    await kubectl("patch", "mpool", "pool", "--subresource=status", "--type=merge",
                  "-p", json.dumps({"status": {"phase": "Ready"}}))
    await kubectl("annotate", "mpool", "pool", "ops/note=checked")
    stored = emulator.get("mpool", "pool")
    assert stored["status"] == {"phase": "Ready", "pendingMember": "b"}
    assert stored["metadata"]["annotations"]["ops/note"] == "checked"
    assert stored["metadata"]["generation"] == 1
    phase = await kubectl("get", "mpool", "pool", "-o", "jsonpath={.status.phase}")
    assert phase == "Ready"


async def test_get_watch_prints_changes(kubectl, emulator):
    emulator.create("isvc", isvc("a"))
    proc = await asyncio.create_subprocess_exec("kubectl", "get", "isvc", "a", "-w", env=kubectl.env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    try:
        header = (await asyncio.wait_for(proc.stdout.readline(), 10)).decode().split()
        first = (await asyncio.wait_for(proc.stdout.readline(), 10)).decode().split()
        # kubectl prints the object, then watches from "0" and skips the initial event: a change made
        # before its watch is open would be folded into that skipped event (with a real server too)
        for _ in range(100):
            if any(r.verb == "watch" for r in emulator.requests):
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)
        emulator.patch("isvc", "a", {"status": {"phase": "Ready", "readyReplicas": 1}}, subresource="status")
        changed = (await asyncio.wait_for(proc.stdout.readline(), 10)).decode().split()
    finally:
        proc.terminate()
        await proc.wait()
    assert header == ["NAME", "PHASE", "REPLICAS", "AGE"]
    assert first[0] == "a" and changed[:3] == ["a", "Ready", "1"]


async def test_describe_lists_the_objects_events(kubectl, emulator):
    pool = emulator.create("mpool", modelpool("pool"))
    emulator.create("events", {
        "metadata": {"name": "pool.1"}, "type": "Normal", "reason": "Swapped", "message": "a to b",
        "involvedObject": {"kind": "ModelPool", "name": "pool", "namespace": "default",
                           "uid": pool["metadata"]["uid"]}})
    described = await kubectl("describe", "mpool", "pool")
    # kubectl aligns the values to the longest key (now "Reclaim After", the CRD's newer default)
    assert re.search(r"^\s*Swap Policy:\s+sticky$", described, re.M)
    assert re.search(r"^\s*Reclaim After:\s+300s$", described, re.M)
    assert "Swapped" in described and "a to b" in described


async def test_scale_and_pods(kubectl, emulator):
    emulator.create("isvc", isvc("a"))
    await kubectl("scale", "isvc", "a", "--replicas=1")
    assert emulator.get("isvc", "a")["spec"]["replicas"] == 1
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"app": "a"}},
           "spec": {"containers": [{"name": "c", "image": "x"}]}}
    await kubectl("apply", "-f", "-", stdin=yaml.safe_dump(pod))
    assert (await kubectl("get", "pods", "-l", "app=a", "-o", "name")).split() == ["pod/p"]
    await kubectl("delete", "pod", "p")
    assert emulator.get("pods", "p") is None
