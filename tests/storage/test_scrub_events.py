"""A scrub's findings as Kubernetes Events on the target's pod (``--events kubernetes``).

The targets of a real ``sluice up`` record to a real apiserver (the chart
starts its targets the same way); ``kubectl get events`` is what an operator
would read.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from etl_runtime.local import LocalCluster
from tests.k8s.fixtures import Cluster, control_plane, k8s_namespace  # noqa: F401
from tests.storage.test_integrity import files_of, flip, make, payload, put
from tests.storage.test_scrub import scrub

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def events_cluster(
    control_plane: Cluster,  # noqa: F811
    k8s_namespace: str,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[LocalCluster]:
    monkeypatch.setenv("SLUICE_EVENTS", "kubernetes")
    monkeypatch.setenv("SLUICE_NAMESPACE", k8s_namespace)
    monkeypatch.setenv("KUBECONFIG", str(control_plane.kubeconfig))
    with LocalCluster(tmp_path / "data", targets=2) as c:
        yield c


def events(plane: Cluster, namespace: str, want: int) -> list:
    deadline = time.monotonic() + 30
    while True:
        items = plane.core.list_namespaced_event(namespace).items
        if len(items) >= want or time.monotonic() > deadline:
            return items
        time.sleep(0.2)


def test_a_scrub_records_its_findings_as_events_on_the_target_pod(
    control_plane: Cluster,  # noqa: F811
    k8s_namespace: str,  # noqa: F811
    events_cluster: LocalCluster,
) -> None:
    with httpx.Client(base_url=events_cluster.endpoint, timeout=30, follow_redirects=True) as http:
        make(http, "ev-bkt")
        put(http, "ev-bkt", "rotten.bin", payload(5000, 3))
        put(http, "ev-bkt", "fine.bin", payload(5000, 4))
        [rotten] = files_of(events_cluster, "ev-bkt", "rotten.bin")
        flip(rotten)
        holder = rotten.parents[2].name  # targets/<id>/buckets/ev-bkt/rotten.bin
        job = scrub(http, {"bucket": "ev-bkt"})
    assert job["output"]["corrupted"] == 1, job
    found = events(control_plane, k8s_namespace, want=3)  # one finding, two summaries
    corrupted = [e for e in found if e.reason == "ObjectCorrupted"]
    assert len(corrupted) == 1, [(e.reason, e.message) for e in found]
    (ev,) = corrupted
    assert ev.type == "Warning"
    assert ev.involved_object.kind == "Pod" and ev.involved_object.name == holder
    assert "ais://ev-bkt/rotten.bin" in ev.message and repr(holder) in ev.message, ev.message
    summaries = {e.involved_object.name: e for e in found if e.reason == "ScrubFinished"}
    ids = {d.name for d in events_cluster.data_dir.glob("targets/*")}
    assert set(summaries) == ids and len(ids) == 2, summaries
    assert summaries[holder].type == "Warning" and "1 corrupted" in summaries[holder].message
    (other,) = set(summaries) - {holder}
    assert summaries[other].type == "Normal", summaries[other].message
