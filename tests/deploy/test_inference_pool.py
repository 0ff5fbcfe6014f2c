"""deploy/overlays/inference-pool: the service as the InferencePool's endpoint picker, and the
InferencePool exactly as `render-routes --format inferencepool` prints it for the example."""

from __future__ import annotations

from pathlib import Path

import yaml

from extproc.cli import main
from extproc.names import POOL_LABEL
from k8s_schema import PROJECT_ROOT

OVERLAY = "deploy/overlays/inference-pool"
EXAMPLE = PROJECT_ROOT / "deploy/examples/shared-gpu.yaml"


def _env(objs: list[dict]) -> dict[str, str]:
    (deployment,) = [o for o in objs if o["kind"] == "Deployment"]
    return {e["name"]: e.get("value", "") for e in
            deployment["spec"]["template"]["spec"]["containers"][0]["env"]}


def test_overlay_runs_the_picker_for_the_pools_pods(render) -> None:
    objs = render(OVERLAY)
    (pool,) = [o for o in objs if o["kind"] == "InferencePool"]
    (service,) = [o for o in objs if o["kind"] == "Service"]
    (route,) = [o for o in objs if o["kind"] == "HTTPRoute"]
    spec = pool["spec"]
    assert spec["selector"]["matchLabels"] == {POOL_LABEL: pool["metadata"]["name"]}
    picker = spec["endpointPickerRef"]
    assert picker["name"] == service["metadata"]["name"]
    assert picker["port"]["number"] in {p["port"] for p in service["spec"]["ports"]}
    env = _env(objs)
    assert env["MODELPOOL_ENDPOINT_PICKER"] == "true"
    assert int(env["MODELPOOL_ENDPOINT_PORT"]) == spec["targetPorts"][0]["number"]
    (rule,) = route["spec"]["rules"]
    assert rule["backendRefs"] == [{"group": "inference.networking.k8s.io",
                                    "kind": "InferencePool", "name": pool["metadata"]["name"]}]
    assert not [o for o in objs if o["kind"] == "EnvoyExtensionPolicy"]  # nothing gateway-specific


def test_render_routes_prints_what_the_overlay_ships(render, capsys) -> None:
    assert main(["render-routes", str(EXAMPLE), "--format", "inferencepool"]) == 0
    printed = capsys.readouterr().out
    rendered = [d for d in yaml.safe_load_all(printed) if d]
    shipped = {(o["kind"], o["metadata"]["name"]): o for o in render(OVERLAY)}
    for doc in rendered:
        assert shipped[(doc["kind"], doc["metadata"]["name"])]["spec"] == doc["spec"]
    # and the label each member needs, as commands
    members = [m["inferenceServiceRef"]["name"]
               for m in yaml.safe_load(Path(EXAMPLE).read_text())["spec"]["members"]]
    for member in members:
        assert f"patch inferenceservice {member} --type merge" in printed


def test_chart_renders_what_the_overlay_ships(render) -> None:
    from helm import render_chart  # noqa: PLC0415 - skips without helm, like the chart tests

    chart = render_chart("inferencepool-values")
    shipped = render(OVERLAY)
    for kind in ("InferencePool", "HTTPRoute"):
        (ours,) = [o for o in chart if o["kind"] == kind]
        (theirs,) = [o for o in shipped if o["kind"] == kind]
        assert ours["spec"] == theirs["spec"], kind
    env = _env(chart)
    assert {k: env[k] for k in ("MODELPOOL_ENDPOINT_PICKER", "MODELPOOL_ENDPOINT_PORT",
                                "MODELPOOL_PARK_TIMEOUT_OVERRIDE")} == \
        {k: _env(shipped)[k] for k in ("MODELPOOL_ENDPOINT_PICKER", "MODELPOOL_ENDPOINT_PORT",
                                       "MODELPOOL_PARK_TIMEOUT_OVERRIDE")}
    assert not [o for o in chart if o["kind"] == "EnvoyExtensionPolicy"]
    rules = [r for o in chart if o["kind"] == "Role" for r in o["rules"]]
    assert {"apiGroups": ["inference.networking.k8s.io"], "resources": ["inferencepools"],
            "verbs": ["list"]} in rules  # the route check's InferencePool half


def test_check_config_says_which_pool_lacks_its_inference_pool(render, tmp_path: Path,
                                                              capsys) -> None:
    for overlay, warned in ((OVERLAY, False), ("deploy/overlays/envoy-gateway", True)):
        rendered = tmp_path / "rendered.yaml"
        rendered.write_text(yaml.safe_dump_all(render(overlay)))
        assert main(["check-config", "--endpoint-picker", "--modelpool", str(EXAMPLE),
                     "--routes", str(rendered)]) == 0
        err = capsys.readouterr().err
        assert ("no InferencePool selecting" in err) is warned, (overlay, err)
        assert "has no route" not in err  # member routes are not what a picker needs
