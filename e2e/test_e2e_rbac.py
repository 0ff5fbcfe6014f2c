"""deploy/base's Roles allow exactly the ext_proc's real API calls, as the emulator recorded them.

The stack gives the ext_proc its own kubeconfig user, so the emulator's record separates its
calls from the simulator's and kubectl's, and runs it with the replica name and Lease namespace
a pod of the base's Deployment gets from the downward API. The test drives every kind of work
the service does against the API (warm-up, swap, failed load, lost member, and a clean leave
and restart: the Leases' whole life) before checking the record against both Roles, the pools'
and the Leases'.
"""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
from types import ModuleType
from typing import Any

import aiohttp
import yaml

from devstack.procs import PROJECT_ROOT
from devstack.stack import LocalStack
from e2e_support import NAMESPACE, chat, eventually, extproc_calls, notices, pools, wait_resident


def load_deploy_helper(name: str) -> ModuleType:
    """tests/deploy/<name>.py, loaded by path (tests/ is not a package)."""
    path = PROJECT_ROOT / "tests" / "deploy" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"deploy_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def deploy_base() -> list[dict[str, Any]]:
    """`kubectl kustomize deploy/base`, as objects."""
    rendered = subprocess.run(["kubectl", "kustomize", str(PROJECT_ROOT / "deploy" / "base")],
                              capture_output=True, text=True, timeout=60, check=True).stdout
    return [d for d in yaml.safe_load_all(rendered) if d]


def pod_args(namespace: str) -> list[str]:
    """The flags standing for what a pod of the base's Deployment in ``namespace`` gets from the
    downward API: its name (the replica name) and its namespace (the Leases' namespace). Read
    from the Deployment's file (no overlay patches the env the base sets), so that collecting
    this module needs no kubectl."""
    downward = load_deploy_helper("downward")
    deployment = yaml.safe_load((PROJECT_ROOT / "deploy" / "base" / "deployment.yaml").read_text())
    return downward.as_flags(downward.downward_env(downward.service_container([deployment]),
                                                   namespace))


STACK_DOCS = pools(("guard", ["guard-a", "guard-b", "guard-bad"],
                    {"default": "guard-a",
                     "member_annotations": {"guard-bad": {"sim.llmkube.dev/fail": "true"}}}))
STACK_OPTIONS = {"extproc_args": pod_args(NAMESPACE)}
LEASE_ROLE = "modelpool-extproc-leases"


def extproc_roles(namespace: str) -> list[dict[str, Any]]:
    """The Roles deploy/base grants the service (the pools', the Leases'), moved to the namespace
    the stack runs the service in.

    The base installs into `llm`, runs the service with --namespace llm and its Leases in its
    own namespace, `llm`; the stack does the same with its own namespace, so both Roles keep
    their scope (no cluster-wide call, no Lease elsewhere passes).
    """
    roles = [d for d in deploy_base() if d["kind"] == "Role"]
    assert sorted(r["metadata"]["name"] for r in roles) == ["modelpool-extproc", LEASE_ROLE], \
        "deploy/base should render the pools' Role and the Leases' Role"
    for role in roles:
        assert role["metadata"]["namespace"] == "llm"
        role["metadata"]["namespace"] = namespace
    return roles


async def exercise(stack: LocalStack, http: aiohttp.ClientSession) -> None:
    """Make the service do each kind of API work: warm, swap, fail a load, lose a member."""
    await wait_resident(stack, "guard", "guard-a")
    assert (await chat(http, stack, "guard-b")).status == 200
    assert (await chat(http, stack, "guard-bad")).status == 503
    assert (await chat(http, stack, "guard-b")).status == 200
    await asyncio.to_thread(stack.annotate, "guard-b", "sim.llmkube.dev/kill-pod", "1")
    await eventually(lambda: notices(stack, "guard", "MemberLost"), what="MemberLost")
    assert (await chat(http, stack, "guard-b")).status == 200
    # a replica leaving (SIGTERM) deletes its Lease; the one that replaces it writes a new one
    await asyncio.to_thread(stack.restart_extproc)
    assert (await chat(http, stack, "guard-b")).status == 200


async def test_deploy_base_role_covers_every_call_the_extproc_made(
        stack: LocalStack, http: aiohttp.ClientSession) -> None:
    await exercise(stack, http)
    record = await asyncio.to_thread(extproc_calls, stack)
    done = {(r["verb"], r["resource"], r["subresource"] or "") for r in record}
    # the record is not vacuous: watching, swapping, reporting and telling all happened
    assert {("watch", "modelpools", ""), ("patch", "modelpools", "status"),
            ("create", "events", "")} <= done, sorted(done)
    assert any(verb == "patch" and res == "inferenceservices" for verb, res, _ in done)
    assert any(verb in ("list", "watch") and res == "pods" for verb, res, _ in done)
    # ... and the Leases lived: written, renewed, deleted on the leave, all in the stack's
    # namespace (the one the Leases' Role is moved to)
    assert {("create", "leases", ""), ("update", "leases", ""), ("delete", "leases", "")} \
        <= done, sorted(done)
    assert {r["namespace"] for r in record if r["resource"] == "leases"} == {NAMESPACE}

    rbac = load_deploy_helper("rbac")
    roles = extproc_roles(NAMESPACE)
    missing = rbac.rbac_covers(roles, record)
    assert missing == [], [str(m) for m in missing]
    # ... and nothing more: every grant was used.
    assert rbac.rbac_excess(roles, record) == []

