"""What the operator observes and reports: pods -> ``ObservedTransformer`` -> ETL status.

``observe()`` reads one transformer pod the way ``reconcile.plan()`` needs it
(ready, terminated for good, exit code, the transformer's own last words);
``etl_status()`` turns ``reconcile.summarize()`` and the per-target picture
into the CR's ``status`` with Ready / Progressing / Degraded conditions.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from etl_operator.pods import (
    LAST_FAILURE_ANNOTATION,
    RESTARTS_ANNOTATION,
    SPEC_HASH_ANNOTATION,
    TARGET_LABEL,
)
from etl_runtime.cluster.kube.records import pod_is_ready, pod_url
from etl_runtime.cluster.reconcile import MAX_RESTARTS, ObservedTransformer, Summary
from etl_runtime.cluster.records import TargetInfo, TransformerStatus

_MAX_MESSAGE = 400


def observe(
    pod: dict[str, Any],
    init_timeout: float | None = None,
    now: dt.datetime | None = None,
) -> ObservedTransformer:
    """An ``ObservedTransformer`` from a transformer pod (as a JSON dict).

    A pod that is still running but has not been ready for more than
    ``init_timeout`` seconds (the spec's ``timeouts.initSeconds``) counts as
    terminated by a transient failure, as the local cluster's controller
    treats a child that does not come up: the reconcile replaces it, counting
    a restart, and after ``MAX_RESTARTS`` the ETL shows ``Error``.
    """
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    status = pod.get("status") or {}
    statuses = status.get("containerStatuses") or [{}]
    container: dict[str, Any] = statuses[0] or {}
    state = container.get("state") or {}
    terminated = state.get("terminated") or (container.get("lastState") or {}).get("terminated")
    phase = status.get("phase")
    done = phase in ("Failed", "Succeeded")
    try:
        restarts = int(annotations.get(RESTARTS_ANNOTATION, 0))
    except ValueError:
        restarts = 0
    restarts += int(container.get("restartCount") or 0)
    ready = pod_is_ready(pod)
    late = None
    if not done and not ready and init_timeout is not None:
        late = not_ready_for(pod, now or dt.datetime.now(dt.UTC))
        if late is not None and late <= init_timeout:
            late = None
    if late is not None:
        kubelet = _pod_message(status, container, None) or _not_created(pod, container)
        why = f": {kubelet}" if kubelet else ""
        return ObservedTransformer(
            name=meta["name"],
            target=annotations.get(TARGET_LABEL) or labels.get(TARGET_LABEL, ""),
            spec_hash=annotations.get(SPEC_HASH_ANNOTATION, ""),
            node=(pod.get("spec") or {}).get("nodeName"),
            endpoint=pod_url(pod, 8000),  # https:// by name under TLS
            ready=False,
            terminated=True,
            exit_code=None,
            restarts=restarts,
            message=_clip(f"not ready after {init_timeout:g}s (initSeconds){why}"),
        )
    return ObservedTransformer(
        name=meta["name"],
        target=annotations.get(TARGET_LABEL) or labels.get(TARGET_LABEL, ""),
        spec_hash=annotations.get(SPEC_HASH_ANNOTATION, ""),
        node=(pod.get("spec") or {}).get("nodeName"),
        endpoint=pod_url(pod, 8000),
        healthy_for=_ran_for(terminated) if done else None,
        ready=ready,
        terminated=done,
        exit_code=(terminated or {}).get("exitCode") if done else None,
        restarts=restarts,
        message=_pod_message(status, container, terminated if done else None)
        or gave_up_message(annotations),
    )


def _not_created(pod: dict[str, Any], container: dict[str, Any]) -> str | None:
    """Why a pod past initSeconds may have no running container: its volumes.

    A volume that does not mount (the target's data claim shared read-only,
    say, on a ReadWriteOncePod claim) shows only as the pod's FailedMount
    events while the container stays ``ContainerCreating``: name the suspects.
    """
    state = container.get("state") or {}
    if state.get("running") or state.get("terminated"):
        return None
    volumes = [
        v["persistentVolumeClaim"]["claimName"]
        for v in (pod.get("spec") or {}).get("volumes") or ()
        if "persistentVolumeClaim" in v
    ]
    if not volumes:
        return None
    return (
        f"container not created: claim {', '.join(volumes)} may not mount here "
        "(see the pod's FailedMount events; etl.shareTargetData=false in the chart, "
        "SLUICE_SHARE_TARGET_DATA=false for the operator, turns the data mount off)"
    )


# A container's ``state.waiting.reason`` while the kubelet cannot get its image.
PULL_FAILURES = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")


@dataclass(frozen=True)
class PullFailure:
    """A transformer pod whose image the kubelet cannot pull (or refuses to)."""

    pod: str
    target: str
    image: str
    reason: str
    detail: str

    def describe(self) -> str:
        head = (
            f"transformer pod {self.pod} on target {self.target} cannot pull image "
            f"{self.image} ({self.reason}"
        )
        if not self.detail:
            return _clip(head + ")")
        # The kubelet's message ends with the cause (no such host, not found, ...).
        room = max(_MAX_MESSAGE - len(head) - 3, 20)
        detail = self.detail if len(self.detail) <= room else "..." + self.detail[3 - room :]
        return _clip(f"{head}: {detail})")


def pull_failure(pod: dict[str, Any]) -> PullFailure | None:
    """The image pull failure a pod's containers are waiting on, if any."""
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    specs = {c.get("name"): c for c in (pod.get("spec") or {}).get("containers") or ()}
    status = pod.get("status") or {}
    for c in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        waiting = ((c or {}).get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in PULL_FAILURES:
            image = (specs.get(c.get("name")) or {}).get("image") or c.get("image") or "?"
            return PullFailure(
                pod=meta.get("name", ""),
                target=annotations.get(TARGET_LABEL)
                or (meta.get("labels") or {}).get(TARGET_LABEL, ""),
                image=image,
                reason=waiting["reason"],
                detail=(waiting.get("message") or "").strip(),
            )
    return None


def gave_up_message(annotations: dict[str, str]) -> str | None:
    """For the pod after the last allowed restart, why its predecessors failed."""
    try:
        restarts = int(annotations.get(RESTARTS_ANNOTATION, 0))
    except ValueError:
        return None
    last = annotations.get(LAST_FAILURE_ANNOTATION)
    if restarts < MAX_RESTARTS or not last:
        return None
    return _clip(f"gave up after {restarts} restarts; last: {last}")


def not_ready_for(pod: dict[str, Any], now: dt.datetime) -> float | None:
    """Seconds the pod has been not ready: since its ``Ready`` condition turned
    False, else since it started (``status.startTime``, else its creation)."""
    status = pod.get("status") or {}
    since = None
    for cond in status.get("conditions") or ():
        if cond.get("type") == "Ready" and cond.get("status") != "True":
            since = cond.get("lastTransitionTime")
    since = since or status.get("startTime") or (pod.get("metadata") or {}).get("creationTimestamp")
    stamp = _parse_time(since)
    return None if stamp is None else (now - stamp).total_seconds()


def _parse_time(value: Any) -> dt.datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        stamp = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=dt.UTC)


def _pod_message(
    status: dict[str, Any], container: dict[str, Any], terminated: dict[str, Any] | None
) -> str | None:
    """The most useful single line: the transformer's own error, else the kubelet's."""
    if terminated:
        text = (terminated.get("message") or "").strip()
        if text:
            return last_line(text)
        code = terminated.get("exitCode")
        reason = terminated.get("reason") or "Error"
        return f"{reason} (exit code {code})"
    if status.get("phase") == "Failed":
        return status.get("message") or status.get("reason") or "pod failed"
    waiting = (container.get("state") or {}).get("waiting") or {}
    if waiting.get("reason") and waiting["reason"] != "ContainerCreating":
        return _clip(f"{waiting['reason']}: {waiting.get('message') or ''}".rstrip(": "))
    return None


def last_line(text: str) -> str:
    """The ``sluice: ...`` line a transformer prints last on a config error, else the last line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for line in reversed(lines):
        if line.startswith("sluice:"):
            return _clip(line)
    return _clip(lines[-1]) if lines else ""


def _ran_for(terminated: dict[str, Any] | None) -> float | None:
    """Seconds between a terminated container's start and finish (None if unknown)."""
    try:
        start = dt.datetime.fromisoformat(str((terminated or {})["startedAt"]))
        end = dt.datetime.fromisoformat(str((terminated or {})["finishedAt"]))
    except (KeyError, ValueError):
        return None
    return (end - start).total_seconds()


def _clip(text: str) -> str:
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 3] + "..."


