"""Helpers for the chart on real nodes (``tests/helm/test_realstack.py``).

- :func:`import_sluice_images`: ``make images``' server, operator and runtime
  archives into every node's containerd (nodes in parallel), as a cluster
  without a registry needs them.
- :func:`installed`: the module's release (``test_realstack``'s fixture).
- :class:`Stack`: the installed release, driven with ``helm`` and ``kubectl``;
  :func:`endpoint` (the gateway once it sees every target), :func:`apply_etl`
  (an ETL as YAML, until ``kubectl get etl`` shows Running N/N),
  :func:`leftovers` (what ``helm uninstall`` left in the namespace).
- :class:`PackageIndex`: a PEP 503 "simple" package index serving one wheel
  written here, on the harness bridge address (``10.240.K.1``) that pods
  reach; transformer pods reach nothing else, so an ETL's ``dependencies``
  come from it (``PIP_INDEX_URL`` in the ETL's ``spec.env``).
"""

from __future__ import annotations

import base64
import hashlib
import io
import random
import subprocess
import tarfile
import threading
import time
import zipfile
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import webdataset as wds
from kubernetes import client
from PIL import Image

from tests.helm.chart import CHART, helm
from tests.k8s.controlplane import BIN_DIR
from tests.k8s.realfixtures import RealNodes
from tests.k8s.realnode import RealCluster, images_index, sluice_image
from tests.k8s.waiting import wait_for
from tests.s3.conftest import s3_client

IMAGES = ("server", "operator", "runtime")
RELEASE = "sl"
TOKEN = "real-stack-token"
STS = f"{RELEASE}-sluice-target"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def etl_yaml(name: str, source: str, mode: str = "object", extra: str = "") -> str:
    """An ETL as a user writes it (crds/etls.sluice.dev.yaml), the source inline."""
    body = "\n".join("      " + line for line in source.strip().splitlines())
    return (
        f"apiVersion: sluice.dev/v1alpha1\nkind: ETL\nmetadata:\n  name: {name}\n"
        f"spec:\n  mode: {mode}\n  code:\n    source: |\n{body}\n{extra}"
    )


def gateway(st: Stack, targets: int = 3) -> str | None:
    """``http://<gateway pod IP>:8080`` once the gateway sees ``targets`` targets."""
    for pod in st.ready_pods("app.kubernetes.io/component=gateway"):
        url = f"http://{pod.status.pod_ip}:8080"
        if httpx.get(f"{url}/v1/health", timeout=5).json().get("targets") == targets:
            return url
    return None


def endpoint(st: Stack, targets: int = 3) -> str:
    """The gateway's URL, waiting (after a restart, say) until it sees every target."""
    url: str = wait_for(lambda: gateway(st, targets), 120)
    return url


def apply_etl(st: Stack, doc: str, name: str, targets: int = 3) -> None:
    """``kubectl apply -f -`` then wait until ``kubectl get etl`` shows Running N/N."""
    st.kubectl("apply", "-f", "-", stdin=doc)
    try:
        wait_for(lambda: st.etl_row(name)[1:3] == ["Running", f"{targets}/{targets}"], 240)
    except BaseException:
        print(st.diagnostics())
        raise


def cluster_view(url: str) -> dict[str, Any]:
    return dict(httpx.get(f"{url}/v1/cluster", timeout=5).json())


_imported: dict[int, set[Path]] = {}  # id(RealCluster) -> archives already in its nodes


def import_sluice_images(real: RealCluster, names: Iterable[str] = IMAGES) -> float:
    """Import the archives of ``make images`` into every node (once per cluster: a
    second release in the same session finds them there); returns the seconds taken.

    Fails (never skips) when an image was not built: ``make test`` builds them.
    """
    archives = []
    for name in names:
        found = sluice_image(name)
        if found is None:
            pytest.fail(f"no {name} image in {images_index()}: run `make images`", pytrace=False)
        archives.append(found[1])
    done = _imported.setdefault(id(real), set())
    archives = [a for a in archives if a not in done]
    t0 = time.monotonic()

    def one_node(i: int) -> None:  # one image after another on a node; nodes in parallel
        for archive in archives:
            real.node_list[i].ctr(
                "images", "import", "--snapshotter=overlayfs", str(archive), timeout=900
            )

    with ThreadPoolExecutor(len(real.node_list)) as pool:
        list(pool.map(one_node, range(len(real.node_list))))
    done.update(archives)
    return time.monotonic() - t0


