"""Controller behaviour on an in-memory cluster: what a user would see in pods and status."""

from __future__ import annotations

import asyncio

import pytest

from etl_operator.actuator import FINALIZER
from etl_operator.controller import Controller, OperatorConfig
from etl_operator.queue import ReconcileQueue
from etl_runtime.cluster.reconcile import (
    HEALTHY_SECONDS,
    MAX_RESTARTS,
    SWITCH_SECONDS,
    ObservedTransformer,
    Plan,
    hold_for_rollout,
    plan,
)
from etl_runtime.cluster.records import TargetInfo
from etl_runtime.core.auth import transformer_token
from etl_runtime.core.spec import EtlSpec

from .fakes import FakeKube

SOURCE = {
    "mode": "object",
    "code": {"entrypoint": "transform", "source": "def transform(d):\n    return d[::-1]\n"},
}


@pytest.fixture
def kube() -> FakeKube:
    k = FakeKube()
    for i in range(3):
        k.add_target(f"target-{i}", node=f"node-{i}")
    k.add_etl("reverse", dict(SOURCE))
    return k


class Clock:
    """The controller's clock, moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def ctl(kube: FakeKube, clock: Clock) -> Controller:
    return Controller(kube, OperatorConfig(image="img", cluster_key="k"), clock=clock)  # type: ignore[arg-type]


def status(kube: FakeKube) -> dict:
    return kube.etls[("ns", "reverse")]["status"]


def test_creates_one_pinned_transformer_per_target_then_running(kube, ctl):
    ctl.reconcile("ns", "reverse")
    assert len(kube.created) == 3
    assert {kube.transformer(f"target-{i}")["spec"]["nodeName"] for i in range(3)} == {
        "node-0",
        "node-1",
        "node-2",
    }
    assert status(kube)["phase"] == "Initializing" and status(kube)["ready"] == "0/3"
    assert FINALIZER in kube.etls[("ns", "reverse")]["metadata"]["finalizers"]
    (secret,) = kube.secrets.values()
    from etl_operator.pods import secret_token

    assert secret_token(secret) == transformer_token("k", "reverse", "u1")
    for i in range(3):
        kube.set_ready(kube.transformer(f"target-{i}"))
    ctl.reconcile("ns", "reverse")
    st = status(kube)
    assert st["phase"] == "Running" and st["ready"] == "3/3" and st["readyCount"] == 3
    assert all(t["endpoint"] == "http://10.1.0.1:8000" for t in st["transformers"])
    # Converged: reconciling again changes nothing (no duplicates after a restart).
    ctl.reconcile("ns", "reverse")
    assert len(kube.created) == 3 and not kube.deleted


def test_target_added_removed_and_moved(kube, ctl):
    ctl.reconcile("ns", "reverse")
    kube.add_target("target-3", node="node-3")
    del kube.pods[("ns", "target-0")]
    kube.pods[("ns", "target-1")]["spec"]["nodeName"] = "node-9"
    ctl.reconcile("ns", "reverse")
    assert kube.transformer("target-3")["spec"]["nodeName"] == "node-3"
    assert kube.transformer("target-1")["spec"]["nodeName"] == "node-9"
    assert not [
        p
        for p in kube.pods.values()
        if p["metadata"]["labels"].get("sluice.dev/target") == "target-0"
    ]
    assert status(kube)["total"] == 3


def test_spec_change_starts_new_pods_before_deleting_ready_old_ones(kube, ctl, clock):
    ctl.reconcile("ns", "reverse")
    old = {i: kube.transformer(f"target-{i}")["metadata"]["name"] for i in range(3)}
    for i in range(3):
        kube.set_ready(kube.transformer(f"target-{i}"))
    kube.etls[("ns", "reverse")]["spec"]["workers"] = 2
    kube.etls[("ns", "reverse")]["metadata"]["generation"] = 2
    ctl.reconcile("ns", "reverse")
    assert not kube.deleted and len(kube.created) == 6  # surge: old still serve
    st = status(kube)
    assert st["phase"] == "Running" and st["observedGeneration"] == 2
    assert {t["pod"] for t in st["transformers"]} == set(old.values())
    new = [
        p
        for p in kube.pods.values()
        if p["metadata"]["name"] not in old.values() and "sluice.dev/etl" in p["metadata"]["labels"]
    ]
    for p in new:
        kube.set_ready(p)
    # The pass that sees the new ones ready publishes them; the old ones keep
    # serving until the targets' watches have had SWITCH_SECONDS to catch up.
    outcome = ctl.reconcile("ns", "reverse")
    assert not kube.deleted and outcome.recheck == SWITCH_SECONDS
    assert {t["pod"] for t in status(kube)["transformers"]} == {p["metadata"]["name"] for p in new}
    clock.now += SWITCH_SECONDS / 2
    assert not kube.deleted and ctl.reconcile("ns", "reverse").recheck == SWITCH_SECONDS / 2
    clock.now += SWITCH_SECONDS / 2
    outcome = ctl.reconcile("ns", "reverse")
    assert sorted(kube.deleted) == sorted(old.values()) and outcome.recheck is None
    assert status(kube)["phase"] == "Running" and status(kube)["ready"] == "3/3"


def test_config_error_is_error_phase_without_crash_loop(kube, ctl):
    ctl.reconcile("ns", "reverse")
    kube.set_exit(kube.transformer("target-0"), 2, "boom\nsluice: ETL 'reverse': bad code\n")
    for _ in range(3):
        ctl.reconcile("ns", "reverse")
    st = status(kube)
    assert st["phase"] == "Error"
    assert "sluice: ETL 'reverse': bad code" in st["message"]
    assert len(kube.created) == 3  # not recreated
    assert {c["type"]: c["status"] for c in st["conditions"]}["Degraded"] == "True"


def test_transient_failures_recreate_until_max_restarts(kube, ctl):
    ctl.reconcile("ns", "reverse")
    for n in range(MAX_RESTARTS):
        kube.set_exit(kube.transformer("target-0"), 1, "Killed")
        ctl.reconcile("ns", "reverse")
        assert kube.transformer("target-0")["metadata"]["annotations"][
            "sluice.dev/restarts"
        ] == str(n + 1)
    kube.set_exit(kube.transformer("target-0"), 1, "Killed")
    ctl.reconcile("ns", "reverse")
    assert len(kube.created) == 3 + MAX_RESTARTS
    assert status(kube)["phase"] == "Error"


def test_crash_budget_resets_after_a_healthy_run(kube, ctl):
    """Issue 20 #4: six kills with a healthy run between them are six incidents,
    not a crash loop: the ETL keeps being served, as a kubelet's back-off resets."""
    ctl.reconcile("ns", "reverse")
    for _ in range(MAX_RESTARTS + 2):
        kube.set_exit(kube.transformer("target-0"), 137, "Killed", ran_for=HEALTHY_SECONDS + 10)
        ctl.reconcile("ns", "reverse")
        assert kube.transformer("target-0")["metadata"]["annotations"]["sluice.dev/restarts"] == "1"
        assert status(kube)["phase"] != "Error"
    assert len(kube.created) == 3 + MAX_RESTARTS + 2


