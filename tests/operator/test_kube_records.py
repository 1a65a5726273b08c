"""ETL custom resources and target pods as the data plane sees them (no cluster needed)."""

from __future__ import annotations

import pytest

from etl_runtime.cluster.kube.records import (
    parse_selector,
    pod_http_port,
    record_from_cr,
    target_from_pod,
)
from etl_runtime.cluster.records import TargetInfo, TransformerStatus
from etl_runtime.core.spec import InvalidSpec

CR = {
    "metadata": {"name": "reverse", "uid": "abc-123", "generation": 2},
    "spec": {"mode": "object", "code": {"source": "def transform(d):\n    return d\n"}},
    "status": {
        "phase": "Running",
        "transformers": [
            {
                "target": "target-0",
                "endpoint": "http://10.0.0.9:8000",
                "ready": True,
                "pod": "etl-reverse-target-0-aaaaaa",
                "node": "n0",
            },
            {"target": "target-1", "ready": False, "message": "starting"},
        ],
    },
}


def test_record_from_cr_uses_uid_and_status():
    rec = record_from_cr(CR)
    assert rec.name == "reverse" and rec.uid == "abc-123" and rec.phase == "Running"
    assert rec.transformer_for("target-0") == TransformerStatus(
        target="target-0",
        endpoint="http://10.0.0.9:8000",
        ready=True,
        pod="etl-reverse-target-0-aaaaaa",
        node="n0",
    )
    assert rec.transformer_for("target-1").endpoint is None
    assert rec.ready_count == 1


def test_stop_is_visible_before_the_operator_reacts():
    cr = {**CR, "spec": {**CR["spec"], "stopped": True}}
    assert record_from_cr(cr).phase == "Stopped"


def test_new_cr_without_status_is_initializing():
    rec = record_from_cr({"metadata": CR["metadata"], "spec": CR["spec"]})
    assert rec.phase == "Initializing" and rec.transformers == ()


def test_bad_spec_raises_invalid_spec():
    with pytest.raises(InvalidSpec):
        record_from_cr({"metadata": CR["metadata"], "spec": {"code": {}}})


def target_pod(ports, ip="127.0.1.7"):
    return {
        "metadata": {"name": "target-3"},
        "spec": {"nodeName": "node-1", "containers": [{"ports": ports}]},
        "status": {"podIP": ip},
    }


def test_target_url_prefers_the_port_named_http():
    pod = target_pod(
        [{"name": "metrics", "containerPort": 9090}, {"name": "http", "containerPort": 8081}]
    )
    assert target_from_pod(pod) == TargetInfo("target-3", "http://127.0.1.7:8081", "node-1")
    assert pod_http_port(target_pod([{"containerPort": 7000}])) == 7000
    assert pod_http_port(target_pod([])) == 8080
    assert target_from_pod(target_pod([], ip=None)) is None


def test_parse_selector():
    assert parse_selector("sluice.dev/role=target, tier==gpu") == {
        "sluice.dev/role": "target",
        "tier": "gpu",
    }
