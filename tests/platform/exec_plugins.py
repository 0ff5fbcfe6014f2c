"""Kubeconfig exec plugins for the credential tests: Python scripts that count their runs, so
a test can hand out a different credential on each run and see how often it was asked."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

V1 = "client.authentication.k8s.io/v1"


def counting_plugin(folder: Path, status: str, api_version: str = V1) -> tuple[Path, Path]:
    """A plugin printing an ExecCredential whose status is the Python expression ``status``,
    evaluated with ``n`` the run's number (1, 2, ...); (the script, the file counting runs)."""
    runs = folder / "runs"
    plugin = folder / "plugin.py"
    plugin.write_text(f"""import json, os, pathlib
info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
assert info["spec"]["interactive"] is False, info
runs = pathlib.Path({str(runs)!r})
n = int(runs.read_text()) + 1 if runs.exists() else 1
runs.write_text(str(n))
print(json.dumps({{"apiVersion": {api_version!r}, "kind": "ExecCredential",
                  "status": {status}}}))
""")
    return plugin, runs


def exec_user(plugin: Path, api_version: str = V1, **extra: Any) -> dict:
    """A kubeconfig user running ``plugin`` with this Python."""
    return {"exec": {"apiVersion": api_version, "command": sys.executable,
                     "args": [str(plugin)], "interactiveMode": "Never", **extra}}