def test_stop_and_start(kube, ctl):
    ctl.reconcile("ns", "reverse")
    kube.etls[("ns", "reverse")]["spec"]["stopped"] = True
    ctl.reconcile("ns", "reverse")
    assert not kube.transformer_pods("ns", "reverse")
    assert status(kube)["phase"] == "Stopped" and status(kube)["transformers"] == []
    kube.etls[("ns", "reverse")]["spec"]["stopped"] = False
    ctl.reconcile("ns", "reverse")
    assert len(kube.transformer_pods("ns", "reverse")) == 3


def test_invalid_spec_reports_error(kube, ctl):
    kube.add_etl("bad", {"mode": "object", "code": {}})
    ctl.reconcile("ns", "bad")
    st = kube.etls[("ns", "bad")]["status"]
    assert st["phase"] == "Error" and "exactly one of 'pickled' or 'source'" in st["message"]


def test_deletion_removes_pods_and_secret_then_finalizer(kube, ctl):
    ctl.reconcile("ns", "reverse")
    kube.etls[("ns", "reverse")]["metadata"]["deletionTimestamp"] = "now"
    out = ctl.reconcile("ns", "reverse")
    assert not out.settled and not kube.transformer_pods("ns", "reverse")
    assert not kube.secrets
    ctl.reconcile("ns", "reverse")
    assert ("ns", "reverse") not in kube.etls


