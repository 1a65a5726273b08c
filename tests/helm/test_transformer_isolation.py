"""Transformer pods of different ETLs cannot reach each other, nor more of Sluice than
their own target's port, and carry nothing that opens the rest.

Rendered from the chart with the real ``helm`` and the operator's own pod spec
(``etl_operator.pods.transformer_pod``), checked with a label-selector matcher:
which NetworkPolicies select a transformer pod, and which pods their rules
admit. Whether a CNI enforces them is another matter: the real-node tests'
bridge CNI does not (docs/deploy.md, "Security").
"""

from __future__ import annotations

from typing import Any

from etl_operator import pods
from etl_runtime.cluster.records import TargetInfo
from etl_runtime.core.spec import EtlSpec
from tests.helm.chart import Manifest, render

FULL = "sl-sluice"  # the release tests/helm/chart.py renders


def matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        if e["operator"] == "Exists" and e["key"] not in labels:
            return False
        if e["operator"] == "In" and labels.get(e["key"]) not in e["values"]:
            return False
    return True


def transformer(etl: str, target: int) -> dict[str, Any]:
    spec = EtlSpec.from_dict({"code": {"source": "def transform(d):\n    return d\n"}})
    ref = pods.EtlRef(name=etl, namespace="default", uid=f"u-{etl}")
    tid = f"{FULL}-target-{target}"
    info = TargetInfo(id=tid, url=f"http://10.0.0.{target}:8080", node="n")
    return pods.transformer_pod(ref, spec, info, image="img", with_token=True)


def pods_of(m: Manifest) -> list[dict[str, str]]:
    """The labels of every pod the release runs: each target replica, gateway, operator."""
    out = []
    for w in m.workloads():
        labels = dict(w["spec"]["template"]["metadata"]["labels"])
        if w["kind"] == "StatefulSet":
            for i in range(int(w["spec"]["replicas"])):
                pod_name = f"{w['metadata']['name']}-{i}"
                out.append({**labels, "statefulset.kubernetes.io/pod-name": pod_name})
        else:
            out.append(labels)
    return out


def egress_peers(m: Manifest, pod_labels: dict[str, str]) -> list[tuple[dict, list]]:
    """``(peer, ports)`` of every egress rule of every policy that selects the pod."""
    out = []
    for np in m.of_kind("NetworkPolicy"):
        if "Egress" in np["spec"]["policyTypes"] and matches(np["spec"]["podSelector"], pod_labels):
            for rule in np["spec"].get("egress", []):
                out += [(peer, rule["ports"]) for peer in rule["to"]]
    return out


def test_a_transformer_reaches_only_dns_and_its_own_targets_port() -> None:
    m = render()
    release = pods_of(m)
    for target in range(3):
        me = transformer("team-a", target)["metadata"]["labels"]
        others = [transformer("team-b", t)["metadata"]["labels"] for t in range(3)]
        peers = egress_peers(m, me)
        assert peers, "no egress policy selects a transformer pod: it may reach anything"
        reached = []
        for peer, ports in peers:
            if peer.get("podSelector", {}).get("matchLabels", {}).get("k8s-app") == "kube-dns":
                assert {p["port"] for p in ports} == {53}
                continue
            assert "namespaceSelector" not in peer and "ipBlock" not in peer, peer
            reached += [(p, ports) for p in release if matches(peer["podSelector"], p)]
            assert not any(matches(peer["podSelector"], o) for o in others), peer
            assert not matches(peer["podSelector"], me), peer
        assert [p["statefulset.kubernetes.io/pod-name"] for p, _ in reached] == [
            f"{FULL}-target-{target}"
        ]
        assert reached[0][1] == [{"port": 8080, "protocol": "TCP"}]


def test_only_targets_reach_a_transformer_not_another_etls_pods() -> None:
    m = render()
    me = transformer("team-a", 0)["metadata"]["labels"]
    other = transformer("team-b", 0)["metadata"]["labels"]
    ingress = [
        np
        for np in m.of_kind("NetworkPolicy")
        if "Ingress" in np["spec"]["policyTypes"] and matches(np["spec"]["podSelector"], me)
    ]
    assert ingress
    for np in ingress:
        for rule in np["spec"]["ingress"]:
            for peer in rule["from"]:
                assert not matches(peer["podSelector"], other), peer
                admitted = [p for p in pods_of(m) if matches(peer["podSelector"], p)]
                assert admitted and all(
                    p["app.kubernetes.io/component"] == "target" for p in admitted
                )


def test_extra_egress_rules_are_added_for_every_transformer() -> None:
    index = {"to": [{"ipBlock": {"cidr": "10.9.0.0/16"}}], "ports": [{"port": 443}]}
    m = render({"networkPolicy.transformerEgress": [index]})
    peers = egress_peers(m, transformer("team-a", 1)["metadata"]["labels"])
    assert ({"ipBlock": {"cidr": "10.9.0.0/16"}}, [{"port": 443}]) in peers
    assert not [np for np in render({"networkPolicy.enabled": False}).of_kind("NetworkPolicy")]


def test_a_transformer_pod_has_no_token_no_key_no_privilege() -> None:
    pod = transformer("team-a", 0)
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for c in spec["containers"] + spec.get("initContainers", []):
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}
        names = {e["name"] for e in c.get("env", [])}
        assert not names & {"SLUICE_CLUSTER_KEY", "SLUICE_TOKEN", "SLUICE_READ_TOKEN"}, names
        refs = [e for e in c.get("env", []) if "valueFrom" in e]
        for e in refs:  # only its own ETL's token Secret, nothing of the cluster's
            if "secretKeyRef" in e["valueFrom"]:
                assert e["valueFrom"]["secretKeyRef"]["name"] == pods.secret_name("team-a")
    assert not [v for v in spec.get("volumes", []) if "projected" in v or "secret" in v]
