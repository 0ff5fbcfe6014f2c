"""deploy/base's Leases' Role on the real RBAC authorizer: the service's own Lease machinery
(memberships, a pool's leader Lease, the Lease client's conflicts; the scenarios of
tests/platform/lease_scenarios.py), run as the base's ServiceAccount, is refused nothing in the
Role's namespace, and every Lease call elsewhere is refused.

The ServiceAccount, the Role and the RoleBinding are the base's, moved to a fresh namespace
(as e2e/test_e2e_rbac.py moves them): the scenarios see no other replica's Lease, and the audit
log tells this test's calls from test_real_swap's (another ServiceAccount name).

This checks the grant, not the service's wiring: which calls the running service makes, and that
the Roles grant nothing beyond them, is test_real_swap's (and e2e/test_e2e_rbac.py's) part.
"""

from __future__ import annotations

import copy
import urllib.error
from pathlib import Path
from typing import Any

import pytest

from control_plane import ControlPlane
from devstack.stack_manifests import dump
from lease_scenarios import (
    a_candidate_that_missed_a_renew_is_refused,
    announcements_continue_across_leaders,
    leader_moves_after_a_full_duration,
    memberships_see_each_other,
    stale_renew_conflicts,
)
from platform_entry import api_client
from rbac import rbac_covers
from real_stack import EXTPROC_USER, audit_requests, deploy_base_rbac, service_account_token

pytestmark = pytest.mark.kube_real

LEASE_ROLE = f"{EXTPROC_USER}-leases"
LEASES = "/apis/coordination.k8s.io/v1"


def _lease_rbac_in(plane: ControlPlane, namespace: str) -> list[dict[str, Any]]:
    """The base's ServiceAccount and its Leases' Role + RoleBinding, moved to ``namespace``."""
    objects = []
    for obj in copy.deepcopy(deploy_base_rbac(plane)):
        if obj["kind"] == "ServiceAccount" or obj["metadata"]["name"] == LEASE_ROLE:
            assert obj["metadata"]["namespace"] == "llm"
            obj["metadata"]["namespace"] = namespace
            for subject in obj.get("subjects", []):
                assert subject["namespace"] == "llm"
                subject["namespace"] = namespace
            objects.append(obj)
    assert sorted(o["kind"] for o in objects) == ["Role", "RoleBinding", "ServiceAccount"]
    return objects


@pytest.fixture
def as_service(control_plane: ControlPlane, namespace: str,
               tmp_path: Path) -> tuple[str, Path, dict[str, Any]]:
    """The ServiceAccount in ``namespace``: its token, a kubeconfig, the Role it is bound to."""
    objects = _lease_rbac_in(control_plane, namespace)
    control_plane.kubectl("apply", "--server-side", "-f", "-", stdin=dump(objects))
    token = service_account_token(control_plane, namespace, EXTPROC_USER)
    kubeconfig = control_plane.write_kubeconfig(tmp_path / "sa.kubeconfig", token=token,
                                                namespace=namespace)
    (role,) = [o for o in objects if o["kind"] == "Role"]
    return token, kubeconfig, role


async def test_lease_role_admits_the_lease_machinery(control_plane: ControlPlane, namespace: str,
                                                     as_service: tuple[str, Path, dict[str, Any]]) -> None:
    _, kubeconfig, role = as_service
    async with api_client(kubeconfig) as api:
        await stale_renew_conflicts(api, namespace)
        await memberships_see_each_other(api, namespace)
        await leader_moves_after_a_full_duration(api, namespace)
        await a_candidate_that_missed_a_renew_is_refused(api, namespace)
        await announcements_continue_across_leaders(api, namespace)
    calls = audit_requests(control_plane, f"system:serviceaccount:{namespace}:{EXTPROC_USER}")
    refused = [c for c in calls if c["code"] in (401, 403)]
    assert refused == [], refused
    # the record is not vacuous: reads, writes (a 409 is authorised, then lost) and a leave
    assert {c["verb"] for c in calls} >= {"get", "list", "create", "update", "delete"}
    assert {c["resource"] for c in calls} == {"leases"}
    assert rbac_covers([role], calls) == []


@pytest.mark.parametrize("method, path", [
    ("GET", f"{LEASES}/namespaces/default/leases"),  # another namespace
    ("GET", f"{LEASES}/leases"),  # every namespace
    ("GET", f"{LEASES}/namespaces/default/leases?watch=true&timeoutSeconds=1"),
    ("POST", f"{LEASES}/namespaces/default/leases"),
])
def test_lease_calls_elsewhere_are_refused(control_plane: ControlPlane,
                                           as_service: tuple[str, Path, dict[str, Any]],
                                           method: str, path: str) -> None:
    token, _, _ = as_service
    body = {"metadata": {"name": "x"}, "spec": {}} if method == "POST" else None
    with pytest.raises(urllib.error.HTTPError) as refused:
        control_plane.request(method, path, body, token=token)
    assert refused.value.code == 403
