"""Build the asyncio API client from in-cluster credentials or a kubeconfig."""

from __future__ import annotations

import os

from kubernetes.aio import config
from kubernetes.aio.client import ApiClient, Configuration

from extproc.logs import get_logger
from extproc.settings import ConfigError, Settings

log = get_logger(__name__)


async def make_api_client(settings: Settings) -> ApiClient:
    """Return an ApiClient: ``settings.kubeconfig`` if set, else in-cluster, else $KUBECONFIG.

    Credentials that cannot be loaded raise ConfigError with one line saying why.
    """
    try:
        return await _make(settings)
    except ConfigError:
        raise
    except Exception as exc:  # the library raises ConfigException, OSError, YAML errors...
        source = settings.kubeconfig or "in-cluster config, then " + (
            os.environ.get("KUBECONFIG") or "~/.kube/config")
        text = str(exc).strip()
        if isinstance(exc, (TypeError, AttributeError, KeyError)):
            text = "not a kubeconfig file"  # the library indexes into whatever YAML it read
        reason = text.splitlines()[0] if text else type(exc).__name__
        raise ConfigError(f"cannot load Kubernetes credentials from {source}: {reason}") \
            from None


async def _make(settings: Settings) -> ApiClient:
    configuration = Configuration()
    if settings.kubeconfig:
        await config.load_kube_config(config_file=settings.kubeconfig,
                                      client_configuration=configuration,
                                      persist_config=False)
        log.info("kubernetes client configured", source="kubeconfig", path=settings.kubeconfig)
        return ApiClient(configuration)
    try:
        config.load_incluster_config(client_configuration=configuration)
        log.info("kubernetes client configured", source="in-cluster")
    except config.ConfigException:
        # Read $KUBECONFIG now, not at import time as the library's default does, so a value
        # set by a wrapper script or a test after import is honoured (":"-separated lists too).
        path = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
        await config.load_kube_config(config_file=path, client_configuration=configuration,
                                      persist_config=False)
        log.info("kubernetes client configured", source="kubeconfig", path=path)
    return ApiClient(configuration)
