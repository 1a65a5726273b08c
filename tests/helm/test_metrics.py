"""The chart's Prometheus wiring: scrape annotations, ServiceMonitor/PodMonitor, policy."""

from __future__ import annotations

import json
import re
from typing import Any

from etl_operator import pods
from etl_runtime.cluster.records import TargetInfo
from etl_runtime.core.spec import EtlSpec
from tests.helm.chart import REPO, Manifest, container, render

SCRAPE = ("prometheus.io/scrape", "prometheus.io/port", "prometheus.io/path")


def _matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A Kubernetes label selector (matchLabels + In/Exists expressions) against labels."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        if e["operator"] == "In" and labels.get(e["key"]) not in e["values"]:
            return False
        if e["operator"] == "Exists" and e["key"] not in labels:
            return False
    return True


def _transformer_pod() -> dict[str, Any]:
    spec = EtlSpec.from_dict({"code": {"source": "def transform(d):\n    return d\n"}})
    ref = pods.EtlRef(name="rev", namespace="data", uid="u")
    target = TargetInfo(id="sl-sluice-target-0", url="http://10.0.0.5:8080", node="n")
    return pods.transformer_pod(ref, spec, target, image="img", with_token=True)


def test_every_pod_is_annotated_with_a_port_its_container_exposes() -> None:
    m = render()
    assert not m.of_kind("ServiceMonitor") and not m.of_kind("PodMonitor")
    for w in m.workloads():
        ann = w["spec"]["template"]["metadata"]["annotations"]
        assert ann["prometheus.io/scrape"] == "true"
        assert ann["prometheus.io/path"] == "/metrics"
        ports = {p["containerPort"] for p in container(w)["ports"]}
        assert int(ann["prometheus.io/port"]) in ports, w["metadata"]["name"]
    op = m.component("Deployment", "operator")
    command = container(op)["command"]
    port = op["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"]
    assert command[command.index("--metrics-port") + 1] == port == "9090"


def test_scrape_annotations_can_be_turned_off_or_overridden() -> None:
    m = render(
        {
            "metrics.scrapeAnnotations": False,
            "gateway.podAnnotations": {"prometheus.io/scrape": "false", "team": "ml"},
        }
    )
    gw = m.component("Deployment", "gateway")["spec"]["template"]["metadata"]["annotations"]
    assert gw == {"prometheus.io/scrape": "false", "team": "ml"}
    for kind, component in (("StatefulSet", "target"), ("Deployment", "operator")):
        meta = m.component(kind, component)["spec"]["template"]["metadata"]
        assert not set(SCRAPE) & set(meta.get("annotations") or {})


def test_service_monitor_scrapes_gateway_targets_and_operator_and_pod_monitor_transformers() -> (
    None
):
    m = render(
        {
            "metrics.serviceMonitor.enabled": True,
            "metrics.serviceMonitor.interval": "15s",
            "metrics.serviceMonitor.labels": {"release": "kps"},
            "operator.metricsPort": 9400,
        }
    )
    (sm,) = m.of_kind("ServiceMonitor")
    assert sm["metadata"]["labels"]["release"] == "kps"
    assert sm["spec"]["namespaceSelector"] == {"matchNames": ["data"]}
    endpoints = {e["port"]: e for e in sm["spec"]["endpoints"]}
    assert all(e["path"] == "/metrics" and e["interval"] == "15s" for e in endpoints.values())

    selected = [
        s for s in m.of_kind("Service") if _matches(sm["spec"]["selector"], s["metadata"]["labels"])
    ]
    components = {s["metadata"]["labels"]["app.kubernetes.io/component"] for s in selected}
    assert components == {"gateway", "target", "operator"}
    for svc in selected:
        # Each Service has a port the ServiceMonitor scrapes, and it leads to a
        # container port of that name on the pods the Service selects.
        (port,) = [p for p in svc["spec"]["ports"] if p["name"] in endpoints]
        (workload,) = [
            w
            for w in m.workloads()
            if _matches(
                {"matchLabels": svc["spec"]["selector"]},
                w["spec"]["template"]["metadata"]["labels"],
            )
        ]
        names = {p["name"]: p["containerPort"] for p in container(workload)["ports"]}
        assert port["targetPort"] in names, svc["metadata"]["name"]
    op = m.component("Deployment", "operator")
    ports = {p["name"]: p["containerPort"] for p in container(op)["ports"]}
    assert ports["metrics"] == 9400
    assert "9400" in container(op)["command"]

    (pm,) = m.of_kind("PodMonitor")
    assert pm["metadata"]["labels"]["release"] == "kps"
    pod = _transformer_pod()
    assert _matches(pm["spec"]["selector"], pod["metadata"]["labels"])
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] in {p["name"] for p in pod["spec"]["containers"][0]["ports"]}
    for w in m.workloads():  # Sluice's own pods are the ServiceMonitor's
        assert not _matches(pm["spec"]["selector"], w["spec"]["template"]["metadata"]["labels"])


def test_transformer_scrapers_get_their_own_network_policy_rule() -> None:
    monitoring = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "mon"}}}
    m: Manifest = render({"metrics.transformerScrapers": [monitoring]})
    (np,) = [p for p in m.of_kind("NetworkPolicy") if "Ingress" in p["spec"]["policyTypes"]]
    targets_rule, scrapers_rule = np["spec"]["ingress"]
    assert scrapers_rule == {"from": [monitoring], "ports": [{"port": 8000, "protocol": "TCP"}]}
    assert targets_rule["ports"] == scrapers_rule["ports"]


def test_grafana_dashboard_queries_only_documented_metrics() -> None:
    dashboard = json.loads((REPO / "docs" / "grafana" / "sluice-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    used = {
        re.sub(r"_(bucket|count|sum)$", "", name)
        for e in exprs
        for name in re.findall(r"\bsluice_[a-z_]+", e)
    }
    section = (REPO / "docs" / "metrics.md").read_text()
    documented = set(re.findall(r"`(sluice_[a-z_]+)`", section))
    assert used and used <= documented, used - documented
    # Every family is on the dashboard, bar the ETL bytes and the disk size.
    assert documented - used <= {
        "sluice_etl_received_bytes_total",
        "sluice_etl_sent_bytes_total",
        "sluice_target_disk_total_bytes",
    }
