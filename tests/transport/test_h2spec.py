"""h2spec, the HTTP/2 conformance checker, against ``serve`` on our own gRPC server.

Every case passes except those below, each with the reason it does not apply to a gRPC
server; the set is asserted exactly, so a case that starts to pass (or to fail) shows here.
h2spec is a Go tool (``make ops-tools`` builds it into the cache); without it the test skips
saying so, and under ``CI=true`` it fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from devstack.procs import LOCALHOST, PROJECT_ROOT, free_port, tool_binary, wait_for_port

H2SPEC_ENV = "MODELPOOL_H2SPEC_BIN"
# h2spec's requests are not gRPC (no `content-type: application/grpc`) and most end with their
# HEADERS frame: a gRPC server answers such a request at once with a trailers-only 415, one
# HEADERS frame with END_STREAM and no DATA (RFC 9113 §8.1 allows a response of one HEADERS
# frame). Two cases wait for the DATA of a web page instead; the stream-limit case never finds
# 100 streams open at once, since each one is answered and closed as it comes.
NO_DATA = "our answer to a non-gRPC request is one HEADERS frame, no DATA"
NOT_APPLICABLE = {
    ("generic/2", "Sends a WINDOW_UPDATE frame on half-closed (remote) stream"): NO_DATA,
    ("generic/2", "Sends a PRIORITY frame on half-closed (remote) stream"): NO_DATA,
    ("http2/5.1.2", "Sends HEADERS frames that causes their advertised concurrent stream limit "
                    "to be exceeded"): "each stream is answered and closed as it comes",
}
POOLS = "pools:\n- name: shared-gpu\n  namespace: demo\n  members: [judge, coder]\n"


def _h2spec() -> Path:
    try:
        return tool_binary(H2SPEC_ENV, ".tools/bin/h2spec",
                           "run `make ops-tools` (builds h2spec from its Go module)")
    except FileNotFoundError as missing:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(str(missing))


def test_h2spec_passes_every_case_that_applies(tmp_path: Path) -> None:
    h2spec = _h2spec()
    pools = tmp_path / "pools.yaml"
    pools.write_text(POOLS, encoding="utf-8")
    port = free_port()
    # a small stream limit, so that h2spec's case for it (5.1.2) opens 101 streams, not 65,537
    serve = subprocess.Popen(
        [sys.executable, "-m", "extproc", "serve", "--pools-file", str(pools),
         "--listen", f"{LOCALHOST}:{port}", "--metrics-listen", "",
         "--max-streams-per-connection", "100"],
        cwd=PROJECT_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    report = tmp_path / "h2spec.xml"
    try:
        wait_for_port(LOCALHOST, port, timeout=30)
        # -o: seconds h2spec waits for each answer (the 4 cases above wait it out: about 30 s
        # in all; a short wait would turn a slow answer on a busy machine into a failed case)
        subprocess.run([str(h2spec), "-h", LOCALHOST, "-p", str(port), "-o", "5",
                        "-j", str(report)], cwd=tmp_path, capture_output=True, timeout=240)
    finally:
        serve.terminate()
        serve.wait(timeout=30)
    cases = list(ET.parse(report).iter("testcase"))
    failed = {(c.get("package"), c.get("classname")) for c in cases
              if c.find("error") is not None or c.find("failure") is not None}
    assert len(cases) > 140  # the whole suite ran (145 cases in h2spec 2.2.1)
    assert failed == set(NOT_APPLICABLE), sorted(failed ^ set(NOT_APPLICABLE))
