"""Two ext_proc replicas as one InferencePool's endpoint picker (the picker's Service backed by
two pods): Envoy spreads the streams over both, each names the pod of the member its request
asks for (holding it while the pool's leader swaps the slot), and with a replica SIGKILLed the
other answers everything.
"""

from __future__ import annotations

import asyncio

import aiohttp

from devstack.stack import LocalStack
from e2e_support import chat, eventually, pools, wait_resident

STACK_DOCS = pools(("pr", ["pr-a", "pr-b"], {"default": "pr-a"}))
STACK_OPTIONS = {"endpoint_picker": True, "replicas": 2}


def leader(stack: LocalStack) -> str:
    """The replica holding the replica set's leader Lease ("" if none)."""
    lease = stack.get(f"/apis/coordination.k8s.io/v1/namespaces/{stack.lease_namespace}/leases/"
                      "modelpool-extproc-leader")
    return (lease.get("spec") or {}).get("holderIdentity") or ""


async def test_two_pickers_route_every_request_and_outlive_one_of_them(
        stack: LocalStack, http: aiohttp.ClientSession) -> None:
    await wait_resident(stack, "pr", "pr-a")
    for model in ("pr-a", "pr-b", "pr-a"):  # each a swap but the first, through either picker
        replies = await asyncio.gather(*(chat(http, stack, model) for _ in range(4)))
        assert [(r.status, r.served_by) for r in replies] == [(200, model)] * 4, \
            [r.body for r in replies]
    # both replicas decided some of them: Envoy round-robins the picker's streams
    decided = [r.metric("modelpool_extproc_requests_total") for r in stack.replicas]
    assert all(count > 0 for count in decided), decided
    victim = next(r for r in stack.replicas if r.name == leader(stack))
    victim.kill()
    await eventually(lambda: leader(stack) not in ("", victim.name), timeout=60,
                     what="the other replica to take the pool's lead")
    for model in ("pr-b", "pr-a"):
        replies = await asyncio.gather(*(chat(http, stack, model) for _ in range(4)))
        assert [(r.status, r.served_by) for r in replies] == [(200, model)] * 4, \
            [r.body for r in replies]