def test_custom_target_selector(kube, ctl):
    kube.add_target("special", node="node-x", tier="gpu")
    kube.add_etl("gpu", {**SOURCE, "targetSelector": {"tier": "gpu"}})
    ctl.reconcile("ns", "gpu")
    pods = kube.transformer_pods("ns", "gpu")
    assert [p["spec"]["nodeName"] for p in pods] == ["node-x"]


def test_pods_of_an_older_etl_with_the_same_name_are_removed(kube, ctl):
    ctl.reconcile("ns", "reverse")
    kube.etls[("ns", "reverse")]["metadata"]["uid"] = "u2"
    ctl.reconcile("ns", "reverse")
    owners = {
        p["metadata"]["ownerReferences"][0]["uid"] for p in kube.transformer_pods("ns", "reverse")
    }
    assert owners == {"u2"}


def test_hold_for_rollout_releases_old_when_new_failed():
    spec = EtlSpec.from_dict(SOURCE)
    h = spec.content_hash()
    targets = [TargetInfo("t0", "", "n0")]
    old = ObservedTransformer("old", "t0", "h0", node="n0", ready=True)
    failed = ObservedTransformer("new", "t0", h, node="n0", terminated=True, exit_code=2)
    p = plan(spec, targets, [old, failed])
    assert hold_for_rollout(p, [old, failed], targets, h).delete == [old]
    starting = ObservedTransformer("new", "t0", h, node="n0")
    p = plan(spec, targets, [old, starting])
    assert hold_for_rollout(p, [old, starting], targets, h) == Plan(create=[], delete=[])


def test_hold_for_rollout_keeps_old_through_the_switch_over():
    """A replacement just ready is published now; its target switches a moment later."""
    spec = EtlSpec.from_dict(SOURCE)
    h = spec.content_hash()
    targets = [TargetInfo("t0", "", "n0"), TargetInfo("t1", "", "n1")]
    old = [ObservedTransformer(f"old{i}", f"t{i}", "h0", node=f"n{i}", ready=True) for i in (0, 1)]
    for ready_for, recheck, gone in (
        ((None, None), SWITCH_SECONDS, []),  # unknown: just now
        ((0.5, 1.0), SWITCH_SECONDS - 1.0, []),  # the sooner of the two
        ((0.5, SWITCH_SECONDS), SWITCH_SECONDS - 0.5, old[1:]),
        ((SWITCH_SECONDS, SWITCH_SECONDS + 5), None, old),
    ):
        new = [
            ObservedTransformer(f"new{i}", f"t{i}", h, node=f"n{i}", ready=True, ready_for=r)
            for i, r in enumerate(ready_for)
        ]
        held = hold_for_rollout(plan(spec, targets, old + new), old + new, targets, h)
        assert held == Plan(create=[], delete=gone, recheck=recheck), ready_for
    # A target that left takes its old transformer with it at once.
    new = ObservedTransformer("new0", "t0", h, node="n0", ready=True, ready_for=0.0)
    p = plan(spec, targets[1:], [old[0], new])
    gone = hold_for_rollout(p, [old[0], new], targets[1:], h).delete
    assert {t.name for t in gone} == {"old0", "new0"}


def test_queue_looks_again_when_a_reconcile_asks_for_it():
    """A switch-over ends with no event: the reconcile's ``recheck`` brings the next run."""
    from etl_operator.controller import Outcome

    calls: list[str] = []

    def work(ns: str, name: str) -> Outcome:
        calls.append(name)
        return Outcome("Running", recheck=0.01 if len(calls) < 3 else None)

    async def scenario() -> None:
        q = ReconcileQueue(work)
        q.request("ns", "a")
        await q.drain()

    asyncio.run(scenario())
    assert calls == ["a"] * 3


def test_queue_coalesces_bursts_and_never_overlaps():
    calls: list[str] = []
    running = set()

    def work(ns: str, name: str) -> None:
        assert name not in running
        running.add(name)
        calls.append(name)
        import time

        time.sleep(0.05)
        running.discard(name)

    async def scenario() -> int:
        q = ReconcileQueue(work)
        for _ in range(20):
            q.request("ns", "a")
            q.request("ns", "b")
            await asyncio.sleep(0.001)
        await q.drain()
        return q.runs

    runs = asyncio.run(scenario())
    assert calls.count("a") >= 1 and runs <= 8, calls


