"""The request record, the debug endpoints and the fault switches."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from kubernetes.aio import client as aclient
from kubernetes.aio import config as aconfig
from kubernetes.aio import watch as awatch
from kubernetes.aio.client.exceptions import ApiException as AioApiException

from devstack.kubeapi import RequestRecord
from tests.kubeapi.conftest import GROUP, VERSION, isvc, modelpool

NS = "default"
ISVCS = (GROUP, VERSION, NS, "inferenceservices")


async def test_record_names_each_request_in_rbac_terms(custom, emulator):
    emulator.requests.clear()
    await custom.create_namespaced_custom_object(*ISVCS, isvc("a"))
    await custom.get_namespaced_custom_object(*ISVCS, "a")
    await custom.list_namespaced_custom_object(*ISVCS)
    await custom.patch_namespaced_custom_object_status(*ISVCS, "a", {"status": {"phase": "Stopped"}})
    await custom.patch_namespaced_custom_object_scale(*ISVCS, "a", {"spec": {"replicas": 1}})
    stream = awatch.Watch()
    async for _ in stream.stream(custom.list_namespaced_custom_object, *ISVCS, timeout_seconds=1):
        break
    await stream.close()
    await custom.delete_namespaced_custom_object(*ISVCS, "a")
    g, r = GROUP, "inferenceservices"
    assert emulator.requests == [
        RequestRecord("create", g, r, None, NS, None),
        RequestRecord("get", g, r, None, NS, "a"),
        RequestRecord("list", g, r, None, NS, None),
        RequestRecord("patch", g, r, "status", NS, "a"),
        RequestRecord("patch", g, r, "scale", NS, "a"),
        RequestRecord("watch", g, r, None, NS, None),
        RequestRecord("delete", g, r, None, NS, "a"),
    ]


async def test_debug_endpoints_expose_and_reset_the_record(custom, emulator):
    await custom.list_cluster_custom_object(GROUP, VERSION, "modelpools")
    async with aiohttp.ClientSession(emulator.url) as http:
        async with http.get("/_emulator/requests") as response:
            assert await response.json() == [{"verb": "list", "group": GROUP, "resource": "modelpools",
                                              "subresource": None, "namespace": None, "name": None}]
        async with http.post("/_emulator/reset-record") as response:
            assert response.status == 200
        async with http.get("/_emulator/requests") as response:
            assert await response.json() == []
        async with http.post("/_emulator/compact") as response:
            assert (await response.json())["oldestResumable"] == emulator.store.resource_version
    assert emulator.requests == []  # debug calls are not resource requests


async def test_injected_conflicts_hit_only_the_next_writes_to_that_resource(custom, emulator):
    await custom.create_namespaced_custom_object(*ISVCS, isvc("a"))
    await custom.create_namespaced_custom_object(GROUP, VERSION, NS, "modelpools", modelpool("p"))
    async with aiohttp.ClientSession(emulator.url) as http:
        async with http.post("/_emulator/faults/conflict", json={"resource": "isvc", "count": 2}) as response:
            assert await response.json() == {"group": GROUP, "resource": "inferenceservices", "remaining": 2}
    await custom.get_namespaced_custom_object(*ISVCS, "a")  # reads are untouched
    await custom.patch_namespaced_custom_object(GROUP, VERSION, NS, "modelpools", "p", {"spec": {"default": "a"}})
    for _ in range(2):
        with pytest.raises(AioApiException) as info:
            await custom.patch_namespaced_custom_object_scale(*ISVCS, "a", {"spec": {"replicas": 1}})
        assert info.value.status == 409
    scaled = await custom.patch_namespaced_custom_object_scale(*ISVCS, "a", {"spec": {"replicas": 1}})
    assert scaled["spec"]["replicas"] == 1


async def test_unavailable_switch_answers_503_and_drops_watches(custom, emulator):
    await custom.create_namespaced_custom_object(*ISVCS, isvc("a"))

    seen: list[str] = []
    opened = asyncio.Event()

    async def watch_all() -> None:
        stream = awatch.Watch()
        try:
            async for event in stream.stream(custom.list_namespaced_custom_object, *ISVCS, timeout_seconds=60):
                seen.append(event["type"])
                opened.set()
        finally:
            await stream.close()

    watching = asyncio.create_task(watch_all())
    # the watch is open (its ADDED came) before the outage: a fixed sleep let a busy machine
    # send the watch request only after the switch, which then answered it 503 (fresh run 26)
    await asyncio.wait_for(opened.wait(), 10)
    async with aiohttp.ClientSession(emulator.url) as http:
        async with http.post("/_emulator/unavailable", json={"on": True}) as response:
            assert await response.json() == {"on": True}
        await asyncio.wait_for(watching, 10)  # ended early: its own end is 60 s away
        assert seen == ["ADDED"]
        with pytest.raises(AioApiException) as info:
            await custom.get_namespaced_custom_object(*ISVCS, "a")
        assert info.value.status == 503
        async with http.get("/apis") as response:
            assert response.status == 503
        async with http.post("/_emulator/unavailable", json={"on": False}) as response:
            assert await response.json() == {"on": False}
    assert (await custom.get_namespaced_custom_object(*ISVCS, "a"))["metadata"]["name"] == "a"


async def test_unknown_resources_and_subresources_are_404(emulator):
    async with aiohttp.ClientSession(emulator.url) as http:
        for path in ("/apis/nope.dev/v1/things", "/api/v1/namespaces/default/pods/p/scale",
                     "/apis/inference.llmkube.dev/v1alpha1/namespaces/default/modelpools/p/scale"):
            async with http.get(path) as response:
                assert response.status == 404, path
                assert (await response.json())["kind"] == "Status"


async def test_record_per_caller_follows_the_kubeconfig_user(emulator, tmp_path):
    kubeconfig = emulator.write_kubeconfig(tmp_path / "extproc.kubeconfig", user="extproc")
    api = await aconfig.new_client_from_config(config_file=str(kubeconfig))
    try:
        await aclient.CustomObjectsApi(api).list_namespaced_custom_object(*ISVCS)
    finally:
        await api.close()
    emulator.create("isvc", isvc("a"))  # in-process helpers are not requests
    async with aiohttp.ClientSession(emulator.url) as http:
        await http.get(f"/apis/{GROUP}/{VERSION}/namespaces/{NS}/modelpools")  # anonymous
        async with http.get("/_emulator/requests", params={"user": "extproc"}) as response:
            by_extproc = await response.json()
    assert emulator.requests_of("extproc") == [RequestRecord("list", GROUP, "inferenceservices", None, NS, None)]
    assert by_extproc == [emulator.requests_of("extproc")[0]._asdict()]
    assert [r.resource for r in emulator.requests_of("")] == ["modelpools"]
