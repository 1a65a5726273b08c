"""Reconcile one ETL: read the world, ``reconcile.plan()``, act, report.

Level-triggered and idempotent: every call looks at the ETL, its target pods
and its transformer pods as they are now and converges them, whatever event
(or none: the periodic resync) caused it. Runs in a worker thread; the kopf
handlers only decide *which* ETL to reconcile (see ``handlers.py``).

Rollout: a spec change gets new pod names (the spec hash is part of them),
so the new transformer starts while the old one keeps serving; the old one
is deleted once its replacement has been ready and published for
``SWITCH_SECONDS`` (the targets' watches catch up first), or once the
replacement failed for good (the ETL then reports Error rather than quietly
serving old code).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from etl_operator import events
from etl_operator import pods as manifests
from etl_operator.actuator import FINALIZER, KubeActuator
from etl_operator.status import (
    PullFailure,
    error_status,
    etl_status,
    gave_up_message,
    observe,
    pull_failure,
    status_changed,
    transformer_statuses,
)
from etl_runtime.cluster.kube.records import DEFAULT_TARGET_LABELS
from etl_runtime.cluster.reconcile import (
    ObservedTransformer,
    hold_for_rollout,
    plan,
    replaced,
    restarts_for,
    summarize,
)
from etl_runtime.cluster.records import TargetInfo
from etl_runtime.core.auth import transformer_token
from etl_runtime.core.spec import EtlSpec, InvalidSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OperatorConfig:
    """Operator-wide settings, from the environment (see docs/operator.md)."""

    image: str = manifests.DEFAULT_IMAGE
    cluster_key: str | None = None
    resync_seconds: float = 30.0
    # Defaults of every transformer pod; an ETL's spec.resources replaces ``resources``.
    resources: dict[str, Any] | None = None
    pull_policy: str = "IfNotPresent"
    pull_secrets: tuple[str, ...] = ()
    # Mount each target's data volumes read-only into its transformers for every
    # ETL (the chart's etl.shareTargetData; its targets then send etl_fqn).
    share_target_data: bool = True

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> OperatorConfig:
        """Read the ``SLUICE_*`` variables; ``ValueError`` names a malformed one."""
        env = dict(os.environ if env is None else env)
        return cls(
            image=env.get("SLUICE_TRANSFORMER_IMAGE") or manifests.DEFAULT_IMAGE,
            cluster_key=env.get("SLUICE_CLUSTER_KEY") or None,
            resync_seconds=float(env.get("SLUICE_RESYNC_SECONDS") or 30.0),
            resources=parse_resources(env.get("SLUICE_TRANSFORMER_RESOURCES") or ""),
            pull_policy=parse_pull_policy(env.get("SLUICE_TRANSFORMER_PULL_POLICY") or ""),
            pull_secrets=parse_names(env.get("SLUICE_TRANSFORMER_PULL_SECRETS") or ""),
            share_target_data=parse_bool(
                "SLUICE_SHARE_TARGET_DATA", env.get("SLUICE_SHARE_TARGET_DATA") or "", True
            ),
        )


def parse_resources(text: str) -> dict[str, Any] | None:
    """``SLUICE_TRANSFORMER_RESOURCES``: JSON ``{"requests": {...}, "limits": {...}}``."""
    if not text.strip():
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"SLUICE_TRANSFORMER_RESOURCES is not JSON: {e}") from e
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - {"requests", "limits", "claims"}:
        raise ValueError(
            "SLUICE_TRANSFORMER_RESOURCES must be an object with 'requests' and/or 'limits', "
            f"got {text!r}"
        )
    return {k: v for k, v in value.items() if v} or None


def parse_pull_policy(text: str) -> str:
    """``SLUICE_TRANSFORMER_PULL_POLICY``: Always, IfNotPresent (default) or Never."""
    policy = text.strip() or "IfNotPresent"
    if policy not in manifests.PULL_POLICIES:
        raise ValueError(
            f"SLUICE_TRANSFORMER_PULL_POLICY must be one of {', '.join(manifests.PULL_POLICIES)}, "
            f"got {text!r}"
        )
    return policy


def parse_bool(name: str, text: str, default: bool) -> bool:
    """A boolean setting: true/false (also 1/0, yes/no, on/off); empty = ``default``."""
    value = text.strip().lower()
    if not value:
        return default
    if value in ("true", "1", "yes", "on"):
        return True
    if value in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"{name} must be true or false, got {text!r}")


def parse_names(text: str) -> tuple[str, ...]:
    """``SLUICE_TRANSFORMER_PULL_SECRETS``: Secret names, comma- or space-separated."""
    return tuple(n for n in text.replace(",", " ").split() if n)


@dataclass(frozen=True)
class Outcome:
    """What a reconcile did; ``settled`` means nothing is left to wait for.

    ``recheck``: look again in this many seconds, as nothing will send an event
    then (an old transformer held for the switch-over, ``hold_for_rollout``)."""

    phase: str | None
    created: int = 0
    deleted: int = 0
    settled: bool = True
    recheck: float | None = None


def live_targets(target_pods: list[dict[str, Any]]) -> list[TargetInfo]:
    """Target pods that can host a transformer: scheduled, not finished, not being deleted."""
    out = []
    for pod in target_pods:
        meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
        if meta.get("deletionTimestamp") or status.get("phase") in ("Succeeded", "Failed"):
            continue
        if not spec.get("nodeName"):
            continue  # not scheduled yet: no node to pin the transformer to
        ip = status.get("podIP")
        url = f"http://{ip}:8080" if ip else ""
        out.append(TargetInfo(id=meta["name"], url=url, node=spec["nodeName"]))
    return sorted(out, key=lambda t: t.id)


class Controller:
    """Converges ETLs; one instance per operator process (holds the actuator and config)."""

    def __init__(
        self,
        kube: KubeActuator,
        config: OperatorConfig,
        parallel: int = 8,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.config = config
        self._clock = clock
        # When this operator first saw each transformer pod ready, so first
        # published its endpoint (a rollout's switch-over counts from then).
        self._ready_seen: dict[tuple[str, str], dict[str, float]] = {}  # ETL -> pod -> time
        # Pod creates/deletes of one reconcile go out concurrently: with 50
        # targets, one-at-a-time calls dominate the time to Running.
        self._pool = ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="etl-actuate")
        # Spec hash each ETL is rolling out to, for its RolledOut event. In
        # memory only: an operator restarted mid-rollout does not report it.
        self._rollouts: dict[tuple[str, str], str] = {}
        self._instance = os.environ.get("POD_NAME") or socket.gethostname()

    def record(self, etl: dict[str, Any], happened: list[events.EtlEvent]) -> None:
        """Record Events on ``etl``; a failure is logged, never raised (events are best effort)."""
        stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

        def send(event: events.EtlEvent) -> None:
            try:
                self.kube.record_event(events.event_body(etl, event, stamp, self._instance))
            except Exception as e:  # noqa: BLE001 - e.g. RBAC without events: keep reconciling
                log.warning(
                    "ETL %s/%s: cannot record event %s: %s",
                    etl["metadata"]["namespace"],
                    etl["metadata"]["name"],
                    event.reason,
                    e,
                )

        list(self._pool.map(send, happened))

    def reconcile(self, namespace: str, name: str) -> Outcome:
        etl = self.kube.get_etl(namespace, name)
        if etl is None:
            # Gone (e.g. deleted while we were down): collect anything left behind.
            self._ready_seen.pop((namespace, name), None)
            self.cleanup(namespace, name)
            return Outcome(phase=None)
        meta = etl["metadata"]
        if meta.get("deletionTimestamp"):
            return self.finalize(etl)
        if FINALIZER not in (meta.get("finalizers") or ()):
            self.kube.set_finalizer(etl, present=True)
        previous = etl.get("status") or {}
        generation = meta.get("generation")
        try:
            spec = EtlSpec.from_dict(etl.get("spec") or {})
        except InvalidSpec as e:
            for pod in self.kube.transformer_pods(namespace, name):
                self.kube.delete_pod(namespace, pod["metadata"]["name"])
            status = error_status(f"invalid spec: {e}", generation, previous)
            if status_changed(previous, status):
                self.kube.patch_status(namespace, name, status)
                self.record(etl, events.phase_change(previous, status, rolled_out=False))
            return Outcome(phase="Error")
        return self.converge(etl, spec)

    def converge(self, etl: dict[str, Any], spec: EtlSpec) -> Outcome:
        meta = etl["metadata"]
        namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
        ref = manifests.EtlRef(name=name, namespace=namespace, uid=uid)
        with_token = self.ensure_token(ref)
        selector = spec.target_selector or DEFAULT_TARGET_LABELS
        target_pods = {
            p["metadata"]["name"]: p for p in self.kube.list_pods(namespace, dict(selector))
        }
        targets = live_targets(list(target_pods.values()))

        observed: list[ObservedTransformer] = []
        pulls: list[PullFailure] = []  # pods whose image the kubelet cannot pull
        now = dt.datetime.now(dt.UTC)
        for pod in self.kube.transformer_pods(namespace, name):
            owners = pod["metadata"].get("ownerReferences") or ()
            if any(o.get("uid") != uid for o in owners if o.get("kind") == "ETL"):
                # Left over from an earlier ETL of the same name.
                self.kube.delete_pod(namespace, pod["metadata"]["name"])
                continue
            if pod["metadata"].get("deletionTimestamp"):
                continue  # already going (e.g. replaced above): not a transformer any more
            observed.append(observe(pod, spec.init_timeout_seconds, now))
            if (pull := pull_failure(pod)) is not None:
                pulls.append(pull)

        share = self.config.share_target_data
        want_hash = manifests.pod_hash(spec, share)
        previous = etl.get("status") or {}
        key = (namespace, name)
        observed = self._ready_for(key, observed)
        changed = previous.get("specHash") not in (None, "", want_hash)
        if changed or any(t.spec_hash != want_hash for t in observed):
            self._rollouts[key] = want_hash  # a spec change is rolling out
        failures = events.failed(observed, want_hash, previous)
        todo = hold_for_rollout(
            plan(spec, targets, observed, want_hash), observed, targets, want_hash
        )
        # Deletes first: a transformer recreated after a transient failure
        # reuses its name, so that pod goes at once (no grace period: it has
        # exited, or hung past initSeconds) and its replacement, which carries
        # the restart count, can be created in this same pass. Both batches
        # run in parallel (one API call each).
        for t in todo.delete:
            log.info(
                "ETL %s/%s: deleting transformer %s%s",
                namespace,
                name,
                t.name,
                f" ({t.message})" if t.terminated and t.message else "",
            )
        list(
            self._pool.map(
                lambda t: self.kube.delete_pod(
                    namespace, t.name, now=t.terminated and t.spec_hash == want_hash
                ),
                todo.delete,
            )
        )
        new_pods = [
            manifests.transformer_pod(
                ref,
                spec,
                target,
                image=self.config.image,
                resources=self.config.resources,
                pull_policy=self.config.pull_policy,
                pull_secrets=self.config.pull_secrets,
                with_token=with_token,
                restarts=restarts_for(target.id, todo.delete, want_hash),
                last_failure=getattr(replaced(target.id, todo.delete, want_hash), "message", None),
                target_pod=target_pods.get(target.id),
                share_target_data=share,
            )
            for target in todo.create
        ]
        if manifests.shares_data(spec, share):
            for pod in new_pods:
                if not manifests.data_roots(pod):
                    log.warning(
                        "ETL %s/%s: target %s has no persistentVolumeClaim or hostPath data "
                        "volume to share; its transformer %s refuses etl_fqn paths",
                        namespace,
                        name,
                        pod["metadata"]["annotations"][manifests.TARGET_LABEL],
                        pod["metadata"]["name"],
                    )
        made = list(self._pool.map(self.kube.create_pod, new_pods))
        created = sum(made)
        if new_pods:
            log.info("ETL %s/%s: created %d transformer pods", namespace, name, created)
        after = [t for t in observed if t not in todo.delete] + [
            ObservedTransformer(
                name=pod["metadata"]["name"],
                target=target.id,
                spec_hash=want_hash,
                node=target.node,
                restarts=int(pod["metadata"]["annotations"][manifests.RESTARTS_ANNOTATION]),
                message=gave_up_message(pod["metadata"]["annotations"]),
            )
            for target, pod in zip(todo.create, new_pods, strict=True)
        ]

        summary = summarize(spec, targets, after, want_hash)
        rolling_out = any(t.spec_hash != want_hash for t in after)
        status = etl_status(
            summary,
            transformer_statuses(targets, after, want_hash) if not spec.stopped else [],
            generation=meta.get("generation"),
            spec_hash=want_hash,
            rolling_out=rolling_out and not spec.stopped,
            previous=etl.get("status"),
            pulls=pulls if not spec.stopped else [],
        )
        if status_changed(etl.get("status"), status):
            self.kube.patch_status(namespace, name, status)
        rolled_out = (
            status["phase"] == "Running"
            and not rolling_out
            and self._rollouts.get(key) == want_hash
        )
        if rolled_out:
            del self._rollouts[key]
        self.record(
            etl,
            failures
            + events.pull_failed(pulls, previous)
            + events.created([p for p, ok in zip(new_pods, made, strict=True) if ok])
            + events.became_ready(previous, status)
            + events.phase_change(previous, status, rolled_out),
        )
        settled = summary.phase in ("Running", "Stopped", "Error") and not rolling_out
        return Outcome(
            summary.phase,
            created,
            len(todo.delete),
            settled and not todo.create,
            recheck=todo.recheck,
        )

    def _ready_for(
        self, key: tuple[str, str], observed: list[ObservedTransformer]
    ) -> list[ObservedTransformer]:
        """``observed`` with ``ready_for``: seconds since this operator first saw each
        ready (so published it); what it remembers is only the pods it sees now."""
        now = self._clock()
        before = self._ready_seen.get(key, {})
        seen = {t.name: before.get(t.name, now) for t in observed if t.ready}
        self._ready_seen[key] = seen
        return [replace(t, ready_for=now - seen[t.name]) if t.ready else t for t in observed]

    def ensure_token(self, ref: manifests.EtlRef) -> bool:
        """Keep the ETL's token Secret current; False when no cluster key is configured."""
        if not self.config.cluster_key:
            return False
        token = transformer_token(self.config.cluster_key, ref.name, ref.uid)
        secret = self.kube.get_secret(ref.namespace, manifests.secret_name(ref.name))
        if secret is not None and manifests.secret_token(secret) == token:
            return True
        body = manifests.token_secret(ref, token)
        if secret is not None:
            body["metadata"]["resourceVersion"] = secret["metadata"]["resourceVersion"]
        self.kube.put_secret(body, exists=secret is not None)
        return True

    def cleanup(self, namespace: str, name: str) -> int:
        """Delete every transformer pod and the Secret of ETL ``name``; pods left."""
        pods = self.kube.transformer_pods(namespace, name)
        for pod in pods:
            if not pod["metadata"].get("deletionTimestamp"):
                self.kube.delete_pod(namespace, pod["metadata"]["name"])
        self.kube.delete_secret(namespace, name)
        return len(pods)

    def finalize(self, etl: dict[str, Any]) -> Outcome:
        """The ETL is being deleted: remove what it owns, then let it go.

        No garbage collector is assumed, so pods and Secret are deleted here;
        the finalizer comes off once no transformer pod is left.
        """
        meta = etl["metadata"]
        left = self.cleanup(meta["namespace"], meta["name"])
        if left:
            return Outcome(phase=None, deleted=left, settled=False)
        self.kube.set_finalizer(etl, present=False)
        self._rollouts.pop((meta["namespace"], meta["name"]), None)
        self._ready_seen.pop((meta["namespace"], meta["name"]), None)
        self.record(etl, [events.deleted()])
        return Outcome(phase=None)