def test_pod_not_ready_past_init_seconds_is_replaced_then_error(kube, ctl):
    """As the local cluster: a transformer that never gets ready within
    ``timeouts.initSeconds`` is killed and recreated (a restart), then Error."""
    kube.etls[("ns", "reverse")]["spec"]["timeouts"] = {"initSeconds": 60}
    ctl.reconcile("ns", "reverse")
    # Just started, not ready yet: left alone.
    kube.set_hung(kube.transformer("target-0"), started=_ago(10))
    ctl.reconcile("ns", "reverse")
    assert not kube.deleted
    for n in range(MAX_RESTARTS):
        old = kube.transformer("target-0")
        kube.set_hung(old)
        ctl.reconcile("ns", "reverse")
        # Replaced at once (no grace period, so the same name can be reused now).
        assert kube.deleted_now[-1] == old["metadata"]["name"]
        new = kube.transformer("target-0")
        assert new["metadata"]["annotations"]["sluice.dev/restarts"] == str(n + 1)
    # The last allowed pod exists: Error, saying why its predecessors went.
    st = status(kube)
    assert st["phase"] == "Error"
    assert f"gave up after {MAX_RESTARTS} restarts; last: not ready after 60s" in st["message"]
    # It hangs too: kept (no crash loop), still Error.
    kube.set_hung(kube.transformer("target-0"))
    ctl.reconcile("ns", "reverse")
    assert len(kube.created) == 3 + MAX_RESTARTS
    st = status(kube)
    assert st["phase"] == "Error"
    assert "not ready after 60s (initSeconds)" in st["message"]


def test_pod_that_turned_unready_recently_is_not_replaced(kube, ctl):
    kube.etls[("ns", "reverse")]["spec"]["timeouts"] = {"initSeconds": 60}
    ctl.reconcile("ns", "reverse")
    pod = kube.transformer("target-0")
    kube.set_hung(pod, started="2020-01-01T00:00:00Z")
    pod["status"]["conditions"][0]["lastTransitionTime"] = _ago(5)  # was ready until 5 s ago
    ctl.reconcile("ns", "reverse")
    assert not kube.deleted


def _ago(seconds: float) -> str:
    import datetime as dt

    stamp = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=seconds)
    return stamp.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_events_tell_the_story_once(kube, ctl, clock):
    def new_events() -> list[tuple[str, str]]:
        out = [(e["type"], e["reason"]) for e in kube.events]
        kube.events.clear()
        return out

    ctl.reconcile("ns", "reverse")
    assert new_events() == [("Normal", "Created")]
    for i in range(3):
        kube.set_ready(kube.transformer(f"target-{i}"))
    ctl.reconcile("ns", "reverse")
    assert new_events() == [("Normal", "TransformerReady")] * 3
    ctl.reconcile("ns", "reverse")
    assert new_events() == []  # level-triggered reconciles do not repeat events

    # A spec change: new pods, ready, old ones gone -> RolledOut.
    kube.etls[("ns", "reverse")]["spec"]["workers"] = 2
    kube.etls[("ns", "reverse")]["metadata"]["generation"] = 2
    ctl.reconcile("ns", "reverse")
    assert new_events() == [("Normal", "Created")]
    for p in kube.transformer_pods("ns", "reverse"):
        kube.set_ready(kube.pods[("ns", p["metadata"]["name"])])
    ctl.reconcile("ns", "reverse")
    assert new_events() == [("Normal", "TransformerReady")] * 3
    clock.now += SWITCH_SECONDS  # the old ones go after the switch-over
    ctl.reconcile("ns", "reverse")
    assert new_events() == [("Normal", "RolledOut")]
    ctl.reconcile("ns", "reverse")
    assert new_events() == []

    # A permanent failure: reported once, then the ETL is in Error.
    kube.set_exit(kube.transformer("target-1"), 2, "sluice: ETL 'reverse': bad code")
    ctl.reconcile("ns", "reverse")
    ctl.reconcile("ns", "reverse")
    story = kube.events[:]
    assert new_events() == [("Warning", "TransformerFailed"), ("Warning", "Error")]
    assert "bad code" in story[0]["message"] and "target-1" in story[0]["message"]
    assert story[1]["involvedObject"]["kind"] == "ETL"
    assert story[1]["involvedObject"]["name"] == "reverse"

    kube.etls[("ns", "reverse")]["metadata"]["deletionTimestamp"] = "now"
    ctl.reconcile("ns", "reverse")
    ctl.reconcile("ns", "reverse")
    assert new_events() == [("Normal", "Deleted")]
