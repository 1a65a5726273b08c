"""The process kubelet runs pods the way a real node would, as seen through the API."""

from __future__ import annotations

import ipaddress
import os
import textwrap
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.k8s.fixtures import Cluster
from tests.k8s.kubelet import Kubelet
from tests.k8s.podspec import IMAGE_ROOTS
from tests.k8s.waiting import wait_for

pytestmark = pytest.mark.k8s
POD_IP = {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}


def pod(name: str, *containers: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"test": name}},
        "spec": {"nodeName": "node-1", "terminationGracePeriodSeconds": 5, **spec,
                 "containers": list(containers)},
    }  # fmt: skip


def python(name: str, code: str, **extra: Any) -> dict[str, Any]:
    """A container running a Python snippet."""
    return {"name": name, "image": "ignored", "command": ["python", "-c", textwrap.dedent(code)],
            **extra}  # fmt: skip


def read_pod(core: Any, ns: str, name: str) -> Any:
    return core.read_namespaced_pod(name=name, namespace=ns)


def phase_is(core: Any, ns: str, name: str, *phases: str) -> Any:
    """The pod if its phase is one of ``phases`` (for ``wait_for``)."""
    p = read_pod(core, ns, name)
    return p if p.status.phase in phases else None


def test_pod_gets_own_ip_and_becomes_ready(
    kubelet: Kubelet, control_plane: Cluster, k8s_namespace: str
) -> None:
    core: Any = control_plane.core
    ns = k8s_namespace
    server = {
        "name": "web",
        "image": "python:3",
        "command": ["python", "-m", "http.server"],
        "args": ["8000", "--bind", "$(POD_IP)"],
        "env": [POD_IP],
        "ports": [{"name": "http", "containerPort": 8000}],
        "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1},
    }
    core.create_namespaced_pod(ns, pod("web", server))

    def ready() -> Any:
        p = read_pod(core, ns, "web")
        conds = {c.type: c.status for c in p.status.conditions or []}
        return p if conds.get("Ready") == "True" else None

    p = wait_for(ready, timeout=60)
    assert p.status.phase == "Running"
    assert ipaddress.ip_address(p.status.pod_ip) in ipaddress.ip_network(kubelet.subnet)
    assert p.status.host_ip == kubelet.node_ips["node-1"]
    assert p.status.container_statuses[0].ready
    assert httpx.get(f"http://{p.status.pod_ip}:8000/", timeout=5).status_code == 200
    with pytest.raises(httpx.ConnectError):  # bound to the pod IP only
        httpx.get("http://127.0.0.1:8000/", timeout=2)


def test_env_downward_api_secrets_and_expansion(
    kubelet: Kubelet, control_plane: Cluster, k8s_namespace: str
) -> None:
    core: Any = control_plane.core
    ns = k8s_namespace
    core.create_namespaced_secret(ns, {"metadata": {"name": "s"}, "stringData": {"token": "t0p"}})
    core.create_namespaced_config_map(ns, {"metadata": {"name": "c"}, "data": {"mode": "fast"}})
    field = lambda path: {"valueFrom": {"fieldRef": {"fieldPath": path}}}  # noqa: E731
    code = """
        import os, sys
        keys = ["POD_IP", "POD_NAME", "POD_NS", "NODE", "UID", "TOKEN", "MODE", "GREETING"]
        print(" ".join(f"{k}={os.environ.get(k)}" for k in keys))
        print("ARGS=" + "|".join(sys.argv[1:]), "CWD=" + os.getcwd())
    """
    env = [
        POD_IP,
        {"name": "POD_NAME", **field("metadata.name")},
        {"name": "POD_NS", **field("metadata.namespace")},
        {"name": "NODE", **field("spec.nodeName")},
        {"name": "UID", **field("metadata.uid")},
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "token"}}},
        {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "mode"}}},
        {"name": "GREETING", "value": "hi $(POD_NAME) on $(NODE)"},
    ]
    container = python("env", code, env=env, workingDir="/tmp",
                       args=["$(POD_IP)", "$$(POD_IP)", "$(UNDEFINED)"])  # fmt: skip
    core.create_namespaced_pod(ns, pod("env", container, restartPolicy="Never"))

    p = wait_for(lambda: phase_is(core, ns, "env", "Succeeded", "Failed"), timeout=60)
    assert p.status.phase == "Succeeded"
    out = kubelet.logs(ns, "env", "env")
    ip = p.status.pod_ip
    assert f"POD_IP={ip} POD_NAME=env POD_NS={ns} NODE=node-1 UID={p.metadata.uid}" in out
    assert "TOKEN=t0p MODE=fast GREETING=hi env on node-1" in out
    assert f"ARGS={ip}|$(POD_IP)|$(UNDEFINED) CWD=/tmp" in out
    assert control_plane.kubectl("logs", "-n", ns, "env").stdout == out  # via the node server


