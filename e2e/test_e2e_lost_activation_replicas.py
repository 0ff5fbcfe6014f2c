"""A lost activation (issue 20) in llmkube mode, three replicas: both reproductions end served.

The same scenarios as test_e2e_lost_activation.py (lost_activation.py) behind three ext_proc
replicas: any of them may have triggered, any may hold the target's request or its retry, and
the one that gets the resident's request must admit it.
"""

from __future__ import annotations

import aiohttp

from devstack.stack import LocalStack
from e2e_support import pools
from lost_activation import paused_reconciler, pool_spec, stale_pass

STACK_OPTIONS = {"actuation": "llmkube", "replicas": 3}
STACK_DOCS = pools(pool_spec("stale3"), pool_spec("paused3"))


async def test_an_activation_lost_by_a_stale_pass_ends_served(
        stack: LocalStack, http: aiohttp.ClientSession) -> None:
    await stale_pass(stack, http, "stale3")


async def test_an_activation_undone_while_the_reconciler_is_paused_ends_served(
        stack: LocalStack, http: aiohttp.ClientSession) -> None:
    await paused_reconciler(stack, http, "paused3")
