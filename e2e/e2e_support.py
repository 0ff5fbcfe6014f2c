"""Helpers for the end-to-end tests: stacks, an HTTP client through Envoy, pool state readers.

Every request goes through the real Envoy to the real ext_proc, which drives simulated members
through the API emulator. Members load in LOAD_DELAY seconds to keep the suite fast.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path
from typing import Any, Callable

import aiohttp
import pytest

from devstack import envoyproc, llamacpp, testkit
from devstack.stack import LocalStack
from devstack.stack_manifests import pool_with_members
from devstack.stack_ports import Ports
from devstack.testkit import Reply

NAMESPACE = "e2e"
LOAD_DELAY = 0.8
UNLOAD_DELAY = 0.3
EXTPROC_USER = "modelpool-extproc"
# A swap here is unload + load plus watch round trips; generous for a loaded 2-core machine.
SWAP_BOUND = UNLOAD_DELAY + LOAD_DELAY + 4.0


def require_tools() -> None:
    """Skip when Envoy, kubectl or the API emulator is missing."""
    try:
        envoyproc.envoy_binary()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed")
    try:
        import devstack.kubeapi  # noqa: F401  (only checking that it is there)
    except ImportError:
        pytest.skip("the API emulator (devstack.kubeapi) is missing")


def require_llama_server() -> None:
    """Skip when llama-server is not built (`make llama-server`); under CI=true, fail."""
    try:
        llamacpp.binary()
    except FileNotFoundError as exc:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(str(exc), allow_module_level=True)


def pools(*specs: tuple[str, list[str], dict[str, Any]]) -> list[dict[str, Any]]:
    """Manifests for several pools in NAMESPACE: (name, members, pool_with_members kwargs)."""
    docs: list[dict[str, Any]] = [{"apiVersion": "v1", "kind": "Namespace",
                                   "metadata": {"name": NAMESPACE}}]
    for name, members, kwargs in specs:
        docs += pool_with_members(name, NAMESPACE, members, **kwargs)
    return docs


def start_stack(workdir: Path, docs: list[dict[str, Any]], **kwargs: Any) -> LocalStack:
    """A started LocalStack on free ports (short load delays unless overridden)."""
    require_tools()
    kwargs.setdefault("load_delay", LOAD_DELAY)
    kwargs.setdefault("unload_delay", UNLOAD_DELAY)
    members = [d["metadata"]["name"] for d in docs if d["kind"] == "InferenceService"]
    return LocalStack(workdir, docs, Ports.free(members), **kwargs).start()


def extproc_calls(stack: LocalStack) -> list[dict[str, Any]]:
    """The emulator's record of the requests the ext_proc made (its own kubeconfig user)."""
    return stack.api_requests(EXTPROC_USER)


# ---- HTTP through Envoy -------------------------------------------------------------------


def client() -> aiohttp.ClientSession:
    """A client session with a connection pool big enough for the concurrency tests."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=100))


async def chat(session: aiohttp.ClientSession, stack: LocalStack, model: str,
               **options: Any) -> Reply:
    """POST /v1/chat/completions through the stack's Envoy and read the whole answer."""
    return await testkit.chat(session, stack.url, model, **options)


# ---- waiting and reading state ------------------------------------------------------------


async def eventually(check: Callable[[], Any], timeout: float = 20.0,
                     what: str = "condition") -> Any:
    """Poll a blocking ``check`` (in a thread) until it is truthy; fail after ``timeout``."""
    return await testkit.eventually(check, timeout, what, interval=0.1, blocking=True)


def status(stack: LocalStack, pool: str) -> dict[str, Any]:
    """The ModelPool's .status as the API holds it."""
    return stack.pool(pool, NAMESPACE).get("status") or {}


def condition(stack: LocalStack, pool: str, kind: str) -> dict[str, Any]:
    """One of the pool's status conditions ({} when absent)."""
    return next((c for c in status(stack, pool).get("conditions") or [] if c["type"] == kind),
                {})


async def wait_resident(stack: LocalStack, pool: str, resident: str,
                        timeout: float = 20.0) -> None:
    """Wait until the pool's status shows `resident` resident and phase Ready."""
    def settled() -> bool:
        st = status(stack, pool)
        return st.get("residentMember") == resident and st.get("phase") == "Ready"
    await eventually(settled, timeout, f"{pool} to report {resident} resident and Ready")


def mpool_row(stack: LocalStack, pool: str) -> dict[str, str]:
    """`kubectl get mpool <pool>` as {column: cell}, cells cut at the header's column starts."""
    header, row = stack.kubectl("get", "mpool", pool, "-n", NAMESPACE).stdout.splitlines()[:2]
    names = header.split()
    starts = [header.index(name) for name in names]
    cells = [row[a:b].strip() for a, b in zip(starts, starts[1:] + [len(row) + 1])]
    return dict(zip(names, cells))


async def kubectl_shows(stack: LocalStack, pool: str, resident: str, phase: str) -> None:
    """Assert on kubectl's own table: the RESIDENT and PHASE columns of the pool."""
    row = await asyncio.to_thread(mpool_row, stack, pool)
    assert (row["RESIDENT"], row["PHASE"]) == (resident, phase), row


def pods_of(stack: LocalStack, member: str) -> list[str]:
    """Names of the member's pods in the API (terminating ones included)."""
    listing = stack.get(f"/api/v1/namespaces/{stack.namespace_of(member)}/pods"
                        f"?labelSelector=inference.llmkube.dev/service%3D{member}")
    return [p["metadata"]["name"] for p in listing["items"]]


def notices(stack: LocalStack, pool: str, kind: str = "SwapCompleted") -> list[dict[str, Any]]:
    """The ext_proc's swap notices of one kind for one pool."""
    return [n for n in stack.swap_notices() if n.get("pool") == pool and n["event"] == kind]


def timeline(stack: LocalStack, member: str, kind: str | None = None) -> list[dict[str, Any]]:
    """The simulator's timeline entries for one member (optionally of one kind)."""
    return [e for e in stack.timeline()
            if e["member"] == member and (kind is None or e["event"] == kind)]
