"""The installed package, run the way the image runs it, behind the real Envoy.

``modelpool-extproc serve --pools-file`` from the clean virtualenv (conftest.py), two fake
members, Envoy on loopback: a resident hit, a swap, a 503 + Retry-After past the swap budget,
gRPC and HTTP health, metrics; and the other commands a user meets first.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import grpc
import pytest
import yaml
from multidict import CIMultiDict
from grpc_health.v1 import health_pb2, health_pb2_grpc

from conftest import Installed
from devstack import procs
from devstack import stack_manifests as manifests
from devstack.testkit import eventually
from devstack.fakemember import UpstreamHandle

# The first test here also pays for the session fixture: a wheel built in an isolated build
# environment, a new virtualenv, the product's dependencies installed into it. On a busy
# machine that alone passed the suite's 120 s per test (fresh-clone run 27): its steps have
# bounds of their own (300 s, 600 s), so the test's is theirs.
pytestmark = [pytest.mark.envoy, pytest.mark.timeout(960)]

HERE = Path(__file__).parent
POOLS = {"pools": [{"namespace": "demo", "name": "shared-gpu", "members": ["judge", "coder"],
                    "default": "judge", "swapBudget": "1s"}]}


def test_the_imports_are_declared_and_every_module_imports(installed: Installed) -> None:
    done = subprocess.run([str(installed.python), str(HERE / "imports_check.py")],
                          capture_output=True, text=True, timeout=120, cwd=installed.home)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["unimportable"] == {}, report["unimportable"]
    assert report["undeclared"] == {}, f"imports with no declared dependency: {report['undeclared']}"
    assert "hpack" in report["declared"]


def test_the_wheel_carries_only_the_product(installed: Installed) -> None:
    done = subprocess.run([str(installed.python), "-c",
                           "import importlib.util as u; print(u.find_spec('devstack') is None)"],
                          capture_output=True, text=True, timeout=30, cwd=installed.home)
    assert done.stdout.strip() == "True", "the local stack (devstack) is not part of the product"


def test_version_help_and_bad_input(installed: Installed) -> None:
    version = installed.run("--version")
    assert version.returncode == 0 and version.stdout.startswith("modelpool-extproc 0."), version
    helped = installed.run("serve", "--help")
    assert helped.returncode == 0 and "--pools-file" in helped.stdout
    bad = installed.run("serve", "--pools-file", "/nonexistent/pools.yaml", timeout=30)
    assert bad.returncode != 0
    assert "Traceback" not in bad.stderr and "/nonexistent/pools.yaml" in bad.stderr, bad.stderr


def test_check_config_and_render_routes(installed: Installed, tmp_path: Path) -> None:
    pools = tmp_path / "pools.yaml"
    pools.write_text(yaml.safe_dump(POOLS))
    checked = installed.run("check-config", "--pools-file", str(pools))
    assert checked.returncode == 0, checked.stderr
    assert json.loads(checked.stdout)["pools_file"] == str(pools)
    pool = tmp_path / "pool.yaml"
    pool.write_text(yaml.safe_dump(manifests.pool("shared-gpu", "demo", ["judge", "coder"])))
    rendered = installed.run("render-routes", str(pool))
    assert rendered.returncode == 0, rendered.stderr
    route = next(d for d in yaml.safe_load_all(rendered.stdout) if d and d["kind"] == "HTTPRoute")
    values = {m["headers"][0]["value"] for rule in route["spec"]["rules"]
              for m in rule["matches"] if m.get("headers")}
    assert values == {"judge.demo", "coder.demo"}


def kubeconfig(path: Path, user: dict) -> Path:
    """A one-context kubeconfig for ``user`` at an address nothing listens on."""
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "here",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:9"}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "here", "context": {"cluster": "c", "user": "u"}}]}))
    return path


def test_cloud_kubeconfigs_without_the_kubernetes_package(installed: Installed,
                                                          tmp_path: Path) -> None:
    # The image ships no kubernetes package: an exec plugin (EKS, GKE, AKS) is run natively;
    # a legacy auth-provider says in one line which extra brings what it needs.
    absent = subprocess.run([str(installed.python), "-c",
                             "import importlib.util as u; print(u.find_spec('kubernetes'))"],
                            capture_output=True, text=True, timeout=30, cwd=installed.home)
    assert absent.stdout.strip() == "None", "the kubernetes package is installed"
    plugin = tmp_path / "plugin.py"
    plugin.write_text("import json\nprint(json.dumps({'apiVersion': "
                      "'client.authentication.k8s.io/v1', 'kind': 'ExecCredential', "
                      "'status': {'token': 't'}}))\n")
    exec_user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1",
                          "command": sys.executable, "args": [str(plugin)],
                          "interactiveMode": "Never"}}
    checked = installed.run("check-config", "--kubeconfig",
                            str(kubeconfig(tmp_path / "exec", exec_user)))
    assert checked.returncode == 0, checked.stderr
    provider = {"auth-provider": {"name": "oidc", "config": {"id-token": "x"}}}
    refused = installed.run("check-config", "--kubeconfig",
                            str(kubeconfig(tmp_path / "provider", provider)))
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    (line,) = refused.stderr.strip().splitlines()
    assert "pip install 'modelpool-extproc[auth-provider]'" in line, line


def health_status(address: str) -> str:
    """grpc.health.v1's answer for the whole server ("" when it does not answer yet)."""
    with grpc.insecure_channel(address) as channel:
        try:
            answer = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=1.0)
        except grpc.RpcError:
            return ""
    return health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)


