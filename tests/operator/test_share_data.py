"""Transformers read their target's files: the target's data claim, mounted read-only.

With sharing on (the default; the chart's ``etl.shareTargetData``) the
operator mounts the data volume of the target a transformer runs beside at
the target's own path, so the ``etl_fqn`` path the target sends is valid in
the transformer pod, and lets ``confine`` accept it (``SLUICE_DATA_ROOTS``).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from etl_operator import pods
from etl_operator.controller import Controller, OperatorConfig
from etl_operator.status import observe
from etl_runtime.cluster.reconcile import SWITCH_SECONDS
from etl_runtime.cluster.records import TargetInfo
from etl_runtime.core.spec import EtlSpec

from .fakes import FakeKube

REF = pods.EtlRef(name="resize", namespace="ns", uid="u1")
BYTES = {"mode": "object", "code": {"source": "def transform(d):\n    return d\n"}}
FQN = {**BYTES, "argType": "fqn"}
TARGET = TargetInfo(id="sl-sluice-target-0", url="http://10.0.0.5:8080", node="node-a")
CLAIM = "data-sl-sluice-target-0"


def target_pod(claim: str = CLAIM, data_dir: str = "/data") -> dict[str, Any]:
    """A target pod as the chart's StatefulSet makes it: its claim, tmp and a secret."""
    return {
        "metadata": {"name": TARGET.id, "labels": {"sluice.dev/role": "target"}},
        "spec": {
            "nodeName": TARGET.node,
            "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": claim}},
                {"name": "tmp", "emptyDir": {}},
                {"name": "bucket-secret-x", "secret": {"secretName": "x"}},
            ],
            "containers": [
                {
                    "name": "target",
                    "volumeMounts": [
                        {"name": "data", "mountPath": data_dir},
                        {"name": "tmp", "mountPath": "/tmp"},
                        {"name": "bucket-secret-x", "mountPath": "/etc/sluice/secrets/x"},
                    ],
                }
            ],
        },
        "status": {"phase": "Running", "podIP": "10.0.0.5"},
    }


def build(spec: dict, share: bool, tpod: dict | None = None) -> dict[str, Any]:
    return pods.transformer_pod(
        REF,
        EtlSpec.from_dict(spec),
        TARGET,
        image="img",
        with_token=False,
        target_pod=tpod if tpod is not None else target_pod(),
        share_target_data=share,
    )


def env(pod: dict) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0]["env"]}


def target_mounts(pod: dict) -> list[dict]:
    return [
        m for m in pod["spec"]["containers"][0]["volumeMounts"] if m["name"].startswith("target-")
    ]


def test_shared_the_targets_claim_is_mounted_read_only_at_the_targets_path():
    pod = build(BYTES, share=True, tpod=target_pod(data_dir="/srv/sluice"))
    # only the objects: not the target's ETL output cache (other ETLs' answers) nor temp files
    assert target_mounts(pod) == [
        {
            "name": "target-data",
            "mountPath": "/srv/sluice/buckets",
            "subPath": "buckets",
            "readOnly": True,
        }
    ]
    (vol,) = [v for v in pod["spec"]["volumes"] if v["name"] == "target-data"]
    assert vol == {
        "name": "target-data",
        "persistentVolumeClaim": {"claimName": CLAIM, "readOnly": True},
    }
    assert env(pod)["SLUICE_DATA_ROOTS"] == "/srv/sluice/buckets"
    # Beside its target, on its node: a ReadWriteOnce claim may be mounted there twice.
    assert pod["spec"]["nodeName"] == "node-a"
    # Nothing else of the target's: not its scratch space, not its bucket secrets.
    names = {v["name"] for v in pod["spec"]["volumes"]}
    assert names == {"deps", "tmp", "target-data"}


def test_not_shared_bytes_etls_get_no_mount_and_no_data_roots():
    pod = build(BYTES, share=False)
    assert target_mounts(pod) == []
    assert "SLUICE_DATA_ROOTS" not in env(pod)
    assert all("persistentVolumeClaim" not in v for v in pod["spec"]["volumes"])
    # argType fqn always needs the files: mounted either way.
    assert env(build(FQN, share=False))["SLUICE_DATA_ROOTS"] == "/data/buckets"


def test_turning_sharing_on_or_off_gives_bytes_etls_new_pods_not_fqn_ones():
    shared, plain = build(BYTES, share=True), build(BYTES, share=False)
    assert shared["metadata"]["name"] != plain["metadata"]["name"]
    assert (
        shared["metadata"]["annotations"]["sluice.dev/spec-hash"]
        != plain["metadata"]["annotations"]["sluice.dev/spec-hash"]
    )
    # Sharing off is exactly the pod of before sharing existed: nothing rolls.
    assert plain["metadata"]["annotations"]["sluice.dev/spec-hash"] == (
        EtlSpec.from_dict(BYTES).content_hash()
    )
    assert build(FQN, share=True) == build(FQN, share=False)


