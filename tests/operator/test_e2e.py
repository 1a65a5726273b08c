"""The operator end to end: a real kube-apiserver, the process kubelet, real pods.

One namespace with three storage target pods (one per fake node) and the
operator running as its own process serves every test in this module; each
test applies its own ETL the way a user would (``kubectl apply``) and checks
what a user would see: ``kubectl get etl``, pods, and objects transformed
through a target. Needs ``make k8s-tools`` (the fixtures fail, not skip,
without the binaries).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest

from etl_runtime.cluster.reconcile import MAX_RESTARTS
from tests.operator.harness import (
    CRD,
    GROUP,
    PLURAL,
    REVERSE_YAML,
    VERSION,
    OperatorProcess,
    SluiceNamespace,
    wait_for,
)

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def sluice(control_plane, kubelet) -> Iterator[SluiceNamespace]:  # noqa: F811
    control_plane.kubectl("apply", "-f", str(CRD))
    control_plane.kubectl("wait", "--for=condition=Established", "crd/etls.sluice.dev")
    ns = f"op-{uuid.uuid4().hex[:6]}"
    control_plane.core.create_namespace({"metadata": {"name": ns}})
    env = SluiceNamespace(control_plane.api_client, control_plane.kubectl, ns).setup()
    for i in range(3):
        env.add_target(f"target-{i}", f"node-{i}")
    operator = OperatorProcess(control_plane.kubeconfig, ns, env.cluster_key).start()
    env.operator = operator  # type: ignore[attr-defined]
    try:
        wait_for("3 ready targets", lambda: len(env.ready_targets()) == 3, timeout=90)
        yield env
    finally:
        operator.stop()
        print(f"--- operator log tail ---\n{operator.tail()}")
        control_plane.core.delete_namespace(ns)


def put_object(env: SluiceNamespace, target: str, bucket: str, obj: str, data: bytes) -> None:
    url = env.target_url(target)
    httpx.post(f"{url}/v1/buckets/{bucket}", json={"action": "create-bck"}).raise_for_status()
    httpx.put(f"{url}/v1/objects/{bucket}/{obj}", content=data).raise_for_status()


def get_transformed(env: SluiceNamespace, target: str, path: str, etl: str) -> httpx.Response:
    return httpx.get(f"{env.target_url(target)}/v1/objects/{path}?etl_name={etl}", timeout=30)


def test_invalid_specs_are_rejected_by_the_apiserver(sluice):
    bad_mode = REVERSE_YAML.format(name="bad-mode").replace("mode: object", "mode: shards")
    done = sluice.apply(bad_mode, check=False)
    assert done.returncode != 0 and 'spec.mode: Unsupported value: "shards"' in done.stderr
    both = REVERSE_YAML.format(name="both") + '    pickled: "gASV"\n    pythonVersion: "3.11"\n'
    done = sluice.apply(both, check=False)
    assert done.returncode != 0
    assert "spec.code needs exactly one of 'pickled' or 'source'" in done.stderr
    no_version = REVERSE_YAML.format(name="nover").replace(
        '    source: "def transform(data):\\n    return data[::-1]\\n"\n', '    pickled: "gASV"\n'
    )
    done = sluice.apply(no_version, check=False)
    assert done.returncode != 0 and "pythonVersion is required" in done.stderr
    long_name = REVERSE_YAML.format(name="x" * 60)
    done = sluice.apply(long_name, check=False)
    assert done.returncode != 0 and "1-53 lowercase letters" in done.stderr


IMAGE_ETL_YAML = """
apiVersion: sluice.dev/v1alpha1
kind: ETL
metadata:
  name: {name}
spec:
  commType: "hpush://"
  image: localhost/me/md5-etl:1
  command: [python3, /app/server.py]
  env:
    MODE: x
