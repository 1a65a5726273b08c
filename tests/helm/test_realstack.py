"""The Helm chart on real nodes: real kubelet, containerd, runc, pod network, Services.

Driven as a platform team would: ``make images``' archives imported into
each node's containerd (no registry), ``helm install`` with
``images.pullPolicy=Never``, the targets' claims bound by the cluster's
default StorageClass (a local-path provisioner, as kind and k3s ship), ETLs
written as YAML and applied with ``kubectl``, data through the gateway with
the SDK, curl-like HTTP and ``webdataset`` from the host (which routes to pod
IPs, as a laptop does to a local cluster), and through the gateway Service
from a client pod. Every Sluice pod runs under the chart's securityContext,
which the real runtime enforces.

One install for the module (tests run in file order and share it; each test
makes its own bucket and ETL). Not covered here: NetworkPolicy (the bridge
CNI does not enforce it) and Service DNS names (no cluster DNS; the chart
needs none).
"""

from __future__ import annotations

import hashlib
import io
import json
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import webdataset as wds
from PIL import Image

from etl_runtime import Client
from etl_runtime.sdk.errors import NotFound, SluiceError
from tests.helm.chart import CHART
from tests.helm.realstack import RELEASE, PackageIndex, Stack, import_sluice_images, make_wheel
from tests.k8s.realfixtures import RealNodes
from tests.k8s.realnode import ECHO_IMAGE
from tests.k8s.waiting import wait_for

pytestmark = [pytest.mark.k8s, pytest.mark.realnode]

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


UPPER = etl_yaml("upper", "def transform(data):\n    return data.upper()")


