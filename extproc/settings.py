"""Every tunable of the service, in one typed object fed by CLI flags and the environment.

Precedence: a command-line flag beats its environment variable, which beats the default
declared here. Each field's environment variable is ``MODELPOOL_`` + the field name in
upper case (``MODELPOOL_SWAP_BUDGET``); each flag is ``--`` + the name with dashes. This
module declares the fields and what makes a set of them unusable (``validate``);
``settings_sources`` turns flags and the environment into them.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass, field
from typing import Any

ENV_PREFIX = "MODELPOOL_"
# Several replicas coordinate through Leases (platform/kube/coordination.py; docs/operations.md).
_REPLICAS = "replicas (identity, Lease names and timings; Kubernetes only)"


class ConfigError(SystemExit):
    """Configuration that cannot work (a bad flag value, pools file or kubeconfig).

    A SystemExit, so that nothing catches it as an ordinary error on the way out; the
    command line prints its one line and exits with status 2, never a traceback.
    """


def _opt(default: Any, help: str, *, group: str, metavar: str | None = None,
         flag: str | None = None) -> Any:
    """Declare a settings field with its help text, help-section group and flag name."""
    meta = {"help": help, "group": group, "metavar": metavar, "flag": flag}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


def parse_duration(text: str | float | int) -> float:
    """Parse ``300``, ``300s``, ``5m``, ``1h30m`` or ``250ms`` into seconds (finite, >= 0)."""
    seconds = _parse_seconds(text)
    # nan or inf would make deadlines that never fire; a negative one fires before it starts.
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"invalid duration {text!r}: must be finite and not negative")
    return seconds


def _parse_seconds(text: str | float | int) -> float:
    if isinstance(text, (int, float)):
        return float(text)
    s = text.strip()
    if not s:
        raise ValueError("empty duration")
    try:
        return float(s)
    except ValueError:
        pass
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    total, number = 0.0, ""
    i = 0
    while i < len(s):
        ch = s[i]
        if ch.isdigit() or ch == ".":
            number += ch
            i += 1
            continue
        unit = "ms" if s.startswith("ms", i) else ch
        if unit not in units or not number:
            raise ValueError(f"invalid duration {text!r} (use e.g. 300s, 5m, 250ms)")
        total += float(number) * units[unit]
        number = ""
        i += len(unit)
    if number:
        raise ValueError(f"invalid duration {text!r}: number without a unit at the end")
    return total


@dataclass(frozen=True, slots=True)
class Settings:
    """The service's configuration; see ``modelpool-extproc serve --help``."""

    # --- listeners -------------------------------------------------------------------------
    listen: str = _opt("127.0.0.1:9002", "gRPC address for ext_proc and grpc.health.v1 "
                       "(use 0.0.0.0:9002 in a pod)", group="listeners", metavar="HOST:PORT")
    metrics_listen: str = _opt("127.0.0.1:9090", "HTTP address serving /metrics and /healthz "
                               "(empty disables it)", group="listeners", metavar="HOST:PORT")
    metrics_idle_timeout: float = _opt(10.0, "a connection to --metrics-listen that has not "
                                       "sent a whole request this long after it opened or "
                                       "after its last answer is closed", group="listeners",
                                       metavar="DURATION")
    tls_cert: str = _opt("", "PEM certificate for TLS on the gRPC listener (with --tls-key); "
                         "it, the key and the client CA are re-read when they change "
                         "(rotation): new connections get the new ones", group="listeners",
                         metavar="FILE")
    tls_key: str = _opt("", "PEM private key for TLS on the gRPC listener", group="listeners",
                        metavar="FILE")
    tls_client_ca: str = _opt("", "PEM CA bundle; when set, clients must present a certificate "
                              "it signed (mutual TLS)", group="listeners", metavar="FILE")
    health_listen: str = _opt("", "extra plaintext gRPC address serving only grpc.health.v1, "
                              "for kubelet probes when the ext_proc listener uses (m)TLS "
                              "(empty: health only on --listen)", group="listeners",
                              metavar="HOST:PORT")
    event_loop: str = _opt("uvloop", "asyncio event loop: uvloop (less CPU per request than "
                           "asyncio's own at c=32, measured in docs/benchmarks.md part 6) or "
                           "asyncio", group="listeners",
                           metavar="LOOP")
    grpc_server: str = _opt("native", "the gRPC server on --listen: native (the service's own "
                            "HTTP/2 on the event loop: less CPU and fewer context switches "
                            "per request, docs/benchmarks.md part 6) or grpcio (grpc.aio)",
                            group="listeners", metavar="SERVER")
    max_streams_per_connection: int = _opt(
        500, "ext_proc streams one connection may keep open at once (HTTP/2's "
        "SETTINGS_MAX_CONCURRENT_STREAMS): every held request is one of Envoy's, and Envoy's "
        "connection pool opens another connection when one reaches this limit, so it bounds "
        "what one connection can pin, not how many requests are held (up to 8,192 are taken "
        "before the peer has acknowledged it)", group="listeners", metavar="N")
    max_connections: int = _opt(
        1_000, "gRPC connections held at once on --listen (the native server): Envoy opens "
        "one per worker thread, and one more per --max-streams-per-connection held requests; "
        "at the cap a new connection takes the place of the oldest one without a stream (or "
        "without its preface), which gets a GOAWAY; only when every one has streams open is "
        "it refused, with a warning. ~6 KB each when idle, up to ~1 MB with all its streams "
        "open (keep it below the process's open-file limit)", group="listeners", metavar="N")
    max_connections_per_peer: int = _opt(
        250, "the part of --max-connections one peer address may hold: past it, its new "
        "connection takes the place of its own oldest idle one, never another peer's (on a "
        "Unix socket only the cap counts)",
        group="listeners", metavar="N")
    connection_idle_timeout: float = _opt(
        300.0, "a gRPC connection with no stream for this long is closed gracefully (GOAWAY, "
        "then a PING, so that no stream Envoy sent meanwhile is lost; 0: never)",
        group="listeners", metavar="DURATION")
    first_message_timeout: float = _opt(
        10.0, "an ext_proc stream whose first message (the request's headers or body) has not "
        "come after this long is ended with DEADLINE_EXCEEDED, so silent streams cannot hold "
        "connections for ever (Envoy sends it at once; 0: wait for ever)", group="listeners",
        metavar="DURATION")
    shutdown_grace: float = _opt(30.0, "on SIGTERM, stop accepting streams and let in-flight "
                                 "ones finish for up to this long", group="listeners",
                                 metavar="DURATION")

    # --- where pools come from ---------------------------------------------------------------
    pools_file: str = _opt("", "static pool definitions (YAML); when empty, pools are watched "
                           "from Kubernetes", group="pools", metavar="FILE")
    kubeconfig: str = _opt("", "kubeconfig for the API server (default: in-cluster config, "
                           "then $KUBECONFIG / ~/.kube/config)", group="pools", metavar="FILE")
    namespaces: list[str] = _opt([], "namespaces to watch (repeatable, or comma separated); "
                                 "empty means all namespaces", group="pools", metavar="NS",
                                 flag="--namespace")
    actuation: str = _opt("own", "who carries swaps out: own (this service drains, unloads, "
                          "loads and writes the pool status), llmkube (LLMKube's ModelPool "
                          "reconciler does; this service only triggers a swap and follows "
                          "status.residentMember) or auto (per pool: llmkube when another "
                          "controller writes the pool's status, else own)", group="pools",
                          metavar="MODE")

    # --- routing -------------------------------------------------------------------------------
    route_header: str = _opt("x-modelpool-member", "request header that tells Envoy which "
                             "member to route to; a client-sent value is always overwritten",
                             group="routing", metavar="NAME")
    route_template: str = _opt("{member}.{namespace}", "value of the routing header; "
                               "placeholders {member}, {pool}, {namespace}", group="routing",
                               metavar="TEMPLATE")
    passthrough_unknown: bool = _opt(False, "let requests naming a model that is in no pool "
                                     "continue untouched instead of answering 404",
                                     group="routing")
    route_check_interval: float = _opt(0.0, "every this long, warn (an Event on the pool) "
                                       "about members no HTTPRoute in the pool's namespace "
                                       "routes; 0 = off (needs RBAC: list httproutes)",
                                       group="routing", metavar="DURATION")
    endpoint_picker: bool = _opt(False, "answer as an InferencePool's endpoint picker (Gateway "
                                 "API inference extension): name a Ready pod of the member "
                                 "(x-gateway-destination-endpoint header and envoy.lb metadata) "
                                 "instead of the routing header; any body mode",
                                 group="routing")
    endpoint_port: int = _opt(8080, "with --endpoint-picker: the member pods' port, the "
                              "InferencePool's targetPorts (LLMKube's model servers: 8080)",
                              group="routing", metavar="PORT")
    max_body_bytes: int = _opt(25 * 1024 * 1024, "largest request body accepted (413 above); "
                               "keep Envoy's buffer limit above it", group="routing",
                               metavar="BYTES")
    body_bytes_in_flight: int = _opt(
        128 * 1024 * 1024, "request-body bytes the whole process holds at once while reading "
        "the model from them; a body past this budget is answered 503 with Retry-After (the "
        "memory a flood of large bodies can take; keep it at least --max-body-bytes)",
        group="routing", metavar="BYTES")
    streamed_body_limit: int = _opt(
        32 * 1024, "with --endpoint-picker behind a gateway sending request bodies STREAMED: "
        "the largest content-length routed, 413 at once above (Envoy forwards the headers of a "
        "body it has not buffered whole before the picker sees it); set it to the listener's "
        "per_connection_buffer_limit_bytes", group="routing", metavar="BYTES")

    # --- swap policy ---------------------------------------------------------------------------
    swap_budget: float = _opt(300.0, "default time a request may be held for a swap when the "
                              "ModelPool sets no spec.swapBudget", group="swap",
                              metavar="DURATION")
    fairness_window: float = _opt(30.0, "after a cross-model request has waited this long, new "
                                  "requests for the incumbent are held too so it can drain "
                                  "(0 = pure coalescing); per pool: annotation "
                                  "modelpool.inference.llmkube.dev/fairness-window",
                                  group="swap", metavar="DURATION")
    drain_linger: float = _opt(0.5, "before unloading an incumbent, wait until it has been idle "
                               "this long (unless the fairness window is over), so interleaved "
                               "traffic is batched instead of swapped per request",
                               group="swap", metavar="DURATION")
    swap_timeout: float = _opt(900.0, "a swap whose target is not Ready after this long is "
                               "declared failed, so a stuck member cannot wedge its pool",
                               group="swap", metavar="DURATION")
    failure_backoff: float = _opt(30.0, "after a member failed to load, requests for it fail "
                                  "fast for this long instead of thrashing the slot",
                                  group="swap", metavar="DURATION")
    retry_after_default: int = _opt(5, "Retry-After seconds when a pool has no swap history",
                                    group="swap", metavar="SECONDS")
    retry_after_max: int = _opt(120, "upper clamp for computed Retry-After values",
                                group="swap", metavar="SECONDS")
    park_timeout_override: bool = _opt(True, "send override_message_timeout when a stream is "
                                       "parked (needs max_message_timeout in Envoy's ext_proc "
                                       "filter)", group="swap")
    idle_gate: bool = _opt(False, "before scaling an incumbent down, ask its runtime whether it "
                           "is idle (llama.cpp /slots, vLLM /metrics, or LLMKube's idle-metric / "
                           "idle-endpoint annotations); an unreachable or unknown probe defers "
                           "the swap", group="swap")
    idle_probe_url: str = _opt("http://{member}.{namespace}.svc:8080/slots", "URL template of "
                               "the idle probe: llama.cpp is asked at this URL, the other probes "
                               "at their own path on its host and port", group="swap",
                               metavar="TEMPLATE")
    idle_probe_timeout: float = _opt(2.0, "an idle probe that has not answered after this long "
                                     "counts as unknown (the swap is deferred)", group="swap",
                                     metavar="DURATION")
    probe_retry: float = _opt(1.0, "after an idle probe said busy or could not tell, ask again "
                              "after this long", group="swap", metavar="DURATION")
    max_held: int = _opt(256, "requests a pool holds at most on this replica while it swaps; "
                         "beyond, 503 + Retry-After at once (each held request pins its body "
                         "in Envoy for up to the swap budget; 0 = no bound); per pool: "
                         "annotation modelpool.inference.llmkube.dev/max-held", group="swap",
                         metavar="COUNT")
    stall_after: float = _opt(120.0, "a swap that unloads or loads with no change in its "
                              "members' replicas, pods or phase for this long is reported "
                              "SwapStalled (condition, Warning Event, gauge); it still fails "
                              "only at --swap-timeout", group="swap", metavar="DURATION")
    idle_report: float = _opt(30.0, "under swapPolicy reclaim, a non-default resident idle "
                              "this long shows status.residentIdleSince (shorter idle spells "
                              "are not written, so busy pools cost no status writes)",
                              group="swap", metavar="DURATION")
    activation_grace: float = _opt(5.0, "llmkube mode: a trigger that leaves no trace in the "
                                   "cluster this long (the target back at 0 replicas, neither "
                                   "pending nor resident) was dropped by LLMKube's reconciler "
                                   "and is sent again; the k-th retry waits twice as long",
                                   group="swap", metavar="DURATION")
    activation_retries: int = _opt(3, "llmkube mode: dropped triggers sent again before the swap "
                                   "is given up (its held requests get 503 activation_lost)",
                                   group="swap", metavar="COUNT")
    hands_off_quiet: float = _opt(300.0, "own mode: a pool handed off because another writer "
                                  "fought over it resumes after this long without a foreign "
                                  "write (doubling for each new spell, up to 16x); at once "
                                  "with the annotation modelpool.inference.llmkube.dev/resume",
                                  group="swap", metavar="DURATION")
    paced_release: bool = _opt(False, "release a member's held requests up to its capacity (its "
                               "annotation modelpool.inference.llmkube.dev/capacity, else the "
                               "slot count llama.cpp's /slots reports), the rest as earlier "
                               "ones end; the same limit in steady state (off: all at once)",
                               group="swap")
    carry_timeout: float = _opt(10.0, "a swap waits this long at most for a member's slot save "
                                "(before it unloads) or restore (before its held requests "
                                "pass) under prompt-cache carry-over (annotation "
                                "modelpool.inference.llmkube.dev/carry-prompt-cache); past "
                                "it the swap goes on without it", group="swap",
                                metavar="DURATION")
    park_margin: float = _opt(5.0, "extra time asked of Envoy (override_message_timeout) beyond "
                              "a held request's budget, so our own 503 arrives before Envoy's",
                              group="swap", metavar="DURATION")

    # --- Kubernetes ----------------------------------------------------------------------------
    pod_selector: str = _opt("inference.llmkube.dev/service", "label selector of the member "
                             "pods watched (LLMKube labels every model pod so); empty watches "
                             "all pods, so hand-made members with only app=<member> count",
                             group="kubernetes", metavar="SELECTOR")
    watch_timeout: float = _opt(300.0, "timeoutSeconds of each watch request; the watch then "
                                "resumes from its last resourceVersion", group="kubernetes",
                                metavar="DURATION")
    api_retry_initial: float = _opt(0.2, "first delay before retrying a failed API call (watch, "
                                    "status write, scale); doubles with jitter",
                                    group="kubernetes", metavar="DURATION")
    api_retry_max: float = _opt(30.0, "longest delay between retries of a failed API call",
                                group="kubernetes", metavar="DURATION")
    api_request_timeout: float = _opt(60.0, "a call to the API server (not a watch) is given up "
                                      "after this; a scale-up or trigger of ours already sent "
                                      "may still land that long, so a member asked up and then "
                                      "removed from the pool or asked down again counts as "
                                      "possibly up for it, and nothing loads beside it",
                                      group="kubernetes", metavar="DURATION")

    # --- replicas: membership and leader Leases ----------------------------------------------
    replica_name: str = _opt("", "this replica's identity in the Leases; empty: $POD_NAME, else "
                             "the host name (a restarted pod keeps its name, so it takes its "
                             "Leases back at once)", group=_REPLICAS, metavar="NAME")
    lease_namespace: str = _opt("", "namespace of every Lease this service uses; empty: "
                                "$POD_NAMESPACE, else the service account's namespace, else "
                                "default", group=_REPLICAS, metavar="NS")
    lost_replica_wait: float = _opt(600.0, "a replica lost without leaving (killed, cut off) may "
                                    "still have requests streaming from the incumbent: until "
                                    "the member's idle probe says idle, a swap waits this long "
                                    "after it was lost (the longest a response may stream: "
                                    "Envoy's route timeout, or its stream idle timeout, 600s "
                                    "in the shipped configs, when the route has none)",
                                    group=_REPLICAS, metavar="DURATION")
    # Membership as docs/design/replicas.md has it (a ~10 s Lease renewed every ~2 s): it gates
    # admission, so a cut off replica must fail closed soon; client-go's 15 s lease is for leaders, which act rarely.
    membership_lease_duration: float = _opt(10.0, "leaseDurationSeconds of each replica's "
                                            "membership Lease (whole seconds; client-go's "
                                            "leader default is 15s, shorter here so a cut-off "
                                            "replica stops admitting sooner)", group=_REPLICAS,
                                            metavar="DURATION")
    membership_renew: float = _opt(2.0, "renew the membership Lease (with the in-flight and "
                                   "held counts) this often; client-go's retry period",
                                   group=_REPLICAS, metavar="DURATION")
    lease_margin: float = _opt(2.0, "safety margin on every Lease: a replica stops admitting "
                               "duration - margin after its last successful renew was sent, "
                               "peers count it lost after duration + margin of silence (covers "
                               "clock rate and scheduling delays)", group=_REPLICAS,
                               metavar="DURATION")
    membership_write_interval: float = _opt(0.25, "extra membership writes asked for between "
                                            "renews (held 0 -> >0, a drained member) are "
                                            "coalesced to at most one per this long",
                                            group=_REPLICAS, metavar="DURATION")
    leader_lease_duration: float = _opt(15.0, "leaseDurationSeconds of the leader Lease; "
                                        "client-go's LeaseDuration", group=_REPLICAS,
                                        metavar="DURATION")
    leader_renew_deadline: float = _opt(10.0, "a leader that has not renewed for this long "
                                        "stops acting as leader; client-go's RenewDeadline",
                                        group=_REPLICAS, metavar="DURATION")
    leader_retry: float = _opt(2.0, "the leader renews its Lease this often (client-go's "
                               "RetryPeriod); candidates watch it and try once it has been "
                               "silent a full duration", group=_REPLICAS,
                               metavar="DURATION")
    membership_lease_name: str = _opt("modelpool-extproc-{replica}", "name of a replica's "
                                      "membership Lease; placeholder {replica}",
                                      group=_REPLICAS, metavar="TEMPLATE")
    leader_lease_name: str = _opt("modelpool-extproc-leader", "name of the one leader Lease "
                                  "of the replica set (its holder leads every pool; replicas "
                                  "sharing it must serve the same namespaces)",
                                  group=_REPLICAS, metavar="NAME")

    # --- observability -------------------------------------------------------------------------
    log_level: str = _opt("info", "debug, info, warning or error", group="observability",
                          metavar="LEVEL")
    router_name: str = _opt("default", "value of the `router` label on the llmkube_modelpool_* "
                            "series (LLMKube's router name)", group="observability",
                            metavar="NAME")
    log_bodies: bool = _opt(False, "log request bodies (first 4 KiB) at debug level; off by "
                            "default because prompts may hold secrets (authorization headers "
                            "are never read, so never logged)", group="observability")
    debug_endpoints: bool = _opt(False, "serve GET /debug/pools on --metrics-listen (every "
                                 "pool of every namespace, members and counts); off by "
                                 "default: anyone who reaches the port would read it",
                                 group="observability")

    # --- trust -------------------------------------------------------------------------------
    client_priority: str = _opt("lower", "what the client headers x-modelpool-priority and "
                                "x-gateway-inference-objective may do to a request's priority: "
                                "lower (below 0 only, never above: any client can send "
                                "them), trust (as sent: only where the gateway sets or strips "
                                "them itself) or ignore",
                                group="trust", metavar="MODE")


