"""A long-running dev cluster: ``python -m tests.k8s.cluster up|down|status``.

``up`` starts a background supervisor process that runs the control plane
(etcd, apiserver, controller-manager, scheduler) and three **real nodes**
(``tests/k8s/realnode.py``: kubelet, containerd, runc, CNI, kube-proxy, each
node in its own network namespace), applies the CRDs in ``crds/``, and, when
the project has them, starts the operator (``python -m etl_operator``, as a
local process with the admin kubeconfig) and three target pods
(``sluice.dev/role=target``, one per node) from ``localhost/sluice/server:dev``
when ``make images`` has built it.  ``up --process-kubelet`` runs the process
kubelet (``tests/k8s/kubelet.py``) instead of real nodes: no containers, the
target pods run as local processes.  It prints ``export KUBECONFIG=...`` once
everything answers and returns.  ``down`` stops what ``up`` started.  State
lives in ``~/.cache/sluice/k8s-dev/`` (override with ``SLUICE_K8S_DEV``); logs
in ``logs/`` there and ``node-*/`` (real nodes) or ``kubelet/pods/``.
"""

from __future__ import annotations

import argparse
import base64
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tests.k8s import nodenet
from tests.k8s.api import Api, ApiError
from tests.k8s.controlplane import (
    BIN_DIR,
    BINARIES,
    DIE_WITH_PARENT,
    ControlPlane,
    ControlPlaneError,
    binary,
    stop_process,
)
from tests.k8s.kubelet import Kubelet
from tests.k8s.realnode import RealCluster, sluice_image

ROOT = Path(__file__).resolve().parents[2]
STATE = Path(os.environ.get("SLUICE_K8S_DEV", Path.home() / ".cache/sluice/k8s-dev"))
NAMESPACE = "default"
TARGET_ROLE: dict[str, Any] = {
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "Role",
    "metadata": {"name": "sluice-target"},
    "rules": [
        {"apiGroups": ["sluice.dev"], "resources": ["etls"], "verbs": ["get", "list", "watch"]}
    ],
}
TARGET_BINDING: dict[str, Any] = {
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "RoleBinding",
    "metadata": {"name": "sluice-target"},
    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "sluice-target"},
    "subjects": [{"kind": "ServiceAccount", "name": "sluice-target", "namespace": NAMESPACE}],
}


def target_pod(index: int, node: str, image: str = "sluice:dev") -> dict[str, Any]:
    """A storage target pod pinned to ``node`` (see docs/architecture.md)."""
    field = lambda path: {"valueFrom": {"fieldRef": {"fieldPath": path}}}  # noqa: E731
    key = {"secretKeyRef": {"name": "sluice-cluster", "key": "cluster-key"}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"target-{index}", "labels": {"sluice.dev/role": "target"}},
        "spec": {
            "nodeName": node,
            "serviceAccountName": "sluice-target",
            "containers": [{
                "name": "target",
                "image": image,
                "imagePullPolicy": "IfNotPresent",
                "command": ["sluice-target"],
                "args": ["--host", "$(POD_IP)", "--port", "8080", "--id", "$(POD_NAME)",
                         "--registry", "kubernetes", "--data-dir", "/data"],
                "env": [{"name": "POD_IP", **field("status.podIP")},
                        {"name": "POD_NAME", **field("metadata.name")},
                        {"name": "POD_NAMESPACE", **field("metadata.namespace")},
                        {"name": "SLUICE_CLUSTER_KEY", "valueFrom": key}],
                "ports": [{"name": "http", "containerPort": 8080}],
                "readinessProbe": {"httpGet": {"path": "/v1/health", "port": 8080},
                                   "periodSeconds": 2},
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                "terminationMessagePolicy": "FallbackToLogsOnError",
            }],
            "volumes": [{"name": "data", "emptyDir": {}}],
        },
    }  # fmt: skip


def ensure(api: Api, path: str, obj: dict[str, Any]) -> None:
    """Create ``obj`` under ``path`` unless it exists."""
    try:
        api.post(path, obj)
    except ApiError as e:
        if e.status != 409:
            raise


def deploy_sluice(
    plane: ControlPlane,
    api: Api,
    log: Path,
    image: str | None = "sluice:dev",
    runtime: str | None = None,
) -> subprocess.Popen[bytes] | None:
    """CRDs, then (if present) the operator process and three target pods.

    ``image`` is the target pods' image; None (real nodes without the built
    server image) starts no target pods.  ``runtime`` is the transformer image
    the operator gives ETL pods (``make images``'s, imported into the nodes), as
    the chart passes ``images.runtime``; None leaves the operator's default.
    """
    crds = sorted(ROOT.glob("crds/*.yaml"))
    if crds:
        kubectl = [str(BIN_DIR / "kubectl"), f"--kubeconfig={plane.kubeconfig}"]
        subprocess.run([*kubectl, "apply", *(f"-f={c}" for c in crds)], check=True)
        subprocess.run([*kubectl, "wait", "--for=condition=Established", "crd", "--all",
                        "--timeout=60s"], check=True, capture_output=True)  # fmt: skip
    key = (STATE / "cluster-key").read_text().strip()
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "sluice-cluster"},
              "data": {"cluster-key": base64.b64encode(key.encode()).decode()}}  # fmt: skip
    ns = f"/api/v1/namespaces/{NAMESPACE}"
    ensure(api, f"{ns}/secrets", secret)
    operator = None
    if (ROOT / "operator/etl_operator/__main__.py").exists() and crds:
        env = {**os.environ, "KUBECONFIG": str(plane.kubeconfig), "SLUICE_CLUSTER_KEY": key}
        if runtime is not None:
            env["SLUICE_TRANSFORMER_IMAGE"] = runtime
        with open(log, "ab") as out:
            operator = subprocess.Popen(
                [*DIE_WITH_PARENT, sys.executable, "-m", "etl_operator"],
                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
    if image is None:
        print("no target pods: run `make images` for localhost/sluice/server:dev", flush=True)
    elif (ROOT / "etl_runtime/storage_target/__main__.py").exists():
        ensure(api, f"{ns}/serviceaccounts", {"metadata": {"name": "sluice-target"}})
        rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NAMESPACE}"
        ensure(api, f"{rbac}/roles", TARGET_ROLE)
        ensure(api, f"{rbac}/rolebindings", TARGET_BINDING)
        for i in range(3):
            ensure(api, f"{ns}/pods", target_pod(i, f"node-{i}", image))
    return operator


