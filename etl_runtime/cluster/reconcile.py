"""Desired state of an ETL's transformers, as plain functions.

Shared by the kopf handlers (actuator: pods) and by the local cluster
(actuator: child processes). Given the ETL spec, the live targets and the
transformers that exist now, ``plan()`` says which to create and which to
delete; ``summarize()`` turns observations into phase and message. Nothing
here talks to Kubernetes or spawns anything, so it is tested directly.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

from etl_runtime.cluster.records import TargetInfo
from etl_runtime.core.spec import EtlSpec

# Exit code a transformer uses for a permanent configuration error (code does
# not load, Python version mismatch, dependencies fail to install): restarting
# it cannot help, so the ETL goes to phase Error instead of crash-looping.
EXIT_CONFIG_ERROR = 2
# Restarts of transient failures tolerated before the ETL is declared Error.
MAX_RESTARTS = 5
# A transformer that served this long before it failed starts a fresh crash
# budget, as a kubelet's back-off resets: six kills 40 s apart are six
# unrelated incidents, not a crash loop.
HEALTHY_SECONDS = 30.0
# How long an old-spec transformer keeps serving after its replacement was
# ready and published: the targets' view of the ETL (a watch of the CR, a
# file) catches up before the old one stops taking connections, so no request
# in flight to the old endpoint meets a closed port during a rollout.
SWITCH_SECONDS = 2.0


def transformer_name(etl: str, target: str) -> str:
    """DNS-1123 name for the transformer of ``etl`` beside ``target`` (<= 63 chars)."""
    base = re.sub(r"[^a-z0-9-]", "-", f"etl-{etl}-{target}".lower()).strip("-")
    if len(base) <= 63:
        return base
    digest = hashlib.sha256(f"{etl}/{target}".encode()).hexdigest()[:8]
    return f"{base[:54].rstrip('-')}-{digest}"


@dataclass(frozen=True)
class ObservedTransformer:
    """A transformer that exists (pod or process), as the actuator sees it."""

    name: str
    target: str
    spec_hash: str
    node: str | None = None
    endpoint: str | None = None
    ready: bool = False
    terminated: bool = False  # the process/container has exited for good
    exit_code: int | None = None
    restarts: int = 0
    message: str | None = None
    healthy_for: float | None = None  # seconds it served (was ready) before it terminated
    # Seconds since the actuator first saw it ready (and so published its endpoint).
    ready_for: float | None = None


def ran_healthy(t: ObservedTransformer) -> bool:
    """It served ``HEALTHY_SECONDS`` before it terminated: its failure starts a new row."""
    return t.healthy_for is not None and t.healthy_for >= HEALTHY_SECONDS


def next_restarts(t: ObservedTransformer) -> int:
    """The restart count of the transformer that replaces ``t`` (failed transiently)."""
    return 1 if ran_healthy(t) else t.restarts + 1


@dataclass
class Plan:
    create: list[TargetInfo] = field(default_factory=list)
    delete: list[ObservedTransformer] = field(default_factory=list)
    # Seconds until a transformer held only for the switch-over may go: the
    # actuator looks again then (no event will come to say so).
    recheck: float | None = None

    @property
    def empty(self) -> bool:
        return not self.create and not self.delete


def is_config_error(t: ObservedTransformer) -> bool:
    return t.terminated and t.exit_code == EXIT_CONFIG_ERROR


def gave_up(t: ObservedTransformer) -> bool:
    """Terminated for good: a config error, or a transient failure once too often.

    Such a transformer is kept (not recreated) so its message stays visible and
    nothing crash-loops; a spec change (new hash) replaces it.
    """
    return is_config_error(t) or (
        t.terminated and t.restarts >= MAX_RESTARTS and not ran_healthy(t)
    )


def plan(
    spec: EtlSpec,
    targets: list[TargetInfo],
    existing: list[ObservedTransformer],
    want_hash: str | None = None,
) -> Plan:
    """What to change so there is exactly one current transformer per live target.

    ``want_hash``: the hash a current transformer carries (default
    ``spec.content_hash()``; the operator folds in how it builds pods).

    * stopped ETL: delete everything;
    * a transformer for a target that is gone, moved node, has an old spec
      hash, or a duplicate: delete;
    * a transformer that terminated with a transient failure: delete (and so
      recreate); one that failed with a config error, or has already been
      restarted ``MAX_RESTARTS`` times, is kept, so its message stays visible
      and we do not crash-loop;
    * a live target without a kept transformer: create.
    """
    out = Plan()
    if spec.stopped:
        out.delete = list(existing)
        return out
    want_hash = want_hash or spec.content_hash()
    by_id = {t.id: t for t in targets}
    kept: dict[str, ObservedTransformer] = {}
    for t in sorted(existing, key=lambda t: (not t.ready, t.name)):
        target = by_id.get(t.target)
        stale = (
            target is None
            or t.spec_hash != want_hash
            or (target.node is not None and t.node is not None and t.node != target.node)
            or t.target in kept
            or (t.terminated and not gave_up(t))
        )
        if stale:
            out.delete.append(t)
        else:
            kept[t.target] = t
    out.create = [t for t in targets if t.id not in kept]
    return out


def hold_for_rollout(
    p: Plan, existing: list[ObservedTransformer], targets: list[TargetInfo], want_hash: str
) -> Plan:
    """Keep old-spec transformers that still serve until their replacement is ready,
    and for ``SWITCH_SECONDS`` after that: the rollout policy of both actuators (the
    operator's pods, ``sluice up``'s processes).

    The replacement's endpoint is published in the pass that first sees it ready;
    a target learns it a moment later, and until then sends to the old one. So the
    old one goes once the new one has been ready ``SWITCH_SECONDS`` (``ready_for``;
    unknown counts as just now), and ``recheck`` says when that is.

    Only a transformer that is stale *just* because of its spec hash is held:
    one whose target left or moved goes at once, and so does one whose
    replacement has terminated (failed for good).
    """
    nodes = {t.id: t.node for t in targets}
    current = {t.target: t for t in existing if t.spec_hash == want_hash}
    held: list[ObservedTransformer] = []
    recheck: float | None = None
    for t in p.delete:
        new = current.get(t.target)
        if not (
            t.ready
            and t.spec_hash != want_hash
            and t.target in nodes
            and (t.node is None or nodes[t.target] in (None, t.node))
            and not any(h.target == t.target for h in held)
        ):
            continue
        if new is None or (not new.ready and not new.terminated):
            held.append(t)  # the new one is not serving yet
        elif new.ready and (left := SWITCH_SECONDS - (new.ready_for or 0.0)) > 0:
            held.append(t)  # the targets may not have switched yet
            recheck = left if recheck is None else min(recheck, left)
    return Plan(create=p.create, delete=[t for t in p.delete if t not in held], recheck=recheck)


def replaced(
    target: str, deleted: list[ObservedTransformer], want_hash: str
) -> ObservedTransformer | None:
    """The current-spec transformer of ``target`` that failed transiently and is being replaced."""
    for t in deleted:
        if t.target == target and t.spec_hash == want_hash and t.terminated:
            return t
    return None


def restarts_for(target: str, deleted: list[ObservedTransformer], want_hash: str) -> int:
    """Restart count for a new transformer replacing one that failed transiently."""
    old = replaced(target, deleted, want_hash)
    return next_restarts(old) if old is not None else 0


@dataclass(frozen=True)
class Summary:
    phase: str
    ready: int
    total: int
    message: str | None


def summarize(
    spec: EtlSpec,
    targets: list[TargetInfo],
    existing: list[ObservedTransformer],
    want_hash: str | None = None,
) -> Summary:
    """Phase of the ETL from what exists now (call after applying a plan)."""
    total = len(targets)
    if spec.stopped:
        return Summary("Stopped", 0, total, "stopped by user")
    want_hash = want_hash or spec.content_hash()
    current = [t for t in existing if t.spec_hash == want_hash]
    ready = len({t.target for t in current if t.ready})
    failures = [
        t
        for t in current
        if is_config_error(t) or (t.restarts >= MAX_RESTARTS and not ran_healthy(t))
    ]
    if failures:
        f = failures[0]
        why = f.message or f"exited with code {f.exit_code}"
        return Summary("Error", ready, total, f"transformer {f.name} (target {f.target}): {why}")
    if total == 0:
        return Summary("Initializing", 0, 0, "no storage targets found")
    if ready == total:
        return Summary("Running", ready, total, None)
    return Summary("Initializing", ready, total, f"{ready}/{total} transformers ready")
