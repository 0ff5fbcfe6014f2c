"""The local stack's calls to its API server: kubectl, GETs and the request record, per user."""

from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from devstack import stack_manifests as manifests
from devstack.procs import StackError


class StackApi:
    """The API server as the stack's users see it (LocalStack's part; it sets the attributes).

    Each client of the API server gets its own kubeconfig user (``stack``, ``simulator``,
    ``modelpool-extproc``, ``llmkube-controller``), so the emulator's request record can tell
    their calls apart; a subclass against another API server overrides `_user_kubeconfig`.
    """

    kubeconfig: Path  # the `stack` user's: kubectl, these helpers
    kubeapi_url: str
    workdir: Path
    namespaces: list[str]
    members: list[tuple[str, str]]  # (namespace, member)
    pools: list[tuple[str, str]]  # (namespace, pool)

    def kubectl(self, *args: str, check: bool = True, stdin: str | None = None,
                timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        """Run kubectl against the emulator with the stack's kubeconfig; text output."""
        done = subprocess.run(["kubectl", "--kubeconfig", str(self.kubeconfig), *args],
                              input=stdin, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise StackError(f"kubectl {' '.join(args)} failed ({done.returncode}): "
                             f"{done.stderr.strip()}")
        return done

    def apply(self, docs: list[dict[str, Any]]) -> None:
        """`kubectl apply` the objects (namespaces already exist: the emulator creates them)."""
        objects = [d for d in docs if d.get("kind") != "Namespace"]
        if objects:
            self.kubectl("apply", "-f", "-", stdin=manifests.dump(objects))

    def annotate(self, member: str, key: str, value: str | None, namespace: str = "") -> None:
        """Set (or with None remove) an annotation on a member InferenceService."""
        pair = f"{key}-" if value is None else f"{key}={value}"
        self.kubectl("annotate", "isvc", member, pair, "--overwrite",
                     "-n", namespace or self.namespace_of(member))

    def namespace_of(self, member: str) -> str:
        """The namespace a member of this stack lives in."""
        return next(ns for ns, m in self.members if m == member)

    def get(self, path: str) -> Any:
        """GET an API path (``/apis/...``) from the emulator as the `stack` user; parsed JSON."""
        req = urllib.request.Request(self.kubeapi_url + path,
                                     headers={"Authorization": "Bearer stack-token"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    def pool(self, name: str, namespace: str) -> dict[str, Any]:
        """A ModelPool object as the API holds it."""
        return self.get(f"/apis/inference.llmkube.dev/v1alpha1/namespaces/{namespace}"
                        f"/modelpools/{name}")

    def isvc(self, name: str, namespace: str = "") -> dict[str, Any]:
        """A member InferenceService object as the API holds it."""
        ns = namespace or self.namespace_of(name)
        return self.get(f"/apis/inference.llmkube.dev/v1alpha1/namespaces/{ns}"
                        f"/inferenceservices/{name}")

    def api_requests(self, user: str | None = None) -> list[dict[str, Any]]:
        """The emulator's request record so far, oldest first; only `user`'s when given.

        Users are the stack's kubeconfig users: ``stack`` (kubectl, these helpers),
        ``simulator``, ``modelpool-extproc`` and (llmkube mode) ``llmkube-controller``.
        """
        query = f"?user={user}" if user is not None else ""
        return self.get(f"/_emulator/requests{query}")

    def _user_kubeconfig(self, user: str, path: Path | None = None) -> Path:
        """A copy of the emulator's kubeconfig whose user (and bearer token) is `user`."""
        config = yaml.safe_load(self.kubeconfig.read_text(encoding="utf-8"))
        config["users"] = [{"name": user, "user": {"token": f"{user}-token"}}]
        for context in config["contexts"]:
            context["context"]["user"] = user
            context["context"]["namespace"] = self.namespaces[0] if self.namespaces else "default"
        target = path or self.workdir / f"{user}.kubeconfig"
        target.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        return target

    def _pools_reconciled(self) -> bool:
        """Every pool's status is written, MetalSupported included (the reconciler's mark)."""
        try:
            statuses = [self.pool(name, ns).get("status") or {} for ns, name in self.pools]
            return all(any(c.get("type") == "MetalSupported" for c in s.get("conditions") or [])
                       for s in statuses)
        except (OSError, urllib.error.HTTPError):
            return False

    def _members_reported(self) -> bool:
        """Every member reports a phase (the simulator has reconciled it)."""
        try:
            return all((self.isvc(m, ns).get("status") or {}).get("phase")
                       for ns, m in self.members)
        except (OSError, urllib.error.HTTPError):
            return False
