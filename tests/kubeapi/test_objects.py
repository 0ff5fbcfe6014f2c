"""Object semantics through the official clients: codes, versions, status isolation, patches, scale."""

from __future__ import annotations

import asyncio

import pytest
from kubernetes import client
from kubernetes.aio.client.exceptions import ApiException as AioApiException
from kubernetes.client.exceptions import ApiException

from tests.kubeapi.conftest import GROUP, VERSION, isvc, modelpool

NS = "default"


async def test_create_answers_201_with_metadata(sync_client, emulator):
    api = client.CustomObjectsApi(sync_client)
    body, status, _headers = await asyncio.to_thread(
        api.create_namespaced_custom_object_with_http_info, GROUP, VERSION, NS, "modelpools", modelpool("p1"))
    assert status == 201
    meta = body["metadata"]
    assert meta["resourceVersion"].isdigit() and int(meta["resourceVersion"]) > 0
    assert meta["uid"] and meta["creationTimestamp"].endswith("Z") and meta["generation"] == 1
    assert body["spec"]["swapBudget"] == "300s"  # schema default applied by the server


async def test_versions_grow_globally_across_resources(custom):
    a = await custom.create_namespaced_custom_object(GROUP, VERSION, NS, "modelpools", modelpool("p1"))
    b = await custom.create_namespaced_custom_object(GROUP, VERSION, NS, "inferenceservices", isvc("a"))
    c = await custom.patch_namespaced_custom_object(GROUP, VERSION, NS, "modelpools", "p1",
                                                    {"metadata": {"labels": {"x": "1"}}})
    versions = [int(o["metadata"]["resourceVersion"]) for o in (a, b, c)]
    assert versions == sorted(versions) and len(set(versions)) == 3


async def test_duplicate_create_is_409_already_exists(custom):
    await custom.create_namespaced_custom_object(GROUP, VERSION, NS, "modelpools", modelpool("p1"))
    with pytest.raises(AioApiException) as info:
        await custom.create_namespaced_custom_object(GROUP, VERSION, NS, "modelpools", modelpool("p1"))
    assert info.value.status == 409 and '"reason": "AlreadyExists"' in info.value.body


async def test_missing_object_is_404_status(sync_client):
    api = client.CoreV1Api(sync_client)
    with pytest.raises(ApiException) as info:
        await asyncio.to_thread(api.read_namespaced_pod, "nope", NS)
    assert info.value.status == 404 and '"reason": "NotFound"' in info.value.body
    assert 'pods \\"nope\\" not found' in info.value.body


async def test_stale_resource_version_is_409_on_put_and_patch(custom):
    first = await custom.create_namespaced_custom_object(GROUP, VERSION, NS, "modelpools", modelpool("p1"))
    await custom.patch_namespaced_custom_object(GROUP, VERSION, NS, "modelpools", "p1",
                                                {"spec": {"default": "a"}})
    stale = first["metadata"]["resourceVersion"]
    with pytest.raises(AioApiException) as put:
        await custom.replace_namespaced_custom_object(GROUP, VERSION, NS, "modelpools", "p1", first)
    with pytest.raises(AioApiException) as patch:
        await custom.patch_namespaced_custom_object(GROUP, VERSION, NS, "modelpools", "p1",
                                                    {"metadata": {"resourceVersion": stale}, "spec": {"default": "b"}})
    assert put.value.status == patch.value.status == 409
    assert '"reason": "Conflict"' in put.value.body
    current = await custom.get_namespaced_custom_object(GROUP, VERSION, NS, "modelpools", "p1")
    assert current["spec"]["default"] == "a"
    current["spec"]["default"] = "b"  # with the current version the same PUT goes through
    replaced = await custom.replace_namespaced_custom_object(GROUP, VERSION, NS, "modelpools", "p1", current)
    assert replaced["spec"]["default"] == "b"


