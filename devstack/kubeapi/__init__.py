"""An in-memory Kubernetes API server for tests and the local stack (a strict kmock subclass)."""

from devstack.kubeapi.errors import ApiError
from devstack.kubeapi.resources import ResourceType
from devstack.kubeapi.routes import RequestRecord
from devstack.kubeapi.server import KubeEmulator

__all__ = ["ApiError", "KubeEmulator", "RequestRecord", "ResourceType"]