def test_deleting_the_pod_stops_the_process(
    kubelet: Kubelet, control_plane: Cluster, k8s_namespace: str
) -> None:
    core: Any = control_plane.core
    ns = k8s_namespace
    core.create_namespaced_pod(ns, pod("sleeper", python("main", "import time; time.sleep(600)")))
    p = wait_for(lambda: phase_is(core, ns, "sleeper", "Running"), timeout=60)
    pid = int(p.status.container_statuses[0].container_id.removeprefix("process://"))
    os.kill(pid, 0)  # alive

    core.delete_namespaced_pod("sleeper", ns)

    def gone() -> bool:
        return not core.list_namespaced_pod(ns, field_selector="metadata.name=sleeper").items

    assert wait_for(gone, timeout=30)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_failing_container_restarts_with_termination_message(
    kubelet: Kubelet, control_plane: Cluster, k8s_namespace: str
) -> None:
    core: Any = control_plane.core
    ns = k8s_namespace
    code = """
        import sys
        print("noise", flush=True)  # stdout to a file is block-buffered, as in a real pod
        print("sluice: ETL x: bad code", file=sys.stderr)
        sys.exit(2)
    """
    failing = python("main", code, terminationMessagePolicy="FallbackToLogsOnError")
    core.create_namespaced_pod(ns, pod("crash", failing))
    core.create_namespaced_pod(ns, pod("once", failing, restartPolicy="Never"))

    def restarted_twice() -> Any:
        st = read_pod(core, ns, "crash").status.container_statuses
        return st[0] if st and st[0].restart_count >= 2 else None

    status = wait_for(restarted_twice, timeout=60)
    assert status.last_state.terminated.exit_code == 2
    assert status.last_state.terminated.message.endswith("sluice: ETL x: bad code")

    p = wait_for(lambda: phase_is(core, ns, "once", "Failed"), timeout=60)
    term = p.status.container_statuses[0].state.terminated
    assert (term.exit_code, term.reason) == (2, "Error")
    assert term.message.splitlines()[-1] == "sluice: ETL x: bad code"
    assert p.status.container_statuses[0].restart_count == 0