def supervise(process_kubelet: bool = False) -> None:
    """Run the dev cluster until SIGTERM/SIGINT (the ``up`` background process)."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    t0 = time.monotonic()
    kubelet = operator = real = None
    image: str | None = "sluice:dev"
    runtime: str | None = None
    try:
        if process_kubelet:
            plane = ControlPlane(STATE, controllers=True, scheduler=True)
            plane.start()
            print(f"control plane ready in {time.monotonic() - t0:.1f}s", flush=True)
            kubelet = Kubelet(plane.kubeconfig, STATE / "kubelet", nodes=3)
            kubelet.start()
        else:
            server, built_runtime = sluice_image("server"), sluice_image("runtime")
            image = server[0] if server else None
            if built_runtime is None:
                print("ETLs will not start: run `make images` for localhost/sluice/runtime:dev")
            else:
                runtime = built_runtime[0]
            extra = [b[1] for b in (server, built_runtime) if b is not None]
            real = RealCluster(STATE, nodes=3, extra_images=extra)
            real.start()
            plane = real.plane
            print(f"control plane and 3 real nodes ready in {time.monotonic() - t0:.1f}s")
        api = Api(plane.kubeconfig)
        operator = deploy_sluice(plane, api, STATE / "logs" / "operator.log", image, runtime)
        (STATE / "ready").write_text(f"{time.monotonic() - t0:.1f}\n")
        print(f"cluster up in {time.monotonic() - t0:.1f}s", flush=True)
        stop.wait()
    finally:
        if operator is not None:
            stop_process(operator, grace=10)
        if kubelet is not None:
            kubelet.stop()
            plane.stop()
        if real is not None:
            real.stop()
        (STATE / "supervisor.pid").unlink(missing_ok=True)
        print("cluster stopped", flush=True)


def running_pid() -> int | None:
    try:
        pid = int((STATE / "supervisor.pid").read_text())
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError):
        return None


def up(timeout: float = 300.0, process_kubelet: bool = False) -> int:
    kubeconfig = STATE / "kubeconfig"
    for name in BINARIES:
        binary(name)  # fail fast with "run make k8s-tools"
    if running_pid() is not None:
        print(f"already running\nexport KUBECONFIG={kubeconfig}")
        return 0
    for name in ("etcd", "kubelet", "logs", "ready", "kubeconfig", *nodenet_dirs()):
        path = STATE / name
        nodenet.remove_tree(path) if path.is_dir() else path.unlink(missing_ok=True)
    (STATE / "logs").mkdir(parents=True)
    key = STATE / "cluster-key"
    if not key.exists():
        key.write_text(secrets.token_hex(32) + "\n")
        key.chmod(0o600)
    with open(STATE / "logs" / "supervisor.log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.k8s.cluster", "supervise",
             *(["--process-kubelet"] if process_kubelet else [])],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    (STATE / "supervisor.pid").write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + timeout
    while not (STATE / "ready").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = (STATE / "logs" / "supervisor.log").read_text(errors="replace")[-3000:]
            print(f"cluster did not come up:\n{tail}", file=sys.stderr)
            down()
            return 1
        time.sleep(0.3)
    print(f"# Kubernetes dev cluster up in {(STATE / 'ready').read_text().strip()}s; state {STATE}")
    print(f"export KUBECONFIG={kubeconfig}")
    return 0


def nodenet_dirs() -> list[str]:
    """The real nodes' state dirs of an earlier ``up`` (its reaper unmounted them)."""
    return [p.name for p in STATE.glob("node-*")]


def down() -> int:
    pid = running_pid()
    if pid is None:
        print("not running")
        return 0
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 90
    while running_pid() is not None and time.monotonic() < deadline:
        time.sleep(0.3)
    if running_pid() is not None:
        os.killpg(pid, signal.SIGKILL)
    (STATE / "supervisor.pid").unlink(missing_ok=True)
    for node in nodenet_dirs():  # the nodes' image stores (GBs); logs stay until the next up
        nodenet.remove_tree(STATE / node / "containerd")
    print("stopped")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.k8s.cluster", description=__doc__)
    parser.add_argument("command", choices=["up", "down", "status", "supervise"])
    parser.add_argument(
        "--process-kubelet", action="store_true", help="process kubelet instead of real nodes"
    )
    args = parser.parse_args(argv)
    STATE.mkdir(parents=True, exist_ok=True)
    try:
        if args.command == "up":
            return up(process_kubelet=args.process_kubelet)
        if args.command == "down":
            return down()
        if args.command == "status":
            pid = running_pid()
            print(f"running (pid {pid}), KUBECONFIG={STATE / 'kubeconfig'}" if pid else "stopped")
            return 0
        supervise(args.process_kubelet)
        return 0
    except ControlPlaneError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
