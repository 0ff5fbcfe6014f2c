"""Every attack of devstack/h2attacks.py against `serve` (uvloop, the native server), each for
two seconds from a process of its own, while a healthy client checks health every 20 ms: no
probe of it is lost, every connection it opens meanwhile gets in, and the server still
answers once the attack is over. How long the
probes took, and what each attack cost the server, is `make bench`'s (bench/attacks.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from devstack.h2attacks import ATTACKS, Prober, launch
from devstack.procs import LOCALHOST, PROJECT_ROOT, free_port, wait_for_port

ATTACK_SECONDS = 2.0
POOLS = "pools:\n- name: shared-gpu\n  namespace: demo\n  members: [judge, coder]\n"


def start_serve(tmp: Path, *flags: str) -> tuple[subprocess.Popen, int]:
    """`modelpool-extproc serve` on a pools file, on a free loopback port."""
    pools = tmp / "pools.yaml"
    pools.write_text(POOLS, encoding="utf-8")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "extproc", "serve", "--pools-file", str(pools),
         "--listen", f"{LOCALHOST}:{port}", "--metrics-listen", "", *flags],
        cwd=PROJECT_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_port(LOCALHOST, port, timeout=30)
    return proc, port


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """One server for every attack: each must leave it as able as it found it."""
    proc, port = start_serve(tmp_path_factory.mktemp("attacks"))
    yield port
    proc.terminate()
    proc.wait(timeout=30)


def serving(port: int) -> bool:
    """Whether a fresh connection gets SERVING from the health service."""
    with grpc.insecure_channel(f"{LOCALHOST}:{port}") as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(),
                                                          timeout=10)
    return reply.status == health_pb2.HealthCheckResponse.SERVING


# 50,000 streams over 100 connections are as many requests' work, done in fair turns with the
# prober's: it is answered, slowly (its memory is what bench/attacks.py measures)
SLOW_ON_PURPOSE = {"fifty-thousand-streams-spread"}


@pytest.mark.parametrize("attack", sorted(set(ATTACKS) - SLOW_ON_PURPOSE))
def test_no_healthy_probe_is_lost_under_attack(server: int, attack: str) -> None:
    with Prober(f"{LOCALHOST}:{server}") as prober:
        time.sleep(0.2)  # a few probes before
        attacker = launch(attack, LOCALHOST, server, ATTACK_SECONDS)
        try:
            attacker.wait(timeout=ATTACK_SECONDS + 30)
        finally:
            attacker.kill()
            attacker.wait()
    assert prober.lost == [], f"{len(prober.lost)} probes lost under {attack}: {prober.lost[:5]}"
    assert len(prober.latencies) >= 10  # it probed throughout
    # and every connection a well-behaved client opened meanwhile got in
    assert prober.fresh_failed == [], f"fresh connections failed: {prober.fresh_failed}"
    assert serving(server)


def test_sigterm_during_a_flood_stops_within_the_grace(tmp_path: Path) -> None:
    proc, port = start_serve(tmp_path, "--shutdown-grace", "1s")
    attacker = launch("tiny-frames", LOCALHOST, port, 20)
    try:
        time.sleep(1.0)  # the flood under way
        proc.send_signal(signal.SIGTERM)
        # a bound for a wedged loop, not a measured time: the grace is 1 s
        assert proc.wait(timeout=15) == 0
    finally:
        attacker.kill()
        attacker.wait()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
