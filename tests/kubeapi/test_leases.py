"""coordination.k8s.io/v1 Leases on the emulator: the real `kubernetes` client's CoordinationV1Api
(create, get, list, watch, replace with a resourceVersion precondition, patch, delete) and kubectl's
`get leases` with the HOLDER and AGE columns kube-apiserver prints."""

from __future__ import annotations

import asyncio
import datetime

import aiohttp
import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

START = datetime.datetime(2025, 1, 1, 12, 0, 0, 123456, tzinfo=datetime.UTC)


def _lease(name: str, holder: str | None, renewed: datetime.datetime = START,
           transitions: int = 0) -> client.V1Lease:
    return client.V1Lease(
        metadata=client.V1ObjectMeta(name=name, labels={"app": "modelpool-extproc"}),
        spec=client.V1LeaseSpec(holder_identity=holder, lease_duration_seconds=15,
                                acquire_time=renewed, renew_time=renewed,
                                lease_transitions=transitions))


@pytest.fixture
def leases(sync_client) -> client.CoordinationV1Api:
    """CoordinationV1Api on the synchronous client (called through asyncio.to_thread)."""
    return client.CoordinationV1Api(sync_client)


async def test_lease_verbs_through_the_client(leases, emulator):
    created = await asyncio.to_thread(leases.create_namespaced_lease, "default", _lease("a", "replica-a"))
    assert created.spec.renew_time == START  # MicroTime keeps its microseconds
    read = await asyncio.to_thread(leases.read_namespaced_lease, "a", "default")
    assert (read.spec.holder_identity, read.metadata.resource_version) == \
        ("replica-a", created.metadata.resource_version)

    read.spec.renew_time = START + datetime.timedelta(seconds=2)
    renewed = await asyncio.to_thread(leases.replace_namespaced_lease, "a", "default", read)
    assert int(renewed.metadata.resource_version) > int(created.metadata.resource_version)

    stale = _lease("a", "replica-b", transitions=1)
    stale.metadata.resource_version = created.metadata.resource_version
    with pytest.raises(ApiException) as conflict:
        await asyncio.to_thread(leases.replace_namespaced_lease, "a", "default", stale)
    assert conflict.value.status == 409
    assert emulator.get("leases", "a")["spec"]["holderIdentity"] == "replica-a"

    patched = await asyncio.to_thread(
        leases.patch_namespaced_lease, "a", "default",
        {"metadata": {"annotations": {"note": "x"}}, "spec": {"leaseTransitions": 3}})
    assert (patched.metadata.annotations, patched.spec.lease_transitions) == ({"note": "x"}, 3)
    await asyncio.to_thread(leases.create_namespaced_lease, "default", _lease("b", None))
    listed = await asyncio.to_thread(leases.list_namespaced_lease, "default",
                                     label_selector="app=modelpool-extproc")
    assert [item.metadata.name for item in listed.items] == ["a", "b"]

    with pytest.raises(ApiException) as refused:  # a delete from a stale version is refused
        await asyncio.to_thread(leases.delete_namespaced_lease, "a", "default", body=client.V1DeleteOptions(
            preconditions=client.V1Preconditions(resource_version=created.metadata.resource_version)))
    assert refused.value.status == 409
    await asyncio.to_thread(leases.delete_namespaced_lease, "a", "default", body=client.V1DeleteOptions(
        preconditions=client.V1Preconditions(resource_version=patched.metadata.resource_version)))
    assert emulator.get("leases", "a") is None


async def test_watch_sees_a_renew(leases, emulator):
    created = await asyncio.to_thread(leases.create_namespaced_lease, "default", _lease("w", "replica-a"))

    def first_modified() -> client.V1Lease:
        stream = watch.Watch()
        for event in stream.stream(leases.list_namespaced_lease, "default", timeout_seconds=10,
                                   resource_version=created.metadata.resource_version):
            if event["type"] == "MODIFIED":
                stream.stop()
                return event["object"]
        raise AssertionError("the watch ended without the renew")

    watching = asyncio.create_task(asyncio.to_thread(first_modified))
    await asyncio.sleep(0.2)  # let the watch open; it starts from the creation's version anyway
    emulator.patch("leases", "w", {"spec": {"holderIdentity": "replica-b"}})
    seen = await asyncio.wait_for(watching, 15)
    assert seen.spec.holder_identity == "replica-b"


async def test_kubectl_get_leases_prints_holder_and_age(kubectl, emulator):
    emulator.create("leases", {"metadata": {"name": "held"}, "spec": {"holderIdentity": "replica-a"}},
                    namespace="demo")
    emulator.create("leases", {"metadata": {"name": "free"}, "spec": {}}, namespace="demo")
    lines = (await kubectl("get", "leases", "-n", "demo")).splitlines()
    assert lines[0].split() == ["NAME", "HOLDER", "AGE"]
    free, held = (line.split() for line in lines[1:])
    assert free[0] == "free" and len(free) == 2  # no holder: an empty cell, as the real server
    assert held[:2] == ["held", "replica-a"] and held[2].endswith("s")
    described = await kubectl("get", "lease", "held", "-n", "demo", "-o", "jsonpath={.spec.holderIdentity}")
    assert described == "replica-a"
    resources = await kubectl("api-resources", "--api-group=coordination.k8s.io")
    assert "leases" in resources and "Lease" in resources


async def test_throttle_fault_answers_429_to_the_next_writes(leases, emulator):
    await asyncio.to_thread(leases.create_namespaced_lease, "default", _lease("t", "replica-a"))
    async with aiohttp.ClientSession(emulator.url) as http:
        async with http.post("/_emulator/faults/throttle", json={"resource": "leases", "count": 1}) as response:
            assert await response.json() == {"group": "coordination.k8s.io", "resource": "leases", "remaining": 1}
    await asyncio.to_thread(leases.read_namespaced_lease, "t", "default")  # reads are untouched
    with pytest.raises(ApiException) as throttled:
        await asyncio.to_thread(leases.patch_namespaced_lease, "t", "default", {"spec": {"holderIdentity": "b"}})
    assert throttled.value.status == 429 and "TooManyRequests" in throttled.value.body
    patched = await asyncio.to_thread(leases.patch_namespaced_lease, "t", "default",
                                      {"spec": {"holderIdentity": "b"}})
    assert patched.spec.holder_identity == "b"
