"""The real-node harness: real kubelets, containerd, runc, a pod network, kube-proxy.

Everything is driven the way a user drives a cluster: pods and Services
applied with kubectl, traffic with ordinary HTTP clients, ``kubectl logs``,
``exec`` and ``port-forward``.  The workload is ``localhost/sluice/echo:v1``
(``tests/k8s/images/echo``), built locally by ``scripts/k8s-tools.sh`` and
imported into every node's containerd: no registry is involved.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import re
import subprocess
import sys
from typing import Any

import httpx
import pytest
import yaml

from tests.k8s.cluster import ROOT, TARGET_BINDING, TARGET_ROLE, target_pod
from tests.k8s.controlplane import BIN_DIR
from tests.k8s.realfixtures import RealNodes
from tests.k8s.realnode import ECHO_IMAGE, images_index, sluice_image
from tests.k8s.waiting import wait_for

pytestmark = [pytest.mark.k8s, pytest.mark.realnode]


def echo_pod(name: str, node: str, labels: dict[str, str] | None = None,
             security: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    container: dict[str, Any] = {
        "name": "echo",
        "image": ECHO_IMAGE,
        "imagePullPolicy": "Never",
        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "ports": [{"name": "http", "containerPort": 8080}],
        "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1},
    }
    if security:
        container["securityContext"] = security
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {"app": name}},
        "spec": {"nodeName": node, "containers": [container], "terminationGracePeriodSeconds": 1},
    }


def apply(cluster: RealNodes, ns: str, *objs: dict[str, Any]) -> None:
    doc = json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objs)})
    done = subprocess.run(
        [str(BIN_DIR / "kubectl"), f"--kubeconfig={cluster.kubeconfig}", "-n", ns, "apply",
         "-f", "-"], input=doc, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def wait_ready(cluster: RealNodes, ns: str, *pods: str) -> None:
    for pod in pods:
        cluster.kubectl("-n", ns, "wait", "--for=condition=Ready", f"pod/{pod}", "--timeout=120s")


def pod_ip(cluster: RealNodes, ns: str, pod: str) -> str:
    return str(cluster.core.read_namespaced_pod(pod, ns).status.pod_ip)


def test_nodes_are_ready_with_containerd(real_cluster: RealNodes) -> None:
    assert real_cluster.real is not None
    slot = real_cluster.real.slot
    nodes = {n.metadata.name: n for n in real_cluster.core.list_node().items}
    assert sorted(nodes) == ["node-0", "node-1", "node-2"]
    for i, (name, node) in enumerate(sorted(nodes.items())):
        ready = {c.type: c.status for c in node.status.conditions}["Ready"]
        assert ready == "True", name
        assert node.status.node_info.container_runtime_version.startswith("containerd://")
        assert node.status.node_info.kubelet_version == "v1.34.4"
        addresses = {a.type: a.address for a in node.status.addresses}
        assert addresses["InternalIP"] == slot.node_ip(i)


def test_pod_gets_a_pod_ip_the_host_reaches(real_cluster: RealNodes, real_namespace: str) -> None:
    assert real_cluster.real is not None
    slot = real_cluster.real.slot
    apply(real_cluster, real_namespace, echo_pod("web", "node-1"))
    wait_ready(real_cluster, real_namespace, "web")
    ip = pod_ip(real_cluster, real_namespace, "web")
    assert ipaddress.ip_address(ip) in ipaddress.ip_network(slot.pod_cidr(1))
    r = httpx.get(f"http://{ip}:8080/", timeout=10)
    assert r.status_code == 200 and r.text == "hello from web\n"


def test_cluster_ip_service_routes_across_nodes(
    real_cluster: RealNodes, real_namespace: str
) -> None:
    ns = real_namespace
    labels = {"app": "backend"}
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "backend"},
        "spec": {"selector": labels, "ports": [{"port": 80, "targetPort": "http"}]},
    }
    apply(real_cluster, ns, echo_pod("backend-1", "node-1", labels),
          echo_pod("backend-2", "node-2", labels), echo_pod("client", "node-0"),
          service)  # fmt: skip
    wait_ready(real_cluster, ns, "backend-1", "backend-2", "client")
    cluster_ip = real_cluster.core.read_namespaced_service("backend", ns).spec.cluster_ip
    seen: set[str] = set()

    def both_backends_answer() -> bool:
        # From a pod on node-0, through node-0's kube-proxy rules, to pods on nodes 1 and 2.
        out = real_cluster.kubectl("-n", ns, "exec", "client", "--", "/echo", "get",
                                   f"http://{cluster_ip}/").stdout  # fmt: skip
        seen.add(out.strip())
        return seen >= {"hello from backend-1", "hello from backend-2"}

    wait_for(both_backends_answer, timeout=90, interval=0.1)
    assert seen == {"hello from backend-1", "hello from backend-2"}
    # And from node-0 itself (its own traffic goes through kube-proxy's OUTPUT rules).
    assert real_cluster.real is not None
    fetch = f"import urllib.request as u; print(u.urlopen('http://{cluster_ip}/').read().decode())"
    node = subprocess.run(
        ["ip", "netns", "exec", real_cluster.real.slot.netns(0), sys.executable, "-c", fetch],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert node.stdout.startswith("hello from backend-"), node.stderr


def test_pod_reaches_the_apiserver_with_its_service_account(
    real_cluster: RealNodes, real_namespace: str
) -> None:
    apply(real_cluster, real_namespace, echo_pod("inside", "node-2"))
    wait_ready(real_cluster, real_namespace, "inside")

    # https://10.0.0.1 is the "kubernetes" Service; the pod's token is projected by the kubelet.
    def version() -> str:  # retried: kube-proxy may not have synced the Service yet
        return real_cluster.kubectl("-n", real_namespace, "exec", "inside", "--", "/echo", "get",
                                    "https://10.0.0.1/version").stdout  # fmt: skip

    assert json.loads(wait_for(version, timeout=60))["gitVersion"] == "v1.34.4"
    denied = real_cluster.kubectl("-n", real_namespace, "exec", "inside", "--", "/echo", "get",
                                  "https://10.0.0.1/api/v1/secrets", check=False)  # fmt: skip
    assert denied.returncode != 0
    assert f"system:serviceaccount:{real_namespace}:default" in denied.stdout


def test_logs_exec_and_port_forward(real_cluster: RealNodes, real_namespace: str) -> None:
    ns = real_namespace
    apply(real_cluster, ns, echo_pod("talk", "node-0"))
    wait_ready(real_cluster, ns, "talk")
    said = real_cluster.kubectl("-n", ns, "exec", "talk", "--", "/echo", "say", "hi", "there")
    assert said.stdout == "hi there\n"

    cmd = [str(BIN_DIR / "kubectl"), f"--kubeconfig={real_cluster.kubeconfig}", "-n", ns,
           "port-forward", "pod/talk", ":8080"]  # fmt: skip
    forward = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert forward.stdout is not None
        line = forward.stdout.readline()  # "Forwarding from 127.0.0.1:PORT -> 8080"
        match = re.search(r"127\.0\.0\.1:(\d+)", line)
        assert match, f"kubectl port-forward said {line!r}: {forward.stderr.read()}"
        r = httpx.get(f"http://127.0.0.1:{match[1]}/port-forwarded", timeout=10)
        assert r.text == "hello from talk\n"
    finally:
        forward.terminate()
        forward.wait(10)

    def logged() -> str:
        out = real_cluster.kubectl("-n", ns, "logs", "talk").stdout
        return out if "GET /port-forwarded" in out else ""

    out = wait_for(logged, timeout=30)
    assert "echo talk listening on :8080" in out


def test_security_context_is_enforced(real_cluster: RealNodes, real_namespace: str) -> None:
    """What the chart asks of its pods: a non-root user and a read-only root filesystem."""
    security = {"runAsUser": 10001, "runAsGroup": 10001, "runAsNonRoot": True,
                "readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]}}  # fmt: skip
    apply(real_cluster, real_namespace, echo_pod("locked", "node-1", security=security),
          echo_pod("open", "node-1"))  # fmt: skip
    wait_ready(real_cluster, real_namespace, "locked", "open")
    locked = real_cluster.kubectl("-n", real_namespace, "exec", "locked", "--", "/echo", "id")
    assert locked.stdout == "uid=10001 gid=10001 rootfs=read-only\n"
    opened = real_cluster.kubectl("-n", real_namespace, "exec", "open", "--", "/echo", "id")
    assert opened.stdout == "uid=0 gid=0 rootfs=writable\n"


def test_sluice_target_from_the_built_image(real_cluster: RealNodes, real_namespace: str) -> None:
    """A storage target from ``make images``'s server image, on a real node, behind a Service.

    Runs when ``make images`` (scripts/images.sh) has exported the server image
    (``~/.cache/sluice/images/index.json``); it is imported into node-1 only.
    """
    server = sluice_image("server")
    if server is None:
        pytest.skip(f"no server image archive listed in {images_index()}: run `make images`")
    assert real_cluster.real is not None
    ref, archive = server
    real_cluster.real.node_list[1].ctr("images", "import", str(archive), timeout=600)
    ns = real_namespace
    real_cluster.kubectl("apply", "-f", str(ROOT / "crds"))
    key = base64.b64encode(b"k" * 64).decode()
    binding = {**TARGET_BINDING, "subjects": [{**TARGET_BINDING["subjects"][0], "namespace": ns}]}
    # Under the chart's own security contexts (non-root, read-only root
    # filesystem, no capabilities, RuntimeDefault seccomp), with its /tmp.
    values = yaml.safe_load((ROOT / "helm/sluice/values.yaml").read_text())
    pod = target_pod(0, "node-1", ref)
    pod["spec"]["securityContext"] = values["podSecurityContext"]
    pod["spec"]["volumes"].append({"name": "tmp", "emptyDir": {}})
    container = pod["spec"]["containers"][0]
    container["imagePullPolicy"] = "Never"
    container["securityContext"] = values["containerSecurityContext"]
    container["volumeMounts"].append({"name": "tmp", "mountPath": "/tmp"})
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "sluice-target"},
        "spec": {
            "selector": {"sluice.dev/role": "target"},
            "ports": [{"port": 80, "targetPort": 8080}],
        },
    }
    apply(real_cluster, ns,
          {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "sluice-cluster"},
           "data": {"cluster-key": key}},
          {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "sluice-target"}},
          TARGET_ROLE, binding, pod, service, echo_pod("client", "node-0"))  # fmt: skip
    wait_ready(real_cluster, ns, "target-0", "client")
    ip = pod_ip(real_cluster, ns, "target-0")
    bucket = httpx.post(
        f"http://{ip}:8080/v1/buckets/bkt1", json={"action": "create-bck"}, timeout=30
    )
    assert bucket.status_code == 200, bucket.text
    put = httpx.put(f"http://{ip}:8080/v1/objects/bkt1/hello.txt", content=b"real node", timeout=30)
    assert put.status_code == 200, put.text
    cluster_ip = real_cluster.core.read_namespaced_service("sluice-target", ns).spec.cluster_ip

    url = f"http://{cluster_ip}/v1/objects/bkt1/hello.txt"

    def through_the_service() -> str:  # retried: kube-proxy may not have synced the Service yet
        return real_cluster.kubectl("-n", ns, "exec", "client", "--", "/echo", "get", url).stdout

    assert wait_for(through_the_service, timeout=60) == "real node"
    probe = "import os; print(os.getuid(), os.access('/', os.W_OK), os.access('/data', os.W_OK))"
    who = real_cluster.kubectl("-n", ns, "exec", "target-0", "--", "python", "-c", probe)
    assert who.stdout.split() == ["10001", "False", "True"]