async def test_stale_resource_version_is_409_on_status_merge_patches_too(custom):
    """As kube-apiserver: a merge patch of /status that names a stale resourceVersion is
    refused, also when it would change nothing; the current one is accepted (fencing.py)."""
    await custom.create_namespaced_custom_object(GROUP, VERSION, NS, "modelpools", modelpool("p1"))
    first = await custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, NS, "modelpools", "p1", {"status": {"phase": "Ready"}})
    stale = first["metadata"]["resourceVersion"]
    await custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, NS, "modelpools", "p1", {"status": {"phase": "Swapping"}})
    for phase in ("Ready", "Swapping"):  # a change, then what is already there
        with pytest.raises(AioApiException) as info:
            await custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, NS, "modelpools", "p1",
                {"metadata": {"resourceVersion": stale}, "status": {"phase": phase}})
        assert info.value.status == 409 and '"reason": "Conflict"' in info.value.body
    current = await custom.get_namespaced_custom_object(GROUP, VERSION, NS, "modelpools", "p1")
    assert current["status"] == {"phase": "Swapping"}
    landed = await custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, NS, "modelpools", "p1",
        {"metadata": {"resourceVersion": current["metadata"]["resourceVersion"]},
         "status": {"phase": "Ready"}})
    assert landed["status"] == {"phase": "Ready"}


async def test_status_and_spec_are_isolated_both_ways(custom):
    await custom.create_namespaced_custom_object(
        GROUP, VERSION, NS, "modelpools", {**modelpool("p1"), "status": {"phase": "Ready"}})
    created = await custom.get_namespaced_custom_object(GROUP, VERSION, NS, "modelpools", "p1")
    assert "status" not in created  # create drops .status when the status subresource exists
    after_status = await custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, NS, "modelpools", "p1", {"status": {"phase": "Swapping"}, "spec": {"default": "b"}})
    assert after_status["status"] == {"phase": "Swapping"} and "default" not in after_status["spec"]
    after_spec = await custom.patch_namespaced_custom_object(
        GROUP, VERSION, NS, "modelpools", "p1", {"status": {"phase": "Ready"}, "spec": {"default": "a"}})
    assert after_spec["status"] == {"phase": "Swapping"} and after_spec["spec"]["default"] == "a"


async def test_generation_bumps_on_spec_changes_only(custom):
    await custom.create_namespaced_custom_object(GROUP, VERSION, NS, "modelpools", modelpool("p1"))

    async def generation() -> int:
        obj = await custom.get_namespaced_custom_object(GROUP, VERSION, NS, "modelpools", "p1")
        return obj["metadata"]["generation"]

    await custom.patch_namespaced_custom_object_status(GROUP, VERSION, NS, "modelpools", "p1",
                                                       {"status": {"phase": "Ready"}})
    await custom.patch_namespaced_custom_object(GROUP, VERSION, NS, "modelpools", "p1",
                                                {"metadata": {"annotations": {"note": "x"}}})
    assert await generation() == 1
    await custom.patch_namespaced_custom_object(GROUP, VERSION, NS, "modelpools", "p1", {"spec": {"default": "a"}})
    assert await generation() == 2


