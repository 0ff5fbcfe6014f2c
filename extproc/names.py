"""Every annotation and label name the service reads or writes, in one place.

Pure constants: the policy may import them (for the words it puts in notices) as well as the
platform. Names under ``modelpool.inference.llmkube.dev/`` are this service's own; names under
``inference.llmkube.dev/`` are LLMKube's, read as LLMKube defines them.
"""

from __future__ import annotations

OURS = "modelpool.inference.llmkube.dev/"
LLMKUBE = "inference.llmkube.dev/"

# On a ModelPool: how the pool is tuned (docs/pools.md)
ALIASES_ANNOTATION = OURS + "aliases"
FAIRNESS_ANNOTATION = OURS + "fairness-window"
MAX_HELD_ANNOTATION = OURS + "max-held"
MIN_RESIDENCY_ANNOTATION = OURS + "min-residency"
FALLBACKS_ANNOTATION = OURS + "fallbacks"
PRIORITIES_ANNOTATION = OURS + "priorities"
PORTS_ANNOTATION = OURS + "member-ports"
# On a ModelPool: an operator's word that ends a hands-off spell at once (a new value)
RESUME_ANNOTATION = OURS + "resume"
# On a ModelPool: a swap asked of LLMKube's reconciler (llmkube mode)
ACTIVATION_ANNOTATION = OURS + "activation"

# On an InferenceService (member)
CAPACITY_ANNOTATION = OURS + "capacity"
CARRY_ANNOTATION = OURS + "carry-prompt-cache"
LEADER_ANNOTATION = OURS + "leader"  # the fence: the leader's term, stamped before a scale
IDLE_ENDPOINT = LLMKUBE + "idle-endpoint"
IDLE_METRIC = LLMKUBE + "idle-metric"
IDLE_METRIC_THRESHOLD = LLMKUBE + "idle-metric-threshold"
IDLE_METRIC_PATH = LLMKUBE + "idle-metric-path"
PROBE_ANNOTATIONS = (IDLE_ENDPOINT, IDLE_METRIC, IDLE_METRIC_THRESHOLD, IDLE_METRIC_PATH)

# On a Lease
PAYLOAD_ANNOTATION = OURS + "replica-state"
ROLE_LABEL = OURS + "lease-role"

# Labels
SERVICE_LABEL = LLMKUBE + "service"  # a member's pods (LLMKube's)
POOL_LABEL = OURS + "pool"  # the InferencePool made for a ModelPool