def test_volumes_are_mounted_at_their_paths(
    kubelet: Kubelet, control_plane: Cluster, k8s_namespace: str
) -> None:
    core: Any = control_plane.core
    ns = k8s_namespace
    core.create_namespaced_secret(ns, {"metadata": {"name": "cred"}, "stringData": {"key": "k1"}})
    core.create_namespaced_persistent_volume_claim(ns, {
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    })  # fmt: skip
    volumes = [
        {"name": "scratch", "emptyDir": {}},
        {"name": "tmp", "emptyDir": {}},
        {"name": "cred", "secret": {"secretName": "cred"}},
        {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
    ]
    mounts = [
        {"name": "scratch", "mountPath": "/scratch"},
        {"name": "tmp", "mountPath": "/tmp"},  # hides the host's /tmp, not the other mounts
        {"name": "cred", "mountPath": "/etc/cred", "readOnly": True},
        {"name": "data", "mountPath": "/data"},
    ]
    init = python("init", "open('/scratch/from-init', 'w').write('init was here')",
                  volumeMounts=mounts)  # fmt: skip
    main = python("main", """
        import os
        print("scratch:", open("/scratch/from-init").read(), "tmp:", sorted(os.listdir("/tmp")))
        print("secret:", open("/etc/cred/key").read())
        try:
            open("/etc/cred/new", "w")
        except OSError as e:
            print("read-only:", e.errno)
        n = int(open("/data/count").read()) if os.path.exists("/data/count") else 0
        open("/data/count", "w").write(str(n + 1))
        print("count:", n + 1)
    """, volumeMounts=mounts)  # fmt: skip
    for name in ("vol-a", "vol-b"):  # the second pod sees the first pod's claim data
        body = pod(name, main, restartPolicy="Never", initContainers=[init], volumes=volumes)
        core.create_namespaced_pod(ns, body)
        p = wait_for(partial(phase_is, core, ns, name, "Succeeded", "Failed"), timeout=60)
        assert p.status.phase == "Succeeded", kubelet.logs(ns, name, "main")
    out = kubelet.logs(ns, "vol-b", "main")
    # The emptyDir hides the host's /tmp; only a checkout that lives under /tmp
    # is put back (the project is the pod's "image").
    image = sorted({Path(r).parts[2] for r in IMAGE_ROOTS if r.startswith("/tmp/")})
    assert f"scratch: init was here tmp: {image}" in out
    assert "secret: k1" in out
    assert "read-only: 30" in out  # EROFS
    assert "count: 2" in out
    assert not os.path.exists("/scratch/from-init")  # mounts are private to the pod


def test_service_account_token_reaches_the_apiserver(
    kubelet: Kubelet, control_plane: Cluster, k8s_namespace: str
) -> None:
    """In-cluster config works: KUBERNETES_SERVICE_* plus the projected token volume."""
    code = """
        from kubernetes import client, config
        config.load_incluster_config()
        review = client.AuthenticationV1Api().create_self_subject_review({})
        print("user:", review.status.user_info.username)
    """
    core: Any = control_plane.core
    ns = k8s_namespace
    core.create_namespaced_pod(ns, pod("incluster", python("main", code), restartPolicy="Never"))
    p = wait_for(lambda: phase_is(core, ns, "incluster", "Succeeded", "Failed"), timeout=60)
    out = kubelet.logs(ns, "incluster", "main")
    assert p.status.phase == "Succeeded", out
    assert f"user: system:serviceaccount:{ns}:default" in out


def test_failing_liveness_probe_restarts_the_container(
    kubelet: Kubelet, control_plane: Cluster, k8s_namespace: str
) -> None:
    core: Any = control_plane.core
    ns = k8s_namespace
    probe = {"tcpSocket": {"port": 9}, "periodSeconds": 1, "failureThreshold": 2}
    sleeper = python("main", "import time; time.sleep(600)", livenessProbe=probe)
    core.create_namespaced_pod(ns, pod("unhealthy", sleeper))

    def restarted() -> Any:
        st = read_pod(core, ns, "unhealthy").status.container_statuses
        return st[0] if st and st[0].restart_count >= 1 else None

    status = wait_for(restarted, timeout=60)
    assert status.last_state.terminated.exit_code == 128 + 15  # SIGTERM from the kubelet


def test_native_sidecar_runs_beside_the_main_container(
    kubelet: Kubelet, control_plane: Cluster, k8s_namespace: str
) -> None:
    """An init container with ``restartPolicy: Always`` starts first and keeps running."""
    core: Any = control_plane.core
    ns = k8s_namespace
    sidecar = python("proxy", "import time; time.sleep(600)", restartPolicy="Always")
    main = python("main", "print('main ran')")
    core.create_namespaced_pod(
        ns, pod("sidecar", main, restartPolicy="Never", initContainers=[sidecar])
    )
    p = wait_for(lambda: phase_is(core, ns, "sidecar", "Succeeded", "Failed"), timeout=60)
    assert p.status.phase == "Succeeded"
    assert kubelet.logs(ns, "sidecar", "main") == "main ran\n"

    def sidecar_stopped() -> bool:
        st = read_pod(core, ns, "sidecar").status.init_container_statuses[0]
        return st.state.terminated is not None

    assert wait_for(sidecar_stopped, timeout=30)
    assert read_pod(core, ns, "sidecar").status.phase == "Succeeded"
