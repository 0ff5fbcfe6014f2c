"""Kubeconfig exec plugins (client.authentication.k8s.io): the cloud logins of EKS, GKE, AKS.

A kubeconfig user with ``exec`` names a command (``aws eks get-token``,
``gke-gcloud-auth-plugin``, ``kubelogin``) that prints an ExecCredential: a bearer token or a
client certificate, and usually an ``expirationTimestamp``. The protocol is small and stable,
so it is run here rather than through the ``kubernetes`` package; what matters is that it is
run again: ``Credentials`` asks for a new credential when the last one has expired or the API
server answers 401, as kubectl does. The service never runs plugins interactively (stdin is
closed): a plugin configured with ``interactiveMode: Always`` is refused with one line.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")
# A plugin that needs longer is stuck (a browser login waiting for a person, a dead network).
RUN_TIMEOUT_S = 60.0


class ExecError(Exception):
    """The exec plugin is misconfigured, failed, or printed no usable credential."""


@dataclass(frozen=True)
class ExecResult:
    """One ExecCredential's status: a token or a client certificate, and when it expires."""

    token: str = ""
    cert: str = ""  # PEM
    key: str = ""  # PEM
    expires_at: float | None = None  # Unix time; None: valid until the API server says 401


class ExecPlugin:
    """One kubeconfig user's ``exec`` section, runnable as often as credentials expire."""

    def __init__(self, spec: dict, base: Path, cluster: dict) -> None:
        self.api_version = str(spec.get("apiVersion") or "")
        if self.api_version not in API_VERSIONS:
            raise ExecError(f"exec plugin apiVersion {self.api_version!r} is not one of "
                            + ", ".join(API_VERSIONS))
        command = str(spec.get("command") or "")
        if not command:
            raise ExecError("exec plugin has no command")
        # kubectl resolves a relative command with a path separator against the kubeconfig
        self.command = str(base / command) if os.sep in command and not os.path.isabs(
            command) else command
        self.args = [str(a) for a in spec.get("args") or []]
        self.env = {str(e.get("name")): str(e.get("value") or "")
                    for e in spec.get("env") or [] if isinstance(e, dict) and e.get("name")}
        if spec.get("interactiveMode") == "Always":
            raise ExecError("exec plugin needs interactiveMode Always; the service cannot "
                            "answer prompts: log in first or use a non-interactive plugin")
        self.install_hint = str(spec.get("installHint") or "")
        info: dict[str, Any] = {"interactive": False}
        if spec.get("provideClusterInfo"):
            info["cluster"] = {k: v for k, v in (
                ("server", cluster.get("server")),
                ("tls-server-name", cluster.get("tls-server-name")),
                ("insecure-skip-tls-verify", cluster.get("insecure-skip-tls-verify")),
                ("certificate-authority-data", cluster.get("certificate-authority-data")),
                ("proxy-url", cluster.get("proxy-url")),
                ("config", _exec_extension(cluster))) if v}
        self.exec_info = json.dumps({"apiVersion": self.api_version, "kind": "ExecCredential",
                                     "spec": info})

    async def run(self) -> ExecResult:
        """Run the plugin once and read its ExecCredential; ExecError saying why it failed."""
        env = {**os.environ, **self.env, "KUBERNETES_EXEC_INFO": self.exec_info}
        try:
            proc = await asyncio.create_subprocess_exec(
                self.command, *self.args, env=env, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        except OSError as exc:
            hint = f" ({self.install_hint.strip().splitlines()[0]})" if self.install_hint else ""
            raise ExecError(f"exec plugin {self.command!r} cannot run: {exc.strerror}{hint}") \
                from None
        try:
            out, err = await asyncio.wait_for(proc.communicate(), RUN_TIMEOUT_S)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            raise ExecError(f"exec plugin {self.command!r} gave no credential within "
                            f"{RUN_TIMEOUT_S:.0f}s") from None
        if proc.returncode:
            last = (err.decode("utf-8", "replace").strip().splitlines() or [""])[-1]
            raise ExecError(f"exec plugin {self.command!r} exited {proc.returncode}: {last}")
        return self._parse(out)

    def _parse(self, out: bytes) -> ExecResult:
        """The status of the ExecCredential the plugin printed."""
        try:
            credential = json.loads(out)
            status = credential["status"]
            if not isinstance(status, dict):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            raise ExecError(f"exec plugin {self.command!r} printed no ExecCredential with a "
                            "status") from None
        if credential.get("apiVersion") != self.api_version:
            raise ExecError(f"exec plugin {self.command!r} answered apiVersion "
                            f"{credential.get('apiVersion')!r}, not {self.api_version!r}")
        token = str(status.get("token") or "")
        cert = str(status.get("clientCertificateData") or "")
        key = str(status.get("clientKeyData") or "")
        if not token and not (cert and key):
            raise ExecError(f"exec plugin {self.command!r} gave neither a token nor a client "
                            "certificate and key")
        expires = status.get("expirationTimestamp")
        return ExecResult(token=token, cert=cert, key=key,
                          expires_at=_timestamp(str(expires)) if expires else None)


def _timestamp(text: str) -> float:
    """An RFC 3339 time (``2026-01-02T03:04:05Z``) as Unix time."""
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise ExecError(f"exec plugin gave a bad expirationTimestamp {text!r}") from None


def _exec_extension(cluster: dict) -> Any:
    """The cluster's per-plugin configuration (its ``client.authentication.k8s.io/exec``
    extension), handed to the plugin as ``spec.cluster.config``."""
    for entry in cluster.get("extensions") or []:
        if isinstance(entry, dict) and entry.get("name") == "client.authentication.k8s.io/exec":
            return entry.get("extension")
    return None
