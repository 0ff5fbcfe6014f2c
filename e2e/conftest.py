"""End-to-end fixtures: one LocalStack per test module, and the RBAC record for deploy tests.

Tests of one module share a stack and use separate pools, so they neither interfere nor need
resetting between tests. Helpers live in e2e_support.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

import aiohttp
import pytest

from devstack.stack import LocalStack
from devstack.testkit import seed_from_env
from e2e_support import client, extproc_calls, start_stack

RBAC_RECORD_ENV = "MODELPOOL_E2E_RBAC_RECORD"
# A module that sets BOTH_MODES = True runs twice: beside our own actuation, and as LLMKube's
# activator beside the stand-in for its reconciler (devstack/reconciler.py).
ACTUATIONS = ("own", "llmkube")
# The ext_proc's API calls from every stack of the session (the record file is their union).
_recorded: list[dict[str, Any]] = []


def pytest_configure(config: pytest.Config) -> None:
    """A soak round's seed (devstack/soak.py), when one is given."""
    seed_from_env()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under e2e/ carries the e2e marker (select or skip them with -m)."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.e2e)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run the modules that ask for it in both actuation modes (one stack per mode)."""
    if "actuation" in metafunc.fixturenames and getattr(metafunc.module, "BOTH_MODES", False):
        metafunc.parametrize("actuation", ACTUATIONS, scope="module")


@pytest.fixture(scope="module")
def actuation() -> str:
    """The module's actuation mode: own, unless the module runs in BOTH_MODES."""
    return "own"


def save_rbac_record(stack: LocalStack) -> None:
    """Write the ext_proc's calls so far to $MODELPOOL_E2E_RBAC_RECORD (if set) as JSON."""
    target = os.environ.get(RBAC_RECORD_ENV)
    if not target:
        return
    for call in extproc_calls(stack):
        if call not in _recorded:
            _recorded.append(call)
    Path(target).write_text(json.dumps(_recorded, indent=1), encoding="utf-8")


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
          actuation: str) -> Iterator[LocalStack]:
    """The module's stack, built from its STACK_DOCS (and optional STACK_OPTIONS)."""
    docs = request.module.STACK_DOCS
    options = {"actuation": actuation, **getattr(request.module, "STACK_OPTIONS", {})}
    started = start_stack(tmp_path_factory.mktemp("stack"), docs, **options)
    try:
        yield started
    finally:
        try:
            save_rbac_record(started)
        finally:
            started.stop()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """An HTTP client session for one test."""
    async with client() as session:
        yield session
