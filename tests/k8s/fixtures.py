"""pytest fixtures: a real Kubernetes control plane and the process kubelet.

Use them from any test package.  Preferred, once for the whole suite, in the
top-level ``tests/conftest.py``::

    pytest_plugins = ["tests.k8s.fixtures"]

or import the fixtures you need into a package's ``conftest.py``::

    from tests.k8s.fixtures import control_plane, k8s_namespace, kubelet  # noqa: F401

Fixtures (the cluster is started once per test process, even if several
conftests import these, and stopped at exit):

``control_plane`` (session) -> :class:`Cluster`
    etcd + kube-apiserver + kube-controller-manager + kube-scheduler.
    ``.kubeconfig`` (admin kubeconfig path, also exported as ``$KUBECONFIG``
    so ``kubernetes.config.load_kube_config()``, kopf and kubectl subprocesses
    find it), ``.api_client`` (``kubernetes.client.ApiClient``), ``.core``
    (``CoreV1Api``), ``.kubectl(*args)`` and ``.env()`` (os.environ plus
    KUBECONFIG and the tools dir on PATH, for subprocesses).
``kubelet`` (session) -> :class:`tests.k8s.kubelet.Kubelet`
    Nodes ``node-0``, ``node-1``, ``node-2`` whose pods run as local
    processes on 127.1.K.x (a /24 per kubelet).  Pods need ``command`` (images are ignored).
``k8s_namespace`` (function) -> str
    A fresh namespace (with its ``default`` ServiceAccount), deleted after
    the test.

The fixtures never skip: if the binaries are missing they fail and say to
run ``make k8s-tools``.  Docs: docs/testing-kubernetes.md.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest
from kubernetes import client, config

from tests.k8s.controlplane import BIN_DIR, ControlPlane, ControlPlaneError
from tests.k8s.kubelet import Kubelet


@dataclass
class Cluster:
    """A running control plane, as handed to tests."""

    plane: ControlPlane
    api_client: client.ApiClient
    kubelet: Kubelet | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def kubeconfig(self) -> Path:
        return self.plane.kubeconfig

    @property
    def state_dir(self) -> Path:
        return self.plane.state_dir

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api_client)

    def env(self) -> dict[str, str]:
        """Environment for subprocesses that talk to this cluster."""
        path = f"{BIN_DIR}{os.pathsep}{os.environ.get('PATH', '')}"
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig), "PATH": path}

    def kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run kubectl against the cluster; output captured as text."""
        cmd = [str(BIN_DIR / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed:\n{done.stderr}")
        return done


_cluster: Cluster | None = None


def _shutdown() -> None:
    global _cluster
    if _cluster is not None:
        if _cluster.kubelet is not None:
            _cluster.kubelet.stop()
        _cluster.plane.stop()
        if not os.environ.get("SLUICE_K8S_KEEP"):  # keep logs for a post-mortem
            shutil.rmtree(_cluster.state_dir, ignore_errors=True)
        _cluster = None


def start_cluster(state_dir: Path) -> Cluster:
    """Start the shared control plane (once per process)."""
    global _cluster
    if _cluster is None:
        plane = ControlPlane(state_dir, controllers=True, scheduler=True)
        try:
            plane.start()
        except ControlPlaneError as e:
            pytest.fail(str(e), pytrace=False)
        atexit.register(_shutdown)
        os.environ["KUBECONFIG"] = str(plane.kubeconfig)
        cfg = client.Configuration()
        config.load_kube_config(config_file=str(plane.kubeconfig), client_configuration=cfg)
        _cluster = Cluster(plane, client.ApiClient(cfg))
    return _cluster


@pytest.fixture(scope="session")
def control_plane() -> Cluster:
    """etcd + apiserver + controller-manager + scheduler on loopback."""
    global _run_lock
    if _cluster is not None:  # fixtures imported by several conftests: one cluster
        return _cluster
    # Not under /tmp: pods often mount an emptyDir at /tmp, which would hide
    # the sources of their other mounts.
    runs = Path.home() / ".cache/sluice/k8s-test"
    runs.mkdir(parents=True, exist_ok=True)
    _remove_stale_runs(runs)
    state = Path(tempfile.mkdtemp(prefix="run-", dir=runs))
    _run_lock = open(state / "in-use.lock", "wb")  # noqa: SIM115 - held until exit
    fcntl.flock(_run_lock, fcntl.LOCK_EX)
    return start_cluster(state)


_run_lock: IO[bytes] | None = None  # marks our state dir as in use (see _remove_stale_runs)


def _remove_stale_runs(runs: Path) -> None:
    """Delete state left by killed test runs (their lock is free), unless kept."""
    if os.environ.get("SLUICE_K8S_KEEP"):
        return
    for run in runs.glob("run-*"):
        try:
            with open(run / "in-use.lock", "rb") as f:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # another test session is using it
        except OSError:  # no lock file: a run being made right now, or an old one
            if time.time() - run.stat().st_mtime < 600:
                continue
        shutil.rmtree(run, ignore_errors=True)


@pytest.fixture(scope="session")
def kubelet(control_plane: Cluster) -> Kubelet:
    """The process kubelet with three Ready nodes (node-0..node-2)."""
    if control_plane.kubelet is None:
        kl = Kubelet(control_plane.kubeconfig, control_plane.state_dir / "kubelet", nodes=3)
        kl.start()
        control_plane.kubelet = kl
    return control_plane.kubelet


@pytest.fixture
def k8s_namespace(control_plane: Cluster) -> Iterator[str]:
    """A fresh namespace with its default ServiceAccount; deleted afterwards."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    core = control_plane.core
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the controller-manager creates it
        if core.list_namespaced_service_account(name).items:
            break
        time.sleep(0.2)
    yield name
    core.delete_namespace(name)
