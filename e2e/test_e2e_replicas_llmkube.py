"""Three replicas as LLMKube's activator (llmkube mode): no leader is elected (LLMKube's
reconciler actuates), any replica may trigger, and every replica holds the incumbent's new
requests once a swap is under way. The slot stays exclusive and every write is a guarded
0 -> 1 trigger."""

from __future__ import annotations

import asyncio

import aiohttp

from devstack.stack import LocalStack
from e2e_support import NAMESPACE, chat, extproc_calls, pools, wait_resident
from faults.invariants import ApiRecorder, exclusive_slot

STACK_OPTIONS = {"actuation": "llmkube", "replicas": 3}
STACK_DOCS = pools(("lk", ["lk-a", "lk-b"], {"default": "lk-a"}))


async def test_any_replica_triggers_and_nobody_leads(stack: LocalStack,
                                                     http: aiohttp.ClientSession) -> None:
    await wait_resident(stack, "lk", "lk-a", timeout=30)
    recorder = await ApiRecorder(stack.kubeapi_url).start()
    try:
        for member in ("lk-b", "lk-a", "lk-b"):
            # a burst spreads over the replicas: several may trigger, one write wins
            replies = await asyncio.gather(*(chat(http, stack, member) for _ in range(6)))
            assert all((r.status, r.served_by) == (200, member) for r in replies), \
                [(r.status, r.served_by, r.body[:80]) for r in replies]
            await wait_resident(stack, "lk", member, timeout=30)
    finally:
        events = await recorder.stop()
    # A trigger is a scale-up while the incumbent runs, by design (LLMKube's reconciler holds
    # it and unloads first): the invariant here is that no two members ever have pods.
    pods_together = [v for v in exclusive_slot(events, {(NAMESPACE, "lk"): ["lk-a", "lk-b"]})
                     if ": pod " in v]
    assert pods_together == []
    listing = stack.get(f"/apis/coordination.k8s.io/v1/namespaces/{stack.lease_namespace}/leases")
    names = [item["metadata"]["name"] for item in listing["items"]]
    assert not [n for n in names if n.startswith("modelpool-extproc-leader")], names
    assert len([n for n in names if n.startswith("modelpool-extproc-replica-")]) == 3
    writes = [c for c in extproc_calls(stack) if c["verb"] in ("patch", "update", "create")
              and c["resource"] in ("inferenceservices", "modelpools")]
    assert writes and all(c["resource"] == "inferenceservices"
                          and c["body"]["spec"] == {"replicas": 1} for c in writes), writes
