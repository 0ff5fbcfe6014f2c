"""Build the API client from in-cluster credentials or a kubeconfig."""

from __future__ import annotations

import os

from extproc.logs import get_logger
from extproc.platform.kube.credentials import CredentialsError, from_kubeconfig, in_cluster
from extproc.platform.kube.rest import KubeClient
from extproc.settings import ConfigError, Settings

log = get_logger(__name__)


async def make_api_client(settings: Settings) -> KubeClient:
    """Return a client: ``settings.kubeconfig`` if set, else in-cluster, else $KUBECONFIG.

    Credentials that cannot be loaded raise ConfigError with one line saying why.
    """
    try:
        return await _make(settings)
    except ConfigError:
        raise
    except Exception as exc:  # CredentialsError, OSError, YAML errors, an exec plugin's...
        source = settings.kubeconfig or "in-cluster config, then " + (
            os.environ.get("KUBECONFIG") or "~/.kube/config")
        text = str(exc).strip()
        if isinstance(exc, (TypeError, AttributeError, KeyError)):
            text = "not a kubeconfig file"  # indexing into whatever YAML was read failed
        reason = text.splitlines()[0] if text else type(exc).__name__
        raise ConfigError(f"cannot load Kubernetes credentials from {source}: {reason}") \
            from None


async def _make(settings: Settings) -> KubeClient:
    if settings.kubeconfig:
        credentials = await from_kubeconfig(settings.kubeconfig)
        log.info("kubernetes client configured", source="kubeconfig", path=settings.kubeconfig)
        return KubeClient(credentials, settings.api_request_timeout)
    try:
        credentials = in_cluster()
        log.info("kubernetes client configured", source="in-cluster")
    except CredentialsError:
        # Read $KUBECONFIG now, not at import time, so a value set by a wrapper script or a
        # test after import is honoured (":"-separated lists too: the first file is used).
        path = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
        credentials = await from_kubeconfig(path)
        log.info("kubernetes client configured", source="kubeconfig", path=path)
    return KubeClient(credentials, settings.api_request_timeout)