def add_target(kube: FakeKube, name: str, node: str) -> None:
    pod = target_pod(claim=f"data-{name}")
    pod["metadata"].update(name=name, namespace="ns")
    pod["spec"]["nodeName"] = node
    kube.pods[("ns", name)] = pod


def fake_cluster() -> FakeKube:
    kube = FakeKube()
    add_target(kube, TARGET.id, "node-a")
    kube.add_etl("resize", dict(BYTES))
    return kube


def test_controller_mounts_the_claim_of_the_target_each_transformer_serves():
    kube = fake_cluster()
    add_target(kube, "sl-sluice-target-1", "node-b")
    Controller(kube, OperatorConfig.from_env({})).reconcile("ns", "resize")  # type: ignore[arg-type]
    for target, node in (("sl-sluice-target-0", "node-a"), ("sl-sluice-target-1", "node-b")):
        pod = kube.transformer(target)
        (vol,) = [v for v in pod["spec"]["volumes"] if v["name"] == "target-data"]
        assert vol["persistentVolumeClaim"] == {"claimName": f"data-{target}", "readOnly": True}
        assert pod["spec"]["nodeName"] == node
        assert env(pod)["SLUICE_DATA_ROOTS"] == "/data/buckets"


def test_switching_sharing_off_rolls_transformers_and_keeps_the_old_until_ready():
    kube = fake_cluster()
    on = Controller(kube, OperatorConfig(share_target_data=True))  # type: ignore[arg-type]
    on.reconcile("ns", "resize")
    old = kube.transformer(TARGET.id)
    kube.set_ready(old)
    on.reconcile("ns", "resize")
    assert kube.etls[("ns", "resize")]["status"]["phase"] == "Running"

    clock = [0.0]
    off = Controller(kube, OperatorConfig(share_target_data=False), clock=lambda: clock[0])  # type: ignore[arg-type]
    off.reconcile("ns", "resize")
    # A replacement without the mount starts; the old one serves until it is ready.
    names = {p["metadata"]["name"] for p in kube.transformer_pods("ns", "resize")}
    assert old["metadata"]["name"] in names and len(names) == 2
    others = kube.transformer_pods("ns", "resize")
    (new,) = [p for p in others if p["metadata"]["name"] != old["metadata"]["name"]]
    assert target_mounts(new) == [] and "SLUICE_DATA_ROOTS" not in env(new)
    kube.set_ready(kube.pods[("ns", new["metadata"]["name"])])
    off.reconcile("ns", "resize")  # publishes the new one; the old one serves the switch-over
    assert len(kube.transformer_pods("ns", "resize")) == 2
    clock[0] += SWITCH_SECONDS
    off.reconcile("ns", "resize")
    assert kube.transformer(TARGET.id)["metadata"]["name"] == new["metadata"]["name"]
    assert kube.etls[("ns", "resize")]["status"]["phase"] == "Running"


@pytest.mark.parametrize(
    ("value", "want"),
    [("", True), ("true", True), ("false", False), ("False", False), ("0", False)],
)
def test_share_setting_from_env(value, want):
    assert OperatorConfig.from_env({"SLUICE_SHARE_TARGET_DATA": value}).share_target_data is want


def test_malformed_share_setting_is_refused_by_name():
    with pytest.raises(ValueError, match="SLUICE_SHARE_TARGET_DATA must be true or false"):
        OperatorConfig.from_env({"SLUICE_SHARE_TARGET_DATA": "sometimes"})


def test_transformer_whose_claim_does_not_mount_says_so_after_init_seconds():
    pod = build(BYTES, share=True)
    pod["status"] = {
        "phase": "Pending",
        "startTime": "2020-01-01T00:00:00Z",
        "conditions": [{"type": "Ready", "status": "False"}],
        "containerStatuses": [{"state": {"waiting": {"reason": "ContainerCreating"}}}],
    }
    t = observe(pod, init_timeout=300, now=dt.datetime(2020, 1, 1, 0, 6, tzinfo=dt.UTC))
    # Replaced (counted as a restart), with a message that names the claim.
    assert t.terminated and not t.ready
    assert t.message is not None
    assert t.message.startswith("not ready after 300s (initSeconds): container not created")
    assert CLAIM in t.message and "FailedMount" in t.message
    assert "etl.shareTargetData=false" in t.message
