"""Where the API server is and how to authenticate: in-cluster, or a kubeconfig.

The common cases are read here directly: the pod's service account (token re-read as the
kubelet rotates it), and a kubeconfig user with a token, a token file, a client certificate
or basic auth, with the cluster's CA or insecure-skip-tls-verify. A user with an exec plugin
(EKS, GKE, AKS logins) runs it through ``execauth.py``, again whenever its credential expires
or the API server answers 401. A user with a legacy ``auth-provider`` is handed to the
``kubernetes`` package's own loader (the optional extra ``auth-provider``), imported only
then, and loaded again on a 401: re-implementing those providers would be neither small nor
careful.
"""

from __future__ import annotations

import asyncio
import base64
import os
import ssl
import tempfile
import time
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from extproc.logs import get_logger
from extproc.platform.kube.execauth import ExecError, ExecPlugin, ExecResult

log = get_logger(__name__)

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# Bound service-account tokens rotate (about hourly); re-reading each minute, as client-go
# does, keeps requests authenticated without watching the file.
TOKEN_REREAD_S = 60.0
# A renewed credential is fetched this long before it expires, so no request carries a token
# that lapses on its way (and a clock a little behind the issuer's does not matter).
EXPIRY_MARGIN_S = 10.0
# After a failed renewal (a plugin's network blip) requests go on with the old credential and
# its 401s; the plugin is not run again sooner than this.
RENEW_RETRY_S = 5.0
AUTH_PROVIDER_EXTRA = "modelpool-extproc[auth-provider]"


class CredentialsError(Exception):
    """No usable cluster configuration was found."""


@dataclass
class Credentials:
    """The API server's address, its TLS trust, and the client's identity."""

    server: str
    ca_data: str = ""  # PEM
    insecure: bool = False
    cert_file: str = ""
    key_file: str = ""
    token: str = ""
    token_file: str = ""
    basic: str = ""  # "user:password"
    expires_at: float | None = None  # Unix time the token or certificate lapses (exec plugins)
    # runs an exec plugin or an auth-provider again: a fresh credential
    renewer: Callable[[], Awaitable[ExecResult]] | None = field(default=None, repr=False)
    _token_read_at: float = field(default=-1e9, repr=False)
    # the contexts in use (weakly: a closed session's goes), to load a renewed certificate into
    _contexts: weakref.WeakSet[ssl.SSLContext] = field(default_factory=weakref.WeakSet,
                                                       repr=False)
    _renewing: asyncio.Lock | None = field(default=None, repr=False)
    _failed_at: float = field(default=-1e9, repr=False)

    def ssl_context(self) -> ssl.SSLContext | bool:
        """TLS settings for aiohttp: a context for https, True (default) for plain http."""
        if not self.server.startswith("https"):
            return True
        context = ssl.create_default_context(cadata=self.ca_data or None)
        if self.insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if self.cert_file:
            context.load_cert_chain(self.cert_file, self.key_file or None)
        self._contexts.add(context)
        return context

    async def refresh(self) -> None:
        """Renew an exec credential that has expired (or is about to); before each request."""
        if self.renewer is not None and self.expires_at is not None and \
                time.time() >= self.expires_at - EXPIRY_MARGIN_S:
            await self._renew(self.headers())

    async def rejected(self, sent: dict[str, str]) -> bool:
        """The API server answered 401 to ``sent`` headers: renew; True when a retry may pass."""
        if self.renewer is None:
            return False
        return await self._renew(sent)

    async def _renew(self, sent: dict[str, str]) -> bool:
        """Run the renewer once for all the requests that saw the same credential fail."""
        if self._renewing is None:
            self._renewing = asyncio.Lock()
        async with self._renewing:
            if self.headers() != sent:
                return True  # another request renewed it meanwhile
            if time.monotonic() - self._failed_at < RENEW_RETRY_S:
                return False
            assert self.renewer is not None
            try:
                self.apply(await self.renewer())
            except Exception as exc:  # a plugin's failure: the request answers 401 (retryable)
                self._failed_at = time.monotonic()
                log.warning("kubernetes credential not renewed", error=str(exc).strip()[:300])
                return False
        log.info("kubernetes credential renewed")
        return True

    def apply(self, result: ExecResult) -> None:
        """Take a new credential: its token, or its client certificate for new connections."""
        self.token, self.expires_at = result.token, result.expires_at
        if result.cert:
            self.cert_file, self.key_file = _private_files(result.cert, result.key)
            for context in list(self._contexts):
                context.load_cert_chain(self.cert_file, self.key_file)

    def headers(self) -> dict[str, str]:
        """The Authorization header (none for a client-certificate user)."""
        if self.token_file and time.monotonic() - self._token_read_at > TOKEN_REREAD_S:
            self.token = Path(self.token_file).read_text().strip()
            self._token_read_at = time.monotonic()
        if self.token:
            return {"Authorization": f"Bearer {self.token}"}
        if self.basic:
            return {"Authorization": "Basic " + base64.b64encode(self.basic.encode()).decode()}
        return {}


