"""A lost activation (issue 20) in llmkube mode, one replica: both reproductions end served.

LLMKube's reconciler sometimes drops our trigger and settles back on the resident; the service
must notice and trigger again (scenarios in lost_activation.py). Until it does, these fail:
the target's request and its retries get 503 while nothing swaps, and the resident's request
is held for the whole budget.
"""

from __future__ import annotations

import aiohttp

from devstack.stack import LocalStack
from e2e_support import pools
from lost_activation import paused_reconciler, pool_spec, stale_pass

STACK_OPTIONS = {"actuation": "llmkube"}
STACK_DOCS = pools(pool_spec("stale"), pool_spec("paused"))


async def test_an_activation_lost_by_a_stale_pass_ends_served(
        stack: LocalStack, http: aiohttp.ClientSession) -> None:
    await stale_pass(stack, http, "stale")


async def test_an_activation_undone_while_the_reconciler_is_paused_ends_served(
        stack: LocalStack, http: aiohttp.ClientSession) -> None:
    await paused_reconciler(stack, http, "paused")
