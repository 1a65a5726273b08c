"""An AIStore-style ETL image as a Sluice ETL on real nodes (issue 24).

A storage target from ``make images``'s server image on a real node (containerd,
runc, pod network), the operator as a local process (as ``tests/operator``
runs it), and an ETL applied as YAML whose ``spec.image`` is the user's own
hpush server (``tests/images/hpush_echo``, imported into the node's
containerd): the operator runs it as the transformer pod beside the target,
under the chart's securityContext, and a GET through the target comes back
transformed by it.
"""

from __future__ import annotations

import base64
import hashlib
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml

from tests.images.build import ImageUnavailable, image
from tests.k8s.cluster import ROOT, TARGET_BINDING, TARGET_ROLE, target_pod
from tests.k8s.realfixtures import RealNodes
from tests.k8s.realnode import images_index, sluice_image
from tests.k8s.test_realnode import apply, pod_ip, wait_ready
from tests.k8s.waiting import wait_for
from tests.operator.harness import OperatorProcess

pytestmark = [pytest.mark.k8s, pytest.mark.realnode]

CLUSTER_KEY = "k" * 64
ETL_YAML = """
apiVersion: sluice.dev/v1alpha1
kind: ETL
metadata:
  name: echo-img
spec:
  commType: "hpush://"
  image: {image}
"""


def test_an_etl_image_serves_gets_through_a_target_on_a_real_node(
    real_cluster: RealNodes, real_namespace: str, tmp_path: Path
) -> None:
    # Fails, never skips (as tests/helm/realstack.py): `make test` builds the images.
    server = sluice_image("server")
    if server is None:
        pytest.fail(f"no server image archive listed in {images_index()}: run `make images`")
    try:
        echo = image("hpush_echo")
    except ImageUnavailable as e:
        pytest.fail(f"cannot build the test ETL image: {e}")
    assert real_cluster.real is not None
    archive = tmp_path / "hpush-echo.tar"
    subprocess.run(
        ["podman", "save", "--quiet", "--format", "docker-archive", "-o", str(archive), echo],
        check=True,
        timeout=300,
    )
    node = real_cluster.real.node_list[1]
    node.ctr("images", "import", str(server[1]), timeout=600)
    node.ctr("images", "import", str(archive), timeout=600)

    ns = real_namespace
    real_cluster.kubectl("apply", "-f", str(ROOT / "crds"))
    binding = {**TARGET_BINDING, "subjects": [{**TARGET_BINDING["subjects"][0], "namespace": ns}]}
    values = yaml.safe_load((ROOT / "helm/sluice/values.yaml").read_text())
    pod = target_pod(0, "node-1", server[0])
    pod["spec"]["securityContext"] = values["podSecurityContext"]
    pod["spec"]["volumes"].append({"name": "tmp", "emptyDir": {}})
    container = pod["spec"]["containers"][0]
    container["imagePullPolicy"] = "Never"
    container["securityContext"] = values["containerSecurityContext"]
    container["volumeMounts"].append({"name": "tmp", "mountPath": "/tmp"})
    key = base64.b64encode(CLUSTER_KEY.encode()).decode()
    apply(real_cluster, ns,
          {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "sluice-cluster"},
           "data": {"cluster-key": key}},
          {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "sluice-target"}},
          TARGET_ROLE, binding, pod)  # fmt: skip
    wait_ready(real_cluster, ns, "target-0")
    url = f"http://{pod_ip(real_cluster, ns, 'target-0')}:8080"
    created = httpx.post(f"{url}/v1/buckets/bkt1", json={"action": "create-bck"}, timeout=30)
    assert created.status_code == 200, created.text
    put = httpx.put(f"{url}/v1/objects/bkt1/hello.txt", content=b"real node", timeout=30)
    assert put.status_code == 200, put.text

    operator = OperatorProcess(real_cluster.kubeconfig, ns, CLUSTER_KEY).start()
    try:
        manifest = tmp_path / "etl.yaml"
        manifest.write_text(ETL_YAML.format(image=echo))
        real_cluster.kubectl("-n", ns, "apply", "-f", str(manifest))

        def running() -> bool:
            got = real_cluster.kubectl("-n", ns, "get", "etl", "echo-img", "-o", "yaml").stdout
            status = (yaml.safe_load(got) or {}).get("status") or {}
            return status.get("phase") == "Running" and status.get("ready") == "1/1"

        wait_for(running, timeout=180)

        def transformed(args: dict[str, str]) -> bytes:
            r = httpx.get(
                f"{url}/v1/objects/bkt1/hello.txt",
                params={"etl_name": "echo-img", **args},
                timeout=60,
                follow_redirects=True,
            )
            assert r.status_code == 200, r.text
            return r.content

        assert transformed({}) == b"REAL NODE"
        assert transformed({"etl_args": "md5"}) == hashlib.md5(b"real node").hexdigest().encode()
        pods = real_cluster.core.list_namespaced_pod(ns, label_selector="sluice.dev/etl").items
        (tf,) = [p.metadata.name for p in pods]
        probe = "import os; print(os.getuid(), os.access('/', os.W_OK))"
        who = real_cluster.kubectl("-n", ns, "exec", tf, "--", "python3", "-c", probe)
        assert who.stdout.split() == ["10001", "False"]  # the chart's securityContext holds
        real_cluster.kubectl("-n", ns, "delete", "etl", "echo-img")

        def gone() -> bool:
            pods = real_cluster.core.list_namespaced_pod(ns, label_selector="sluice.dev/etl")
            return not pods.items

        wait_for(gone, timeout=120)
    finally:
        operator.stop()
        print(f"--- operator log tail ---\n{operator.tail()}")
