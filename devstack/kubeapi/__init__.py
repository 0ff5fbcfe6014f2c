"""An in-memory Kubernetes API server for tests and the local stack (a strict kmock subclass).

In process::

    emu = KubeEmulator(["crds/"], bookmark_interval=1.0)
    url = await emu.start(host="127.0.0.1", port=0)
    emu.write_kubeconfig(".demo/kubeconfig", user="extproc")   # token "extproc-token"
    emu.create("mpool", {...}); emu.patch("isvc", "a", {"status": {...}}, subresource="status")
    emu.requests          # [RequestRecord(verb, group, resource, subresource, namespace, name), ...]
    emu.requests_of("extproc"); emu.compact(); emu.fail_writes("isvc", 2)
    emu.throttle_writes("leases", 2); emu.set_unavailable(True)
    await emu.stop()

Out of process: `python -m devstack.kubeapi --port 0 --crds crds/ --kubeconfig-out K` prints the
URL and serves until SIGINT/SIGTERM. Debug endpoints (never recorded, never unavailable):
GET /_emulator/requests[?user=U], POST /_emulator/reset-record, POST /_emulator/compact
[?expireWatches=false], POST /_emulator/faults/conflict {"resource": "isvc", "count": N}
(409s), POST /_emulator/faults/throttle {"resource": "leases", "count": N} (429s),
GET|POST /_emulator/unavailable {"on": true|false}.

Not emulated: protobuf request bodies (`kubectl create <core kind>`; use apply), pagination
(limit/continue are ignored, lists are whole), schema validation and pruning (defaults are
applied), field ownership (server-side apply is a merge patch), strategic-merge list merging
(treated as merge patch), cascading deletion, pod grace periods (deletion is immediate unless
finalizers hold the object), resourceVersionMatch=NotOlderThan waits.
"""

from devstack.kubeapi.errors import ApiError
from devstack.kubeapi.resources import ResourceType
from devstack.kubeapi.routes import RequestRecord
from devstack.kubeapi.server import KubeEmulator

__all__ = ["ApiError", "KubeEmulator", "RequestRecord", "ResourceType"]
