"""List and watch through the official clients: replay, live order, bookmarks, timeouts, 410 and re-list."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from kubernetes import client, watch
from kubernetes.aio import watch as awatch
from kubernetes.aio.client.exceptions import ApiException as AioApiException
from kubernetes.client.exceptions import ApiException

from devstack.kubeapi import KubeEmulator
from tests.kubeapi.conftest import GROUP, VERSION, modelpool

NS = "default"
POOLS = (GROUP, VERSION, NS, "modelpools")


async def collect(custom, *, stop_after: int | None = None, **kwargs) -> list[dict]:
    """Watch ModelPools with the asyncio client until the server ends the stream (or `stop_after` events)."""
    events = []
    stream = awatch.Watch()
    try:
        async for event in stream.stream(custom.list_namespaced_custom_object, *POOLS, **kwargs):
            events.append(event)
            if stop_after is not None and len(events) >= stop_after:
                break
    finally:
        await stream.close()
    return events


def summary(events: list[dict]) -> list[tuple[str, str]]:
    return [(e["type"], e["raw_object"]["metadata"].get("name", "")) for e in events]


async def test_watch_replays_everything_after_the_listed_version_in_order(custom):
    await custom.create_namespaced_custom_object(*POOLS, modelpool("p1"))
    listed = await custom.list_namespaced_custom_object(*POOLS)
    since = listed["metadata"]["resourceVersion"]
    assert [o["metadata"]["name"] for o in listed["items"]] == ["p1"]
    await custom.create_namespaced_custom_object(*POOLS, modelpool("p2"))
    await custom.patch_namespaced_custom_object(*POOLS, "p1", {"spec": {"default": "a"}})
    await custom.delete_namespaced_custom_object(*POOLS, "p2")
    events = await collect(custom, resource_version=since, timeout_seconds=2, stop_after=3)
    assert summary(events) == [("ADDED", "p2"), ("MODIFIED", "p1"), ("DELETED", "p2")]
    versions = [int(e["raw_object"]["metadata"]["resourceVersion"]) for e in events]
    assert versions == sorted(versions) and versions[0] > int(since)


async def test_live_events_arrive_in_commit_order(custom):
    listed = await custom.list_namespaced_custom_object(*POOLS)
    watching = asyncio.create_task(collect(custom, resource_version=listed["metadata"]["resourceVersion"],
                                           timeout_seconds=5, stop_after=21))
    await asyncio.sleep(0.2)
    await custom.create_namespaced_custom_object(*POOLS, modelpool("p"))
    for i in range(20):
        await custom.patch_namespaced_custom_object(*POOLS, "p", {"metadata": {"labels": {"n": str(i)}}})
    events = await asyncio.wait_for(watching, 5)
    assert [e["raw_object"]["metadata"].get("labels", {}).get("n") for e in events[1:]] == [str(i) for i in range(20)]


async def test_watch_without_version_starts_with_current_objects(custom):
    await custom.create_namespaced_custom_object(*POOLS, modelpool("p1"))
    await custom.create_namespaced_custom_object(*POOLS, modelpool("p2"))
    events = await collect(custom, timeout_seconds=2, stop_after=2)
    assert summary(events) == [("ADDED", "p1"), ("ADDED", "p2")]


async def test_bookmarks_carry_the_current_version(custom, emulator):
    created = await custom.create_namespaced_custom_object(*POOLS, modelpool("p1"))
    events = await collect(custom, resource_version=created["metadata"]["resourceVersion"],
                           allow_watch_bookmarks=True, timeout_seconds=1)
    bookmarks = [e for e in events if e["type"] == "BOOKMARK"]
    assert bookmarks, "expected periodic BOOKMARK events (bookmark_interval=0.2 s)"
    assert bookmarks[-1]["raw_object"]["metadata"]["resourceVersion"] == str(emulator.store.resource_version)
    unasked = await collect(custom, resource_version=created["metadata"]["resourceVersion"], timeout_seconds=1)
    assert not [e for e in unasked if e["type"] == "BOOKMARK"]


async def test_timeout_seconds_ends_the_stream(custom):
    started = time.monotonic()
    assert await collect(custom, resource_version="1", timeout_seconds=1) == []
    assert 0.9 <= time.monotonic() - started < 10  # ended by its timeout: not at once, not never


async def test_label_selector_watch_sees_objects_enter_and_leave(custom):
    created = await custom.create_namespaced_custom_object(*POOLS, modelpool("p1"))
    await custom.patch_namespaced_custom_object(*POOLS, "p1", {"metadata": {"labels": {"tier": "gpu"}}})
    await custom.patch_namespaced_custom_object(*POOLS, "p1", {"metadata": {"labels": {"tier": "cpu"}}})
    events = await collect(custom, resource_version=created["metadata"]["resourceVersion"],
                           label_selector="tier=gpu", timeout_seconds=2, stop_after=2)
    assert summary(events) == [("ADDED", "p1"), ("DELETED", "p1")]
    listed = await custom.list_namespaced_custom_object(*POOLS, label_selector="tier in (cpu,tpu)")
    assert [o["metadata"]["name"] for o in listed["items"]] == ["p1"]
    by_name = await custom.list_namespaced_custom_object(*POOLS, field_selector="metadata.name=nope")
    assert by_name["items"] == []


async def test_compacted_version_is_410_at_watch_start_and_on_exact_list(custom, emulator):
    created = await custom.create_namespaced_custom_object(*POOLS, modelpool("p1"))
    old = created["metadata"]["resourceVersion"]
    await custom.patch_namespaced_custom_object(*POOLS, "p1", {"spec": {"default": "a"}})
    emulator.compact()
    with pytest.raises(AioApiException) as at_start:
        await collect(custom, resource_version=old, timeout_seconds=1)
    assert at_start.value.status == 410
    with pytest.raises(AioApiException) as exact_list:
        await custom.list_namespaced_custom_object(*POOLS, resource_version=old, resource_version_match="Exact")
    assert exact_list.value.status == 410 and '"reason": "Expired"' in exact_list.value.body


async def test_compaction_expires_an_open_watch_and_the_client_relists(sync_client, emulator):
    api = client.CustomObjectsApi(sync_client)
    created = await asyncio.to_thread(api.create_namespaced_custom_object, *POOLS, modelpool("p1"))

    def watch_until_gone() -> tuple[list[str], int]:
        seen, stream = [], watch.Watch()
        try:
            for event in stream.stream(api.list_namespaced_custom_object, *POOLS, timeout_seconds=5,
                                       resource_version=created["metadata"]["resourceVersion"]):
                seen.append(event["type"])
        except ApiException as exc:
            return seen, exc.status
        return seen, 0

    watching = asyncio.create_task(asyncio.to_thread(watch_until_gone))
    await asyncio.sleep(0.3)
    await asyncio.to_thread(api.patch_namespaced_custom_object, *POOLS, "p1", {"spec": {"default": "a"}})
    await asyncio.sleep(0.3)
    emulator.compact()
    seen, status = await asyncio.wait_for(watching, 5)
    assert (seen, status) == (["MODIFIED"], 410)
    # the informer's answer to 410: list again, then watch from the list's version
    relisted = await asyncio.to_thread(api.list_namespaced_custom_object, *POOLS)
    assert relisted["items"][0]["spec"]["default"] == "a"
    await asyncio.to_thread(api.patch_namespaced_custom_object, *POOLS, "p1", {"spec": {"default": "b"}})
    stream = watch.Watch()
    resumed = await asyncio.to_thread(lambda: [e["type"] for e in stream.stream(
        api.list_namespaced_custom_object, *POOLS, timeout_seconds=1,
        resource_version=relisted["metadata"]["resourceVersion"])])
    assert resumed == ["MODIFIED"]


async def test_sync_client_watches_typed_pods(sync_client):
    core = client.CoreV1Api(sync_client)
    pods = await asyncio.to_thread(core.list_namespaced_pod, NS)
    await asyncio.to_thread(core.create_namespaced_pod, NS, {"metadata": {"name": "p"},
                                                             "spec": {"containers": [{"name": "c", "image": "x"}]}})
    stream = watch.Watch()
    event = await asyncio.to_thread(lambda: next(iter(stream.stream(
        core.list_namespaced_pod, NS, resource_version=pods.metadata.resource_version, timeout_seconds=2))))
    stream.stop()
    assert (event["type"], event["object"].metadata.name, event["object"].status.phase) == ("ADDED", "p", "Pending")


async def test_bounded_history_forgets_old_versions():
    emu = KubeEmulator(history_limit=3)
    first = emu.create("configmaps", {"metadata": {"name": "c"}, "data": {"n": "0"}})
    for i in range(1, 5):
        emu.patch("configmaps", "c", {"data": {"n": str(i)}})
    rt = emu.resource_type("cm")
    with pytest.raises(Exception, match="too old resource version"):
        emu.store.open_watch(rt, int(first["metadata"]["resourceVersion"]))
    replay, watcher = emu.store.open_watch(rt, emu.store.resource_version - 2)
    assert [e.obj["data"]["n"] for e in replay] == ["3", "4"]
    emu.store.close_watch(watcher)


async def test_a_client_leaving_releases_its_watch_and_stop_ends_open_ones(emulator):
    url = f"{emulator.url}/apis/{GROUP}/{VERSION}/namespaces/{NS}/modelpools?watch=1"
    async with aiohttp.ClientSession() as http:
        response = await http.get(url)
        await asyncio.sleep(0.1)
        assert emulator.store.open_watches == 1
        response.close()  # drops the connection without a word
        for _ in range(40):  # an idle watch notices within about a second
            if emulator.store.open_watches == 0:
                break
            await asyncio.sleep(0.05)
        assert emulator.store.open_watches == 0
        async with http.get(url) as held:
            await asyncio.sleep(0.1)
            started = time.monotonic()
            await emulator.stop()
            assert await held.read() == b""  # the stream ended cleanly, with no events
            assert time.monotonic() - started < 10  # the watch itself would run 30 min
