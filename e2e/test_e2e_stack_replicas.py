"""The LocalStack with two ext_proc replicas: Envoy spreads requests over both, and one replica
killed, paused, terminated or cut off the API leaves the stack serving.

Stack mechanics only: every request here is for the resident default member, so the replicas
need not coordinate (that is the service's side, tested with the HA scenarios).
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import aiohttp

from devstack.stack import LocalStack
from devstack.stack_replicas import Replica
from e2e_support import chat, eventually, pools, start_stack, wait_resident
from test_e2e_stack import processes_logging_into

POOL, MEMBER = "twice", "twice-a"
STACK_DOCS = pools((POOL, [MEMBER, "twice-b"], {"default": MEMBER}))
STACK_OPTIONS = {"replicas": 2, "api_proxies": True}
REQUESTS = 8  # round robin over two replicas: four each
HEALTH = 10.0  # Envoy checks every 0.5 s; room for a loaded machine


async def served(http: aiohttp.ClientSession, stack: LocalStack, count: int = REQUESTS) -> None:
    """``count`` requests through Envoy, each answered 200 by the member."""
    for _ in range(count):
        reply = await chat(http, stack, MEMBER)
        assert (reply.status, reply.served_by) == (200, MEMBER), reply


def decided(replica: Replica) -> float:
    """How many requests the replica decided (all runs since its last start)."""
    return replica.metric("modelpool_extproc_requests_total", pool=POOL)


async def envoy_sends(stack: LocalStack, replica: Replica, expected: bool) -> None:
    """Wait until Envoy's health checks say ``expected`` for the replica."""
    await eventually(lambda: stack.envoy_sends_to()[replica.name] is expected, HEALTH,
                     f"Envoy to {'send' if expected else 'stop sending'} to {replica.name}")


async def test_replicas_have_their_own_names_ports_logs_and_api_links(
        stack: LocalStack, http: aiohttp.ClientSession) -> None:
    first, second = stack.replicas
    assert (first.name, second.name) == ("replica-0", "replica-1")
    assert first.pid != second.pid and first.grpc_port != second.grpc_port
    assert stack.replica(0) is first and first.metrics_url == stack.metrics_url
    assert first.log_path.name == "extproc-replica-0.log" and second.log_path.exists()
    assert second.line() == (f"replica replica-1 pid {second.pid} grpc 127.0.0.1:"
                             f"{second.grpc_port} metrics http://127.0.0.1:"
                             f"{second.metrics_port}/metrics")
    for replica in stack.replicas:
        assert replica.proxy is not None and replica.proxy.stats.forwarded >= 1
    assert stack.envoy_sends_to() == {"replica-0": True, "replica-1": True}


async def test_requests_through_envoy_reach_both_replicas(
        stack: LocalStack, http: aiohttp.ClientSession) -> None:
    await served(http, stack, 1)  # the cold load
    await wait_resident(stack, POOL, MEMBER)
    before = [decided(r) for r in stack.replicas]
    await served(http, stack)
    after = [decided(r) for r in stack.replicas]
    assert all(a > b for a, b in zip(after, before)), (before, after)
    assert sum(after) - sum(before) == REQUESTS
    assert stack.metric("modelpool_extproc_requests_total", pool=POOL) == sum(after)


async def test_a_killed_replica_leaves_the_stack_serving_and_restarts_as_itself(
        stack: LocalStack, http: aiohttp.ClientSession) -> None:
    replica = stack.replica(1)
    pid, ports = replica.pid, (replica.grpc_port, replica.metrics_port)
    assert await asyncio.to_thread(replica.kill) == -signal.SIGKILL
    assert stack.exited() == [replica.piece]
    await envoy_sends(stack, replica, False)
    await served(http, stack)

    await asyncio.to_thread(replica.restart, 30.0)
    assert replica.pid != pid and (replica.grpc_port, replica.metrics_port) == ports
    await envoy_sends(stack, replica, True)
    await served(http, stack)
    assert decided(replica) > 0 and stack.exited() == []


async def test_a_paused_replica_gets_no_streams_until_resumed(
        stack: LocalStack, http: aiohttp.ClientSession) -> None:
    replica = stack.replica(0)
    await asyncio.to_thread(replica.pause)
    try:
        assert replica.running and not replica.live
        await envoy_sends(stack, replica, False)  # its health checks time out
        await served(http, stack)
    finally:
        await asyncio.to_thread(replica.resume)
    await envoy_sends(stack, replica, True)
    before = decided(replica)
    await served(http, stack)
    assert decided(replica) > before


async def test_a_terminated_replica_exits_cleanly_and_starts_again(
        stack: LocalStack, http: aiohttp.ClientSession) -> None:
    replica = stack.replica(1)
    assert await asyncio.to_thread(replica.terminate) == 0
    await envoy_sends(stack, replica, False)
    await served(http, stack)
    await asyncio.to_thread(stack.start_extproc)  # starts only what is not running
    await envoy_sends(stack, replica, True)
    await served(http, stack)


async def test_a_replica_cut_off_the_api_keeps_its_link_broken_until_restored(
        stack: LocalStack, http: aiohttp.ClientSession) -> None:
    replica = stack.replica(1)
    proxy = replica.proxy
    assert proxy is not None
    await asyncio.to_thread(proxy.cut)
    forwarded = proxy.stats.forwarded
    await served(http, stack)  # the resident-hit path makes no API call
    # its watches, reset by the cut, try again and hang in the black hole
    await eventually(lambda: proxy.stats.black_holed > 0, 20.0,
                     f"{replica.name} to try the API while cut off")
    assert proxy.stats.forwarded == forwarded  # nothing it tried reached the API

    await asyncio.to_thread(proxy.restore)
    # the black-holed connections are reset at the restore: it connects anew
    await eventually(lambda: proxy.stats.forwarded > forwarded, 20.0,
                     f"{replica.name} to reach the API again")
    await served(http, stack)


def test_stop_leaves_nothing_behind_with_a_replica_paused_and_one_cut_off(tmp_path: Path) -> None:
    own: LocalStack = start_stack(tmp_path, pools(("lone", ["lone-a"], {"default": "lone-a"})),
                                  **STACK_OPTIONS)
    try:
        own.replica(0).pause()
        assert own.replica(1).proxy is not None
        own.replica(1).proxy.cut()
    finally:
        own.stop()
    assert sorted(own.exited()) == sorted(["kubeapi", "simulator", "proberouter",
                                           "extproc-replica-0", "extproc-replica-1", "envoy"])
    assert processes_logging_into(tmp_path) == []
    assert not any(r.proxy is None or r.proxy.running for r in own.replicas)