"""


def test_an_aistore_style_image_gets_transformer_pods_of_that_image(sluice):
    sluice.apply(IMAGE_ETL_YAML.format(name="md5-image"))

    def three() -> list | None:
        pods = sluice.transformers("md5-image")
        return pods if len(pods) == 3 else None

    for pod in wait_for("3 transformer pods of the image", three, timeout=120):
        (c,) = pod["spec"]["containers"]
        assert c["image"] == "localhost/me/md5-etl:1"
        assert c["command"] == ["python3", "/app/server.py"]
        assert c["readinessProbe"]["httpGet"]["path"] == "/health"
        assert c["readinessProbe"]["httpGet"]["port"] == 8000
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["DIRECT_PUT"] == "false" and env["MODE"] == "x"
        assert env["AIS_TARGET_URL"].startswith("http://")
        assert not any(k.startswith("SLUICE_") for k in env)
    # the CRD's rules: an image ETL needs the image; any other needs code
    no_image = IMAGE_ETL_YAML.format(name="no-image").replace(
        "  image: localhost/me/md5-etl:1\n", ""
    )
    done = sluice.apply(no_image, check=False)
    assert done.returncode != 0 and "spec.commType hpush:// needs spec.image" in done.stderr
    no_code = IMAGE_ETL_YAML.format(name="no-code").replace('  commType: "hpush://"\n', "")
    done = sluice.apply(no_code, check=False)
    assert done.returncode != 0 and "spec.code is required" in done.stderr
    sluice.kubectl("delete", "etl", "md5-image", "-n", sluice.ns)
    wait_for("md5-image's pods gone", lambda: not sluice.transformers("md5-image"), timeout=120)


def test_kubectl_explain_describes_the_spec(control_plane, sluice):
    out = control_plane.kubectl("explain", "etl.spec").stdout
    assert "pickled (written by the SDK)" in out and "targetSelector" in out
    out = control_plane.kubectl("explain", "etl.status.transformers").stdout
    assert "endpoint" in out and "http://<pod IP>:8000" in out


def test_reverse_etl_serves_transformed_objects(control_plane, sluice):
    sluice.apply(REVERSE_YAML.format(name="reverse"))
    status = sluice.wait_phase("reverse", "Running", "3/3")
    table = control_plane.kubectl("get", "etl", "-n", sluice.ns).stdout
    row = next(line for line in table.splitlines() if line.startswith("reverse "))
    assert row.split()[:4] == ["reverse", "Running", "3/3", "object"], table
    pods = sluice.transformers("reverse")
    assert sorted(p["spec"]["nodeName"] for p in pods) == ["node-0", "node-1", "node-2"]
    by_target = {t["target"]: t for t in status["transformers"]}
    assert set(by_target) == {"target-0", "target-1", "target-2"}
    assert all(t["ready"] and t["endpoint"].endswith(":8000") for t in by_target.values())
    secret = control_plane.core.read_namespaced_secret("sluice-etl-reverse-token", sluice.ns)
    assert secret.metadata.owner_references[0].kind == "ETL"

    put_object(sluice, "target-1", "books", "hello.txt", b"hello, sluice")
    r = get_transformed(sluice, "target-1", "books/hello.txt", "reverse")
    assert r.status_code == 200, r.text
    assert r.content == b"hello, sluice"[::-1]


def test_deleted_transformer_pod_is_recreated(sluice):
    sluice.apply(REVERSE_YAML.format(name="heal"))
    sluice.wait_phase("heal", "Running", "3/3")
    victim = next(p for p in sluice.transformers("heal") if p["spec"]["nodeName"] == "node-2")
    sluice.delete_pod(victim["metadata"]["name"])
    wait_for(
        "a new transformer on node-2",
        lambda: any(
            p["spec"]["nodeName"] == "node-2" and p["metadata"]["uid"] != victim["metadata"]["uid"]
            for p in sluice.transformers("heal")
        ),
    )
    sluice.wait_phase("heal", "Running", "3/3")
    assert len(sluice.transformers("heal")) == 3


def test_spec_change_replaces_pods_and_keeps_serving(sluice):
    sluice.apply(REVERSE_YAML.format(name="roll"))
    sluice.wait_phase("roll", "Running", "3/3")
    put_object(sluice, "target-0", "roll", "o", b"abc")
    old_names = {p["metadata"]["name"] for p in sluice.transformers("roll")}
    failures: list[str] = []
    results: set[bytes] = set()
    stop = threading.Event()

    def keep_reading() -> None:
        while not stop.is_set():
            r = get_transformed(sluice, "target-0", "roll/o", "roll")
            if r.status_code != 200:
                failures.append(f"{r.status_code} {r.text}")
            else:
                results.add(r.content)
            time.sleep(0.05)

    reader = threading.Thread(target=keep_reading, daemon=True)
    reader.start()
    try:
        sluice.patch_spec(
            "roll",
            {
                "code": {
                    "entrypoint": "transform",
                    "source": "def transform(d):\n    return d.upper()\n",
                }
            },
        )
        wait_for(
            "all transformers replaced",
            lambda: (
                {p["metadata"]["name"] for p in sluice.transformers("roll")}.isdisjoint(old_names)
                and len(sluice.transformers("roll")) == 3
            ),
            timeout=90,
        )
        sluice.wait_phase("roll", "Running", "3/3")
        wait_for(
            "new code served",
            lambda: get_transformed(sluice, "target-0", "roll/o", "roll").content == b"ABC",
        )
    finally:
        stop.set()
        reader.join()
    assert not failures, failures[:5]
    assert results <= {b"cba", b"ABC"}
    hashes = {
        p["metadata"]["annotations"]["sluice.dev/spec-hash"] for p in sluice.transformers("roll")
    }
    assert hashes == {sluice.status("roll")["specHash"]}


def test_stop_and_start(sluice):
    sluice.apply(REVERSE_YAML.format(name="pause"))
    sluice.wait_phase("pause", "Running", "3/3")
    sluice.patch_spec("pause", {"stopped": True})
    sluice.wait_phase("pause", "Stopped")
    wait_for("transformer pods gone", lambda: not sluice.pods("sluice.dev/etl=pause"))
    put_object(sluice, "target-0", "pause", "o", b"abc")
    assert get_transformed(sluice, "target-0", "pause/o", "pause").status_code == 409
    sluice.patch_spec("pause", {"stopped": False})
    sluice.wait_phase("pause", "Running", "3/3")
    assert get_transformed(sluice, "target-0", "pause/o", "pause").content == b"cba"


def test_code_that_does_not_load_is_an_error_not_a_crash_loop(sluice):
    bad = REVERSE_YAML.format(name="broken").replace(
        "return data[::-1]", "return data[::-1]\\nraise RuntimeError('no config file here')"
    )
    sluice.apply(bad)
    status = sluice.wait_phase("broken", "Error")
    assert "no config file here" in status["message"], status
    uids = {p["metadata"]["uid"] for p in sluice.pods("sluice.dev/etl=broken")}
    time.sleep(6)  # a crash loop would replace pods within this time
    assert {p["metadata"]["uid"] for p in sluice.pods("sluice.dev/etl=broken")} == uids
    assert sluice.status("broken")["phase"] == "Error"


def test_dependencies_that_fail_to_install_are_an_error(sluice):
    yaml_text = REVERSE_YAML.format(name="deps") + (
        "  dependencies: ['sluice-no-such-package==0.0.1']\n"
        "  env:\n"
        "    PIP_INDEX_URL: http://127.0.0.1:9/simple\n"
        "    PIP_RETRIES: '0'\n"
    )
    sluice.apply(yaml_text)
    status = sluice.wait_phase("deps", "Error", timeout=120)
    assert "sluice-no-such-package" in status["message"] or "depend" in status["message"], status


def test_transformer_not_ready_within_init_seconds_is_restarted_then_error(sluice):
    """As in the local cluster: a pod stuck not-ready past initSeconds is replaced
    (restart counted), and after MAX_RESTARTS the ETL is Error.

    The transformer enforces initSeconds on its own start-up; what only the
    operator sees is a pod that never starts (image pull back-off, a node that
    does not run it). Here: a target bound to a node no kubelet serves, so its
    transformer pod stays Pending.
    """
    ghost = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "ghost-target", "labels": {"tier": "ghost"}},
        "spec": {"nodeName": "no-such-node", "containers": [{"name": "c", "image": "x"}]},
    }
    sluice.core.create_namespaced_pod(sluice.ns, ghost)
    sluice.apply(
        REVERSE_YAML.format(name="stuck")
        + "  targetSelector: {tier: ghost}\n  timeouts: {initSeconds: 2}\n"
    )
    try:
        status = sluice.wait_phase("stuck", "Error", timeout=150)
        assert "not ready after 2s (initSeconds)" in status["message"], status
        (pod,) = sluice.transformers("stuck")
        assert pod["metadata"]["annotations"]["sluice.dev/restarts"] == str(MAX_RESTARTS)
        assert pod["spec"]["nodeName"] == "no-such-node"
    finally:
        # No kubelet will confirm a graceful deletion on that node.
        sluice.crs.delete_namespaced_custom_object(GROUP, VERSION, sluice.ns, PLURAL, "stuck")
        for p in sluice.pods("tier=ghost") + sluice.pods("sluice.dev/etl=stuck"):
            sluice.core.delete_namespaced_pod(
                p["metadata"]["name"], sluice.ns, grace_period_seconds=0
            )
        wait_for("the ETL to be finalized", lambda: sluice.etl("stuck") is None, timeout=60)


def test_targets_added_moved_and_removed(sluice):
    sluice.apply(REVERSE_YAML.format(name="follow"))
    sluice.wait_phase("follow", "Running", "3/3")
    sluice.add_target("target-3", "node-0")
    sluice.wait_phase("follow", "Running", "4/4")

    def transformer_node(target: str) -> str | None:
        for p in sluice.transformers("follow"):
            if p["metadata"]["labels"]["sluice.dev/target"] == target:
                return str(p["spec"]["nodeName"])
        return None

    assert transformer_node("target-3") == "node-0"
    # "Move" target-3: a new pod of that name on another node.
    sluice.delete_pod("target-3")
    wait_for(
        "target-3 gone",
        lambda: all(
            p["metadata"]["name"] != "target-3" for p in sluice.pods("sluice.dev/role=target")
        ),
    )
    sluice.wait_phase("follow", "Running", "3/3")
    assert transformer_node("target-3") is None
    sluice.add_target("target-3", "node-1")
    sluice.wait_phase("follow", "Running", "4/4")
    assert transformer_node("target-3") == "node-1"
    sluice.delete_pod("target-3")
    sluice.wait_phase("follow", "Running", "3/3")
    wait_for("transformer of target-3 gone", lambda: transformer_node("target-3") is None)


def test_deleting_the_etl_removes_pods_and_secret(control_plane, sluice):
    sluice.apply(REVERSE_YAML.format(name="bye"))
    sluice.wait_phase("bye", "Running", "3/3")
    control_plane.kubectl("delete", "etl", "bye", "-n", sluice.ns, "--wait=true", "--timeout=60s")
    assert sluice.etl("bye") is None
    wait_for("pods gone", lambda: not sluice.pods("sluice.dev/etl=bye"), timeout=30)
    secrets = control_plane.core.list_namespaced_secret(sluice.ns).items
    assert "sluice-etl-bye-token" not in {s.metadata.name for s in secrets}


def test_events_tell_the_story_of_an_etl(control_plane, sluice):
    sluice.apply(REVERSE_YAML.format(name="story"))
    sluice.wait_phase("story", "Running", "3/3")
    sluice.patch_spec(
        "story",
        {"code": {"entrypoint": "transform", "source": "raise RuntimeError('story breaks')\n"}},
    )
    sluice.wait_phase("story", "Error")

    def events() -> list[dict]:
        done = control_plane.kubectl(
            "get", "events", "-n", sluice.ns, "--field-selector",
            "involvedObject.kind=ETL,involvedObject.name=story", "-o", "json",
        )  # fmt: skip
        return json.loads(done.stdout)["items"]

    def reasons() -> list[str]:
        return [e["reason"] for e in sorted(events(), key=lambda e: e["metadata"]["name"])]

    wait_for("Error event", lambda: "Error" in reasons(), timeout=30)
    got = events()
    assert {"Created", "TransformerReady", "TransformerFailed", "Error"} <= set(reasons())
    assert sum(e["reason"] == "TransformerReady" for e in got) == 3
    failed = next(e for e in got if e["reason"] == "TransformerFailed")
    assert failed["type"] == "Warning" and "story breaks" in failed["message"]
    described = control_plane.kubectl("describe", "etl", "story", "-n", sluice.ns).stdout
    assert "TransformerFailed" in described and "story breaks" in described

    control_plane.kubectl("delete", "etl", "story", "-n", sluice.ns, "--timeout=60s")
    wait_for("Deleted event", lambda: "Deleted" in reasons(), timeout=30)


def test_operator_killed_mid_way_converges_without_duplicates(sluice):
    operator: OperatorProcess = sluice.operator  # type: ignore[attr-defined]
    sluice.apply(REVERSE_YAML.format(name="restart"))
    wait_for("first transformer pod", lambda: sluice.pods("sluice.dev/etl=restart"), timeout=30)
    operator.kill()
    sluice.delete_pod(sluice.pods("sluice.dev/etl=restart")[0]["metadata"]["name"])
    operator.start()
    sluice.wait_phase("restart", "Running", "3/3")
    pods = sluice.transformers("restart")
    targets = sorted(p["metadata"]["labels"]["sluice.dev/target"] for p in pods)
    assert targets == ["target-0", "target-1", "target-2"], targets
