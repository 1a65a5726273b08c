"""``helm install`` the chart on a real control plane and run the WebDataset workflow.

The control plane is real (etcd, kube-apiserver, controller-manager,
scheduler: ``tests/k8s``); the process kubelet runs every pod the chart's
StatefulSet and Deployments produce as local processes on 127.0.1.x, using
the container commands from the chart (images are ignored). So this checks
what the chart wires together: RBAC that lets each component do its job,
the cluster-key Secret, downward-API env, probes, PVCs, the operator turning
an ETL into transformer pods beside each target, and the gateway in front.

There is no volume provisioner in the test cluster: the test creates one
hostPath PersistentVolume per target and the claim the StatefulSet will use,
bound to each other before the chart is installed (a StatefulSet adopts a
claim of the right name). Claims created by the StatefulSet and bound after
its pod once left that pod Pending for 4 minutes in CI (the scheduler never
retried it: kubernetes/kubernetes#125762 is that symptom), so the claims are
Bound before any pod exists.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import webdataset as wds
from kubernetes import client
from PIL import Image

from tests.helm.chart import CHART, helm
from tests.k8s.fixtures import Cluster

pytestmark = pytest.mark.k8s

RELEASE = "sl"
TARGETS = 2
SHARDS = 4
SAMPLES_PER_SHARD = 6
TOKEN = "full-stack-token"
STORAGE_CLASS = "sluice-fullstack"


def wait_for(what: str, check: Callable[[], Any], timeout: float = 180.0) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except Exception as e:  # the condition is "no error yet"
            last = e
        else:
            if last:
                return last
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def make_shard(index: int) -> bytes:
    """A WebDataset shard of small PNGs with class labels, written by webdataset itself."""
    buf = io.BytesIO()
    with wds.TarWriter(buf) as sink:
        for j in range(SAMPLES_PER_SHARD):
            image = Image.new("RGB", (16, 8), color=(index * 40, j * 30, 200))
            sink.write({"__key__": f"s{index:03d}-{j:02d}", "png": image, "cls": j})
    return buf.getvalue()


class Release:
    """The installed chart, with helm pointed at the test cluster."""

    def __init__(self, cluster: Cluster, namespace: str, home: Path) -> None:
        self.cluster, self.namespace = cluster, namespace
        self.env = {
            "KUBECONFIG": str(cluster.kubeconfig),
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        }

    def helm(self, *args: str) -> str:
        return helm(*args, "--namespace", self.namespace, env=self.env).stdout

    def pods(self, selector: str) -> list[client.V1Pod]:
        return self.cluster.core.list_namespaced_pod(self.namespace, label_selector=selector).items

    def ready_ips(self, selector: str) -> list[str]:
        out = []
        for pod in self.pods(selector):
            conditions = {c.type: c.status for c in (pod.status.conditions or [])}
            if conditions.get("Ready") == "True" and pod.status.pod_ip:
                out.append(pod.status.pod_ip)
        return out

    def etls(self) -> list[dict[str, Any]]:
        custom = client.CustomObjectsApi(self.cluster.api_client)
        found = custom.list_namespaced_custom_object(
            "sluice.dev", "v1alpha1", self.namespace, "etls"
        )
        return list(found["items"])

    def cluster_key(self) -> str:
        secret = self.cluster.core.read_namespaced_secret(
            f"{RELEASE}-sluice-cluster-key", self.namespace
        )
        return secret.data["cluster-key"]

    def diagnostics(self) -> str:
        """Pod phases and the tail of every container log of the namespace."""
        lines = [self.cluster.kubectl("get", "pods,pvc,etl", "-n", self.namespace, "-o", "wide",
                                      check=False).stdout]  # fmt: skip
        events = self.cluster.kubectl("get", "events", "-n", self.namespace,
                                      "--sort-by=.lastTimestamp", check=False).stdout  # fmt: skip
        lines.append("--- events\n" + "\n".join(events.splitlines()[-40:]))
        kubelet = self.cluster.kubelet
        if kubelet is not None:
            for log in sorted((kubelet.state_dir / "pods").glob(f"{self.namespace}_*/logs/*.log")):
                noise = "GET /healthz"  # kopf's liveness endpoint, probed every second
                kept = [
                    ln for ln in log.read_text(errors="replace").splitlines() if noise not in ln
                ]
                text = "\n".join(kept)[-4000:]
                lines.append(f"--- {log.parent.parent.name}/{log.name}\n{text}")
        return "\n".join(lines)


@pytest.fixture
def volumes(control_plane: Cluster, k8s_namespace: str, tmp_path: Path) -> Iterator[None]:
    """hostPath PVs pre-bound to the claims ``data-<release>-sluice-target-N``."""
    core = control_plane.core
    names = [f"{k8s_namespace}-target-{i}" for i in range(TARGETS)]
    for i, name in enumerate(names):
        path = tmp_path / "pv" / str(i)
        path.mkdir(parents=True)
        core.create_persistent_volume(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": name},
                "spec": {
                    "capacity": {"storage": "1Gi"},
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": STORAGE_CLASS,
                    "persistentVolumeReclaimPolicy": "Retain",
                    "hostPath": {"path": str(path), "type": "DirectoryOrCreate"},
                    "claimRef": {
                        "namespace": k8s_namespace,
                        "name": f"data-{RELEASE}-sluice-target-{i}",
                    },
                },
            }
        )
        core.create_namespaced_persistent_volume_claim(
            k8s_namespace,
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": f"data-{RELEASE}-sluice-target-{i}"},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": STORAGE_CLASS,
                    "resources": {"requests": {"storage": "1Gi"}},
                    "volumeName": name,
                },
            },
        )
    wait_for(
        "the target claims to be Bound",
        lambda: all(
            c.status.phase == "Bound"
            for c in core.list_namespaced_persistent_volume_claim(k8s_namespace).items
        ),
        timeout=120,
    )
    yield
    for name in names:
        core.delete_persistent_volume(name)


def test_helm_install_runs_a_wds_etl_end_to_end_and_uninstall_keeps_only_pvcs(
    control_plane: Cluster,
    kubelet: Any,
    k8s_namespace: str,
    volumes: None,
    tmp_path: Path,
) -> None:
    from etl_runtime import Client

    ns = k8s_namespace
    rel = Release(control_plane, ns, tmp_path / "helm")
    rel.helm(
        "install",
        RELEASE,
        str(CHART),
        "--set",
        f"target.replicas={TARGETS}",
        "--set",
        "target.storage.size=1Gi",
        "--set",
        f"target.storage.storageClassName={STORAGE_CLASS}",
        "--set",
        "gateway.replicas=1",
        "--set",
        f"auth.token={TOKEN}",
    )
    try:
        key_at_install = rel.cluster_key()
        gateway_ip = wait_for(
            "the gateway to see every target",
            lambda: _gateway_with_targets(rel),
            timeout=240,
        )
        endpoint = f"http://{gateway_ip}:8080"

        with Client(endpoint, token=TOKEN, timeout=120) as sdk:
            bucket = sdk.bucket("images").create()
            shards = [make_shard(i) for i in range(SHARDS)]
            for i, shard in enumerate(shards):
                name = f"shard-{i:03d}.tar"
                if i % 2:
                    path = tmp_path / name
                    path.write_bytes(shard)
                    bucket.object(name).put_file(path)
                else:
                    bucket.object(name).put_content(shard)

            # Defined here so cloudpickle ships it by value.
            def shrink(sample: dict[str, Any]) -> dict[str, Any] | None:
                if sample["cls"] == 3:
                    return None  # dropping a sample is part of the contract
                sample["png"] = sample["png"].resize((4, 2))
                return sample

            sdk.etl("shrink").init_code(transform=shrink, mode="wds", decode="pil", timeout=240)

            (cr,) = rel.etls()
            assert cr["status"]["phase"] == "Running", cr["status"]
            transformers = rel.pods("sluice.dev/etl=shrink")
            targets = {
                p.metadata.name: p.spec.node_name for p in rel.pods("sluice.dev/role=target")
            }
            assert len(transformers) == TARGETS
            for pod in transformers:
                assert pod.spec.node_name in targets.values()
            assert_transformers_read_target_files(rel, transformers)

            urls = bucket.object_urls(f"shard-{{000..{SHARDS - 1:03d}}}.tar", etl_name="shrink")
            samples = list(wds.WebDataset(urls, shardshuffle=False).decode("pil"))
            want = [
                f"s{i:03d}-{j:02d}"
                for i in range(SHARDS)
                for j in range(SAMPLES_PER_SHARD)
                if j != 3
            ]
            assert [s["__key__"] for s in samples] == want
            for s in samples:
                assert s["png"].size == (4, 2)
                assert s["cls"] == int(s["__key__"][-2:])

            # S3 keys live in the chart's Secret; boto3 reads an ETL view through them.
            sdk.bucket("images-small").create(view_of="images", etl="shrink")
            made = httpx.post(
                f"{endpoint}/v1/s3/keys",
                json={"permission": "read"},
                headers={"Authorization": f"Bearer {TOKEN}"},
                timeout=10,
            )
            assert made.status_code == 200, made.text
            s3_key = made.json()
            assert _s3_view_keys(endpoint, s3_key) == want[: SAMPLES_PER_SHARD - 1]

            # Upgrading keeps the generated cluster key (redirects and ETL tokens stay valid)
            # and the S3 keys.
            rel.helm("upgrade", RELEASE, str(CHART), "--reuse-values")
            assert rel.cluster_key() == key_at_install
            assert bucket.object("shard-001.tar").get_bytes() == shards[1]
            assert _s3_view_keys(endpoint, s3_key) == want[: SAMPLES_PER_SHARD - 1]

            sdk.etl("shrink").delete()
        # The operator finalizes the ETL (its pods and token Secret) before it goes.
        wait_for("the ETL to be finalized", lambda: not rel.etls(), timeout=120)
        assert not rel.pods("sluice.dev/etl")
        assert_clean_operator_logs(rel, kubelet)
    except BaseException:
        print(rel.diagnostics())
        raise
    finally:
        rel.helm("uninstall", RELEASE, "--wait", "--timeout", "120s")

    deadline = time.monotonic() + 120
    while leftovers := _leftovers(control_plane, ns):
        assert time.monotonic() < deadline, f"helm uninstall left {leftovers}"
        time.sleep(1)
    claims = control_plane.core.list_namespaced_persistent_volume_claim(ns).items
    assert sorted(c.metadata.name for c in claims) == [
        f"data-{RELEASE}-sluice-target-{i}" for i in range(TARGETS)
    ]
    for c in claims:
        control_plane.core.delete_namespaced_persistent_volume_claim(c.metadata.name, ns)


def assert_transformers_read_target_files(rel: Release, transformers: list[client.V1Pod]) -> None:
    """etl.shareTargetData (default): each transformer mounts the claim of the target it
    serves, read-only at the target's /data, and the targets send paths, not bytes.
    The wds GETs that follow then work only if the path is valid in the transformer."""
    for target in rel.pods("sluice.dev/role=target"):
        env = {e.name: e.value for e in target.spec.containers[0].env}
        assert env.get("SLUICE_ETL_FQN") == "always", env
    for pod in transformers:
        target = pod.metadata.annotations["sluice.dev/target"]
        (vol,) = [v for v in pod.spec.volumes if v.persistent_volume_claim]
        assert vol.persistent_volume_claim.claim_name == f"data-{target}"
        assert vol.persistent_volume_claim.read_only is True
        c = pod.spec.containers[0]
        (mount,) = [m for m in c.volume_mounts if m.name == vol.name]
        assert (mount.mount_path, mount.read_only) == ("/data", True)
        assert {e.name: e.value for e in c.env}["SLUICE_DATA_ROOTS"] == "/data"


def _s3_view_keys(endpoint: str, key: dict[str, Any]) -> list[str]:
    """The sample keys of shard 0 of the view ``images-small``, read with boto3."""
    import tarfile

    from tests.s3.conftest import s3_client

    s3 = s3_client(endpoint, key)
    body = s3.get_object(Bucket="images-small", Key="shard-000.tar")["Body"].read()
    with tarfile.open(fileobj=io.BytesIO(body)) as tar:
        return sorted({m.name.split(".")[0] for m in tar.getmembers()})


def _gateway_with_targets(rel: Release) -> str | None:
    for ip in rel.ready_ips("app.kubernetes.io/component=gateway"):
        health = httpx.get(f"http://{ip}:8080/v1/health", timeout=5).json()
        if health.get("targets") == TARGETS:
            return ip
    return None


def _leftovers(cluster: Cluster, ns: str) -> list[str]:
    """Every object of the namespace that is not a PVC or put there by Kubernetes itself."""
    out = []
    for kind in (
        "pods",
        "services",
        "statefulsets",
        "deployments",
        "replicasets",
        "secrets",
        "serviceaccounts",
        "roles",
        "rolebindings",
        "networkpolicies",
        "etls",
        "configmaps",
    ):
        names = cluster.kubectl("get", kind, "-n", ns, "-o", "name").stdout.split()
        out += [
            n for n in names if n not in ("serviceaccount/default", "configmap/kube-root-ca.crt")
        ]
    return out


def operator_logs(rel: Release, kubelet: Any) -> dict[str, str]:
    """Every operator pod's output so far (pods that are gone included), by pod name."""
    out = {}
    for log in sorted((kubelet.state_dir / "pods").glob(f"{rel.namespace}_*/logs/operator.log")):
        pod = log.parent.parent.name.split("_")[1]  # <namespace>_<pod>_<uid>
        out[pod] = out.get(pod, "") + log.read_text(errors="replace")
    return out


