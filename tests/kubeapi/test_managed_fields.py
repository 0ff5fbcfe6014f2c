"""metadata.managedFields as the real API server records them: the request's fieldManager, else
its User-Agent's first word ("kubectl"), with each changed field moving to it; a /scale write
names its manager unless it writes 0, which leaves the replicas with no manager."""

from __future__ import annotations

import aiohttp

from devstack.kubeapi import KubeEmulator
from extproc.platform.kube.objects import REPLICAS_FIELD, field_owner
from tests.kubeapi.conftest import GROUP, VERSION, isvc

BASE = f"/apis/{GROUP}/{VERSION}/namespaces/default/inferenceservices"
KUBECTL = "kubectl/v1.35.4 (linux/amd64) kubernetes/6c1cd99"


async def _send(emulator: KubeEmulator, method: str, path: str, body: dict, *,
                agent: str, content_type: str = "application/merge-patch+json") -> dict:
    async with aiohttp.ClientSession(headers={"User-Agent": agent}) as session:
        async with session.request(method, f"{emulator.url}{path}", json=body,
                                   headers={"Content-Type": content_type}) as resp:
            assert resp.status < 300, await resp.text()
            return await resp.json()


async def test_each_write_names_its_field_manager(emulator: KubeEmulator) -> None:
    created = await _send(emulator, "POST", BASE, isvc("a", 1), agent="helm/v3.17",
                          content_type="application/json")
    assert field_owner(created, REPLICAS_FIELD) == "helm"
    ours = await _send(emulator, "PATCH", f"{BASE}/a?fieldManager=modelpool-extproc",
                       {"spec": {"replicas": 0}}, agent="anything/1")
    assert field_owner(ours, REPLICAS_FIELD) == "modelpool-extproc"
    # helm keeps the fields it set that nobody changed since
    assert any(e["manager"] == "helm" for e in ours["metadata"]["managedFields"])
    patched = await _send(emulator, "PATCH", f"{BASE}/a", {"spec": {"replicas": 1}},
                          agent=KUBECTL)
    assert field_owner(patched, REPLICAS_FIELD) == "kubectl"
    [entry] = [e for e in patched["metadata"]["managedFields"] if e["manager"] == "kubectl"]
    assert entry["operation"] == "Update" and "subresource" not in entry
    assert entry["fieldsV1"] == {"f:spec": {"f:replicas": {}}}
    assert not any(e["manager"] == "modelpool-extproc"
                   for e in patched["metadata"]["managedFields"])  # its only field moved
    scaled = await _send(emulator, "PATCH", f"{BASE}/a/scale", {"spec": {"replicas": 2}},
                         agent="scaler/1")
    stored = await _send(emulator, "PATCH", f"{BASE}/a", {}, agent="reader/1")
    assert scaled["spec"]["replicas"] == 2
    assert field_owner(stored, REPLICAS_FIELD) == "scaler"
    [entry] = [e for e in stored["metadata"]["managedFields"] if e["manager"] == "scaler"]
    assert (entry["operation"], entry["subresource"]) == ("Update", "scale")
    assert entry["fieldsV1"] == {"f:spec": {"f:replicas": {}}}
    # a Scale of 0 omits its replicas (omitempty): the field is left with no manager
    await _send(emulator, "PATCH", f"{BASE}/a/scale", {"spec": {"replicas": 0}}, agent=KUBECTL)
    stored = await _send(emulator, "PATCH", f"{BASE}/a", {}, agent="reader/1")
    assert stored["spec"]["replicas"] == 0
    assert field_owner(stored, REPLICAS_FIELD) == ""
    assert not any(e["manager"] == "scaler" for e in stored["metadata"]["managedFields"])


async def test_a_status_write_owns_status_fields_only(emulator: KubeEmulator) -> None:
    await _send(emulator, "POST", BASE, isvc("a"), agent="kubectl/v1",
                content_type="application/json")
    written = await _send(emulator, "PATCH", f"{BASE}/a/status?fieldManager=manager",
                          {"status": {"phase": "Ready"}}, agent="x/1")
    assert field_owner(written, ("status", "phase")) == "manager"
    assert field_owner(written, REPLICAS_FIELD) == "kubectl"


async def test_kubectl_scale_names_kubectl_unless_it_scales_to_zero(kubectl, emulator) -> None:
    """The kubectl on PATH, as a person runs it: through /scale, with no fieldManager."""
    await _send(emulator, "POST", BASE, isvc("a", 0), agent="modelpool-extproc/1",
                content_type="application/json")
    await kubectl("scale", "isvc", "a", "--replicas=1")
    stored = await _send(emulator, "PATCH", f"{BASE}/a", {}, agent="reader/1")
    assert stored["spec"]["replicas"] == 1
    assert field_owner(stored, REPLICAS_FIELD) == "kubectl"
    await kubectl("scale", "isvc", "a", "--replicas=0")
    stored = await _send(emulator, "PATCH", f"{BASE}/a", {}, agent="reader/1")
    assert stored["spec"]["replicas"] == 0
    assert field_owner(stored, REPLICAS_FIELD) == ""
