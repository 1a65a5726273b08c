"""``etl_runtime.cluster.kube`` against the real apiserver: what the gateway and targets rely on.

No operator runs here: the backend writes CRs, the registry and discovery
watch them (and target pods), exactly as the gateway and targets do.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest

from etl_runtime.cluster.kube import KubeEtlBackend, KubeEtlRegistry, KubeTargetDiscovery
from etl_runtime.core.spec import EtlSpec, InvalidSpec
from tests.operator.harness import CRD, SluiceNamespace, wait_for

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(300)]

SPEC = EtlSpec.from_dict({"code": {"source": "def transform(d):\n    return d\n"}})


@pytest.fixture(scope="module")
def ns(control_plane, kubelet) -> Iterator[SluiceNamespace]:  # noqa: F811
    control_plane.kubectl("apply", "-f", str(CRD))
    control_plane.kubectl("wait", "--for=condition=Established", "crd/etls.sluice.dev")
    name = f"glue-{uuid.uuid4().hex[:6]}"
    control_plane.core.create_namespace({"metadata": {"name": name}})
    env = SluiceNamespace(control_plane.api_client, control_plane.kubectl, name).setup()
    try:
        yield env
    finally:
        control_plane.core.delete_namespace(name)


def test_backend_lifecycle_and_registry_follow(ns):
    backend = KubeEtlBackend(ns.ns)
    registry = KubeEtlRegistry(ns.ns)
    try:
        assert registry.wait_synced(30)
        rec = asyncio.run(backend.init("echo", SPEC))
        assert rec.name == "echo" and rec.uid and rec.phase == "Initializing"
        seen = wait_for("registry sees echo", lambda: registry.get("echo"), timeout=30)
        assert seen.uid == rec.uid and seen.spec == SPEC

        # init again with a new spec replaces it in place (same uid)
        new = EtlSpec.from_dict({"code": {"source": "def transform(d):\n    return d * 2\n"}})
        again = asyncio.run(backend.init("echo", new))
        assert again.uid == rec.uid and again.spec == new
        wait_for("registry sees new spec", lambda: registry.get("echo").spec == new, timeout=30)

        stopped = asyncio.run(backend.set_stopped("echo", True))
        assert stopped.phase == "Stopped" and stopped.spec.stopped
        wait_for("registry sees stop", lambda: registry.get("echo").phase == "Stopped", timeout=30)

        assert [r.name for r in asyncio.run(backend.list())] == ["echo"]
        assert asyncio.run(backend.get("nope")) is None
        with pytest.raises(KeyError):
            asyncio.run(backend.set_stopped("nope", True))
        asyncio.run(backend.delete("echo"))
        with pytest.raises(KeyError):
            asyncio.run(backend.delete("nope"))
        wait_for("registry forgets echo", lambda: registry.get("echo") is None, timeout=30)
    finally:
        registry.close()


def test_backend_rejects_a_bad_name(ns):
    with pytest.raises(InvalidSpec):
        asyncio.run(KubeEtlBackend(ns.ns).init("Not_Valid", SPEC))


def test_discovery_lists_ready_targets_with_their_http_port(ns):
    discovery = KubeTargetDiscovery(ns.ns)
    try:
        assert discovery.wait_synced(30)
        ns.add_target("target-a", "node-1")
        (target,) = wait_for("target-a ready", lambda: discovery.targets(), timeout=90)
        assert target.id == "target-a" and target.node == "node-1"
        assert target.url.startswith("http://127.") and target.url.endswith(":8080")
        ns.delete_pod("target-a")
        wait_for("target-a gone", lambda: discovery.targets() == [], timeout=60)
    finally:
        discovery.close()
