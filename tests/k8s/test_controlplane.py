"""The control plane is real: kubectl, RBAC, controllers and the scheduler work."""

from __future__ import annotations

import ipaddress
import json
import ssl
from typing import Any

import httpx
import pytest
from kubernetes import client

from tests.k8s.fixtures import Cluster
from tests.k8s.kubelet import Kubelet
from tests.k8s.waiting import wait_for

pytestmark = pytest.mark.k8s


def test_kubectl_talks_to_the_apiserver(control_plane: Cluster) -> None:
    version = json.loads(control_plane.kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"].startswith("v1.")
    assert control_plane.kubectl("auth", "can-i", "*", "*").stdout.strip() == "yes"
    names = control_plane.kubectl("get", "namespaces", "-o", "name").stdout.split()
    assert "namespace/kube-system" in names


def test_rbac_refuses_anonymous_and_unknown_tokens(control_plane: Cluster) -> None:
    plane = control_plane.plane
    ca = ssl.create_default_context(cafile=str(plane.pki / "ca.crt"))  # no client cert
    with httpx.Client(base_url=plane.server, verify=ca) as http:
        anonymous = http.get("/api/v1/namespaces/default/secrets")
        bad_token = http.get(
            "/api/v1/namespaces/default/secrets", headers={"Authorization": "Bearer x"}
        )
    assert anonymous.status_code == 403
    assert "system:anonymous" in anonymous.json()["message"]
    assert bad_token.status_code == 401


def test_nodes_register_ready(kubelet: Kubelet, control_plane: Cluster) -> None:
    def ready_nodes() -> list[str]:
        core: Any = control_plane.core
        nodes = core.list_node(label_selector="sluice.dev/process-kubelet").items
        return sorted(
            n.metadata.name
            for n in nodes
            if any(c.type == "Ready" and c.status == "True" for c in n.status.conditions)
        )

    assert wait_for(ready_nodes, timeout=30) == ["node-0", "node-1", "node-2"]


def test_deployment_is_scheduled_and_run(
    kubelet: Kubelet, control_plane: Cluster, k8s_namespace: str
) -> None:
    """Controller-manager makes pods, the scheduler binds them, the kubelet runs them."""
    apps: Any = client.AppsV1Api(control_plane.api_client)
    core: Any = control_plane.core
    labels = {"app": "sleeper"}
    container = client.V1Container(
        name="sleep", image="busybox", command=["python", "-c", "import time; time.sleep(600)"]
    )
    spec = client.V1DeploymentSpec(
        replicas=2,
        selector=client.V1LabelSelector(match_labels=labels),
        template=client.V1PodTemplateSpec(
            metadata=client.V1ObjectMeta(labels=labels),
            spec=client.V1PodSpec(containers=[container], termination_grace_period_seconds=1),
        ),
    )
    deployment = client.V1Deployment(metadata=client.V1ObjectMeta(name="sleeper"), spec=spec)
    apps.create_namespaced_deployment(k8s_namespace, deployment)

    def available() -> bool:
        d = apps.read_namespaced_deployment(name="sleeper", namespace=k8s_namespace)
        return (d.status.available_replicas or 0) == 2

    assert wait_for(available, timeout=90)
    net = ipaddress.ip_network(kubelet.subnet)
    pods = core.list_namespaced_pod(k8s_namespace).items
    assert {p.spec.node_name for p in pods} <= {"node-0", "node-1", "node-2"}
    assert all(ipaddress.ip_address(p.status.pod_ip) in net for p in pods)


def test_statefulset_claims_are_provisioned_and_bound(
    kubelet: Kubelet, control_plane: Cluster, k8s_namespace: str
) -> None:
    """volumeClaimTemplates bind through the default StorageClass (local-path)."""
    apps: Any = client.AppsV1Api(control_plane.api_client)
    core: Any = control_plane.core
    code = "import time; open('/data/who', 'w').write('x'); time.sleep(600)"
    template = {
        "metadata": {"labels": {"app": "db"}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "db", "image": "x", "command": ["python", "-c", code],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
            }],
        },
    }  # fmt: skip
    claim = {
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    apps.create_namespaced_stateful_set(k8s_namespace, {
        "metadata": {"name": "db"},
        "spec": {"replicas": 2, "serviceName": "db", "selector": {"matchLabels": {"app": "db"}},
                 "template": template, "volumeClaimTemplates": [claim]},
    })  # fmt: skip

    def ready() -> bool:
        s = apps.read_namespaced_stateful_set(name="db", namespace=k8s_namespace)
        return (s.status.ready_replicas or 0) == 2

    assert wait_for(ready, timeout=120)
    claims = core.list_namespaced_persistent_volume_claim(k8s_namespace).items
    assert sorted(c.metadata.name for c in claims) == ["data-db-0", "data-db-1"]
    assert all(c.status.phase == "Bound" for c in claims)
