"""The service's Lease client, memberships and leader Lease against a real kube-apiserver: the
same scenarios as tests/platform/test_kube_leases.py (shared in tests/platform/lease_scenarios.py),
plus the Table kube-apiserver prints for `kubectl get leases`, which the emulator copies.

Outages and 429s cannot be played on cue by a real server; those stay with the emulator."""

from __future__ import annotations

from typing import Any

import pytest

from control_plane import ControlPlane
from lease_scenarios import (
    leader_moves_after_a_full_duration,
    memberships_see_each_other,
    silent_peer_is_lost_with_unknown_counts,
    stale_renew_conflicts,
)
from platform_entry import api_client

pytestmark = pytest.mark.kube_real


@pytest.fixture
async def service(control_plane: ControlPlane) -> Any:
    """The service's own API client, as the admin."""
    async with api_client(control_plane.kubeconfig) as api:
        yield api


async def test_stale_renew_conflicts(service: Any, namespace: str) -> None:
    await stale_renew_conflicts(service, namespace)


async def test_memberships_see_each_other(service: Any, namespace: str) -> None:
    await memberships_see_each_other(service, namespace)


async def test_silent_peer_is_lost_with_unknown_counts(service: Any, namespace: str) -> None:
    await silent_peer_is_lost_with_unknown_counts(service, namespace)


async def test_leader_moves_after_a_full_duration(service: Any, namespace: str) -> None:
    await leader_moves_after_a_full_duration(service, namespace)


def test_lease_table_matches_the_emulators(control_plane: ControlPlane, namespace: str) -> None:
    from devstack.kubeapi.resources import builtin_types  # noqa: PLC0415 - the emulator's side

    for name, spec in (("held", {"holderIdentity": "replica-a"}), ("free", {})):
        control_plane.request("POST", f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases",
                              {"metadata": {"name": name}, "spec": spec})
    table = control_plane.request(
        "GET", f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases",
        accept="application/json;as=Table;v=v1;g=meta.k8s.io")
    [emulated] = [rt for rt in builtin_types() if rt.plural == "leases"]
    real = [(c["name"], c["description"]) for c in table["columnDefinitions"]][1:]
    assert [name for name, _ in real] == [c.name for c in emulated.columns] == ["Holder", "Age"]
    assert real[0][1] == emulated.columns[0].description
    assert [row["cells"][:2] for row in table["rows"]] == [["free", ""], ["held", "replica-a"]]
