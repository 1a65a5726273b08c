"""Sluice job views mapped onto AIStore's job status and snapshots, parsed by the SDK's models.

The end-to-end calls (``Job.wait``/``status``/``get_details`` against ``sluice
up``) are in tests/compat/test_aistore_jobs.py; these cover the states a
real run rarely shows: a job failed because a target was gone, prefetch kinds.
"""

from __future__ import annotations

from typing import Any

import pytest

from etl_runtime.gateway.aisjobs import snaps, status
from etl_runtime.gateway.context import Gateway

types = pytest.importorskip("aistore.sdk.types")
GO_ZERO_TIME = "0001-01-01T00:00:00Z"


def view(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": "etl-bck-1a2b3c4d",
        "kind": "etl-bck",
        "state": "Failed",
        "reason": "target 't1' not reachable (ConnectError) for more than 60s",
        "spec": {"src": "bkt-a", "dst": "bkt", "num_workers": 3},
        "started": 1_795_390_000.5,
        "ended": 1_795_390_070.25,
        "targets": {
            "t0": {
                "state": "Failed",
                "reason": "target 't1' not reachable (ConnectError) for more than 60s",
                "started": 1_795_390_000.5,
                "ended": 1_795_390_070.25,
                "progress": {"objects": 4, "bytes": 400},
            },
            "t1": {"state": "Unreachable", "reason": "not reachable (ConnectError)"},
        },
    }
    return base | over


def test_a_failed_job_is_aborted_with_its_reason() -> None:
    st = types.JobStatus.model_validate(status(view()))
    assert st.aborted and "t1" in st.err and st.end_time == 1_795_390_070_250_000_000
    got = types.AggregatedJobSnap.model_validate(
        {t: [s] for t, s in snaps(Gateway(None, None), view()).items()}  # type: ignore[arg-type]
    )
    assert got.any_aborted() and got.all_idle()
    t0, t1 = got.root["t0"][0], got.root["t1"][0]
    assert t0.stats and t0.stats.objects == 4 and t0.stats.bytes == 400
    assert t0.start_time == "2026-11-22T23:26:40.500000Z" and t0.end_time.endswith("50.250000Z")
    assert t1.aborted and "t1" in t1.abort_err and t1.end_time != GO_ZERO_TIME
    assert t0.source_bck and t0.source_bck.name == "bkt-a" and t0.destination_bck.name == "bkt"
    assert got.get_num_workers() == 3


def test_running_and_prefetch_kinds() -> None:
    running = view(
        kind="prefetch",
        state="Running",
        reason=None,
        ended=None,
        spec={"bucket": "remote"},
        targets={"t0": {"state": "Running", "started": 1.0, "ended": None, "progress": {}}},
    )
    st = types.JobStatus.model_validate(status(running))
    assert st.end_time == 0 and not st.aborted and st.err == ""
    snap = types.JobSnap.model_validate(snaps(Gateway(None, None), running)["t0"])  # type: ignore[arg-type]
    assert snap.kind == "prefetch-listrange" and snap.end_time == GO_ZERO_TIME
    assert not snap.is_idle and snap.bucket and snap.bucket.name == "remote"
