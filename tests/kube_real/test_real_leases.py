"""Leases (coordination.k8s.io/v1) on a real API server behave as the replicas work assumes:
create, renew with a resourceVersion precondition, a stale renew gets 409, holderIdentity /
renewTime / leaseTransitions round-trip, delete. Uses the `kubernetes` client."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from control_plane import ControlPlane

pytestmark = pytest.mark.kube_real


@pytest.fixture
def leases(control_plane: ControlPlane) -> Iterator[client.CoordinationV1Api]:
    """A CoordinationV1Api for the admin, through the admin kubeconfig."""
    api_client = config.new_client_from_config(config_file=str(control_plane.kubeconfig))
    try:
        yield client.CoordinationV1Api(api_client)
    finally:
        api_client.close()


def _lease(holder: str, renewed: datetime, transitions: int) -> client.V1Lease:
    return client.V1Lease(
        metadata=client.V1ObjectMeta(name="modelpool-extproc-leader"),
        spec=client.V1LeaseSpec(holder_identity=holder, lease_duration_seconds=15,
                                acquire_time=renewed, renew_time=renewed,
                                lease_transitions=transitions))


def test_lease_lifecycle(leases: client.CoordinationV1Api, namespace: str) -> None:
    start = datetime(2025, 1, 1, 12, 0, 0, 123456, tzinfo=timezone.utc)
    created = leases.create_namespaced_lease(namespace, _lease("replica-a", start, 0))
    assert created.spec.holder_identity == "replica-a"
    assert created.spec.renew_time == start  # MicroTime keeps the microseconds
    assert created.spec.lease_transitions == 0

    # renew: update carrying the resourceVersion we read (a compare-and-swap)
    renewed = created
    renewed.spec.renew_time = start + timedelta(seconds=5)
    after_renew = leases.replace_namespaced_lease(renewed.metadata.name, namespace, renewed)
    assert after_renew.metadata.resource_version != created.metadata.resource_version

    # a replica that still holds the old resourceVersion loses: 409, and nothing changes
    stale = _lease("replica-b", start + timedelta(seconds=6), 1)
    stale.metadata.resource_version = created.metadata.resource_version
    with pytest.raises(ApiException) as conflict:
        leases.replace_namespaced_lease(stale.metadata.name, namespace, stale)
    assert conflict.value.status == 409
    current = leases.read_namespaced_lease(stale.metadata.name, namespace)
    assert current.spec.holder_identity == "replica-a"
    assert current.spec.renew_time == start + timedelta(seconds=5)

    # a takeover from the current version succeeds and round-trips every field
    takeover = _lease("replica-b", start + timedelta(seconds=30), 1)
    takeover.metadata.resource_version = current.metadata.resource_version
    taken = leases.replace_namespaced_lease(takeover.metadata.name, namespace, takeover)
    read = leases.read_namespaced_lease(taken.metadata.name, namespace)
    assert (read.spec.holder_identity, read.spec.lease_transitions,
            read.spec.renew_time, read.spec.lease_duration_seconds) == \
        ("replica-b", 1, start + timedelta(seconds=30), 15)

    # delete with a stale precondition is refused; with the current one it goes
    with pytest.raises(ApiException) as refused:
        leases.delete_namespaced_lease(read.metadata.name, namespace, body=client.V1DeleteOptions(
            preconditions=client.V1Preconditions(
                resource_version=created.metadata.resource_version)))
    assert refused.value.status == 409
    leases.delete_namespaced_lease(read.metadata.name, namespace, body=client.V1DeleteOptions(
        preconditions=client.V1Preconditions(resource_version=read.metadata.resource_version)))
    with pytest.raises(ApiException) as gone:
        leases.read_namespaced_lease(read.metadata.name, namespace)
    assert gone.value.status == 404


def test_second_create_conflicts(leases: client.CoordinationV1Api, namespace: str) -> None:
    now = datetime.now(timezone.utc)
    leases.create_namespaced_lease(namespace, _lease("replica-a", now, 0))
    with pytest.raises(ApiException) as exists:
        leases.create_namespaced_lease(namespace, _lease("replica-b", now, 0))
    assert exists.value.status == 409