class Stack:
    """One helm release in one namespace of the real-node cluster."""

    def __init__(self, cluster: RealNodes, namespace: str, home: Path) -> None:
        self.cluster, self.namespace = cluster, namespace
        self.custom = client.CustomObjectsApi(cluster.api_client)
        self.apps = client.AppsV1Api(cluster.api_client)
        self.env = {
            "KUBECONFIG": str(cluster.kubeconfig),
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        }

    @property
    def real(self) -> RealCluster:
        assert self.cluster.real is not None
        return self.cluster.real

    def helm(self, *args: str) -> str:
        return helm(*args, "--namespace", self.namespace, env=self.env).stdout

    def kubectl(self, *args: str, stdin: str | None = None, timeout: float = 120) -> str:
        """``kubectl -n <ns> args``; fails the test with kubectl's stderr."""
        cmd = [str(BIN_DIR / "kubectl"), f"--kubeconfig={self.cluster.kubeconfig}",
               "-n", self.namespace, *args]  # fmt: skip
        done = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
        return done.stdout

    def pods(self, selector: str) -> list[client.V1Pod]:
        core = self.cluster.core
        return core.list_namespaced_pod(self.namespace, label_selector=selector).items

    def ready_pods(self, selector: str) -> list[client.V1Pod]:
        out = []
        for pod in self.pods(selector):
            conditions = {c.type: c.status for c in (pod.status.conditions or [])}
            if conditions.get("Ready") == "True" and pod.metadata.deletion_timestamp is None:
                out.append(pod)
        return out

    def cluster_key(self) -> str:
        """The generated key in the chart's Secret (signs redirects and ETL tokens)."""
        name = f"{RELEASE}-sluice-cluster-key"
        secret = self.cluster.core.read_namespaced_secret(name, self.namespace)
        return str(secret.data["cluster-key"])

    def etl_row(self, name: str) -> list[str]:
        """The row ``kubectl get etl NAME`` prints: NAME PHASE READY MODE AGE."""
        return self.kubectl("get", "etl", name, "--no-headers").split()

    def etls(self) -> list[dict[str, Any]]:
        found = self.custom.list_namespaced_custom_object(
            "sluice.dev", "v1alpha1", self.namespace, "etls"
        )
        return list(found["items"])

    def diagnostics(self) -> str:
        """Objects, events and the tail of every pod's log (for a failed test's output)."""
        run = partial(subprocess.run, capture_output=True, text=True, timeout=60)
        kubectl = [str(BIN_DIR / "kubectl"), f"--kubeconfig={self.cluster.kubeconfig}",
                   "-n", self.namespace]  # fmt: skip
        out = [run([*kubectl, "get", "pods,pvc,etl,svc", "-o", "wide"]).stdout]
        events = run([*kubectl, "get", "events", "--sort-by=.lastTimestamp"]).stdout
        out.append("--- events\n" + "\n".join(events.splitlines()[-40:]))
        for pod in self.pods(""):
            logs = run([*kubectl, "logs", pod.metadata.name, "--all-containers", "--tail=40"])
            kept = [ln for ln in logs.stdout.splitlines() if "GET /healthz" not in ln]
            out.append(f"--- {pod.metadata.name}\n" + "\n".join(kept)[-3000:] + logs.stderr)
        return "\n".join(out)


