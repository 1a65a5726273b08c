"""pytest fixtures for the real-node harness (``tests/k8s/realnode.py``).

Import them into a package's ``conftest.py``::

    from tests.k8s.realfixtures import real_cluster, real_namespace  # noqa: F401

``real_cluster`` (session) -> :class:`RealNodes`
    Its own control plane (apiserver on the harness bridge ``10.240.K.1``) and
    three real nodes ``node-0..2`` (kubelet + containerd + runc + CNI +
    kube-proxy, each in its own network namespace), started once per test
    process and torn down at exit.  ``.kubectl(*args)``, ``.core``,
    ``.api_client``, ``.env()``, ``.kubeconfig`` as for ``control_plane``,
    plus ``.real`` (the :class:`RealCluster`: ``.slot`` names the addresses,
    ``.node_list[i].ctr(...)`` talks to a node's containerd).
``real_namespace`` (function) -> str
    A fresh namespace in that cluster, deleted afterwards.

They never skip: missing binaries or packages fail with "run ``make
k8s-tools``" (which builds and installs them).  State lives in
``~/.cache/sluice/k8s-realnode/run-*``, removed at exit unless
``SLUICE_K8S_KEEP=1``.  Docs: docs/testing-kubernetes.md.
"""

from __future__ import annotations

import atexit
import os
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client, config

from tests.k8s import nodenet
from tests.k8s.controlplane import ControlPlaneError
from tests.k8s.fixtures import Cluster
from tests.k8s.realnode import RealCluster

RUNS = Path.home() / ".cache/sluice/k8s-realnode"


@dataclass
class RealNodes(Cluster):
    """The real-node cluster as handed to tests."""

    real: RealCluster | None = None


_nodes: RealNodes | None = None


def _shutdown() -> None:
    global _nodes
    if _nodes is not None and _nodes.real is not None:
        _nodes.real.stop()
        if not os.environ.get("SLUICE_K8S_KEEP"):
            nodenet.remove_tree(_nodes.real.state_dir)
    _nodes = None


def _remove_stale_runs() -> None:
    """Old run dirs whose slot is no longer theirs (their slot was cleaned when reused)."""
    if os.environ.get("SLUICE_K8S_KEEP"):
        return
    live = set()
    for f in nodenet.LOCK_DIR.glob("slot-*.state"):
        live.add(f.read_text().strip())
    for run in RUNS.glob("run-*"):
        if str(run.resolve()) not in live and time.time() - run.stat().st_mtime > 600:
            nodenet.remove_tree(run)


@pytest.fixture(scope="session")
def real_cluster() -> RealNodes:
    """Control plane + three real kubelet nodes (see the module docstring)."""
    global _nodes
    if _nodes is None:
        RUNS.mkdir(parents=True, exist_ok=True)
        _remove_stale_runs()
        state = Path(tempfile.mkdtemp(prefix="run-", dir=RUNS))
        real = RealCluster(state, nodes=3)
        try:
            real.start()
        except ControlPlaneError as e:
            nodenet.remove_tree(state)
            pytest.fail(str(e), pytrace=False)
        atexit.register(_shutdown)
        cfg = client.Configuration()
        config.load_kube_config(config_file=str(real.kubeconfig), client_configuration=cfg)
        _nodes = RealNodes(real.plane, client.ApiClient(cfg), real=real)
    return _nodes


@pytest.fixture
def real_namespace(real_cluster: RealNodes) -> Iterator[str]:
    """A fresh namespace (with its default ServiceAccount) in the real-node cluster."""
    name = f"r-{uuid.uuid4().hex[:8]}"
    core = real_cluster.core
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not core.list_namespaced_service_account(name).items:
        time.sleep(0.2)
    yield name
    core.delete_namespace(name)
