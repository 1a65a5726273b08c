"""Reading transformer pods and writing ETL status (no cluster needed)."""

from __future__ import annotations

from etl_operator.status import etl_status, last_line, observe, serving, transformer_statuses
from etl_runtime.cluster.reconcile import ObservedTransformer, Summary
from etl_runtime.cluster.records import TargetInfo


def pod(name="etl-r-t0-abc", phase="Running", ready=False, **status) -> dict:
    return {
        "metadata": {
            "name": name,
            "labels": {"sluice.dev/etl": "r", "sluice.dev/target": "t0"},
            "annotations": {
                "sluice.dev/spec-hash": "h1",
                "sluice.dev/restarts": "2",
                "sluice.dev/target": "t0",
            },
        },
        "spec": {"nodeName": "n1"},
        "status": {
            "phase": phase,
            "podIP": "127.0.1.5",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            **status,
        },
    }


def test_ready_pod():
    t = observe(pod(ready=True))
    assert t == ObservedTransformer(
        name="etl-r-t0-abc",
        target="t0",
        spec_hash="h1",
        node="n1",
        endpoint="http://127.0.1.5:8000",
        ready=True,
        restarts=2,
    )


def test_config_error_reports_the_transformers_own_line():
    log_tail = "Traceback ...\nNameError: x\nsluice: ETL 'r': code does not load: NameError: x\n"
    t = observe(
        pod(
            phase="Failed",
            containerStatuses=[
                {"state": {"terminated": {"exitCode": 2, "message": log_tail, "reason": "Error"}}}
            ],
        )
    )
    assert t.terminated and t.exit_code == 2 and not t.ready
    assert t.message == "sluice: ETL 'r': code does not load: NameError: x"


def test_crash_without_message_and_waiting_reasons():
    t = observe(
        pod(
            phase="Failed",
            containerStatuses=[{"state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}],
        )
    )
    assert t.terminated and t.exit_code == 137 and t.message == "OOMKilled (exit code 137)"
    t = observe(
        pod(
            phase="Pending",
            containerStatuses=[
                {"state": {"waiting": {"reason": "ErrImagePull", "message": "no such image"}}}
            ],
        )
    )
    assert not t.terminated and t.message == "ErrImagePull: no such image"


def test_terminating_pod_is_not_ready():
    p = pod(ready=True)
    p["metadata"]["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    assert not observe(p).ready


def test_last_line_prefers_sluice_line():
    assert last_line("a\nsluice: bad\ntrailing noise\n") == "sluice: bad"
    assert last_line("a\nb\n") == "b"


TARGETS = [TargetInfo("t0", "", "n1"), TargetInfo("t1", "", "n2")]


def ot(name, target, h, ready=False, **kw) -> ObservedTransformer:
    return ObservedTransformer(
        name=name, target=target, spec_hash=h, ready=ready, endpoint=f"http://{name}:8000", **kw
    )


def test_rollout_keeps_old_ready_pod_serving_and_phase_running():
    existing = [
        ot("old0", "t0", "h0", ready=True),
        ot("new0", "t0", "h1"),
        ot("new1", "t1", "h1", ready=True),
    ]
    chosen = serving(TARGETS, existing, "h1")
    assert chosen["t0"].name == "old0" and chosen["t1"].name == "new1"
    statuses = transformer_statuses(TARGETS, existing, "h1")
    assert [s.ready for s in statuses] == [True, True]
    assert "previous spec" in (statuses[0].message or "")
    st = etl_status(
        Summary("Initializing", 1, 2, "1/2 transformers ready"),
        statuses,
        generation=3,
        spec_hash="h1",
        rolling_out=True,
    )
    assert st["phase"] == "Running" and st["ready"] == "2/2"
    conds = {c["type"]: c["status"] for c in st["conditions"]}
    assert conds == {
        "Ready": "True",
        "Progressing": "True",
        "Degraded": "False",
        "ImagePulled": "True",
    }
    assert st["observedGeneration"] == 3


def test_status_shape_and_transition_times_kept():
    statuses = transformer_statuses(TARGETS, [ot("a", "t0", "h1", ready=True)], "h1")
    assert statuses[1].message == "transformer pod not created yet" and statuses[1].node == "n2"
    first = etl_status(
        Summary("Initializing", 1, 2, "1/2 transformers ready"),
        statuses,
        generation=1,
        spec_hash="h1",
        rolling_out=False,
        now="T1",
    )
    assert first["ready"] == "1/2" and first["readyCount"] == 1 and first["total"] == 2
    assert first["transformers"][1] == {
        "target": "t1",
        "ready": False,
        "node": "n2",
        "message": "transformer pod not created yet",
    }
    again = etl_status(
        Summary("Initializing", 1, 2, "1/2"),
        statuses,
        generation=1,
        spec_hash="h1",
        rolling_out=False,
        previous=first,
        now="T2",
    )
    assert {c["lastTransitionTime"] for c in again["conditions"]} == {"T1"}
    done = etl_status(
        Summary("Running", 2, 2, None),
        statuses,
        generation=1,
        spec_hash="h1",
        rolling_out=False,
        previous=again,
        now="T3",
    )
    times = {c["type"]: c["lastTransitionTime"] for c in done["conditions"]}
    assert times == {"Ready": "T3", "Progressing": "T3", "Degraded": "T1", "ImagePulled": "T1"}
