"""The Helm chart on real nodes: real kubelet, containerd, runc, pod network, Services.

Driven as a platform team would: ``make images``' archives imported into
each node's containerd (no registry), ``helm install`` with
``images.pullPolicy=Never``, the targets' claims bound by the cluster's
default StorageClass (a local-path provisioner, as kind and k3s ship), ETLs
written as YAML and applied with ``kubectl``, data through the gateway with
the SDK (jobs with the official ``aistore`` SDK too), curl-like HTTP and
``webdataset`` from the host (which routes to pod IPs, as a laptop does to a
local cluster), and through the gateway Service
from a client pod. Every Sluice pod runs under the chart's securityContext,
which the real runtime enforces.

One install for the module (tests run in file order and share it; each test
makes its own bucket and ETL). Later tests change the release as a user
would: ``helm upgrade --reuse-values`` (the keys survive), ``target.replicas=4``,
``operator.replicas=2`` (kopf peering, a fail-over), and the last one runs
``helm uninstall`` (only the claims stay). Pods resolve Services by name (the
harness's cluster DNS, ``tests/k8s/clusterdns.py``). TLS on this cluster:
``test_realstack_tls.py``; NetworkPolicy is not enforced by the bridge CNI
(``test_realstack_tls.py`` shows it).
"""

from __future__ import annotations

import hashlib
import io
import json
import random
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import webdataset as wds
from aistore.sdk import Client as AisClient
from kubernetes import client

from etl_runtime import Client
from etl_runtime.sdk.errors import NotFound, SluiceError
from tests.helm.chart import CHART
from tests.helm.realstack import (
    AUTH,
    RELEASE,
    SHRINK,
    STS,
    TOKEN,
    PackageIndex,
    Stack,
    apply_etl,
    assert_transformers_read_target_files,
    cluster_view,
    endpoint,
    etl_yaml,
    installed,
    leftovers,
    make_shard,
    make_wheel,
    operator_log_problems,
    s3_view_keys,
)
from tests.k8s.realfixtures import RealNodes
from tests.k8s.realnode import ECHO_IMAGE
from tests.k8s.waiting import wait_for

pytestmark = [pytest.mark.k8s, pytest.mark.realnode]


