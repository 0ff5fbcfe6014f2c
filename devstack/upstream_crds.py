"""Where the tests find upstream CRDs: inside the Go modules their projects publish.

Gateway API, Envoy Gateway and the Prometheus Operator ship their CustomResourceDefinitions in
their Go modules, so the Go module proxy serves them at exactly the versions the project
targets. ``make schemas`` runs ``python -m devstack.upstream_crds write`` which downloads
those modules into the Go module cache (``go mod download``, the user's cache, nothing else
touched) and records each one's directory in ``.tools/upstream-crds.json``; the tests read
that file (``$MODELPOOL_UPSTREAM_CRDS`` names another one). LLMKube's own CRDs are published
in no Go module; the tests that use them say where they come from (``tests/deploy/k8s_schema.py``).

A test that needs a missing source skips saying how to get it; under ``CI=true`` it fails,
because CI runs ``make test``, which records every source, so a missing one there means the
schema checks silently did not happen.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TypeVar


PROJECT_ROOT = Path(__file__).resolve().parent.parent
RECORD_ENV = "MODELPOOL_UPSTREAM_CRDS"
DEFAULT_RECORD = PROJECT_ROOT / ".tools" / "upstream-crds.json"
T = TypeVar("T")
HOW = "run `make schemas` (downloads the upstream CRDs' Go modules into the Go module cache)"


@dataclass(frozen=True)
class Source:
    """One upstream module at a pinned version, and the folder of its CRD files in it."""

    module: str
    version: str
    crd_dir: str
    why: str


SOURCES = {
    # The bundle Envoy Gateway v1.9 ships (standard + experimental) is this module's
    # config/crd/experimental, CRD for CRD; the folder also holds a ValidatingAdmissionPolicy,
    # which `files` leaves out.
    "gateway-api": Source("sigs.k8s.io/gateway-api", "v1.6.1", "config/crd/experimental",
                          "Gateway API v1.6.1, the release Envoy Gateway v1.9 bundles"),
    # The release egctl is built at (the Makefile's EG_VERSION): the overlay is translated and
    # validated against the same Envoy Gateway.
    "envoy-gateway": Source("github.com/envoyproxy/gateway", "v1.9.1",
                            "charts/gateway-helm/charts/crds/crds/generated",
                            "Envoy Gateway v1.9.1, the release deploy/overlays/envoy-gateway targets"),
    # InferencePool (inference.networking.k8s.io/v1, GA) for deploy/overlays/inference-pool
    # and the chart's inferencePool values; the proxy refuses this module's version list, so
    # the version is pinned, not looked up.
    "inference-extension": Source("sigs.k8s.io/gateway-api-inference-extension", "v1.0.0",
                                  "config/crd/bases",
                                  "Gateway API inference extension v1.0.0 (InferencePool v1)"),
    # The API types tools/monitoringcheck decodes with are v0.95.2 (pkg/apis/monitoring); the
    # proxy refuses the root module at v0.95.x (403, "not available"), and v0.85.0 is the
    # newest it serves. The fields our ServiceMonitor, PodMonitor and PrometheusRule use are
    # in both; the strict decode at v0.95.2 stays the check of the newer types.
    "prometheus-operator": Source("github.com/prometheus-operator/prometheus-operator",
                                  "v0.85.0", "example/prometheus-operator-crd",
                                  "Prometheus Operator v0.85.0, the newest the proxy serves"),
}


def record_path() -> Path:
    """The JSON record `make schemas` writes: $MODELPOOL_UPSTREAM_CRDS or .tools/upstream-crds.json."""
    configured = os.environ.get(RECORD_ENV)
    return Path(configured) if configured else DEFAULT_RECORD


def _only_crds(path: Path) -> bool:
    # the documents' top-level `kind:` lines, not a YAML parse: PyYAML cannot read every
    # upstream file (AlertmanagerConfig's `- =` is its "value" tag), and these are megabytes
    kinds = re.findall(r"^kind: *(\S+)", path.read_text(), flags=re.M)
    return bool(kinds) and all(k == "CustomResourceDefinition" for k in kinds)


def crd_dir(name: str) -> Path:
    """The recorded CRD folder of source `name`; FileNotFoundError saying how to get it."""
    source = SOURCES[name]
    path = record_path()
    try:
        record = json.loads(path.read_text())[name]
    except (FileNotFoundError, KeyError, ValueError):
        raise FileNotFoundError(f"{source.module}@{source.version}'s CRDs are not recorded in "
                                f"{path}; {HOW}") from None
    if record.get("version") != source.version:
        raise FileNotFoundError(f"{path} records {name} {record.get('version')}, the tests want "
                                f"{source.version}; {HOW}")
    folder = Path(record["crd_dir"])
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is gone (the Go module cache was cleaned?); {HOW}")
    return folder


def files(name: str, kinds: tuple[str, ...] = ()) -> list[Path]:
    """The source's files that hold only CRDs (those of `kinds`' plurals if given), sorted."""
    found = [p for p in sorted(crd_dir(name).glob("*.yaml")) if _only_crds(p)]
    if kinds:
        found = [p for p in found if any(p.name.endswith(f"_{k.lower()}s.yaml") for k in kinds)]
    return found


def need(lookup: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`lookup(*args)`, or a pytest skip saying why it is missing (a failure under CI=true)."""
    import pytest  # only tests call this; the record writer below runs without pytest

    try:
        return lookup(*args, **kwargs)
    except FileNotFoundError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"under CI=true every upstream schema must be there: {exc}")
        pytest.skip(str(exc))


def download(go: str, source: Source) -> Path:
    """`go mod download` the module into the Go module cache; the folder of its CRDs."""
    done = subprocess.run([go, "mod", "download", "-json", f"{source.module}@{source.version}"],
                          capture_output=True, text=True, timeout=600, cwd=PROJECT_ROOT / "tools")
    info = json.loads(done.stdout or "{}")
    if done.returncode != 0 or "Dir" not in info:
        raise SystemExit(f"go mod download {source.module}@{source.version} failed: "
                         f"{info.get('Error') or done.stderr.strip()}")
    folder = Path(info["Dir"]) / source.crd_dir
    if not folder.is_dir():
        raise SystemExit(f"{source.module}@{source.version} has no {source.crd_dir}")
    return folder


def write(path: Path, go: str) -> None:
    """Download every source and record where its CRDs are (written at once, never half)."""
    record = {}
    for name, source in SOURCES.items():
        record[name] = {"module": source.module, "version": source.version,
                        "crd_dir": str(download(go, source)), "what": source.why}
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".tmp")
    partial.write_text(json.dumps(record, indent=2) + "\n")
    partial.replace(path)


def main(argv: list[str]) -> None:
    """`write [RECORD] [--go GO]`: the record `make schemas` leaves for the tests."""
    go = "go"
    if "--go" in argv:
        at = argv.index("--go")
        go, argv = argv[at + 1], argv[:at] + argv[at + 2:]
    if not argv or argv[0] != "write":
        raise SystemExit("usage: python -m devstack.upstream_crds write [RECORD] [--go GO]")
    write(Path(argv[1]) if len(argv) > 1 else record_path(), go)


if __name__ == "__main__":
    main(sys.argv[1:])