def make_wheel(name: str, version: str, module_source: str) -> tuple[str, bytes]:
    """A pure-Python wheel (file name, bytes) holding one module ``name``."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}.py": module_source.encode(),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: sluice-tests\n"
        b"Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    files[f"{dist}/RECORD"] = ("\n".join([*record, f"{dist}/RECORD,,"]) + "\n").encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as whl:
        for path, data in files.items():
            whl.writestr(path, data)
    return f"{name}-{version}-py3-none-any.whl", buf.getvalue()


class PackageIndex:
    """``http://<address>:<port>/simple/``: a PEP 503 index of the wheels given."""

    def __init__(self, root: Path, address: str, wheels: dict[str, tuple[str, bytes]]) -> None:
        for project, (filename, data) in wheels.items():
            d = root / "simple" / project.replace("_", "-")
            d.mkdir(parents=True, exist_ok=True)
            (d / filename).write_bytes(data)
            sha = hashlib.sha256(data).hexdigest()
            (d / "index.html").write_text(
                f'<html><body><a href="{filename}#sha256={sha}">{filename}</a></body></html>\n'
            )
        self.requests: list[str] = []
        index = self

        class Handler(SimpleHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                index.requests.append(self.path)

        self.server = ThreadingHTTPServer((address, 0), partial(Handler, directory=str(root)))
        self.url = f"http://{address}:{self.server.server_address[1]}/simple/"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> PackageIndex:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def leftovers(st: Stack) -> list[str]:
    """Every object of the namespace that is not a claim or put there by Kubernetes itself."""
    kinds = ("pods,services,statefulsets,deployments,replicasets,secrets,serviceaccounts,"
             "roles,rolebindings,networkpolicies,etls,configmaps")  # fmt: skip
    names = st.kubectl("get", kinds, "-o", "name").split()
    own = ("serviceaccount/default", "configmap/kube-root-ca.crt")
    return [n for n in names if n not in own]


def installed(
    real_cluster: RealNodes, home: Path, values: Sequence[str] = (), targets: int = 3
) -> Iterator[Stack]:
    """The chart installed (images imported first; ``values``: more ``helm install``
    arguments), every pod Ready and, unless ``tls.enabled`` (the host resolves no
    cluster name), the gateway seeing every target; at the end its ETLs and the
    release (unless a test uninstalled it) removed, and its namespace."""
    assert real_cluster.real is not None
    t0 = time.monotonic()
    imported = import_sluice_images(real_cluster.real)
    ns = f"rs-{random.randbytes(4).hex()}"
    real_cluster.kubectl("create", "namespace", ns)
    st = Stack(real_cluster, ns, home)
    st.helm(
        "install", RELEASE, str(CHART),
        "--set", "images.registry=localhost", "--set", "images.tag=dev",
        "--set", "images.pullPolicy=Never",
        "--set", "target.storage.size=1Gi", "--set", "gateway.replicas=1",
        "--set", f"target.replicas={targets}",
        "--set", "target.terminationGracePeriodSeconds=10",
        "--set", f"auth.token={TOKEN}",
        # Transformer pods are bound to their target's node, past the scheduler:
        # small requests, or 2-CPU nodes reject them (OutOfcpu).
        "--set-json", 'transformer.resources={"requests":{"cpu":"50m","memory":"64Mi"},'
                      '"limits":{"memory":"1Gi"}}',
        *values,
    )  # fmt: skip
    ready = targets + 2  # the targets, a gateway, an operator
    try:
        wait_for(lambda: len(st.ready_pods("app.kubernetes.io/instance=" + RELEASE)) == ready, 300)
        if "tls.enabled=true" not in values:
            endpoint(st, targets)
    except BaseException:
        print(st.diagnostics())
        raise
    print(f"images imported in {imported:.0f}s; chart Ready {time.monotonic() - t0:.0f}s in")
    yield st
    st.kubectl("delete", "etl", "--all", "--wait", "--timeout=120s")
    if RELEASE in st.helm("list", "-q").split():  # the last test uninstalls it
        st.helm("uninstall", RELEASE, "--wait", "--timeout", "120s")
    real_cluster.kubectl("delete", "namespace", ns, "--wait=false")


def make_shard(index: int, samples: int = 5) -> bytes:
    buf = io.BytesIO()
    with wds.TarWriter(buf) as sink:
        for j in range(samples):
            image = Image.new("RGB", (16, 8), color=(index * 40, j * 30, 200))
            sink.write({"__key__": f"s{index:02d}-{j:02d}", "png": image, "cls": j})
    return buf.getvalue()


SHRINK = """
def transform(sample):
    if sample["cls"] == 3:
        return None
    sample["png"] = sample["png"].resize((4, 2))
    return sample
"""


def s3_view_keys(url: str, key: dict[str, Any]) -> list[str]:
    """The sample keys of ``shard-00.tar`` in the ETL view ``s3view``, read with boto3."""
    body = s3_client(url, key).get_object(Bucket="s3view", Key="shard-00.tar")["Body"].read()
    with tarfile.open(fileobj=io.BytesIO(body)) as tar:
        return sorted({m.name.split(".")[0] for m in tar.getmembers()})


def operator_log_problems(stack: Stack, pod: str) -> list[str]:
    """What a namespaced operator must never log: RBAC refusals, or a peering tie
    (kopf would pause every replica)."""
    logs = stack.kubectl("logs", pod)
    bad = ("Not enough permissions", "forbidden", "Possibly conflicting operators", "Traceback")
    return [f"{pod}: {b!r} in\n{logs[-3000:]}" for b in bad if b in logs]


def assert_transformers_read_target_files(st: Stack, etl: str) -> None:
    """etl.shareTargetData (the default): targets send every ETL the object's path, and
    each transformer mounts the claim of the target it serves, read-only: only its
    objects (the buckets/ subPath at /data/buckets), not the ETL output cache, temp
    files or jobs beside them."""
    for target in st.pods("sluice.dev/role=target"):
        env = {e.name: e.value for e in target.spec.containers[0].env}
        assert env.get("SLUICE_ETL_FQN") == "always", env
    for pod in st.pods(f"sluice.dev/etl={etl}"):
        target = pod.metadata.annotations["sluice.dev/target"]
        (vol,) = [v for v in pod.spec.volumes if v.persistent_volume_claim]
        assert vol.persistent_volume_claim.claim_name == f"data-{target}"
        assert vol.persistent_volume_claim.read_only is True
        c = pod.spec.containers[0]
        (mount,) = [m for m in c.volume_mounts if m.name == vol.name]
        assert (mount.mount_path, mount.sub_path, mount.read_only) == (
            "/data/buckets",
            "buckets",
            True,
        )
        assert {e.name: e.value for e in c.env}["SLUICE_DATA_ROOTS"] == "/data/buckets"
        probe = (
            "import os; d = '/data/buckets'; print(os.access(d, os.W_OK), "
            "sorted(os.listdir(d)), sum(len(files) for _, _, files in os.walk(d)))"
        )
        seen = st.kubectl("exec", pod.metadata.name, "--", "python", "-c", probe)
        held = st.kubectl("exec", target, "--", "python", "-c", probe)
        # The target's very files, read-only (the target itself may write them).
        assert seen == held.replace("True", "False", 1), (pod.metadata.name, seen, held)
        assert seen.startswith("False"), seen