def assert_clean_operator_logs(rel: Release, kubelet: Any) -> None:
    """A namespaced operator does not try (and fail) to list namespaces or CRDs,
    and peers never tie (kopf would pause all of them)."""
    logs = operator_logs(rel, kubelet)
    assert logs
    for pod, text in logs.items():
        for bad in ("Not enough permissions", "forbidden", "Possibly conflicting operators"):
            assert bad not in text, f"{pod}: {bad!r} in the operator log:\n{text[-3000:]}"


def test_two_operator_replicas_are_active_standby_and_fail_over(
    control_plane: Cluster,
    kubelet: Any,
    k8s_namespace: str,
    volumes: None,
    tmp_path: Path,
) -> None:
    """operator.replicas=2: one replica reconciles, the other takes over when it goes."""
    ns = k8s_namespace
    rel = Release(control_plane, ns, tmp_path / "helm")
    custom = client.CustomObjectsApi(control_plane.api_client)
    rel.helm(
        "install",
        RELEASE,
        str(CHART),
        "--set",
        f"target.replicas={TARGETS}",
        "--set",
        f"target.storage.storageClassName={STORAGE_CLASS}",
        "--set",
        "target.storage.size=1Gi",
        "--set",
        "gateway.replicas=1",
        "--set",
        "operator.replicas=2",
    )

    def peers() -> dict[str, Any]:
        peering = custom.get_namespaced_custom_object(
            "kopf.dev", "v1", ns, "kopfpeerings", "sluice"
        )
        return peering.get("status") or {}

    def apply_etl(name: str, expr: str) -> None:
        source = f"def transform(data):\n    return {expr}\n"
        custom.create_namespaced_custom_object(
            "sluice.dev",
            "v1alpha1",
            ns,
            "etls",
            {
                "apiVersion": "sluice.dev/v1alpha1",
                "kind": "ETL",
                "metadata": {"name": name},
                "spec": {"mode": "object", "code": {"source": source}},
            },
        )

    def phase(name: str) -> str | None:
        etl = custom.get_namespaced_custom_object("sluice.dev", "v1alpha1", ns, "etls", name)
        return (etl.get("status") or {}).get("phase")

    try:
        operators = {p.metadata.name for p in rel.pods("app.kubernetes.io/component=operator")}
        assert len(operators) == 2
        # Both replicas announce themselves (POD_ID = pod name), with distinct priorities.
        wait_for("both operators in the peering", lambda: set(peers()) >= operators, 120)
        priorities = {pod: info["priority"] for pod, info in peers().items()}
        assert len(set(priorities.values())) == len(priorities), priorities
        active = max(priorities, key=lambda pod: priorities[pod])
        # A transformer per target: wait for every target first (on a busy machine
        # one may still be Pending when the ETL reports Running for the others).
        wait_for(
            "every target ready",
            lambda: len(rel.ready_ips("sluice.dev/role=target")) == TARGETS,
            timeout=180,
        )

        apply_etl("upper", "data.upper()")
        wait_for("the ETL to run", lambda: phase("upper") == "Running", timeout=90)
        assert len(rel.pods("sluice.dev/etl=upper")) == TARGETS
        logs = operator_logs(rel, kubelet)
        standby = next(pod for pod in operators if pod != active)
        assert "created 2 transformer pods" in logs[active]
        # The standby never acted (whether it logs kopf's "Pausing operations"
        # depends on which replica started first).
        assert "transformer pods" not in logs[standby]

        # The active replica goes (a clean exit: kopf removes it from the
        # peering at once); the standby, or the Deployment's new pod if it drew
        # a higher priority, reconciles what comes next.
        control_plane.core.delete_namespaced_pod(active, ns)
        wait_for("the active operator to leave the peering", lambda: active not in peers(), 60)
        apply_etl("lower", "data.lower()")
        wait_for("the new ETL to run", lambda: phase("lower") == "Running", timeout=120)
        assert len(rel.pods("sluice.dev/etl=lower")) == TARGETS
        # ... and a spec change of the first one rolls out.
        custom.patch_namespaced_custom_object(
            "sluice.dev", "v1alpha1", ns, "etls", "upper", {"spec": {"workers": 2}}
        )
        wait_for(
            "the changed ETL to be observed",
            lambda: (rel.etls() and all(
                (e.get("status") or {}).get("observedGeneration") == e["metadata"]["generation"]
                and e["status"]["phase"] == "Running"
                for e in rel.etls()
            )),
            timeout=120,
        )  # fmt: skip
        for name in ("upper", "lower"):
            custom.delete_namespaced_custom_object("sluice.dev", "v1alpha1", ns, "etls", name)
        wait_for("the ETLs to be finalized", lambda: not rel.etls(), timeout=120)
        assert_clean_operator_logs(rel, kubelet)
    except BaseException:
        print(rel.diagnostics())
        raise
    finally:
        rel.helm("uninstall", RELEASE, "--wait", "--timeout", "120s")
    crds = client.ApiextensionsV1Api(control_plane.api_client).list_custom_resource_definition()
    assert "kopfpeerings.kopf.dev" not in {c.metadata.name for c in crds.items}
    for c in control_plane.core.list_namespaced_persistent_volume_claim(ns).items:
        control_plane.core.delete_namespaced_persistent_volume_claim(c.metadata.name, ns)
