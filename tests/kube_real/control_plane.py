"""A real Kubernetes control plane on loopback: etcd and kube-apiserver built by `make kube-tools`.

The API server runs with generated certificates, static token authentication (an admin, the
test users), a ServiceAccount issuer and signing key (so the TokenRequest API works), RBAC
authorization and a Metadata-level JSON audit log. There is no controller manager, scheduler
or kubelet: nothing creates `default` ServiceAccounts (so the ServiceAccount admission plugin,
which would reject every pod for lack of one, is off), nothing finalizes a deleted namespace,
and a pod without a nodeName is deleted at once.

Pods are served without the watch cache (``--watch-cache-sizes pods#0``; custom resources
cannot opt out), so a pod watch reads etcd directly and a real etcd compaction reaches it as
a real 410 Gone; ModelPools and InferenceServices go through the watch cache, which is what
sends bookmarks.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from devstack.procs import LOCALHOST, PROJECT_ROOT, ManagedProcess, free_port
from pki import ServerPki, make_server_pki

BIN_DIR_ENV = "MODELPOOL_KUBE_BIN_DIR"
ADMIN = "kube-admin"
# Static-token users besides the admin: name -> groups (system:masters bypasses RBAC).
USERS: dict[str, tuple[str, ...]] = {
    ADMIN: ("system:masters",),
    "stack": ("system:masters",),
    "simulator": ("system:masters",),
    "nobody": (),
}
START_TIMEOUT = 120.0
AUDIT_POLICY = {"apiVersion": "audit.k8s.io/v1", "kind": "Policy",
                "omitStages": ["RequestReceived"], "rules": [{"level": "Metadata"}]}


def binaries() -> tuple[Path, Path]:
    """(etcd, kube-apiserver) from $MODELPOOL_KUBE_BIN_DIR or .tools/kube; FileNotFoundError."""
    directory = Path(os.environ.get(BIN_DIR_ENV) or PROJECT_ROOT / ".tools" / "kube")
    found = directory / "etcd", directory / "kube-apiserver"
    for path in found:
        if not os.access(path, os.X_OK):
            raise FileNotFoundError(f"{path} is not built: run `make kube-tools` (it builds "
                                    "etcd and kube-apiserver from the Go module proxy)")
    return found


@dataclass
class ControlPlane:
    """etcd + kube-apiserver under ``workdir``; ``start()`` then ``stop()`` (by pid, always)."""

    workdir: Path
    etcd_port: int = field(default_factory=free_port)
    etcd_peer_port: int = field(default_factory=free_port)
    port: int = field(default_factory=free_port)
    pki: ServerPki | None = None
    _procs: list[ManagedProcess] = field(default_factory=list)

    @property
    def url(self) -> str:
        """The API server's HTTPS address."""
        return f"https://{LOCALHOST}:{self.port}"

    @property
    def etcd_url(self) -> str:
        """etcd's client address (plain HTTP, loopback only)."""
        return f"http://{LOCALHOST}:{self.etcd_port}"

    @property
    def audit_log(self) -> Path:
        """The API server's JSON audit log (one event per line)."""
        return self.workdir / "audit.log"

    @property
    def kubeconfig(self) -> Path:
        """The admin's kubeconfig."""
        return self.workdir / "admin.kubeconfig"

    @staticmethod
    def token_of(user: str) -> str:
        """The static bearer token of one of USERS."""
        return f"{user}-token"

    def start(self) -> ControlPlane:
        """Start etcd, then the API server; wait until /readyz answers ok."""
        etcd_bin, apiserver_bin = binaries()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.pki = make_server_pki(self.workdir / "pki")
        try:
            self._start_etcd(etcd_bin)
            self._start_apiserver(apiserver_bin)
        except BaseException:
            self.stop()
            raise
        self.write_kubeconfig(self.kubeconfig, token=self.token_of(ADMIN))
        return self

    def stop(self) -> None:
        """Stop the API server, then etcd (each by its own pid)."""
        for proc in reversed(self._procs):
            proc.stop(grace=10.0)
        self._procs.clear()

    def pids(self) -> list[int]:
        """The process ids of etcd and the API server while they run."""
        return [p.pid for p in self._procs if p.pid is not None and p.running]

    def _launch(self, name: str, args: list[str]) -> ManagedProcess:
        proc = ManagedProcess(args, self.workdir / f"{name}.log", cwd=self.workdir).start()
        self._procs.append(proc)
        return proc

    def _start_etcd(self, etcd_bin: Path) -> None:
        peer = f"http://{LOCALHOST}:{self.etcd_peer_port}"
        proc = self._launch("etcd", [
            str(etcd_bin), "--name", "kube-real", "--data-dir", str(self.workdir / "etcd"),
            "--listen-client-urls", self.etcd_url, "--advertise-client-urls", self.etcd_url,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"kube-real={peer}", "--log-level", "warn",
            # progress notifications move the watch cache to etcd's head on a quiet cluster;
            # without them a bookmark carries an old version and is not sent to a new watch
            "--watch-progress-notify-interval", "1s",
            # a test store: losing it on a power cut costs nothing, fsyncs cost every write
            "--unsafe-no-fsync"])
        self._wait(proc, f"{self.etcd_url}/health", None)

    def _start_apiserver(self, apiserver_bin: Path) -> None:
        assert self.pki is not None
        tokens = self.workdir / "tokens.csv"
        tokens.write_text("".join(f'{self.token_of(u)},{u},uid-{u},"{",".join(groups)}"\n'
                                  for u, groups in USERS.items()))
        policy = self.workdir / "audit-policy.yaml"
        policy.write_text(yaml.safe_dump(AUDIT_POLICY))
        proc = self._launch("kube-apiserver", [
            str(apiserver_bin), "--etcd-servers", self.etcd_url,
            "--bind-address", LOCALHOST, "--advertise-address", LOCALHOST,
            "--secure-port", str(self.port), "--service-cluster-ip-range", "10.96.0.0/24",
            "--tls-cert-file", str(self.pki.serving_cert),
            "--tls-private-key-file", str(self.pki.serving_key),
            "--token-auth-file", str(tokens), "--authorization-mode", "RBAC",
            "--service-account-issuer", f"{self.url}",
            "--service-account-key-file", str(self.pki.sa_public_key),
            "--service-account-signing-key-file", str(self.pki.sa_private_key),
            "--api-audiences", "https://kubernetes.default.svc",
            "--audit-policy-file", str(policy), "--audit-log-path", str(self.audit_log),
            "--audit-log-format", "json",
            "--disable-admission-plugins", "ServiceAccount",
            "--watch-cache-sizes", "pods#0",
            # only the tests compact etcd: the 410 test decides when history is gone
            "--etcd-compaction-interval", "0",
            "--profiling=false", "--enable-priority-and-fairness=false"])
        self._wait(proc, f"{self.url}/readyz", self.token_of(ADMIN))

    def _wait(self, proc: ManagedProcess, url: str, token: str | None) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        last = ""
        while time.monotonic() < deadline:
            if not proc.running:
                raise RuntimeError(f"{proc.args[0]} exited:\n{proc.log_tail()}")
            try:
                self.request("GET", url, token=token)
                return
            except (OSError, urllib.error.HTTPError) as exc:
                last = repr(exc)
            time.sleep(0.2)
        raise TimeoutError(f"{url} not ready after {START_TIMEOUT}s ({last}):\n"
                           f"{proc.log_tail()}")

    # --- clients ------------------------------------------------------------------------------

    def _ssl_context(self) -> ssl.SSLContext:
        assert self.pki is not None
        return ssl.create_default_context(cafile=str(self.pki.ca_cert))

    def request(self, method: str, url_or_path: str, body: Any = None, *,
                token: str | None = "", content_type: str = "application/json",
                accept: str = "application/json", user_agent: str = "") -> Any:
        """One HTTP call to the API server (as the admin unless ``token`` is given; None sends
        no credentials) or to etcd (never any); parsed JSON, or text. ``user_agent``: the
        client to pose as (the server takes a write's default field manager from it)."""
        url = url_or_path if "://" in url_or_path else self.url + url_or_path
        headers = {"Content-Type": content_type, "Accept": accept}
        if user_agent:
            headers["User-Agent"] = user_agent
        if token is not None and not url.startswith(self.etcd_url):
            headers["Authorization"] = f"Bearer {token or self.token_of(ADMIN)}"
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method, headers=headers)
        context = self._ssl_context() if url.startswith("https") else None
        with urllib.request.urlopen(req, timeout=30, context=context) as resp:
            text = resp.read().decode()
        try:
            return json.loads(text)
        except ValueError:
            return text

    def write_kubeconfig(self, path: Path, *, token: str, namespace: str = "default") -> Path:
        """A kubeconfig for this server with one user authenticating by ``token``."""
        assert self.pki is not None
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "kube-real",
            "clusters": [{"name": "kube-real", "cluster": {
                "server": self.url, "certificate-authority": str(self.pki.ca_cert)}}],
            "users": [{"name": "user", "user": {"token": token}}],
            "contexts": [{"name": "kube-real", "context": {
                "cluster": "kube-real", "user": "user", "namespace": namespace}}],
        }
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True,
                kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
        """Run /usr/bin/kubectl (or PATH's) as the admin unless ``kubeconfig`` is given."""
        done = subprocess.run(["kubectl", "--kubeconfig", str(kubeconfig or self.kubeconfig),
                               *args], input=stdin, capture_output=True, text=True, timeout=120)
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {done.stderr.strip()}")
        return done

    def apply_file(self, path: Path) -> None:
        """`kubectl apply --server-side` one manifest file or directory as the admin."""
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))

    def wait_established(self, *names: str) -> None:
        """Wait until each named CRD reports Established (its API is being served)."""
        self.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                     *[f"crd/{name}" for name in names])

    def ensure_namespace(self, name: str) -> None:
        """Create a namespace unless it exists (namespaces are never deleted: no controller)."""
        try:
            self.request("POST", "/api/v1/namespaces",
                         {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        except urllib.error.HTTPError as exc:
            if exc.code != 409:
                raise

    def compact_etcd(self) -> int:
        """Compact etcd's history up to its current revision (v3 HTTP gateway); the revision."""
        header = self.request("POST", f"{self.etcd_url}/v3/kv/range",
                              {"key": "AA==", "limit": 1})["header"]
        revision = int(header["revision"])
        self.request("POST", f"{self.etcd_url}/v3/kv/compaction",
                     {"revision": str(revision), "physical": True})
        return revision

    def audit_events(self) -> list[dict[str, Any]]:
        """Every audit event written so far."""
        if not self.audit_log.exists():
            return []
        return [json.loads(line) for line in self.audit_log.read_text().splitlines() if line]


CRDS = PROJECT_ROOT / "crds"
# LLMKube's own CRDs (config/crd/bases of its repository) are published in no Go module: the
# workspace keeps a copy beside the clone; the tests that need it skip without it.
SHARED_CRDS = PROJECT_ROOT.parent / "shared" / "reference" / "crds"
OUR_CRD_NAMES = ("modelpools.inference.llmkube.dev", "inferenceservices.inference.llmkube.dev")


def install_our_crds(plane: ControlPlane) -> None:
    """Apply crds/ (our ModelPool and InferenceService) and wait until both are served."""
    for path in sorted(CRDS.glob("inference.llmkube.dev_*.yaml")):
        plane.apply_file(path)
    plane.wait_established(*OUR_CRD_NAMES)