@pytest.fixture(scope="module")
def stack(real_cluster: RealNodes, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The chart installed once, every pod Ready; ETLs and the release removed at the end."""
    assert real_cluster.real is not None
    t0 = time.monotonic()
    imported = import_sluice_images(real_cluster.real)
    ns = f"rs-{random.randbytes(4).hex()}"
    real_cluster.kubectl("create", "namespace", ns)
    st = Stack(real_cluster, ns, tmp_path_factory.mktemp("helm"))
    st.helm(
        "install", RELEASE, str(CHART),
        "--set", "images.registry=localhost", "--set", "images.tag=dev",
        "--set", "images.pullPolicy=Never",
        "--set", "target.storage.size=1Gi", "--set", "gateway.replicas=1",
        "--set", "target.terminationGracePeriodSeconds=10",
        "--set", f"auth.token={TOKEN}",
        # Transformer pods are bound to their target's node, past the scheduler:
        # small requests, or 2-CPU nodes reject them (OutOfcpu).
        "--set-json", 'transformer.resources={"requests":{"cpu":"50m","memory":"64Mi"},'
                      '"limits":{"memory":"1Gi"}}',
    )  # fmt: skip
    try:
        wait_for(lambda: len(st.ready_pods("app.kubernetes.io/instance=" + RELEASE)) == 5, 300)
        endpoint(st)
    except BaseException:
        print(st.diagnostics())
        raise
    print(f"images imported in {imported:.0f}s; chart Ready {time.monotonic() - t0:.0f}s in")
    yield st
    st.kubectl("delete", "etl", "--all", "--wait", "--timeout=120s")
    st.helm("uninstall", RELEASE, "--wait", "--timeout", "120s")
    real_cluster.kubectl("delete", "namespace", ns, "--wait=false")


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


def test_chart_installs_and_every_pod_is_ready_under_its_security_context(stack: Stack) -> None:
    pods = stack.pods(f"app.kubernetes.io/instance={RELEASE}")
    by_component = {}
    for pod in pods:
        component = pod.metadata.labels["app.kubernetes.io/component"]
        by_component.setdefault(component, []).append(pod)
        (status,) = pod.status.container_statuses
        assert status.ready and status.container_id.startswith("containerd://"), status
        image = "operator" if component == "operator" else "server"
        assert status.image == f"localhost/sluice/{image}:dev"
    assert {k: len(v) for k, v in by_component.items()} == {"target": 3, "gateway": 1,
                                                            "operator": 1}  # fmt: skip
    # Spread over the three nodes (soft anti-affinity), claims bound by the default class.
    assert len({p.spec.node_name for p in by_component["target"]}) == 3
    for claim in stack.cluster.core.list_namespaced_persistent_volume_claim(stack.namespace).items:
        assert (claim.status.phase, claim.spec.storage_class_name) == ("Bound", "standard")
    probe = (
        "import os; print(os.getuid(), os.getgid(), os.access('/', os.W_OK), "
        "os.access('/tmp', os.W_OK), os.path.exists('/var/run/secrets/kubernetes.io'))"
    )
    who = stack.kubectl("exec", f"{STS}-0", "--", "python", "-c", probe).split()
    assert who == ["10001", "10001", "False", "True", "True"]  # it reads ETLs: it has a token
    data = stack.kubectl("exec", f"{STS}-0", "--", "python", "-c",
                         "import os; print(os.access('/data', os.W_OK))")  # fmt: skip
    assert data.strip() == "True"  # the provisioned hostPath volume is writable as 10001
    (operator,) = by_component["operator"]
    logs = stack.kubectl("logs", operator.metadata.name)
    for bad in ("Not enough permissions", "forbidden", "Traceback"):
        assert bad not in logs, logs[-3000:]


def test_kubectl_apply_etl_yaml_and_get_transformed_bytes(stack: Stack) -> None:
    """An ETL applied as YAML runs in runtime-image pods; GETs through the gateway
    (pod IP from the host, and the Service from a pod) follow the redirect to a target."""
    apply_etl(stack, UPPER, "upper")
    transformers = stack.pods("sluice.dev/etl=upper")
    targets = {p.metadata.name: p.spec.node_name for p in stack.pods("sluice.dev/role=target")}
    assert sorted(p.spec.node_name for p in transformers) == sorted(targets.values())
    for pod in transformers:
        assert pod.status.container_statuses[0].image == "localhost/sluice/runtime:dev"
    probe = ("import os; print(os.getuid(), os.access('/', os.W_OK), "
             "os.path.exists('/var/run/secrets/kubernetes.io'))")  # fmt: skip
    who = stack.kubectl("exec", transformers[0].metadata.name, "--", "python", "-c", probe)
    assert who.split() == ["10001", "False", "False"]  # no ServiceAccount token

    url = endpoint(stack)
    with Client(url, token=TOKEN, timeout=60) as sdk:
        bucket = sdk.bucket("plain").create()
        objects = {f"obj-{i}": f"object {i} on a real node".encode() for i in range(12)}
        for name, data in objects.items():
            bucket.object(name).put_content(data)
    for name, data in objects.items():
        first = httpx.get(f"{url}/v1/objects/plain/{name}", params={"etl_name": "upper"})
        assert first.status_code == 307  # to the target that holds it, by its pod IP
        got = httpx.get(first.headers["location"], follow_redirects=True, timeout=60)
        assert (got.status_code, got.content) == (200, data.upper()), got.text

    # Through the gateway Service (kube-proxy), from a client pod without a token.
    client_pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "client"},
        "spec": {"nodeName": "node-0", "automountServiceAccountToken": False,
                 "terminationGracePeriodSeconds": 1,
                 "containers": [{"name": "echo", "image": ECHO_IMAGE, "imagePullPolicy": "Never"}]},
    }  # fmt: skip
    stack.kubectl("apply", "-f", "-", stdin=json.dumps(client_pod))
    core = stack.cluster.core
    service = core.read_namespaced_service(f"{RELEASE}-sluice-gateway", stack.namespace)
    svc_url = f"http://{service.spec.cluster_ip}:8080/v1/objects/plain/obj-3?etl_name=upper"
    # Retried: kube-proxy may not have synced the Service yet.
    via_service = wait_for(
        lambda: stack.kubectl("exec", "client", "--", "/echo", "get", svc_url), 120
    )
    assert via_service == "OBJECT 3 ON A REAL NODE"
    stack.kubectl("delete", "pod", "client", "--wait=false")


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


def test_wds_etl_is_read_by_webdataset(stack: Stack) -> None:
    apply_etl(stack, etl_yaml("shrink", SHRINK, mode="wds", extra="  decode: pil\n"), "shrink")
    url = endpoint(stack)
    with Client(url, token=TOKEN, timeout=60) as sdk:
        bucket = sdk.bucket("shards").create()
        for i in range(3):
            bucket.object(f"shard-{i:02d}.tar").put_content(make_shard(i))
        urls = bucket.object_urls("shard-{00..02}.tar", etl_name="shrink")
    samples = list(wds.WebDataset(urls, shardshuffle=False).decode("pil"))
    assert [s["__key__"] for s in samples] == [
        f"s{i:02d}-{j:02d}" for i in range(3) for j in range(5) if j != 3
    ]
    assert {s["png"].size for s in samples} == {(4, 2)}


def test_killed_transformer_container_is_healed(stack: Stack) -> None:
    apply_etl(stack, UPPER, "upper")
    url = endpoint(stack)
    with Client(url, token=TOKEN, timeout=60) as sdk:
        obj = sdk.bucket("heal").create().object("x")
        obj.put_content(b"heal me")
        assert obj.get_bytes(etl_name="upper") == b"HEAL ME"
    victim = stack.pods("sluice.dev/etl=upper")[0]
    node = int(victim.spec.node_name.split("-")[1])
    container_id = victim.status.container_statuses[0].container_id.split("//")[1]
    stack.real.node_list[node].ctr("tasks", "kill", "--signal", "SIGKILL", container_id)

    def healed() -> bool:
        pods = stack.ready_pods("sluice.dev/etl=upper")
        uids = {p.metadata.uid for p in pods}
        return (
            len(pods) == 3
            and victim.metadata.uid not in uids
            and (stack.etl_row("upper")[1:3] == ["Running", "3/3"])
        )

    try:
        wait_for(healed, 180)
    except BaseException:
        print(stack.diagnostics())
        raise
    with Client(url, token=TOKEN, timeout=60) as sdk:
        bucket = sdk.bucket("heal")
        for i in range(9):  # over every target, so over the new transformer too
            bucket.object(f"y{i}").put_content(f"after {i}".encode())
        for i in range(9):
            assert bucket.object(f"y{i}").get_bytes(etl_name="upper") == f"AFTER {i}".encode()


def test_etl_dependencies_come_from_an_index_pods_reach(stack: Stack, tmp_path: Path) -> None:
    """``dependencies`` pip-installed in each transformer, from the harness's own index
    (pods reach no public index); ``PIP_INDEX_URL`` is set through the ETL's env."""
    wheel = make_wheel("sluice_shout", "1.0", "def shout(b):\n    return b.upper() + b'!'\n")
    with PackageIndex(tmp_path / "index", stack.real.slot.host_ip, {"sluice_shout": wheel}) as idx:
        extra = (f"  dependencies: [sluice-shout==1.0]\n  env:\n    PIP_INDEX_URL: {idx.url}\n"
                 f"    PIP_TRUSTED_HOST: {stack.real.slot.host_ip}\n")  # fmt: skip
        source = "import sluice_shout\ndef transform(data):\n    return sluice_shout.shout(data)"
        apply_etl(stack, etl_yaml("shout", source, extra=extra), "shout")
        wheel_gets = [p for p in idx.requests if p.endswith(".whl")]
    assert len(wheel_gets) >= 3  # a pip install in each transformer pod
    url = endpoint(stack)
    with Client(url, token=TOKEN, timeout=60) as sdk:
        obj = sdk.bucket("deps").create().object("d")
        obj.put_content(b"quiet")
        assert obj.get_bytes(etl_name="shout") == b"QUIET!"
    stack.kubectl("delete", "etl", "shout", "--wait", "--timeout=120s")


def cluster_view(url: str) -> dict[str, Any]:
    return dict(httpx.get(f"{url}/v1/cluster", timeout=5).json())


def test_rolling_restart_with_copies_2_loses_no_write(stack: Stack) -> None:
    """``kubectl rollout restart`` of the targets under writers and readers: every
    acknowledged write reads back, no read answers 404."""
    url = endpoint(stack)
    acked: dict[str, str] = {}
    lock, stop = threading.Lock(), threading.Event()
    counts = {"puts": 0, "put_refused": 0, "gets": 0, "get_failed": 0, "404": 0}
    with Client(url, token=TOKEN, timeout=30, retries=2) as sdk:
        bucket = sdk.bucket("rolling").create(copies=2)
        names = [f"r{i:02d}" for i in range(30)]
        for name in names:
            data = random.randbytes(3000)
            bucket.object(name).put_content(data)
            acked[name] = hashlib.md5(data).hexdigest()

        def writer() -> None:
            while not stop.is_set():
                name, data = random.choice(names), random.randbytes(random.randint(100, 30_000))
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
                try:
                    bucket.object(random.choice(names)).get_bytes()
                    key = "gets"
                except NotFound:
                    key = "404"
                except SluiceError:
                    key = "get_failed"
                    time.sleep(0.2)
                with lock:
                    counts[key] += 1

        threads = [threading.Thread(target=f) for f in (writer, writer, reader)]
        for t in threads:
            t.start()
        try:
            stack.kubectl("rollout", "restart", f"statefulset/{STS}")
            stack.kubectl("rollout", "status", f"statefulset/{STS}", "--timeout=300s", timeout=320)
            wait_for(lambda: not cluster_view(url)["away"], 60)
        finally:
            stop.set()
            for t in threads:
                t.join(60)
        print("rolling restart on real nodes:", counts)
        assert counts["404"] == 0 and counts["puts"] > 0 and counts["gets"] > 0, counts
        lost = [n for n, md5 in acked.items()
                if hashlib.md5(bucket.object(n).get_bytes()).hexdigest() != md5]  # fmt: skip
        assert lost == []


def test_targets_scaled_3_to_4_rebalance_and_every_object_reads(stack: Stack) -> None:
    url = endpoint(stack)
    with Client(url, token=TOKEN, timeout=60) as sdk:
        bucket = sdk.bucket("scale").create()
        objects = {f"s{i:02d}": random.randbytes(2000 + i) for i in range(40)}
        for name, data in objects.items():
            bucket.object(name).put_content(data)
        before = cluster_view(url)["rebalance"]["id"]
        stack.helm("upgrade", RELEASE, str(CHART), "--reuse-values", "--set", "target.replicas=4")

        def rebalanced() -> dict[str, Any] | None:
            view = cluster_view(url)
            done = view["rebalance"]["id"] > before and view["rebalance"]["state"] == "idle"
            return view if done and len(view["members"]) == 4 else None

        try:
            view = wait_for(rebalanced, 240)
        except BaseException:
            print(stack.diagnostics())
            raise
        print("after scaling to 4:", view["rebalance"])
        assert view["rebalance"]["errors"] == 0
        # What the new target's volume holds, before any read could fetch anything there.
        ls = stack.kubectl("exec", f"{STS}-3", "--", "ls", "/data/buckets/scale")
        new_target = next(t["url"] for t in view["targets"] if t["id"] == f"{STS}-3")
        owned_by_new = set()
        for name, data in objects.items():  # the gateway sends each GET to its owner
            first = httpx.get(f"{url}/v1/objects/scale/{name}", timeout=30)
            assert first.status_code == 307, first.text
            if first.headers["location"].startswith(new_target + "/"):
                owned_by_new.add(name)
            assert bucket.object(name).get_bytes() == data, name
        # ~1/4 of the objects now belong to the new target, and the rebalance moved them there.
        assert owned_by_new and owned_by_new == set(ls.split()), (owned_by_new, ls)
    # Every ETL still running gets a transformer beside the new target too.
    wait_for(lambda: all(e["status"]["ready"] == "4/4" for e in stack.etls()), 180)
