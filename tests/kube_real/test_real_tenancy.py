"""Many teams on one service, on a real kube-apiserver: a pool in one namespace can neither take
a model name another namespace's pool serves nor make the service write into another namespace,
and many watched namespaces do not starve the service's writes.

One replica (a KubePlatform reporting to the runtime's Hub, as in the service) watches two
team namespaces; its Leases live in a third.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from control_plane import ControlPlane
from platform_entry import (
    LEADER_ANNOTATION,
    KubeClient,
    KubePlatform,
    PoolKey,
    Settings,
    from_kubeconfig,
    until,
)

from extproc.runtime.hub import Hub

pytestmark = pytest.mark.kube_real

GROUP, VERSION = "inference.llmkube.dev", "v1alpha1"
ALIASES = "modelpool.inference.llmkube.dev/aliases"
_SERIAL = itertools.count()


def _teams(plane: ControlPlane) -> tuple[str, str]:
    """Two fresh team namespaces, team-a-N and team-b-N."""
    serial = next(_SERIAL)
    names = (f"team-a-{serial}", f"team-b-{serial}")
    for name in names:
        plane.ensure_namespace(name)
    return names


def _settings(scopes: list[str], leases: str, **kwargs: Any) -> Settings:
    """The teams' namespaces watched, short Leases in ``leases`` (the defaults' ratios)."""
    return Settings(namespaces=scopes, lease_namespace=leases, replica_name="r1",
                    leader_lease_duration=4.0, leader_renew_deadline=3.0, leader_retry=0.5,
                    membership_lease_duration=4.0, membership_renew=0.5, lease_margin=0.5,
                    api_retry_initial=0.05, api_retry_max=0.5, watch_timeout=30, **kwargs)


def _create(plane: ControlPlane, namespace: str, plural: str, obj: dict[str, Any]) -> None:
    kind = "ModelPool" if plural == "modelpools" else "InferenceService"
    plane.request("POST", f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{plural}",
                  {"apiVersion": f"{GROUP}/{VERSION}", "kind": kind, **obj})


def _service(plane: ControlPlane, namespace: str, name: str) -> None:
    _create(plane, namespace, "inferenceservices",
            {"metadata": {"name": name}, "spec": {"modelRef": name, "replicas": 0}})


def _pool(plane: ControlPlane, namespace: str, name: str, members: list[str],
          annotations: dict[str, str] | None = None) -> None:
    _create(plane, namespace, "modelpools", {
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {"members": [{"inferenceServiceRef": {"name": m}} for m in members]}})


def _read(plane: ControlPlane, namespace: str, plural: str, name: str) -> dict[str, Any]:
    return plane.request("GET", f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{plural}/{name}")


def _spec_valid(plane: ControlPlane, namespace: str, pool: str) -> dict[str, Any]:
    status = _read(plane, namespace, "modelpools", pool).get("status") or {}
    return next((c for c in status.get("conditions") or [] if c["type"] == "SpecValid"), {})


def _warnings(plane: ControlPlane, namespace: str, reason: str) -> list[str]:
    events = plane.request("GET", f"/api/v1/namespaces/{namespace}/events")["items"]
    return [e["message"] for e in events if e["reason"] == reason and e["type"] == "Warning"]


@contextlib.asynccontextmanager
async def _serving(plane: ControlPlane, settings: Settings) -> AsyncIterator[tuple[Hub, Any]]:
    """The service's runtime Hub over a KubePlatform, running until the block ends."""
    platform = KubePlatform(KubeClient(await from_kubeconfig(str(plane.kubeconfig))), settings)
    hub = Hub(settings, platform)
    task = asyncio.get_running_loop().create_task(platform.run(hub))
    try:
        await until(lambda: platform.synced.is_set() or task.done(), "the platform synced")
        assert not task.done(), task
        yield hub, platform
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        hub.close()
        await platform.stop()