async def test_noop_patch_keeps_the_version(custom):
    created = await custom.create_namespaced_custom_object(GROUP, VERSION, NS, "modelpools", modelpool("p1"))
    same = await custom.patch_namespaced_custom_object(GROUP, VERSION, NS, "modelpools", "p1",
                                                       {"spec": {"swapPolicy": "sticky"}})
    assert same["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]


async def test_json_patch_and_merge_patch(custom):
    await custom.create_namespaced_custom_object(GROUP, VERSION, NS, "modelpools", modelpool("p1", default="a"))
    merged = await custom.patch_namespaced_custom_object(
        GROUP, VERSION, NS, "modelpools", "p1", {"spec": {"default": None, "gpu": "h100"}})
    assert "default" not in merged["spec"] and merged["spec"]["gpu"] == "h100"
    ops = [{"op": "test", "path": "/spec/gpu", "value": "h100"},
           {"op": "add", "path": "/spec/members/-", "value": {"inferenceServiceRef": {"name": "c"}}},
           {"op": "replace", "path": "/spec/gpu", "value": "a100"},
           {"op": "remove", "path": "/spec/members/0"}]
    patched = await custom.patch_namespaced_custom_object(GROUP, VERSION, NS, "modelpools", "p1", ops,
                                                          _content_type="application/json-patch+json")
    assert [m["inferenceServiceRef"]["name"] for m in patched["spec"]["members"]] == ["b", "c"]
    assert patched["spec"]["gpu"] == "a100"
    stale = [{"op": "replace", "path": "/metadata/resourceVersion", "value": "1"},
             {"op": "replace", "path": "/spec/gpu", "value": "x"}]
    with pytest.raises(AioApiException) as info:
        await custom.patch_namespaced_custom_object(GROUP, VERSION, NS, "modelpools", "p1", stale,
                                                    _content_type="application/json-patch+json")
    assert info.value.status == 409


async def test_scale_subresource_reads_and_writes_replicas(custom):
    await custom.create_namespaced_custom_object(GROUP, VERSION, NS, "inferenceservices", isvc("a", replicas=0))
    await custom.patch_namespaced_custom_object_status(GROUP, VERSION, NS, "inferenceservices", "a",
                                                       {"status": {"replicas": 0, "phase": "Stopped"}})
    scale = await custom.get_namespaced_custom_object_scale(GROUP, VERSION, NS, "inferenceservices", "a")
    assert scale["kind"] == "Scale" and scale["apiVersion"] == "autoscaling/v1"
    assert scale["spec"] == {"replicas": 0} and scale["status"]["replicas"] == 0
    scaled = await custom.patch_namespaced_custom_object_scale(GROUP, VERSION, NS, "inferenceservices", "a",
                                                               {"spec": {"replicas": 1}})
    assert scaled["spec"]["replicas"] == 1
    obj = await custom.get_namespaced_custom_object(GROUP, VERSION, NS, "inferenceservices", "a")
    assert obj["spec"]["replicas"] == 1 and obj["metadata"]["generation"] == 2
    with pytest.raises(AioApiException) as info:
        await custom.patch_namespaced_custom_object_scale(
            GROUP, VERSION, NS, "inferenceservices", "a",
            {"metadata": {"resourceVersion": scale["metadata"]["resourceVersion"]}, "spec": {"replicas": 0}})
    assert info.value.status == 409
    with pytest.raises(AioApiException) as missing:  # ModelPool declares no /scale
        await custom.create_namespaced_custom_object(GROUP, VERSION, NS, "modelpools", modelpool("p1"))
        await custom.get_namespaced_custom_object_scale(GROUP, VERSION, NS, "modelpools", "p1")
    assert missing.value.status == 404


async def test_pods_delete_and_finalizers(sync_client, emulator):
    core = client.CoreV1Api(sync_client)
    pod = {"metadata": {"name": "p", "finalizers": ["test/hold"]},
           "spec": {"containers": [{"name": "c", "image": "x"}]}}
    created = await asyncio.to_thread(core.create_namespaced_pod, NS, pod)
    assert created.status.phase == "Pending"
    await asyncio.to_thread(core.delete_namespaced_pod, "p", NS)
    held = emulator.get("pods", "p")
    assert held["metadata"]["deletionTimestamp"]  # a finalizer keeps a terminating pod visible
    await asyncio.to_thread(core.patch_namespaced_pod, "p", NS, {"metadata": {"finalizers": None}})
    assert emulator.get("pods", "p") is None
    await asyncio.to_thread(core.create_namespaced_pod, NS, {**pod, "metadata": {"name": "q"}})
    await asyncio.to_thread(core.delete_namespaced_pod, "q", NS)
    assert emulator.get("pods", "q") is None  # no finalizer: gone at once, no grace period


async def test_in_process_helpers_seed_status(emulator):
    created = emulator.create("isvc", {**isvc("a"), "status": {"phase": "Ready"}})
    assert created["status"] == {"phase": "Ready"}
    patched = emulator.patch("isvc", "a", {"status": {"phase": "Stopped"}}, subresource="status")
    assert patched["status"]["phase"] == "Stopped"
    assert [o["metadata"]["name"] for o in emulator.list("inferenceservices")] == ["a"]
    emulator.delete("isvc", "a")
    assert emulator.get("isvc", "a") is None


async def test_delete_collection_honours_the_label_selector(custom, emulator):
    for name, tier in (("p1", "gpu"), ("p2", "gpu"), ("p3", "cpu")):
        await custom.create_namespaced_custom_object(
            GROUP, VERSION, NS, "modelpools", {**modelpool(name), "metadata": {"name": name, "labels": {"tier": tier}}})
    gone = await custom.delete_collection_namespaced_custom_object(GROUP, VERSION, NS, "modelpools",
                                                                   label_selector="tier=gpu")
    assert [o["metadata"]["name"] for o in gone["items"]] == ["p1", "p2"]
    assert [o["metadata"]["name"] for o in emulator.list("mpool")] == ["p3"]
