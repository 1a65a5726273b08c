"""RBAC is least privilege: namespaced Roles, exact verbs, no wildcards.

A compromised target (it serves user traffic) must not be able to read
Secrets or create pods; the gateway manages ETLs but never touches Secrets;
only the operator creates pods and the per-ETL token Secrets.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.helm.chart import Manifest, pod_spec, render

Rules = dict[tuple[str, str], set[str]]

EXPECTED: dict[str, Rules] = {
    "target": {
        ("sluice.dev", "etls"): {"get", "list", "watch"},
        ("", "configmaps"): {"get", "list", "watch"},  # the cluster map, by name
        ("apps", "statefulsets"): {"get"},  # leaving or restarting? by name
        ("", "events"): {"create"},  # a scrub's findings, on its own pod
    },
    "gateway": {
        ("sluice.dev", "etls"): {"get", "list", "watch", "create", "update", "patch", "delete"},
        ("", "pods"): {"get", "list", "watch"},
        ("", "configmaps"): {"get", "list", "watch", "create", "update", "patch"},
        ("", "secrets"): {"get", "list", "watch", "update"},  # its S3 key Secret, by name
        ("apps", "statefulsets"): {"get", "list", "watch"},
    },
    "operator": {
        ("sluice.dev", "etls"): {"get", "list", "watch", "patch", "update"},
        ("sluice.dev", "etls/status"): {"get", "patch", "update"},
        ("sluice.dev", "etls/finalizers"): {"update"},
        ("", "pods"): {"get", "list", "watch", "create", "delete", "patch"},
        ("", "secrets"): {"get", "create", "update", "delete"},
        ("", "events"): {"create"},
        ("events.k8s.io", "events"): {"create"},
    },
}
PEERING: Rules = {("kopf.dev", "kopfpeerings"): {"get", "list", "watch", "patch"}}


def flatten(rules: list[dict[str, Any]]) -> Rules:
    out: Rules = {}
    for rule in rules:
        assert "resourceNames" not in rule or rule["resourceNames"]
        assert not rule.get("nonResourceURLs"), rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return out


def role_of(m: Manifest, component: str) -> Rules:
    """Rules granted to the ServiceAccount the component's pods run as."""
    workload = next(
        w
        for w in m.workloads()
        if w["metadata"]["labels"]["app.kubernetes.io/component"] == component
    )
    sa = pod_spec(workload)["serviceAccountName"]
    rules: Rules = {}
    for binding in m.of_kind("RoleBinding"):
        if any(s["kind"] == "ServiceAccount" and s["name"] == sa for s in binding["subjects"]):
            assert binding["roleRef"]["kind"] == "Role"
            role = m.get("Role", binding["roleRef"]["name"])
            for key, verbs in flatten(role["rules"]).items():
                rules.setdefault(key, set()).update(verbs)
    return rules


@pytest.mark.parametrize("values", [{}, {"operator.replicas": 2}, {"auth.token": "t"}])
def test_no_wildcards_and_nothing_cluster_wide(values: dict[str, Any]) -> None:
    m = render(values)
    assert not m.of_kind("ClusterRole") and not m.of_kind("ClusterRoleBinding")
    for role in m.of_kind("Role"):
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[field], f"{role['metadata']['name']}: {rule}"
                assert not any("*" in item for item in rule[field]), rule


@pytest.mark.parametrize("component", sorted(EXPECTED))
def test_each_component_gets_exactly_its_rules(component: str) -> None:
    assert role_of(render(), component) == EXPECTED[component]


def test_kopf_peering_rights_only_with_peering() -> None:
    assert role_of(render({"operator.replicas": 2}), "operator") == {
        **EXPECTED["operator"],
        **PEERING,
    }
    assert role_of(render({"operator.peering.enabled": True}), "operator") == {
        **EXPECTED["operator"],
        **PEERING,
    }


def test_each_component_has_its_own_service_account() -> None:
    m = render()
    accounts = {
        w["metadata"]["labels"]["app.kubernetes.io/component"]: pod_spec(w)["serviceAccountName"]
        for w in m.workloads()
    }
    assert len(set(accounts.values())) == 3, accounts
    for sa in accounts.values():
        m.get("ServiceAccount", sa)


def test_only_the_operator_can_touch_secrets_or_create_pods() -> None:
    """The gateway's one exception: the S3 key Secret, by name, never created."""
    m = render({"auth.token": "t", "operator.replicas": 2})
    for component in ("target", "gateway"):
        rules = role_of(m, component)
        assert "create" not in rules.get(("", "pods"), set())
        if component == "target":
            assert ("", "secrets") not in rules
    (gateway_role,) = [r for r in m.of_kind("Role") if r["metadata"]["name"].endswith("gateway")]
    secret_rules = [r for r in gateway_role["rules"] if "secrets" in r["resources"]]
    (keys,) = [s for s in m.of_kind("Secret") if s["metadata"]["name"].endswith("-s3-keys")]
    assert secret_rules == [
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": [keys["metadata"]["name"]],
            "verbs": ["get", "list", "watch", "update"],
        }
    ]
