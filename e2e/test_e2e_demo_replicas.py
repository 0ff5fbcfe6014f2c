"""`MODELPOOL_DEMO_REPLICAS=N make demo`: one line per replica, a killed replica is started
again while the others serve, and Ctrl-C still leaves nothing behind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from devstack.__main__ import parse_args
from test_e2e_demo import demo, leftovers

LINE = re.compile(r"^replica (replica-\d) pid (\d+) grpc 127\.0\.0\.1:(\d+) "
                  r"metrics http://127\.0\.0\.1:(\d+)/metrics$")
STARTUP = 60.0  # the whole stack on a loaded 2-core machine
REPLICAS = 2


def read_until(proc: subprocess.Popen[str], marker: str, timeout: float) -> list[str]:
    """The demo's output lines up to the first one containing ``marker``."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    lines = []
    for line in proc.stdout:  # bounded: the demo prints the marker, or we stop at the deadline
        lines.append(line.rstrip("\n"))
        if marker in line or time.monotonic() > deadline:
            break
    assert any(marker in line for line in lines), "\n".join(lines)
    return lines


def test_replicas_come_from_the_environment_and_must_be_a_count(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("MODELPOOL_DEMO_REPLICAS", "3")
    assert parse_args(["demo"]).replicas == 3
    assert parse_args(["demo", "--replicas", "2"]).replicas == 2  # the flag wins
    monkeypatch.delenv("MODELPOOL_DEMO_REPLICAS")
    assert parse_args(["demo"]).replicas == 1
    for bad in ("0", "two"):
        with pytest.raises(SystemExit):
            parse_args(["demo", "--replicas", bad])
        assert "MODELPOOL_DEMO_REPLICAS" in capsys.readouterr().err


def test_a_killed_replica_is_started_again_and_the_demo_serves_meanwhile(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODELPOOL_DEMO_REPLICAS", str(REPLICAS))  # as `make demo` passes it
    proc = demo(tmp_path)
    try:
        lines = read_until(proc, "Swaps as they happen", STARTUP)
        replicas = [m.groups() for m in map(LINE.match, lines) if m]
        assert [r[0] for r in replicas] == [f"replica-{i}" for i in range(REPLICAS)]
        assert len({r[2] for r in replicas}) == len({r[3] for r in replicas}) == REPLICAS
        args = list(proc.args)  # type: ignore[arg-type]
        listen = args[args.index("--port") + 1]
        name, pid = replicas[1][0], int(replicas[1][1])
        os.kill(pid, signal.SIGKILL)
        said = read_until(proc, f"replica {name} (pid {pid}) exited with code -9", 20)
        with urllib.request.urlopen(f"http://127.0.0.1:{listen}/v1/models", timeout=10) as resp:
            assert resp.status == 200  # the other replica serves
        again = read_until(proc, f"replica {name} pid ", 30)[-1]
        match = LINE.match(again)
        assert match and match.group(2) != str(pid), said + [again]
        assert match.group(3, 4) == replicas[1][2:]  # same ports
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    assert "Stopped; nothing left running." in out
    assert leftovers(tmp_path) == []
