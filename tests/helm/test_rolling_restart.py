"""Issue 8 on Kubernetes: a rolling restart of the target StatefulSet loses nothing.

The chart runs on the project's control plane (see test_fullstack.py); the
cluster map lives in its ConfigMap and its members are the StatefulSet's
ordinals. While writers and readers run against the gateway, a pod-template
change rolls the targets one at a time (each pod: SIGTERM, gone, recreated
with a new IP). With ``copies=2`` every read is served by the other copy
meanwhile and a write either is acknowledged by both copies or answers 503.
Afterwards every acknowledged write reads back with its md5, and no read
ever answered 404.
"""

from __future__ import annotations

import hashlib
import json
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from etl_runtime.sdk.errors import NotFound, SluiceError
from tests.helm.chart import CHART
from tests.helm.test_fullstack import (  # noqa: F401  (volumes: a fixture)
    RELEASE,
    STORAGE_CLASS,
    TARGETS,
    Release,
    volumes,
    wait_for,
)
from tests.k8s.fixtures import Cluster

pytestmark = pytest.mark.k8s

TOKEN = "rolling-token"
STS = f"{RELEASE}-sluice-target"


def cluster_view(endpoint: str) -> dict[str, Any]:
    import httpx

    return dict(httpx.get(f"{endpoint}/v1/cluster", timeout=5).json())


def rolled(apps: client.AppsV1Api, ns: str, generation: int) -> bool:
    s = apps.read_namespaced_stateful_set(STS, ns).status
    return bool(
        s.observed_generation is not None
        and s.observed_generation >= generation
        and s.update_revision == s.current_revision
        and (s.updated_replicas or 0) == TARGETS
        and (s.ready_replicas or 0) == TARGETS
    )


@pytest.mark.usefixtures("volumes", "kubelet")
def test_rolling_restart_of_the_targets_loses_no_write_and_never_404s(
    control_plane: Cluster, k8s_namespace: str, tmp_path: Path
) -> None:
    from etl_runtime import Client

    ns = k8s_namespace
    rel = Release(control_plane, ns, tmp_path / "helm")
    rel.helm("install", RELEASE, str(CHART),
             "--set", f"target.replicas={TARGETS}", "--set", "target.storage.size=1Gi",
             "--set", f"target.storage.storageClassName={STORAGE_CLASS}",
             "--set", "target.terminationGracePeriodSeconds=10",
             "--set", "gateway.replicas=1", "--set", f"auth.token={TOKEN}")  # fmt: skip
    apps = client.AppsV1Api(control_plane.api_client)
    try:
        ips = wait_for(
            "the gateway to serve the StatefulSet's targets as members",
            lambda: [
                ip
                for ip in rel.ready_ips("app.kubernetes.io/component=gateway")
                if cluster_view(f"http://{ip}:8080").get("members")
                == [f"{STS}-{i}" for i in range(TARGETS)]
                and not cluster_view(f"http://{ip}:8080")["away"]
            ],
            timeout=240,
        )
        endpoint = f"http://{ips[0]}:8080"
        before = cluster_view(endpoint)

        acked: dict[str, str] = {}  # name -> md5 of its last acknowledged version
        lock = threading.Lock()
        stop = threading.Event()
        counts = {"puts": 0, "put_refused": 0, "gets": 0, "get_failed": 0, "404": 0}
        problems: list[str] = []

        with Client(endpoint, token=TOKEN, timeout=30, retries=2) as sdk:
            bucket = sdk.bucket("data").create(copies=2)
            for i in range(20):
                data = random.randbytes(2000 + i)
                bucket.object(f"o{i:03d}").put_content(data)
                acked[f"o{i:03d}"] = hashlib.md5(data).hexdigest()

            def writer(names: list[str]) -> None:
                while not stop.is_set():
                    name = random.choice(names)
                    data = random.randbytes(random.randint(100, 50_000))
                    try:
                        bucket.object(name).put_content(data)
                    except SluiceError:
                        with lock:
                            counts["put_refused"] += 1  # 503 while a copy is away: not acked
                        time.sleep(0.2)
                        continue
                    with lock:
                        counts["puts"] += 1
                        acked[name] = hashlib.md5(data).hexdigest()

            def reader() -> None:
                while not stop.is_set():
                    with lock:
                        name = random.choice(sorted(acked))
                    try:
                        bucket.object(name).get_bytes()
                    except NotFound as e:
                        with lock:
                            counts["404"] += 1
                            problems.append(f"404 for {name}: {e}")
                    except SluiceError:
                        with lock:
                            counts["get_failed"] += 1
                        time.sleep(0.2)
                    else:
                        with lock:
                            counts["gets"] += 1

            names = [f"o{i:03d}" for i in range(40)]
            threads = [
                threading.Thread(target=writer, args=(names[:20],)),
                threading.Thread(target=writer, args=(names[20:],)),
                threading.Thread(target=reader),
                threading.Thread(target=reader),
            ]
            for t in threads:
                t.start()
            try:
                time.sleep(2)
                # What `kubectl rollout restart statefulset` does.
                stamp = {"kubectl.kubernetes.io/restartedAt": str(time.time())}
                patched = apps.patch_namespaced_stateful_set(
                    STS, ns, {"spec": {"template": {"metadata": {"annotations": stamp}}}}
                )
                generation = patched.metadata.generation
                wait_for("the rolling restart to finish",
                         lambda: rolled(apps, ns, generation), timeout=180)  # fmt: skip
                wait_for("every member back", lambda: not cluster_view(endpoint)["away"], 60)
                time.sleep(2)
            finally:
                stop.set()
                for t in threads:
                    t.join(60)

            print("rolling restart:", counts)
            assert counts["404"] == 0, problems[:10]
            assert counts["puts"] > 0 and counts["gets"] > 0, counts
            lost = []
            for name, md5 in sorted(acked.items()):
                got = hashlib.md5(bucket.object(name).get_bytes()).hexdigest()
                if got != md5:
                    lost.append(name)
            assert lost == [], f"acknowledged writes lost or hidden: {lost}"

        # Membership did not move (no rebalance), but every address did.
        after = cluster_view(endpoint)
        assert after["members"] == before["members"]
        cm = control_plane.core.read_namespaced_config_map(f"{RELEASE}-sluice-cluster-map", ns)
        stored = json.loads(cm.data["cluster-map.json"])
        assert stored["members"] == before["members"]
        assert stored["buckets"]["data"]["copies"] == 2
        pods = {p.metadata.name: p.status.pod_ip for p in rel.pods("sluice.dev/role=target")}
        assert {m: u.split("//")[1].split(":")[0] for m, u in stored["urls"].items()} == pods
    except BaseException:
        print(rel.diagnostics())
        raise
    finally:
        rel.helm("uninstall", RELEASE, "--wait", "--timeout", "120s")
        for c in control_plane.core.list_namespaced_persistent_volume_claim(ns).items:
            control_plane.core.delete_namespaced_persistent_volume_claim(c.metadata.name, ns)