def validate(settings: Settings) -> str:
    """The first thing wrong with ``settings`` that would only show up per request, or ""."""
    for name in ("route_template", "idle_probe_url"):
        try:
            getattr(settings, name).format(member="m", pool="p", namespace="ns")
        except (KeyError, IndexError, ValueError) as exc:
            return f"bad {name} {getattr(settings, name)!r}: unknown placeholder {exc}"
    if not isinstance(logging.getLevelName(settings.log_level.upper()), int):
        return f"bad log_level {settings.log_level!r}: use debug, info, warning or error"
    if bool(settings.tls_cert) != bool(settings.tls_key):
        return "--tls-cert and --tls-key go together"
    if settings.api_retry_initial <= 0 or settings.api_retry_max < settings.api_retry_initial:
        return "--api-retry-initial must be above 0 and at most --api-retry-max"
    if settings.max_streams_per_connection < 1:
        return "--max-streams-per-connection must be at least 1"
    if settings.max_connections < 1:
        return "--max-connections must be at least 1"
    if settings.max_connections_per_peer < 1:
        return "--max-connections-per-peer must be at least 1"
    if settings.metrics_idle_timeout <= 0:
        return "--metrics-idle-timeout must be above 0"
    if settings.body_bytes_in_flight < settings.max_body_bytes:
        return "--body-bytes-in-flight must be at least --max-body-bytes"
    if settings.grpc_server not in ("native", "grpcio"):
        return f"bad grpc_server {settings.grpc_server!r}: use native or grpcio"
    if settings.client_priority not in ("lower", "trust", "ignore"):
        return f"bad client_priority {settings.client_priority!r}: use lower, trust or ignore"
    if settings.event_loop not in ("uvloop", "asyncio"):
        return f"bad event_loop {settings.event_loop!r}: use uvloop or asyncio"
    if settings.actuation not in ("own", "llmkube", "auto"):
        return f"bad actuation {settings.actuation!r}: use own, llmkube or auto"
    if settings.actuation == "llmkube" and settings.pools_file:
        return "--actuation llmkube needs Kubernetes (LLMKube's reconciler), not --pools-file"
    if settings.endpoint_picker and settings.passthrough_unknown:
        return ("--endpoint-picker and --passthrough-unknown exclude each other: a request the "
                "picker does not route has no pod to go to")
    if not 0 < settings.endpoint_port < 65536:
        return f"bad endpoint_port {settings.endpoint_port}: use a port 1-65535"
    if settings.watch_timeout < 1:
        return "--watch-timeout must be at least 1s"
    if settings.api_request_timeout < 1:
        return "--api-request-timeout must be at least 1s"
    return _lease_problem(settings)


_DNS_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _lease_problem(settings: Settings) -> str:
    """What is wrong with the Lease timings, or ""."""
    for name in ("membership_lease_duration", "leader_lease_duration"):
        value = getattr(settings, name)
        if value < 1 or value != int(value):  # leaseDurationSeconds is an integer
            return f"--{name.replace('_', '-')} must be whole seconds, at least 1s"
    if not 0 < settings.membership_renew < settings.membership_lease_duration - settings.lease_margin:
        return "--membership-renew must be above 0 and below the membership duration - margin"
    if not _DNS_NAME.fullmatch(settings.leader_lease_name):
        return (f"bad leader_lease_name {settings.leader_lease_name!r}: one Lease name for the "
                "replica set (lower-case letters, digits, '-' and '.'), no placeholders")
    if not 0 < settings.leader_retry < settings.leader_renew_deadline < settings.leader_lease_duration:
        return "need 0 < --leader-retry < --leader-renew-deadline < --leader-lease-duration"
    return ""