async def test_a_model_name_stays_with_the_pool_that_claimed_it_first(
        control_plane: ControlPlane, namespace: str) -> None:
    """team-b's alias chat=other does not take chat from team-a: team-a's requests for chat
    still route, team-b's pool is told (SpecValid False naming team-a's pool, a Warning
    Event) and gets chat only once team-a's pool is gone."""
    team_a, team_b = _teams(control_plane)
    _service(control_plane, team_a, "chat")
    _pool(control_plane, team_a, "slot", ["chat"])
    time.sleep(1.1)  # creationTimestamp has whole seconds: team-b's pool is the later one
    _service(control_plane, team_b, "other")
    _pool(control_plane, team_b, "slot", ["other"], {ALIASES: "chat=other"})
    holder, claimant = PoolKey(team_a, "slot"), PoolKey(team_b, "slot")

    async with _serving(control_plane, _settings([team_a, team_b], namespace)) as (hub, _):
        route = hub.resolve("chat")
        assert route is not None and route.driver.key == holder and route.member == "chat"
        assert hub.ambiguity("chat") == []
        assert hub.resolve("other").driver.key == claimant  # its own name is its own
        condition = await until(lambda: (c := _spec_valid(control_plane, team_b, "slot"))
                                .get("status") == "False" and c, "team-b's SpecValid False")
        assert f"ModelPool {team_a}/slot" in condition["message"], condition
        assert "model name chat" in condition["message"], condition
        assert _spec_valid(control_plane, team_a, "slot").get("status") != "False"
        warnings = await until(lambda: _warnings(control_plane, team_b, "ModelNameTaken"),
                               "a Warning Event on team-b's pool")
        assert f"ModelPool {team_a}/slot" in warnings[0]
        assert not _warnings(control_plane, team_a, "ModelNameTaken")

        # the holder's pool goes: the name passes to the next claimant
        control_plane.request("DELETE", f"/apis/{GROUP}/{VERSION}/namespaces/{team_a}/"
                              "modelpools/slot")
        await until(lambda: (r := hub.resolve("chat")) is not None and r.driver.key == claimant,
                    "chat routes to team-b's pool once team-a's is gone")
        assert hub.resolve("chat").member == "other"
        await until(lambda: _spec_valid(control_plane, team_b, "slot").get("status") == "True",
                    "team-b's SpecValid True again")


async def test_a_member_name_never_leads_a_write_into_another_namespace(
        control_plane: ControlPlane, namespace: str) -> None:
    """team-b's pool lists a member named like a path into team-a. Taking the lead stamps
    every member of the pool (fencing.py): the valid one is stamped, team-a's victim never,
    and the pool's status refuses the name."""
    team_a, team_b = _teams(control_plane)
    _service(control_plane, team_a, "victim")  # in no pool
    _service(control_plane, team_b, "real")
    crafted = f"../../../namespaces/{team_a}/inferenceservices/victim"
    _pool(control_plane, team_b, "slot", ["real", crafted])
    key = PoolKey(team_b, "slot")

    before = _read(control_plane, team_a, "inferenceservices", "victim")["metadata"]

    async with _serving(control_plane, _settings([team_a, team_b], namespace)) as (_, platform):
        await until(lambda: platform.replicas.leads(key), "r1 leads team-b's pool")
        await until(lambda: (_read(control_plane, team_b, "inferenceservices", "real")
                             ["metadata"].get("annotations") or {}).get(LEADER_ANNOTATION),
                    "the leader stamped its valid member")
        await asyncio.sleep(1.0)  # every stamp of this takeover was sent with the first
        victim = _read(control_plane, team_a, "inferenceservices", "victim")["metadata"]
        assert LEADER_ANNOTATION not in (victim.get("annotations") or {}), victim
        assert victim["resourceVersion"] == before["resourceVersion"], victim
        condition = await until(lambda: (c := _spec_valid(control_plane, team_b, "slot"))
                                .get("status") == "False" and c, "SpecValid False")
        assert "not a valid object name" in condition["message"], condition
        assert crafted in condition["message"]
        assert _warnings(control_plane, team_b, "InvalidSpec")
