"""The LocalStack itself: whatever happened to its pieces, stop() leaves no process behind."""

from __future__ import annotations

import os
from pathlib import Path

from devstack.stack import LocalStack
from devstack.testkit import eventually
from e2e_support import pools, start_stack, wait_resident


def processes_logging_into(directory: Path) -> list[int]:
    """Live processes whose stdout is a file under `directory` (every piece of a stack)."""
    found = []
    for fd in Path("/proc").glob("[0-9]*/fd/1"):
        try:
            if os.readlink(fd).startswith(str(directory)):
                found.append(int(fd.parent.parent.name))
        except OSError:
            continue
    return found


async def test_stop_reaps_member_servers_of_a_killed_simulator(tmp_path: Path) -> None:
    stack: LocalStack = start_stack(tmp_path, pools(("solo", ["solo-a", "solo-b"],
                                                     {"default": "solo-a"})))
    try:
        await wait_resident(stack, "solo", "solo-a")
        # solo-a's fake model server, and each member's standby (its next server, idle)
        before = processes_logging_into(stack.log_dir / "members")
        assert len(before) == 3
        stack.kill("simulator")  # its member server is orphaned, still serving
        # the standbys see their parent gone (end of their stdin) and leave
        [server] = await eventually(
            lambda: (left := processes_logging_into(stack.log_dir / "members")) and
            len(left) == 1 and left, timeout=10, what="only the serving member left")
        assert server in before
    finally:
        stack.stop()
    assert stack.exited() == ["kubeapi", "simulator", "proberouter", "extproc", "envoy"]
    assert processes_logging_into(tmp_path) == []
