"""deploy/base's Role allows exactly the ext_proc's real API calls, as the emulator recorded them.

The stack gives the ext_proc its own kubeconfig user, so the emulator's record separates its
calls from the simulator's and kubectl's. The test drives every kind of work the service does
against the API (warm-up, swap, failed load, lost member) before checking the record.
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

STACK_DOCS = pools(("guard", ["guard-a", "guard-b", "guard-bad"],
                    {"default": "guard-a",
                     "member_annotations": {"guard-bad": {"sim.llmkube.dev/fail": "true"}}}))


def load_rbac_helpers() -> ModuleType:
    """tests/deploy/rbac.py, loaded by path (tests/ is not a package)."""
    path = PROJECT_ROOT / "tests" / "deploy" / "rbac.py"
    spec = importlib.util.spec_from_file_location("deploy_rbac", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def extproc_role(namespace: str) -> dict[str, Any]:
    """The Role deploy/base grants the service, moved to the namespace the stack watches.

    The base installs into `llm` and runs the service with --namespace llm; the stack does the
    same with its own namespace, so the Role keeps its scope (no cluster-wide calls pass).
    """
    rendered = subprocess.run(["kubectl", "kustomize", str(PROJECT_ROOT / "deploy" / "base")],
                              capture_output=True, text=True, timeout=60, check=True).stdout
    roles = [d for d in yaml.safe_load_all(rendered)
             if d and d["kind"] == "Role" and d["metadata"]["name"] == "modelpool-extproc"]
    assert len(roles) == 1, "deploy/base should render exactly one Role for the service"
    role = roles[0]
    role["metadata"]["namespace"] = namespace
    return role


async def exercise(stack: LocalStack, http: aiohttp.ClientSession) -> None:
    """Make the service do each kind of API work: warm, swap, fail a load, lose a member."""
    await wait_resident(stack, "guard", "guard-a")
    assert (await chat(http, stack, "guard-b")).status == 200
    assert (await chat(http, stack, "guard-bad")).status == 503
    assert (await chat(http, stack, "guard-b")).status == 200
    await asyncio.to_thread(stack.annotate, "guard-b", "sim.llmkube.dev/kill-pod", "1")
    await eventually(lambda: notices(stack, "guard", "MemberLost"), what="MemberLost")
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

    rbac = load_rbac_helpers()
    role = extproc_role(NAMESPACE)
    missing = rbac.rbac_covers([role], record)
    assert missing == [], [str(m) for m in missing]
    # ... and nothing more: every grant was used.
    assert rbac.rbac_excess([role], record) == []

