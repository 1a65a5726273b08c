"""``etl.shareTargetData``, ``redirectBytes``, ``cacheBytes``: the chart tells targets and operator.

Sharing on (the default): targets send every ETL the object's path
(``SLUICE_ETL_FQN=always``) and the operator mounts each target's data claim
into its transformers. The last test joins the two halves: the transformer
pod the operator builds, from the chart's own operator env and target pod,
mounts the very claim and directory the chart gives the target.
"""

from __future__ import annotations

from typing import Any

import pytest

from etl_operator import pods
from etl_operator.controller import OperatorConfig
from etl_runtime.cluster.records import TargetInfo
from etl_runtime.core.spec import EtlSpec
from tests.helm.chart import (
    CHART,
    Manifest,
    container,
    env_of,
    helm,
    pod_spec,
    render,
    set_args,
)


def target_env(m: Manifest) -> dict[str, dict[str, Any]]:
    return env_of(container(m.component("StatefulSet", "target"), "target"))


def operator_config(m: Manifest) -> OperatorConfig:
    env = env_of(container(m.component("Deployment", "operator")))
    return OperatorConfig.from_env({k: e["value"] for k, e in env.items() if "value" in e})


def test_default_targets_send_paths_and_the_operator_shares_their_data():
    m = render()
    env = target_env(m)
    assert env["SLUICE_ETL_FQN"]["value"] == "always"
    # the NetworkPolicy keeps clients away from transformers: targets relay every answer
    assert env["SLUICE_ETL_REDIRECT_BYTES"]["value"] == "off"
    assert operator_config(m).share_target_data is True


def test_redirects_follow_the_network_policy():
    m = render({"networkPolicy.enabled": False})
    assert "SLUICE_ETL_REDIRECT_BYTES" not in target_env(m)  # the target's built-in threshold
    clients = [{"namespaceSelector": {"matchLabels": {"team": "ml"}}}]
    m = render({"networkPolicy.transformerClients": clients, "etl.redirectBytes": 65536})
    assert target_env(m)["SLUICE_ETL_REDIRECT_BYTES"]["value"] == "65536"
    (policy,) = [p for p in m.of_kind("NetworkPolicy") if "Ingress" in p["spec"]["policyTypes"]]
    assert {"from": clients, "ports": [{"port": 8000, "protocol": "TCP"}]} in policy["spec"][
        "ingress"
    ]
    proc = helm("template", "x", str(CHART), *set_args({"etl.redirectBytes": 65536}), check=False)
    assert proc.returncode != 0 and "networkPolicy.transformerClients" in proc.stderr


def test_sharing_off_targets_send_bytes_and_the_operator_mounts_nothing():
    m = render({"etl.shareTargetData": False})
    assert "SLUICE_ETL_FQN" not in target_env(m)
    assert operator_config(m).share_target_data is False


@pytest.mark.parametrize(("value", "env"), [(1048576, "1048576"), ("off", "off"), ("0", "0")])
def test_redirect_bytes_reaches_the_targets(value, env):
    m = render({"etl.redirectBytes": value, "networkPolicy.enabled": False})
    assert target_env(m)["SLUICE_ETL_REDIRECT_BYTES"]["value"] == env
    # Only targets answer ETL GETs.
    for comp in ("gateway", "operator"):
        assert "SLUICE_ETL_REDIRECT_BYTES" not in env_of(container(m.component("Deployment", comp)))


def test_redirect_bytes_that_is_not_a_size_or_off_is_refused():
    proc = helm("template", "x", str(CHART), *set_args({"etl.redirectBytes": "1MiB"}), check=False)
    assert proc.returncode != 0
    assert "redirectBytes" in proc.stderr


def test_operator_mounts_the_claim_the_statefulset_gives_each_target():
    m = render({"target.replicas": 2})
    sts = m.component("StatefulSet", "target")
    (claim_template,) = sts["spec"]["volumeClaimTemplates"]
    tmpl = pod_spec(sts)
    (target_c,) = tmpl["containers"]
    data_dir = target_c["command"][target_c["command"].index("--data-dir") + 1]
    # The pod the StatefulSet controller makes for ordinal 1: its claim volume added.
    name = f"{sts['metadata']['name']}-1"
    claim = f"{claim_template['metadata']['name']}-{name}"
    target_pod = {
        "metadata": {"name": name},
        "spec": {
            **tmpl,
            "nodeName": "node-1",
            "volumes": [
                *tmpl["volumes"],
                {"name": claim_template["metadata"]["name"],
                 "persistentVolumeClaim": {"claimName": claim}},
            ],
        },
    }  # fmt: skip
    config = operator_config(m)
    spec = EtlSpec.from_dict({"code": {"source": "def transform(d):\n    return d\n"}})
    pod = pods.transformer_pod(
        pods.EtlRef("resize", "data", "u1"),
        spec,
        TargetInfo(id=name, url="", node="node-1"),
        image=config.image,
        with_token=True,
        target_pod=target_pod,
        share_target_data=config.share_target_data,
    )
    c = pod["spec"]["containers"][0]
    # the objects only (buckets/), at the path the target sends (etl_fqn)
    objects = f"{data_dir}/buckets"
    mounts = [m for m in c["volumeMounts"] if m["mountPath"].startswith(data_dir)]
    assert mounts == [
        {"name": "target-data", "mountPath": objects, "subPath": "buckets", "readOnly": True}
    ]
    (vol,) = [v for v in pod["spec"]["volumes"] if v["name"] == "target-data"]
    assert vol["persistentVolumeClaim"] == {"claimName": claim, "readOnly": True}
    assert env_of(c)["SLUICE_DATA_ROOTS"]["value"] == objects
    assert pod["spec"]["nodeName"] == "node-1"
    # Only the claim: the target's scratch emptyDir stays its own.
    assert [v for v in pod["spec"]["volumes"] if "persistentVolumeClaim" in v] == [vol]


@pytest.mark.parametrize(
    ("value", "env"), [("20GiB", "20GiB"), ("5%", "5%"), (1 << 30, "1073741824")]
)
def test_etl_cache_bytes_reaches_the_targets(value, env):
    assert "SLUICE_ETL_CACHE_BYTES" not in target_env(render())  # the target's default
    m = render({"etl.cacheBytes": value})
    assert target_env(m)["SLUICE_ETL_CACHE_BYTES"]["value"] == env
    for comp in ("gateway", "operator"):
        assert "SLUICE_ETL_CACHE_BYTES" not in env_of(container(m.component("Deployment", comp)))
    proc = helm("template", "x", str(CHART), *set_args({"etl.cacheBytes": "lots"}), check=False)
    assert proc.returncode != 0 and "cacheBytes" in proc.stderr
