"""Fault-suite fixtures: the API history recorder around each test."""

from __future__ import annotations

from typing import AsyncIterator

import pytest_asyncio
from invariants import ApiRecorder

from devstack.stack import LocalStack
from devstack.testkit import finish_within


@pytest_asyncio.fixture
async def recorder(stack: LocalStack) -> AsyncIterator[ApiRecorder]:
    """Watches members and pods on the stack's API server for the whole test."""
    rec = await ApiRecorder(stack.kubeapi_url).start()
    try:
        yield rec
    finally:
        await finish_within(rec.stop(), 15, "the API recorder's watches to end")
