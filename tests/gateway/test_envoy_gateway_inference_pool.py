"""An HTTPRoute whose backend is an InferencePool (deploy/overlays/inference-pool) through
Envoy Gateway v1.9.1's translator: what it makes of it alone, and a real swap through its
translation completed as its InferencePool extension completes it (inference_extension.py).
"""

from __future__ import annotations

import asyncio
import functools
import time
from pathlib import Path
from typing import Iterator

import aiohttp
import pytest
import yaml

from devstack.stack import LocalStack
from devstack.stack_manifests import member
from devstack.testkit import chat
from e2e.e2e_support import SWAP_BOUND, notices, start_stack, timeline
from extproc.protocol.picker import DESTINATION
from tests.deploy.conftest import render_path
from tests.gateway.conftest import require_egctl
from tests.gateway.egctl import EXAMPLE_POOL, ExamplePool, translate, translation_input
from tests.reliability import certs
from tests.gateway.inference_extension import (OVERLAY, inference_gateway, pool_routes,
                                               translated)

pytestmark = [pytest.mark.envoy]


def test_egctl_cannot_read_an_inference_pool(pool: ExamplePool, tmp_path: Path) -> None:
    require_egctl()
    with pytest.raises(RuntimeError, match='no kind "InferencePool" is registered'):
        translate(translation_input(render_path(OVERLAY), pool), tmp_path)


def test_alone_envoy_gateway_leaves_the_backend_unresolved(pool: ExamplePool,
                                                          tmp_path: Path) -> None:
    translation = translated(tmp_path)
    conditions = {c["type"]: c for parent in
                  translation.status_of("httpRoutes", pool.name)["parents"]
                  for c in parent["conditions"]}
    assert conditions["Accepted"]["status"] == "True"
    assert (conditions["ResolvedRefs"]["status"], conditions["ResolvedRefs"]["reason"]) == \
        ("False", "InvalidKind")
    (dump,) = translation.xds.values()
    routes = pool_routes(dump)
    assert routes and all(r.get("directResponse") == {"status": 500} for r in routes)


@pytest.fixture
def stack(pool: ExamplePool, tmp_path: Path) -> Iterator[LocalStack]:
    """The example pool on the local stack behind the completed translation, members cold;
    the ext_proc serves TLS, which the extension dials without verifying it."""
    if not certs.available():
        pytest.skip("the openssl CLI is not installed (the picker's TLS certificate)")
    ca = certs.make_ca(tmp_path, "ca")
    leaf = certs.make_leaf(tmp_path, "picker", ca, "serverAuth")
    docs = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": pool.namespace}}]
    docs += [member(name, pool.namespace) for name in pool.members]
    docs.append(yaml.safe_load(EXAMPLE_POOL.read_text(encoding="utf-8")))
    started = start_stack(tmp_path / "stack", docs, endpoint_picker=True,
                          gateway=functools.partial(inference_gateway, tls=True),
                          extproc_args=["--no-park-timeout-override", "--tls-cert",
                                        str(leaf.cert), "--tls-key", str(leaf.key)])
    try:
        yield started
    finally:
        started.stop()


@pytest.mark.e2e
async def test_a_cross_model_request_is_parked_through_a_real_load(
        stack: LocalStack, pool: ExamplePool) -> None:
    target = next(m for m in pool.members if m != pool.default)
    async with aiohttp.ClientSession() as http:
        deadline = time.monotonic() + SWAP_BOUND
        while not notices(stack, pool.name):  # the cold pool warms its default
            assert time.monotonic() < deadline, "the default never became resident"
            await asyncio.sleep(0.1)
        # a client naming the default's pod for the other member is not listened to
        spoofed = {DESTINATION: stack.member_address(pool.default)}
        reply = await chat(http, stack.url, target, headers=spoofed)
    assert (reply.status, reply.served_by) == (200, target), reply.body
    [swap] = [n for n in notices(stack, pool.name) if n["target"] == target]
    assert (swap["source"], swap["released"]) == (pool.default, 1)
    [gone] = timeline(stack, pool.default, "pod_deleted")
    [created] = timeline(stack, target, "pod_created")
    assert gone["t"] < created["t"] < reply.ended
