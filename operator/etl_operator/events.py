"""Which Kubernetes Events a reconcile records on its ETL, so ``kubectl describe etl``
tells the ETL's story. Plain functions of what the reconcile saw and did.

Reasons (``type`` Normal unless noted):

==================  ===========================================================
``Created``         transformer pods were created (first start, a new spec, a
                    restart after a failure, a new target)
``TransformerReady`` a target's serving transformer became ready
``TransformerFailed`` (Warning) a transformer of the current spec exited or
                    hung past ``initSeconds``; it is restarted or, if the
                    failure is permanent, the ETL goes to Error
``ImagePullFailed`` (Warning) the kubelet cannot pull a transformer pod's image
                    (``ErrImagePull``, ``ImagePullBackOff``, ``InvalidImageName``);
                    the message names the image and the pod
``RolledOut``       a changed spec now runs on every target (the previous
                    spec's transformers are gone)
``Error``           (Warning) the ETL entered phase Error; the message says why
``Deleted``         the ETL's transformers and Secret are gone; it is released
==================  ===========================================================

Conditions stay in ``status``; events are the history, and like every
Kubernetes Event they are best effort (the apiserver expires them after an
hour, and a failure to record one never fails a reconcile).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from etl_operator.status import PULL_FAILURES, PullFailure
from etl_runtime.cluster.reconcile import EXIT_CONFIG_ERROR, MAX_RESTARTS, ObservedTransformer

NORMAL, WARNING = "Normal", "Warning"
_MAX_NAMES = 5


@dataclass(frozen=True)
class EtlEvent:
    reason: str
    message: str
    type: str = NORMAL


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:_MAX_NAMES])
    return shown + (f" and {len(names) - _MAX_NAMES} more" if len(names) > _MAX_NAMES else "")


def created(pods: list[dict[str, Any]]) -> list[EtlEvent]:
    """``Created`` for the transformer pods this reconcile created."""
    if not pods:
        return []
    names = [p["metadata"]["name"] for p in pods]
    word = "pod" if len(names) == 1 else "pods"
    return [EtlEvent("Created", f"created transformer {word} {_names(names)}")]


def failed(
    observed: Iterable[ObservedTransformer],
    want_hash: str,
    previous: dict[str, Any] | None,
) -> list[EtlEvent]:
    """``TransformerFailed`` for current-spec transformers newly seen failed.

    A failed pod that stays (a permanent error) is reported once: the status
    written after the first report shows the same pod with the same message.
    """
    reported = {
        (t.get("pod"), t.get("message")) for t in (previous or {}).get("transformers") or ()
    }
    out = []
    for t in observed:
        if not t.terminated or t.spec_hash != want_hash or (t.name, t.message) in reported:
            continue
        why = t.message or (f"exit code {t.exit_code}" if t.exit_code is not None else "failed")
        then = (
            "not restarting: configuration error"
            if t.exit_code == EXIT_CONFIG_ERROR
            else f"restart {t.restarts + 1} of {MAX_RESTARTS}"
            if t.restarts < MAX_RESTARTS
            else "giving up"
        )
        out.append(
            EtlEvent(
                "TransformerFailed",
                f"transformer {t.name} on target {t.target} failed: {why} ({then})",
                WARNING,
            )
        )
    return out


def pull_failed(pulls: Iterable[PullFailure], previous: dict[str, Any] | None) -> list[EtlEvent]:
    """``ImagePullFailed`` for each transformer pod newly seen waiting for its image.

    Once per pod: the status written after the first report lists the pod with
    a pull reason as its message (the kubelet alternates ``ErrImagePull`` and
    ``ImagePullBackOff`` while it retries; that is not news).
    """
    reported = {
        t.get("pod")
        for t in (previous or {}).get("transformers") or ()
        if str(t.get("message") or "").split(":")[0] in PULL_FAILURES
    }
    return [
        EtlEvent("ImagePullFailed", p.describe(), WARNING) for p in pulls if p.pod not in reported
    ]


def became_ready(previous: dict[str, Any] | None, status: dict[str, Any]) -> list[EtlEvent]:
    """``TransformerReady`` for each target whose serving transformer is newly ready."""
    before = {
        t.get("target"): t.get("pod")
        for t in (previous or {}).get("transformers") or ()
        if t.get("ready")
    }
    total = status.get("total") or 0
    out = []
    for t in status.get("transformers") or ():
        if t.get("ready") and before.get(t.get("target")) != t.get("pod"):
            node = f" (node {t['node']})" if t.get("node") else ""
            out.append(
                EtlEvent(
                    "TransformerReady",
                    f"transformer {t.get('pod')} on target {t.get('target')}{node} is ready "
                    f"({status.get('readyCount', 0)}/{total} ready)",
                )
            )
    return out


def phase_change(
    previous: dict[str, Any] | None, status: dict[str, Any], rolled_out: bool
) -> list[EtlEvent]:
    """``Error`` on entering phase Error; ``RolledOut`` when a spec change completed."""
    phase, before = status.get("phase"), (previous or {}).get("phase")
    if phase == "Error" and before != "Error":
        return [EtlEvent("Error", status.get("message") or "ETL failed", WARNING)]
    if rolled_out:
        spec_hash = str(status.get("specHash") or "")[:6]
        total = status.get("total") or 0
        return [
            EtlEvent(
                "RolledOut",
                f"spec {spec_hash} (generation {status.get('observedGeneration')}) "
                f"runs on all {total} targets",
            )
        ]
    return []


def deleted() -> EtlEvent:
    return EtlEvent("Deleted", "transformer pods and token Secret deleted; ETL released")


def event_body(etl: dict[str, Any], event: EtlEvent, now: str, instance: str) -> dict[str, Any]:
    """A ``core/v1`` Event about ``etl`` (what ``kubectl describe`` lists)."""
    meta = etl["metadata"]
    return {
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": etl.get("apiVersion") or "sluice.dev/v1alpha1",
            "kind": etl.get("kind") or "ETL",
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
        },
        "reason": event.reason,
        "message": event.message[:1024],
        "type": event.type,
        "source": {"component": "sluice-operator"},
        "reportingComponent": "sluice.dev/operator",
        "reportingInstance": instance,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