@pytest.fixture(scope="module")
def stack(real_cluster: RealNodes, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The chart installed once, every pod Ready; ETLs and the release removed at the end."""
    yield from installed(real_cluster, tmp_path_factory.mktemp("helm"))


UPPER = etl_yaml("upper", "def transform(data):\n    return data.upper()")


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

    # Through the gateway Service by its DNS name (the cluster DNS, then kube-proxy),
    # from a client pod without a token.
    client_pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "client"},
        "spec": {"nodeName": "node-0", "automountServiceAccountToken": False,
                 "terminationGracePeriodSeconds": 1,
                 "containers": [{"name": "echo", "image": ECHO_IMAGE, "imagePullPolicy": "Never"}]},
    }  # fmt: skip
    stack.kubectl("apply", "-f", "-", stdin=json.dumps(client_pod))
    core = stack.cluster.core
    service = core.read_namespaced_service(f"{RELEASE}-sluice-gateway", stack.namespace)
    fqdn = f"{RELEASE}-sluice-gateway.{stack.namespace}.svc.cluster.local"
    svc_url = f"http://{fqdn}:8080/v1/objects/plain/obj-3?etl_name=upper"
    # Retried: kube-proxy may not have synced the Service yet.
    via_service = wait_for(
        lambda: stack.kubectl("exec", "client", "--", "/echo", "get", svc_url), 120
    )
    assert via_service == "OBJECT 3 ON A REAL NODE"
    stack.kubectl("delete", "pod", "client", "--wait=false")
    # glibc's resolver in a transformer pod too: the full name, and the short one
    # through the pod's search path; the pods' resolv.conf names the kube-dns Service.
    resolve = ("import socket, sys; print(*(socket.gethostbyname(n) for n in sys.argv[1:]), "
               "open('/etc/resolv.conf').read())")  # fmt: skip
    seen = stack.kubectl("exec", transformers[0].metadata.name, "--", "python", "-c", resolve,
                         fqdn, f"{RELEASE}-sluice-gateway").split()  # fmt: skip
    dns = core.read_namespaced_service("kube-dns", "kube-system").spec.cluster_ip
    assert seen[:2] == [service.spec.cluster_ip] * 2, seen
    assert dns in seen[2:] and f"{stack.namespace}.svc.cluster.local" in seen[2:], seen
    events = stack.kubectl("get", "events", "--field-selector=reason=MissingClusterDNS", "-o",
                           "name")  # fmt: skip
    assert events == ""  # the kubelets have a cluster DNS to give pods


def test_wds_etl_is_read_by_webdataset(stack: Stack) -> None:
    apply_etl(stack, etl_yaml("shrink", SHRINK, mode="wds", extra="  decode: pil\n"), "shrink")
    assert_transformers_read_target_files(stack, "shrink")
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


def test_aistore_sdk_jobs_copy_transform_and_dsort_on_the_chart(stack: Stack) -> None:
    """One job of each kind through the official aistore SDK, each followed by Job.wait():
    copy-listrange, etl-listrange (the YAML ETL) and dSort over the chart's targets."""
    apply_etl(stack, UPPER, "upper")
    ais = AisClient(endpoint(stack), token=TOKEN)
    src = ais.bucket("ais-src")
    src.create(exist_ok=True)
    for i in range(6):
        src.object(f"o-{i}.txt").get_writer().put_content(f"object {i}".encode())
    for i in range(3):
        src.object(f"shard-{i:06d}.tar").get_writer().put_content(make_shard(i))
    names = ["o-0.txt", "o-3.txt", "o-5.txt"]
    (copy,) = src.objects(obj_names=names).copy(ais.bucket("ais-copy"))
    etl = src.objects(obj_names=names).transform(ais.bucket("ais-upper"), "upper")
    spec = {
        "extension": ".tar",
        "bck": {"name": "ais-src", "provider": "ais"},
        "input_format": "shard-{000000..000002}",
        "output_format": "sorted-%06d.tar",
        "output_shard_size": "10KB",
        "algorithm": {"kind": "alphanumeric"},
        "output_bck": {"name": "ais-sorted", "provider": "ais"},
    }
    spec_file = Path(tempfile.mkdtemp()) / "spec.json"
    spec_file.write_text(json.dumps(spec))
    dsort = ais.dsort().start(spec_file)
    for job in (copy, etl, dsort):
        result = ais.job(job).wait(timeout=120, verbose=False)
        assert result.success, (job, result)
    for name in names:
        data = src.object(name).get_reader().read_all()
        assert ais.bucket("ais-copy").object(name).get_reader().read_all() == data
        assert ais.bucket("ais-upper").object(name).get_reader().read_all() == data.upper()
    out = [e.name for e in ais.bucket("ais-sorted").list_all_objects()]
    assert out and all(n.startswith("sorted-") for n in out), out
    keys: list[str] = []
    for name in sorted(out):
        data = ais.bucket("ais-sorted").object(name).get_reader().read_all()
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            keys += sorted({m.name.split(".")[0] for m in tar})
    assert keys == sorted(f"s{i:02d}-{j:02d}" for i in range(3) for j in range(5)), keys


def test_boto3_reads_an_etl_view_and_helm_upgrade_keeps_the_keys(stack: Stack) -> None:
    """An S3 key (kept in the chart's Secret) reads an ETL view with boto3; ``helm upgrade
    --reuse-values`` keeps the generated cluster key (redirects and ETL tokens stay
    valid) and the S3 keys."""
    apply_etl(stack, etl_yaml("shrink", SHRINK, mode="wds", extra="  decode: pil\n"), "shrink")
    url, key_at_install = endpoint(stack), stack.cluster_key()
    shard = make_shard(0)
    with Client(url, token=TOKEN, timeout=60) as sdk:
        sdk.bucket("s3src").create().object("shard-00.tar").put_content(shard)
        sdk.bucket("s3view").create(view_of="s3src", etl="shrink")
    made = httpx.post(f"{url}/v1/s3/keys", json={"permission": "read"}, headers=AUTH, timeout=10)
    assert made.status_code == 200, made.text
    key = made.json()
    want = [f"s00-{j:02d}" for j in range(5) if j != 3]  # the ETL dropped sample 3
    assert s3_view_keys(url, key) == want

    stack.helm("upgrade", RELEASE, str(CHART), "--reuse-values", "--wait", "--timeout", "300s")
    assert stack.cluster_key() == key_at_install
    url = endpoint(stack)
    with Client(url, token=TOKEN, timeout=60) as sdk:
        assert sdk.bucket("s3src").object("shard-00.tar").get_bytes() == shard
    assert s3_view_keys(url, key) == want


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


def test_rolling_restart_with_copies_2_loses_no_write(stack: Stack) -> None:
    """``kubectl rollout restart`` of the targets under writers and readers: every
    acknowledged write reads back, no read answers 404."""
    url = endpoint(stack)
    acked: dict[str, str] = {}
    lock, stop = threading.Lock(), threading.Event()
    counts = {"puts": 0, "put_refused": 0, "gets": 0, "get_failed": 0, "404": 0}
    history: dict[str, list[str]] = {}  # every acknowledged version, oldest first
    with Client(url, token=TOKEN, timeout=30, retries=2) as sdk:
        bucket = sdk.bucket("rolling").create(copies=2)
        names = [f"r{i:02d}" for i in range(30)]
        for name in names:
            data = random.randbytes(3000)
            bucket.object(name).put_content(data)
            acked[name] = hashlib.md5(data).hexdigest()
            history[name] = [acked[name]]

        # Each writer has its own names: two writers racing on one name are acknowledged
        # in one order and applied in the other (the last ack is not the last write):
        # the test's race, not a lost write.
        def writer(mine: list[str]) -> None:
            while not stop.is_set():
                name, data = random.choice(mine), random.randbytes(random.randint(100, 30_000))
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
                    history[name].append(acked[name])

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

        threads = [threading.Thread(target=writer, args=(names[k::2],)) for k in (0, 1)]
        threads.append(threading.Thread(target=reader))
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
        read = {n: hashlib.md5(bucket.object(n).get_bytes()).hexdigest() for n in names}
        # a stale read names which acknowledged version came back instead of the last
        lost = {n: f"version {history[n].index(read[n]) + 1} of {len(history[n])}"
                if read[n] in history[n] else "never acknowledged"
                for n in names if read[n] != acked[n]}  # fmt: skip
        assert lost == {}, counts


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


def test_two_operator_replicas_are_active_standby_and_fail_over(stack: Stack) -> None:
    """``helm upgrade --reuse-values --set operator.replicas=2`` (kopf peering): one
    replica reconciles, the other takes over when it goes. The release keeps two
    replicas for the last test."""
    t0, phases = time.monotonic(), {}

    def phase(name: str) -> None:  # seconds since the test began, printed at the end
        phases[name] = round(time.monotonic() - t0)

    stack.kubectl("delete", "etl", "--all", "--wait", "--timeout=120s")
    phase("ETLs deleted")
    targets = stack.apps.read_namespaced_stateful_set(STS, stack.namespace).spec.replicas
    key = stack.cluster_key()
    # No --wait: the KopfPeering hook would come after the replicas (joined ~55 s later).
    stack.helm("upgrade", RELEASE, str(CHART), "--reuse-values", "--set", "operator.replicas=2")
    assert stack.cluster_key() == key
    phase("upgraded")

    def peers() -> dict[str, Any]:
        found = stack.custom.get_namespaced_custom_object(
            "kopf.dev", "v1", stack.namespace, "kopfpeerings", "sluice"
        )
        return dict(found.get("status") or {})

    def both_in_the_peering() -> set[str] | None:
        pods = {p.metadata.name for p in stack.pods("app.kubernetes.io/component=operator")}
        return pods if len(pods) == 2 and set(peers()) >= pods else None

    try:
        # Both replicas announce themselves (POD_ID = pod name), with distinct priorities;
        # the old single replica (no peering) is gone.
        operators = wait_for(both_in_the_peering, 180)
        priorities = {pod: info["priority"] for pod, info in peers().items() if pod in operators}
        assert len(set(priorities.values())) == 2, priorities
        active = max(priorities, key=lambda pod: priorities[pod])
        phase("both peering")
        (standby,) = operators - {active}

        apply_etl(stack, UPPER, "upper", targets)
        assert len(stack.pods("sluice.dev/etl=upper")) == targets
        assert f"created {targets} transformer pods" in stack.kubectl("logs", active)
        # The standby never acted (whether it logs kopf's "Pausing operations"
        # depends on which replica started first).
        assert "transformer pods" not in stack.kubectl("logs", standby)
        assert operator_log_problems(stack, active) == []
        phase("ETL 1 Running")

        # The active replica goes (a clean exit: kopf removes it from the peering at
        # once); the standby, or the Deployment's new pod if it drew a higher
        # priority, reconciles what comes next.
        stack.kubectl("delete", "pod", active, "--wait=false")
        wait_for(lambda: active not in peers(), 120)
        phase("active gone")
        apply_etl(stack, etl_yaml("lower", "def transform(data):\n    return data.lower()"),
                  "lower", targets)  # fmt: skip
        assert len(stack.pods("sluice.dev/etl=lower")) == targets
        phase("ETL 2 Running")
        # ... and a spec change of the first one rolls out.
        stack.kubectl("patch", "etl", "upper", "--type=merge", "-p", '{"spec":{"workers":2}}')

        def observed() -> bool:
            etls = stack.etls()
            return len(etls) == 2 and all(
                (e.get("status") or {}).get("observedGeneration") == e["metadata"]["generation"]
                and e["status"]["phase"] == "Running"
                for e in etls
            )

        wait_for(observed, 180)
        phase("spec change observed")
        url = endpoint(stack, targets)
        with Client(url, token=TOKEN, timeout=60) as sdk:
            obj = sdk.bucket("failover").create().object("f")
            obj.put_content(b"Fail Over")
            assert obj.get_bytes(etl_name="upper") == b"FAIL OVER"
            assert obj.get_bytes(etl_name="lower") == b"fail over"
        stack.kubectl("delete", "etl", "upper", "lower", "--wait", "--timeout=120s")
        for pod in stack.ready_pods("app.kubernetes.io/component=operator"):
            assert operator_log_problems(stack, pod.metadata.name) == []
        phase("ETLs finalized")
    except BaseException:
        print(stack.diagnostics())
        raise
    finally:
        print("operator fail-over, seconds:", phases)


def test_helm_uninstall_leaves_only_the_claims(stack: Stack) -> None:
    """Last in the module. The operator finalizes an ETL (its pods and token Secret)
    before it goes; then ``helm uninstall`` removes everything of the release but the
    targets' claims, which hold the data."""
    targets = stack.apps.read_namespaced_stateful_set(STS, stack.namespace).spec.replicas
    apply_etl(stack, UPPER, "upper", targets)
    stack.kubectl("delete", "etl", "upper", "--wait", "--timeout=120s")
    assert not stack.etls() and not stack.pods("sluice.dev/etl")
    stack.helm("uninstall", RELEASE, "--wait", "--timeout", "120s")
    try:
        wait_for(lambda: not leftovers(stack), 120)
    except BaseException:
        print("helm uninstall left", leftovers(stack), stack.diagnostics())
        raise
    core = stack.cluster.core
    claims = core.list_namespaced_persistent_volume_claim(stack.namespace).items
    assert sorted(c.metadata.name for c in claims) == [f"data-{STS}-{i}" for i in range(targets)]
    # operator.replicas=2 (the previous test) made the release install kopf's CRD: gone too.
    crds = client.ApiextensionsV1Api(stack.cluster.api_client).list_custom_resource_definition()
    assert "kopfpeerings.kopf.dev" not in {c.metadata.name for c in crds.items}
