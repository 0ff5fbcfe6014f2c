"""Real llama.cpp members: llama.cpp's own ``llama-server`` on a generated GGUF model.

``make llama-server`` builds the server from the llama.cpp tree of a pinned PyPI sdist
(llama-cpp-python) into a cache outside the clone and links it into ``.tools/llama.cpp``;
``devstack.tinymodel`` writes the models. With ``--runtime llama.cpp`` the member simulator
starts one of these for a member scaled to 1 (on the member's pod address and port) instead of
the fake upstream, stops it with SIGTERM for a member scaled to 0, and reports Ready only when
llama.cpp's ``/health`` answers 200 (it answers 503 while the model loads).

Per member, annotations on the InferenceService (read at each load):

- ``sim.llmkube.dev/model-file``: the GGUF to serve (default: the runtime's ``tiny`` model). A
  missing or corrupt file is llama.cpp's own failure: the server exits, the load fails.
- ``sim.llmkube.dev/parallel``: llama-server's ``-np`` (slots), default 2.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from devstack import tinymodel
from devstack.procs import LOCALHOST, PROJECT_ROOT, ManagedProcess
from devstack.simulator_server import ProcessServer

BINARY_ENV = "MODELPOOL_LLAMA_SERVER"  # set by the Makefile
ANN_MODEL_FILE = "sim.llmkube.dev/model-file"
ANN_PARALLEL = "sim.llmkube.dev/parallel"
DEFAULT_PARALLEL = 2
CONTEXT_PER_SLOT = 512
LOAD_TIMEOUT = 120.0  # a large model on a busy machine


def binary() -> Path:
    """The llama-server built by ``make llama-server``; FileNotFoundError saying how."""
    path = Path(os.environ.get(BINARY_ENV) or PROJECT_ROOT / ".tools/llama.cpp/llama-server")
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise FileNotFoundError(f"llama-server not found at {path}: run `make llama-server` "
                                "(builds it once from llama-cpp-python's sdist)")
    return path


class LlamaServer(ProcessServer):
    """One member's llama-server process."""

    start_timeout = LOAD_TIMEOUT


@dataclass(frozen=True)
class LlamaRuntime:
    """How the simulator starts a member's llama-server."""

    binary: Path
    models: Path  # where devstack.tinymodel writes (and finds) the default model
    slot_dir: Path  # --slot-save-path: outlives every pod, as a volume would
    threads: int = 1  # two shared cores: one thread per server keeps a swap's two apart

    @classmethod
    def create(cls, models: Path, slot_dir: Path) -> LlamaRuntime:
        """A runtime on the built binary, its default model written if needed."""
        tinymodel.ensure(models, "tiny")
        slot_dir.mkdir(parents=True, exist_ok=True)
        return cls(binary(), models, slot_dir)

    def server(self, member: str, port: int, log_dir: Path, annotations: dict[str, str],
               host: str = LOCALHOST) -> LlamaServer:
        """The server a load of ``member`` starts (not started yet)."""
        model = annotations.get(ANN_MODEL_FILE) or str(self.models / "tiny.gguf")
        try:
            parallel = max(1, int(annotations.get(ANN_PARALLEL, DEFAULT_PARALLEL)))
        except ValueError:
            parallel = DEFAULT_PARALLEL
        args = [self.binary, "-m", model, "--host", host, "--port", str(port),
                "-np", str(parallel), "-c", str(CONTEXT_PER_SLOT * parallel),
                "-t", str(self.threads), "--alias", member, "--metrics",
                "--slot-save-path", str(self.slot_dir) + os.sep, "--no-webui"]
        process = ManagedProcess(args, log_dir / f"llama-{member}.log", cwd=log_dir)
        return LlamaServer(member, port, process, host)