def in_cluster() -> Credentials:
    """The pod's service account; CredentialsError outside a pod."""
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get(
        "KUBERNETES_SERVICE_PORT")
    token = SERVICE_ACCOUNT / "token"
    if not host or not port or not token.exists():
        raise CredentialsError("not running in a pod (no service host or token)")
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    ca = SERVICE_ACCOUNT / "ca.crt"
    return Credentials(server=f"https://{host}:{port}", token_file=str(token),
                       ca_data=ca.read_text() if ca.exists() else "")


async def from_kubeconfig(path: str) -> Credentials:
    """The current context of the kubeconfig at ``path`` (the first file of a ":" list)."""
    first = path.split(os.pathsep)[0]
    try:
        config = yaml.safe_load(Path(first).expanduser().read_text()) or {}
    except OSError as exc:
        raise CredentialsError(f"cannot read kubeconfig {first}: {exc}") from None
    base = Path(first).expanduser().resolve().parent
    context = _named(config, "contexts", config.get("current-context"))
    cluster = _named(config, "clusters", context.get("cluster"))
    user = _named(config, "users", context.get("user"), required=False)
    if "auth-provider" in user:
        return await _with_auth_provider(first)
    creds = Credentials(server=str(cluster.get("server") or "").rstrip("/"),
                        insecure=bool(cluster.get("insecure-skip-tls-verify")),
                        token=str(user.get("token") or ""),
                        token_file=_path(base, user.get("tokenFile")))
    if not creds.server:
        raise CredentialsError(f"kubeconfig {first}: the cluster has no server")
    creds.ca_data = _pem(base, cluster, "certificate-authority")
    if user.get("username"):
        creds.basic = f"{user['username']}:{user.get('password') or ''}"
    cert, key = _pem(base, user, "client-certificate"), _pem(base, user, "client-key")
    if cert:
        creds.cert_file, creds.key_file = _private_files(cert, key)
    if user.get("exec"):
        try:
            plugin = ExecPlugin(user["exec"], base, cluster)
            creds.renewer = plugin.run
            creds.apply(await plugin.run())
        except ExecError as exc:
            raise CredentialsError(f"kubeconfig {first}: {exc}") from None
    return creds


def _named(config: dict, section: str, name: Any, *, required: bool = True) -> dict:
    """The entry ``name`` of a kubeconfig section (``contexts``, ``clusters``, ``users``)."""
    for entry in config.get(section) or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            return entry.get(section[:-1]) or {}
    if required:
        raise CredentialsError(f"kubeconfig has no {section[:-1]} named {name!r}")
    return {}


def _path(base: Path, value: Any) -> str:
    """A kubeconfig file reference, relative to the kubeconfig's folder as kubectl reads it."""
    return str(base / Path(str(value)).expanduser()) if value else ""


def _pem(base: Path, entry: dict, key: str) -> str:
    """The PEM text behind ``key`` (a file path) or ``key-data`` (base64), "" when neither."""
    if entry.get(f"{key}-data"):
        return base64.b64decode(entry[f"{key}-data"]).decode()
    if entry.get(key):
        return Path(_path(base, entry[key])).read_text()
    return ""


def _private_files(cert: str, key: str) -> tuple[str, str]:
    """Write a client certificate and key where only this user can read them (ssl needs files)."""
    folder = tempfile.mkdtemp(prefix="modelpool-extproc-tls-")  # mode 0700
    paths = []
    for name, text in (("client.crt", cert), ("client.key", key)):
        path = os.path.join(folder, name)
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as out:
            out.write(text)
        paths.append(path)
    return paths[0], paths[1] if key else ""


async def _with_auth_provider(path: str) -> Credentials:
    """An ``auth-provider`` user, through the kubernetes package; loaded again on a 401."""
    creds = await _kubernetes_package_load(path)

    async def renew() -> ExecResult:
        again = await _kubernetes_package_load(path)
        return ExecResult(token=again.token)

    creds.renewer = renew
    return creds


async def _kubernetes_package_load(path: str) -> Credentials:
    """Run the kubernetes package's kubeconfig loader (auth-providers: gcp, azure, oidc)."""
    try:
        from kubernetes.aio import config  # noqa: PLC0415 - imported only for these users
        from kubernetes.aio.client import Configuration  # noqa: PLC0415
    except ImportError:
        raise CredentialsError(f"kubeconfig {path} uses an auth-provider, which needs the "
                               f"kubernetes package: pip install '{AUTH_PROVIDER_EXTRA}'") \
            from None
    loaded = Configuration()
    await config.load_kube_config(config_file=path, client_configuration=loaded,
                                  persist_config=False)
    token = (loaded.api_key or {}).get("BearerToken") or (loaded.api_key or {}).get(
        "authorization") or ""
    return Credentials(server=loaded.host.rstrip("/"), insecure=not loaded.verify_ssl,
                       ca_data=Path(loaded.ssl_ca_cert).read_text() if loaded.ssl_ca_cert else "",
                       cert_file=loaded.cert_file or "", key_file=loaded.key_file or "",
                       token=token.removeprefix("Bearer ").strip())
