"""swapPolicy reclaim-down through the real stack, in both actuation modes: once the resident
has been idle for spec.reclaimAfter it is unloaded and the pool is left cold (no resident, in
the status, kubectl's table and the resident gauge), and the next request loads its member
from cold. Own mode: this service releases the slot; llmkube mode: LLMKube's reconciler (the
stand-in) does and this service follows its status.
"""

from __future__ import annotations

import asyncio

import aiohttp

from devstack.stack import LocalStack
from e2e_support import NAMESPACE, SWAP_BOUND, chat, eventually, mpool_row, pods_of, pools, \
    status, wait_resident

BOTH_MODES = True
POOL, MEMBERS = "cold", ("cold-a", "cold-b")
RECLAIM_AFTER = 2.0
STACK_DOCS = pools((POOL, list(MEMBERS), {"default": "cold-a", "swapPolicy": "reclaim-down",
                                          "reclaimAfter": f"{RECLAIM_AFTER:g}s"}))


def is_cold(stack: LocalStack) -> bool:
    """No resident or pending member, and no member with replicas or pods left."""
    st = status(stack, POOL)
    members = [stack.isvc(m, NAMESPACE) for m in MEMBERS]
    return not st.get("residentMember") and not st.get("pendingMember") \
        and st.get("phase") == "Pending" \
        and all(m["spec"].get("replicas") == 0 for m in members) \
        and not any(pods_of(stack, m) for m in MEMBERS)


async def test_an_idle_pool_goes_cold_and_the_next_request_loads_its_member(
        stack: LocalStack, http: aiohttp.ClientSession) -> None:
    first = await chat(http, stack, "cold-b")  # cold at start: b loads for it
    assert (first.status, first.served_by) == (200, "cold-b")
    await wait_resident(stack, POOL, "cold-b")

    # idle for reclaimAfter: released (the bound: the release's probes and unload, the
    # stand-in's requeue)
    await eventually(lambda: is_cold(stack), RECLAIM_AFTER + SWAP_BOUND + 6.0,
                     "the pool to go cold")
    row = await asyncio.to_thread(mpool_row, stack, POOL)
    assert row["RESIDENT"] in ("", "<none>") and row["PHASE"] == "Pending", row
    assert all(stack.metric("llmkube_modelpool_resident", pool=POOL, member=m) == 0
               for m in MEMBERS)

    # the next request, for either member, loads it from cold within its budget
    again = await chat(http, stack, "cold-a")
    assert (again.status, again.served_by) == (200, "cold-a")
    assert "x-modelpool-held-ms" in again.headers  # held while it loaded
    await wait_resident(stack, POOL, "cold-a")
    assert stack.metric("llmkube_modelpool_resident", pool=POOL, member="cold-a") == 1
