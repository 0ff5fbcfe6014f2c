"""The whole service on the Kubernetes platform against the emulator: what its health answers
through an API server outage, and what its membership Lease says when it stops.

The kubelet is played by a loop that asks the gRPC health services the shipped manifests name,
at their periods scaled down as the Lease settings are (production: a 10 s Lease; here 2 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc
from kube_helpers import NS, eventually, isvc, modelpool

from extproc.app import Service
from extproc.names import PAYLOAD_ANNOTATION
from extproc.platform.kube.membership import Load, Membership
from extproc.settings import Settings

DEPLOYMENT = Path(__file__).resolve().parents[2] / "deploy" / "base" / "deployment.yaml"
SERVING = health_pb2.HealthCheckResponse.SERVING
# Production's membership Lease is 10 s renewed every 2 s with a 2 s margin; the test runs
# the same shape five times faster, and plays the kubelet's probe periods five times faster.
SCALE = 5.0
FAST = dict(membership_lease_duration=2.0, membership_renew=0.4, lease_margin=0.4,
            leader_lease_duration=3.0, leader_renew_deadline=2.0, leader_retry=0.4,
            api_retry_max=0.5)


def _probes() -> dict[str, dict[str, Any]]:
    """The kustomize base's probes by kind (the chart's agree: tests/deploy)."""
    pod = yaml.safe_load(DEPLOYMENT.read_text())["spec"]["template"]["spec"]
    container = next(c for c in pod["containers"] if c["name"] == "extproc")
    return {kind: container[f"{kind}Probe"] for kind in ("readiness", "liveness")}


@contextlib.asynccontextmanager
async def _service(emulator: Any, **overrides: Any) -> AsyncIterator[Service]:
    emulator.create("inferenceservices", isvc("a", replicas=1, phase="Ready"))
    emulator.create("inferenceservices", isvc("b", replicas=0, phase="Stopped"))
    emulator.create("modelpools", modelpool("slot", ["a", "b"]))
    settings = Settings(kubeconfig=str(emulator.kubeconfig), namespaces=[NS],
                        lease_namespace=NS, replica_name="r1", listen="127.0.0.1:0",
                        metrics_listen="", **{**FAST, **overrides})
    service = Service(settings)
    await service.start()
    try:
        await asyncio.wait_for(service.platform.synced.wait(), 10)
        yield service
    finally:
        if not service._stopping:  # (a test may have stopped it itself)
            await service.stop()


async def _status(stub: Any, name: str, timeout: float = 2.0) -> int:
    try:
        answer = await stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=timeout)
    except grpc.aio.AioRpcError:
        return -1  # unanswered: a failed probe
    return answer.status


class Kubelet:
    """Asks one probe's service every scaled period; a restart after failureThreshold
    failures in a row, readiness dropped after its own."""

    def __init__(self, stub: Any, probe: dict[str, Any]) -> None:
        self.stub, self.service = stub, probe["grpc"].get("service", "")
        self.period = probe.get("periodSeconds", 10) / SCALE
        self.threshold = probe.get("failureThreshold", 3)
        # the kubelet's own timeout, not scaled: a slow answer on a busy machine is no failure
        # of what is tested here
        self.timeout = max(2.0, probe.get("timeoutSeconds", 1))
        self.answers: list[int] = []
        self.tripped = False  # failureThreshold failures in a row were seen
        self._run_of_failures = 0

    async def run(self) -> None:
        """Probe until cancelled."""
        while True:
            status = await _status(self.stub, self.service, self.timeout)
            self.answers.append(status)
            self._run_of_failures = 0 if status == SERVING else self._run_of_failures + 1
            self.tripped |= self._run_of_failures >= self.threshold
            await asyncio.sleep(self.period)


async def test_api_outage_restarts_no_replica_and_readiness_follows_the_lease(
        emulator: Any) -> None:
    probes = _probes()
    async with _service(emulator) as service:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            ready = probes["readiness"]["grpc"].get("service", "")

            async def serving() -> bool:
                return await _status(stub, ready) == SERVING
            await eventually(serving, 10, "readiness SERVING after the sync")
            await eventually(lambda: service.hub.admit_until > time.monotonic(), 10,
                             "the membership Lease")
            liveness = Kubelet(stub, probes["liveness"])
            readiness = Kubelet(stub, probes["readiness"])
            tasks = [asyncio.create_task(k.run()) for k in (liveness, readiness)]
            try:
                emulator.set_unavailable(True)
                # the Lease lapses (duration - margin after the last renew); from then the
                # outage lasts longer than the kubelet needs to restart on failed liveness
                started = time.monotonic()
                await eventually(lambda: readiness.tripped, 4 * FAST["membership_lease_duration"],
                                 "readiness NOT_SERVING once the Lease lapsed")
                lapsed, asked_before = time.monotonic() - started, len(liveness.answers)
                restart_window = liveness.period * liveness.threshold
                await asyncio.sleep(1.5 * restart_window)
                outage = time.monotonic() - started
                asked_while_lapsed = len(liveness.answers) - asked_before
                emulator.set_unavailable(False)
                await eventually(lambda: readiness.answers[-1] == SERVING, 20,
                                 "readiness SERVING again after the outage")
            finally:
                emulator.set_unavailable(False)
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
    assert outage > lapsed + restart_window
    # the kubelet asked liveness more than failureThreshold times while readiness was down
    assert asked_while_lapsed > liveness.threshold, asked_while_lapsed
    assert not liveness.tripped and set(liveness.answers) == {SERVING}, liveness.answers


async def _routed_stream(port: int) -> tuple[grpc.aio.Channel, Any]:
    """One request for member a routed and left open, as Envoy keeps it while the response
    streams."""
    from reliability.grpcprobe import body_message, headers_message, open_process

    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    call = open_process(channel)
    await call.write(headers_message())
    assert (await call.read()).HasField("request_headers")
    await call.write(body_message(b'{"model": "a"}'))
    answer = await call.read()
    assert answer.HasField("request_body"), answer
    return channel, call


def _membership(emulator: Any) -> Any:
    return next((lease for lease in emulator.list("leases", NS)
                 if lease["metadata"]["name"] == "modelpool-extproc-r1"), None)


@pytest.mark.parametrize("server", ["native", "grpcio"])
async def test_streams_cut_at_shutdown_leave_the_lease_to_lapse(emulator: Any, api: Any,
                                                                 server: str) -> None:
    peer = Membership(api, NS, "r2", Load, Settings(**FAST))
    await peer.start()
    try:
        async with _service(emulator, shutdown_grace=0.5, grpc_server=server) as service:
            await eventually(lambda: service.hub.admit_until > time.monotonic(), 10,
                             "the membership Lease")
            channel, call = await _routed_stream(service.grpc_port)
            try:
                await service.stop()
            finally:
                call.cancel()
                await channel.close()
        # cut while Envoy may still relay the response: no clean leave, the Lease lapses
        lease = _membership(emulator)
        assert lease is not None
        load = json.loads(lease["metadata"]["annotations"][PAYLOAD_ANNOTATION])
        assert load["pools"][f"{NS}/slot"]["inFlight"] == {"a": 1}, load
        # and the other replica counts it lost, its counts unknown (not gone: none in flight)
        [lost] = await eventually(lambda: [p for p in peer.peers() if p.identity == "r1"
                                           and p.lost], 20, "r1 lost to its peer")
        assert lost.pools is None
    finally:
        await peer.stop()


async def test_drained_shutdown_deletes_the_lease(emulator: Any) -> None:
    async with _service(emulator, shutdown_grace=5.0) as service:
        await eventually(lambda: _membership(emulator) is not None, 10, "the membership Lease")
        channel, call = await _routed_stream(service.grpc_port)
        stopping = asyncio.create_task(service.stop())
        await asyncio.sleep(0.3)
        await call.done_writing()  # the response ended within the grace
        await stopping
        await channel.close()
    assert _membership(emulator) is None