@pytest.fixture
def served(installed: Installed, tmp_path: Path) -> Iterator[tuple[int, int]]:
    """``serve`` from the installed package on free loopback ports: (gRPC, metrics)."""
    pools = tmp_path / "pools.yaml"
    pools.write_text(yaml.safe_dump(POOLS))
    grpc_port, metrics_port = procs.free_port(), procs.free_port()
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(
        [str(installed.command), "serve", "--pools-file", str(pools),
         "--listen", f"127.0.0.1:{grpc_port}", "--metrics-listen", f"127.0.0.1:{metrics_port}",
         "--drain-linger", "0"], stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 30
        while health_status(f"127.0.0.1:{grpc_port}") != "SERVING":
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            assert time.monotonic() < deadline, "serve never reported SERVING"
            time.sleep(0.1)
        yield grpc_port, metrics_port
        first = (tmp_path / "serve.log").read_text().splitlines()[0]
        assert {"level", "logger", "msg"} <= set(json.loads(first)), first  # JSON lines
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()


async def chat(session: aiohttp.ClientSession, url: str, model: str, query: str = "",
               **extra) -> tuple[int, CIMultiDict, dict]:
    """POST a chat completion; (status, headers, JSON body)."""
    async with session.post(f"{url}/v1/chat/completions{query}", json={
            "model": model, "messages": [{"role": "user", "content": "hi"}], **extra}) as resp:
        return resp.status, CIMultiDict(resp.headers), json.loads(await resp.read())


async def streamed(session: aiohttp.ClientSession, url: str, model: str,
                   query: str) -> tuple[int, str, int]:
    """A 200-token streamed chat completion read to its end; (status, served by, chunks)."""
    async with session.post(f"{url}/v1/chat/completions{query}", json={
            "model": model, "stream": True, "max_tokens": 200,
            "messages": [{"role": "user", "content": "hi"}]}) as resp:
        events = [line for line in (await resp.text()).splitlines() if line.startswith("data: {")]
        # the last event carries finish_reason and timings, no token
        return resp.status, resp.headers.get("x-served-by", ""), len(events) - 1


async def test_serve_behind_envoy(served: tuple[int, int], envoy_factory,
                                  upstreams: dict[str, UpstreamHandle]) -> None:
    grpc_port, metrics_port = served
    envoy = envoy_factory(grpc_port, {f"{n}.demo": h.port for n, h in upstreams.items()})
    async with aiohttp.ClientSession() as session:
        status, headers, body = await chat(session, envoy.url, "judge")
        assert (status, headers.get("x-served-by")) == (200, "judge"), body  # cold default
        status, headers, _ = await chat(session, envoy.url, "judge")
        assert (status, headers.get("x-served-by")) == (200, "judge")  # a resident hit
        status, headers, body = await chat(session, envoy.url, "coder")
        assert (status, headers.get("x-served-by")) == (200, "coder"), body  # a swap
        # coder answers for 5 s at least (200 tokens, 25 ms each); judge must wait for it to
        # drain: a request for judge waits past its 1 s budget, answered 503 + Retry-After
        long = asyncio.create_task(streamed(session, envoy.url, "coder", "?delay_ms=25"))
        await eventually(lambda: upstreams["coder"].stats.in_flight == 1, 10)
        status, headers, body = await chat(session, envoy.url, "judge")
        assert status == 503 and body["error"]["code"] == "swap_budget_exceeded", body
        assert int(headers["retry-after"]) >= 1
        assert await long == (200, "coder", 200)  # whole: not cut by the swap
        # the swap went on: judge serves once coder drained
        status, headers, _ = await chat(session, envoy.url, "judge")
        assert (status, headers.get("x-served-by")) == (200, "judge")
        async with session.get(f"http://127.0.0.1:{metrics_port}/healthz") as resp:
            assert resp.status == 200
        async with session.get(f"http://127.0.0.1:{metrics_port}/metrics") as resp:
            exposition = await resp.text()
    assert 'code="swap_budget_exceeded"' in exposition
    assert "modelpool_extproc_swaps_total" in exposition
