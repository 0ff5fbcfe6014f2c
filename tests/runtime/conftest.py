"""Fixtures of the runtime tests."""

from __future__ import annotations

import pytest

from extproc.policy.machine import PoolMachine


@pytest.fixture
def passes(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts every pass of every pool's machine, by pool name."""
    counted: dict[str, int] = {}
    handle = PoolMachine.handle

    def counting(machine: PoolMachine, event, now: float):
        counted[machine.spec.key.name] = counted.get(machine.spec.key.name, 0) + 1
        return handle(machine, event, now)

    monkeypatch.setattr(PoolMachine, "handle", counting)
    return counted
