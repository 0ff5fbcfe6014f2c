"""What the emulator serves: resource types from CustomResourceDefinitions plus a few core kinds."""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import yaml

AGE = "Age"
_CREATED = ".metadata.creationTimestamp"
_HOLDER_DOC = ("holderIdentity contains the identity of the holder of a current lease. If Coordinated "
               "Leader Election is used, the holder identity must be equal to the elected "
               "LeaseCandidate.metadata.name field.")


@dataclasses.dataclass(frozen=True)
class Column:
    """One printer column of the server-side Table output (a CRD's additionalPrinterColumns entry)."""

    name: str
    type: str
    json_path: str
    description: str = ""
    format: str = ""
    priority: int = 0
    missing: str | None = None  # the cell when the path is unset (built-in printers say "", CRDs null)


@dataclasses.dataclass(frozen=True)
class ScaleSpec:
    """Where a CRD's /scale subresource reads and writes replicas."""

    spec_replicas_path: str
    status_replicas_path: str
    label_selector_path: str | None = None


@dataclasses.dataclass(frozen=True, eq=False)
class ResourceType:
    """One served group/version/plural with the behaviour the API server attaches to it."""

    group: str
    version: str
    plural: str
    kind: str
    singular: str
    namespaced: bool = True
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    status: bool = False
    scale: ScaleSpec | None = None
    columns: tuple[Column, ...] = (Column(AGE, "date", _CREATED),)
    crd: bool = False
    schema: dict[str, Any] | None = None
    initial_status: dict[str, Any] | None = None

    @property
    def api_version(self) -> str:
        """The apiVersion objects of this type carry."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def storage_key(self) -> tuple[str, str]:
        """Versions of one group/plural share their objects, as in etcd."""
        return (self.group, self.plural)

    @property
    def display(self) -> str:
        """The resource name the API server uses in messages (`pods`, `modelpools.inference.llmkube.dev`)."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def subresources(self) -> tuple[str, ...]:
        """The subresources this type serves."""
        return tuple(name for name, on in (("status", self.status), ("scale", self.scale)) if on)

    def names(self) -> set[str]:
        """Every name a user may call this type by (kubectl style), lower-cased."""
        return {n.lower() for n in (self.plural, self.singular, self.kind, self.display, *self.short_names)}


def _core(plural: str, kind: str, **kwargs: Any) -> ResourceType:
    return ResourceType("", "v1", plural, kind, kind.lower(), **kwargs)


def builtin_types() -> list[ResourceType]:
    """The core kinds the project touches; Pods and Namespaces get the initial status the real server sets."""
    status_then_age = (Column("Status", "string", ".status.phase"), Column(AGE, "date", _CREATED))
    return [
        _core("namespaces", "Namespace", namespaced=False, short_names=("ns",), status=True,
              columns=status_then_age, initial_status={"phase": "Active"}),
        _core("pods", "Pod", short_names=("po",), categories=("all",), status=True,
              columns=status_then_age, initial_status={"phase": "Pending"}),
        _core("services", "Service", short_names=("svc",), categories=("all",), status=True),
        _core("endpoints", "Endpoints", short_names=("ep",)),
        _core("configmaps", "ConfigMap", short_names=("cm",)),
        _core("events", "Event", short_names=("ev",),
              columns=(Column("Type", "string", ".type"), Column("Reason", "string", ".reason"),
                       Column("Object", "string", ".involvedObject.name"),
                       Column("Message", "string", ".message"))),
        ResourceType("events.k8s.io", "v1", "events", "Event", "event", short_names=("ev",)),
        # an autoscaler aimed at a pool member is a second writer of its replicas (the pool
        # refuses such a member); KEDA's ScaledObjects come only with KEDA's CRD
        ResourceType("autoscaling", "v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler",
                     "horizontalpodautoscaler", short_names=("hpa",), categories=("all",),
                     status=True),
        # kube-apiserver's own Lease printer: HOLDER is "" when nobody holds the Lease
        ResourceType("coordination.k8s.io", "v1", "leases", "Lease", "lease",
                     columns=(Column("Holder", "string", ".spec.holderIdentity", _HOLDER_DOC, missing=""),
                              Column(AGE, "date", _CREATED))),
    ]


def _crd_files(paths: Iterable[str | os.PathLike[str]]) -> Iterator[Path]:
    for entry in map(Path, paths):
        if entry.is_dir():
            yield from sorted(p for p in entry.iterdir() if p.suffix in (".yaml", ".yml", ".json"))
        else:
            yield entry


def load_crds(paths: Iterable[str | os.PathLike[str]]) -> list[ResourceType]:
    """Resource types for every served version of every CRD in the given files or directories."""
    types: list[ResourceType] = []
    for path in _crd_files(paths):
        with path.open() as stream:
            for doc in yaml.safe_load_all(stream):
                if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                    types.extend(crd_types(doc))
    return types


def crd_types(crd: dict[str, Any]) -> list[ResourceType]:
    """Resource types for one CustomResourceDefinition object."""
    spec = crd["spec"]
    names = spec["names"]
    result = []
    for version in spec["versions"]:
        if not version.get("served", True):
            continue
        subresources = version.get("subresources") or {}
        scale = subresources.get("scale")
        printer = version.get("additionalPrinterColumns")
        columns = tuple(
            Column(c["name"], c.get("type", "string"), c["jsonPath"], c.get("description", ""),
                   c.get("format", ""), c.get("priority", 0))
            for c in printer
        ) if printer else (Column(AGE, "date", _CREATED),)
        result.append(ResourceType(
            group=spec["group"], version=version["name"], plural=names["plural"], kind=names["kind"],
            singular=names.get("singular") or names["kind"].lower(),
            namespaced=spec.get("scope", "Namespaced") == "Namespaced",
            short_names=tuple(names.get("shortNames") or ()), categories=tuple(names.get("categories") or ()),
            status="status" in subresources,
            scale=ScaleSpec(scale["specReplicasPath"], scale["statusReplicasPath"],
                            scale.get("labelSelectorPath")) if scale is not None else None,
            columns=columns, crd=True, schema=(version.get("schema") or {}).get("openAPIV3Schema"),
        ))
    return result


def apply_defaults(schema: dict[str, Any] | None, value: Any) -> None:
    """Fill structural-schema `default`s into `value` in place, as the API server does on every write."""
    if not schema:
        return
    if isinstance(value, dict):
        declared = schema.get("properties") or {}
        for prop, sub in declared.items():
            if prop not in value and "default" in sub:
                value[prop] = copy.deepcopy(sub["default"])
            if prop in value:
                apply_defaults(sub, value[prop])
        # map values (additionalProperties) are defaulted too, like the API server does
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for prop, item in value.items():
                if prop not in declared:
                    apply_defaults(extra, item)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            apply_defaults(schema["items"], item)
