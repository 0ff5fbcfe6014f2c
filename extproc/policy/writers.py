"""Who else writes a member's replicas or the pool's status: field managers, told apart.

The API server records, for every field, the field manager of the request that last set it
(``metadata.managedFields``: the request's ``fieldManager``, else the first word of its
User-Agent). The platform reads which manager owns a member's ``spec.replicas`` and the pool
status's slot fields and hands the name over as data (``MemberObservation.replicas_by``,
``PoolStatus.written_by``); this file says what a name means:

* ``ours``: this service's writes (``OUR_MANAGER``, sent with every write it makes).
* a person: ``kubectl`` and its sub-managers (``kubectl scale`` sends no fieldManager, so the
  API server takes ``kubectl`` from its User-Agent). A one-off: reported, undone as the pool
  needs, and only a repeated fight hands the pool off.
* nobody (``SCALE_UNRECORDED``): a write of 0 through the ``/scale`` subresource (``kubectl
  scale --replicas=0``, or any /scale client) leaves no field manager on ``spec.replicas``: the
  autoscaling/v1 Scale omits a zero replicas, so the API server records none. Told apart from
  a server that records no managers by the manager that owned the replicas before
  (``replicas_writer``), and reported like a person's write.
* a controller that will write again (Argo CD, Flux, Helm, an autoscaler): reported and the
  pool handed off at once, with the remedy; fighting it would only flap the member.
* anything else: ``other`` (reported and counted like a person; its name is in the message,
  never in a metric label).

In llmkube mode LLMKube's reconciler (``LLMKUBE_MANAGER``) and this service's trigger write
the replicas; a write by anyone else is reported, never undone nor fought
(``replicas_written_beside_llmkube``): the reconciler decides what it means.

Rules of this file: pure functions of names; no state.
"""

from __future__ import annotations

from dataclasses import dataclass

OUR_MANAGER = "modelpool-extproc"
# LLMKube's operator binary is a kubebuilder "manager": the API server records its writes so
LLMKUBE_MANAGER = "manager"
SCALE_UNRECORDED = "(scale subresource)"  # who set replicas to 0 when no manager is left


@dataclass(frozen=True, slots=True)
class Writer:
    """What a field manager is: its bounded metric label, whether it writes again, the fix."""

    label: str  # the metric label: one of LABELS
    controller: bool  # a controller re-applies its value: fighting it only flaps the member
    what: str  # who that is, in words
    remedy: str  # what an operator does about it


_PERSON = Writer("kubectl", False, "a person with kubectl (scale, edit, patch or apply)",
                 "if that was meant, pin the member outside the pool; own mode scales it as "
                 "the pool needs, and hands the pool off if it keeps being scaled against it")
_ARGO = Writer("argocd", True, "Argo CD syncing the member from Git",
               "add ignoreDifferences for /spec/replicas (jsonPointers) to the Application, "
               "with the sync option RespectIgnoreDifferences=true")
_FLUX = Writer("flux", True, "Flux applying the member from Git",
               "drop spec.replicas from the member's manifest (or its Kustomize patch or Helm "
               "values) so Flux stops re-applying it")
_HELM = Writer("helm", True, "Helm (every upgrade re-applies the chart's replicas)",
               "drop spec.replicas from the chart's template or values for pooled members")
_AUTOSCALER = Writer("autoscaler", True, "an autoscaler (a HorizontalPodAutoscaler, or KEDA's)",
                     "delete the HorizontalPodAutoscaler or ScaledObject aimed at the member: "
                     "a pooled member's replicas are the pool's")
_OURS = Writer("ours", False, "this service", "")
_UNRECORDED = Writer("unrecorded", False, "kubectl scale or another /scale client to 0 left "
                     "no field manager", _PERSON.remedy)
_OTHER = Writer("other", False, "another client", "find the client by this field manager name "
                "and stop it writing spec.replicas of pooled members")

# exact field manager names; prefixes below catch the families
_KNOWN = {
    OUR_MANAGER: _OURS,
    SCALE_UNRECORDED: _UNRECORDED,
    "kubectl": _PERSON,
    "argocd-controller": _ARGO,
    "argocd-application-controller": _ARGO,
    "kustomize-controller": _FLUX,
    "helm-controller": _FLUX,
    "helm": _HELM,
    "kube-controller-manager": _AUTOSCALER,  # the HPA controller writes /scale as it
    "horizontal-pod-autoscaler": _AUTOSCALER,
    "keda-operator": _AUTOSCALER,
}
_PREFIXES = (("kubectl-", _PERSON), ("argocd", _ARGO))

LABELS = ("ours", "kubectl", "argocd", "flux", "helm", "autoscaler", "unrecorded", "other",
          "unknown")


def classify(manager: str) -> Writer:
    """What the field manager ``manager`` is ("" : not known, taken as another client)."""
    found = _KNOWN.get(manager)
    if found is not None:
        return found
    return next((w for prefix, w in _PREFIXES if manager.startswith(prefix)), _OTHER)


def replicas_writer(before: str, after: str, replicas: int) -> str:
    """Who set a member's changed replicas, from the manager owning them ``before`` and
    ``after`` the change: the owner after it, else SCALE_UNRECORDED when they went to 0 and the
    owner before is gone ("": not known, e.g. a server recording no managers)."""
    if after or replicas or not before:
        return after
    return SCALE_UNRECORDED


def foreign(manager: str) -> bool:
    """Whether ``manager`` is a known writer other than us ("" : nobody known)."""
    return bool(manager) and manager != OUR_MANAGER


def beside_llmkube(manager: str) -> bool:
    """llmkube mode: whether ``manager`` is neither us nor LLMKube's reconciler ("" : nobody
    known)."""
    return foreign(manager) and manager != LLMKUBE_MANAGER


def label(manager: str) -> str:
    """The bounded metric label for ``manager`` ("unknown" when no manager was recorded)."""
    return classify(manager).label if manager else "unknown"


def named(manager: str) -> str:
    """The manager as messages name it: its own name, and what it is."""
    if manager == SCALE_UNRECORDED:
        return f"a write through the /scale subresource ({_UNRECORDED.what})"
    return f"field manager {manager!r} ({classify(manager).what})"


def replicas_written(member: str, replicas: int, manager: str) -> str:
    """The message for a member's replicas set by ``manager``, with what to do about it."""
    writer = classify(manager)
    return (f"{member}'s spec.replicas was set to {replicas} by {named(manager)}: "
            f"{writer.remedy}")


def replicas_written_beside_llmkube(member: str, replicas: int, manager: str) -> str:
    """llmkube mode's message for a member's replicas set by ``manager``: LLMKube's reconciler
    acts on the write (a scale-up asks for the member), this service only reports it."""
    writer = classify(manager)
    remedy = writer.remedy if writer.controller else (
        "if that was not meant, leave pooled members' replicas to the pool (remove the member "
        "from spec.members to keep it out)")
    return (f"{member}'s spec.replicas was set to {replicas} by {named(manager)}, beside "
            f"LLMKube's reconciler, which acts on it (this service only reports it): {remedy}")