def serving(
    targets: list[TargetInfo], existing: list[ObservedTransformer], want_hash: str
) -> dict[str, ObservedTransformer]:
    """For each target, the transformer its requests should go to.

    A ready one on the current spec, else a ready one from the previous spec
    (a rollout in progress keeps serving), else the current one that is
    starting (or failed, so its message shows).
    """

    def rank(t: ObservedTransformer) -> tuple[int, int, str]:
        return (0 if t.ready else 1, 0 if t.spec_hash == want_hash else 1, t.name)

    out: dict[str, ObservedTransformer] = {}
    live = {t.id for t in targets}
    for t in sorted(existing, key=rank):
        if t.target in live and t.target not in out:
            if t.ready or t.spec_hash == want_hash:
                out[t.target] = t
    return out


def transformer_statuses(
    targets: list[TargetInfo], existing: list[ObservedTransformer], want_hash: str
) -> list[TransformerStatus]:
    chosen = serving(targets, existing, want_hash)
    out = []
    for target in targets:
        t = chosen.get(target.id)
        if t is None:
            out.append(
                TransformerStatus(
                    target=target.id,
                    endpoint=None,
                    ready=False,
                    node=target.node,
                    message="transformer pod not created yet",
                )
            )
            continue
        message = t.message
        if t.ready and t.spec_hash != want_hash:
            message = "serving the previous spec until the new transformer is ready"
        elif not t.ready and not message:
            message = "starting"
        out.append(
            TransformerStatus(
                target=target.id,
                endpoint=t.endpoint,
                ready=t.ready,
                pod=t.name,
                node=t.node,
                message=message,
            )
        )
    return out


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def etl_status(
    summary: Summary,
    transformers: list[TransformerStatus],
    *,
    generation: int | None,
    spec_hash: str,
    rolling_out: bool,
    previous: dict[str, Any] | None = None,
    now: str | None = None,
    pulls: Sequence[PullFailure] = (),
) -> dict[str, Any]:
    """The CR ``status`` document; conditions keep their ``lastTransitionTime`` while unchanged.

    While a rollout replaces transformers that still serve the previous spec,
    the ETL stays ``Running`` (every target can transform) and
    ``Progressing`` says how far the update got.  ``pulls`` (transformer pods
    whose image cannot be pulled) turn ``ImagePulled`` False and, while the
    ETL is starting, become its message.
    """
    phase, message = summary.phase, summary.message
    serving_ready = sum(1 for t in transformers if t.ready)
    if phase == "Initializing" and rolling_out and summary.total and serving_ready == summary.total:
        phase = "Running"
        message = f"updating: {summary.ready}/{summary.total} transformers run the new spec"
    pulled = "no transformer pod is waiting for its image"
    if pulls:
        pulled = pulls[0].describe()
        if len(pulls) > 1:
            pulled = _clip(f"{pulled} (and {len(pulls) - 1} more pods)")
        if phase == "Initializing":
            message = pulled
    ready_count = serving_ready if phase == "Running" else summary.ready
    conditions = [
        _condition(
            "Ready",
            phase == "Running",
            "AllTransformersReady" if phase == "Running" else phase,
            message or "every target has a ready transformer",
        ),
        _condition(
            "Progressing",
            phase == "Initializing" or rolling_out,
            "RollingOut" if rolling_out else ("Starting" if phase == "Initializing" else "Stable"),
            message or "",
        ),
        _condition(
            "Degraded",
            phase == "Error",
            "TransformerFailed" if phase == "Error" else "AsExpected",
            message or "",
        ),
        _condition(
            "ImagePulled",
            not pulls,
            pulls[0].reason if pulls else "AsExpected",
            pulled,
        ),
    ]
    old = {c.get("type"): c for c in (previous or {}).get("conditions") or ()}
    stamp = now or now_iso()
    for cond in conditions:
        before = old.get(cond["type"])
        same = before is not None and before.get("status") == cond["status"]
        cond["lastTransitionTime"] = (before or {}).get("lastTransitionTime") if same else stamp
        cond["lastTransitionTime"] = cond["lastTransitionTime"] or stamp
        if generation is not None:
            cond["observedGeneration"] = generation
        if not cond["message"]:
            del cond["message"]
    status: dict[str, Any] = {
        "phase": phase,
        "message": message,
        "ready": f"{ready_count}/{summary.total}",
        "readyCount": ready_count,
        "total": summary.total,
        "specHash": spec_hash,
        "conditions": conditions,
        "transformers": [_without_nulls(t.to_dict()) for t in transformers],
    }
    if generation is not None:
        status["observedGeneration"] = generation
    return status


def error_status(
    message: str, generation: int | None, previous: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Status for an ETL whose spec cannot be used at all (no transformers run)."""
    summary = Summary("Error", 0, 0, message)
    return etl_status(
        summary, [], generation=generation, spec_hash="", rolling_out=False, previous=previous
    )


def _condition(kind: str, ok: bool, reason: str, message: str) -> dict[str, Any]:
    return {"type": kind, "status": "True" if ok else "False", "reason": reason, "message": message}


def _without_nulls(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def status_changed(old: dict[str, Any] | None, new: dict[str, Any]) -> bool:
    """Whether writing ``new`` would change anything a user sees (ignores key order)."""
    return any((old or {}).get(k) != v for k, v in new.items())
