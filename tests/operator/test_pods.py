"""The transformer pod and token Secret the operator creates (no cluster needed)."""

from __future__ import annotations

import base64
import json
from typing import Any

from etl_operator import pods
from etl_runtime.cluster.reconcile import transformer_name
from etl_runtime.cluster.records import TargetInfo
from etl_runtime.core.spec import EtlSpec

REF = pods.EtlRef(name="reverse", namespace="ns1", uid="uid-1")
SPEC = EtlSpec.from_dict(
    {
        "mode": "object",
        "code": {"source": "def transform(d):\n    return d[::-1]\n"},
        "env": {"GREETING": "hi", "SLUICE_ETL_NAME": "evil"},
        "resources": {"limits": {"cpu": "1", "memory": "512Mi"}},
    }
)
TARGET = TargetInfo(id="target-0", url="http://10.0.0.5:8080", node="node-a")


def build(spec: EtlSpec = SPEC, **kw) -> dict:
    return pods.transformer_pod(REF, spec, TARGET, image="img:1", with_token=True, **kw)


def env_of(pod: dict) -> dict:
    return {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}


def test_pod_is_pinned_owned_labelled_and_named_by_spec_hash():
    pod = build()
    meta = pod["metadata"]
    assert meta["name"] == pods.pod_name("reverse", "target-0", SPEC.content_hash())
    assert meta["name"].startswith(transformer_name("reverse", "target-0"))
    assert meta["labels"]["sluice.dev/etl"] == "reverse"
    assert meta["labels"]["sluice.dev/target"] == "target-0"
    assert meta["labels"]["app.kubernetes.io/managed-by"] == "sluice-operator"
    assert meta["annotations"]["sluice.dev/spec-hash"] == SPEC.content_hash()
    (owner,) = meta["ownerReferences"]
    assert owner == {
        "apiVersion": "sluice.dev/v1alpha1",
        "kind": "ETL",
        "name": "reverse",
        "uid": "uid-1",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    assert pod["spec"]["nodeName"] == "node-a"


def test_new_spec_gets_a_new_pod_name_so_old_keeps_serving():
    other = EtlSpec.from_dict({"code": {"source": "def transform(d):\n    return d\n"}})
    assert build()["metadata"]["name"] != build(other)["metadata"]["name"]
    assert build()["metadata"]["name"] == build()["metadata"]["name"]


def test_long_names_stay_valid_dns_labels():
    name = pods.pod_name("e" * 53, "t" * 60, "abcdef0123")
    assert len(name) <= 63 and name[-1].isalnum()
    assert pods.label_value("x" * 80) != pods.label_value("x" * 81)
    assert len(pods.label_value("x" * 80)) <= 63


def test_container_contract_command_env_probe_security():
    pod = build()
    (c,) = pod["spec"]["containers"]
    assert c["image"] == "img:1"
    assert c["command"] == ["sluice-transformer", "--host", "$(POD_IP)", "--port", "8000"]
    env = env_of(pod)
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert EtlSpec.from_dict(__import__("json").loads(env["SLUICE_ETL_SPEC"]["value"])) == SPEC
    assert env["SLUICE_ETL_NAME"]["value"] == "reverse"  # spec.env cannot override it
    assert env["GREETING"]["value"] == "hi"
    assert env["SLUICE_ETL_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": pods.secret_name("reverse"),
        "key": "token",
    }
    deps_mount = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}["deps"]
    assert env["SLUICE_DEPS_DIR"]["value"] == deps_mount
    assert {"name": "deps", "emptyDir": {}} in pod["spec"]["volumes"]
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": 8000}
    assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert c["resources"] == {"limits": {"cpu": "1", "memory": "512Mi"}}
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] and sc["runAsNonRoot"]
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
    assert pod["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert pod["spec"]["restartPolicy"] == "Never"


def test_spec_image_wins_and_no_token_without_cluster_key():
    spec = EtlSpec.from_dict({"code": {"source": "x=1"}, "image": "mine:2"})
    pod = pods.transformer_pod(REF, spec, TARGET, image="img:1", with_token=False)
    assert pod["spec"]["containers"][0]["image"] == "mine:2"
    assert "SLUICE_ETL_TOKEN" not in env_of(pod)


def test_fqn_mounts_target_volumes_read_only():
    spec = EtlSpec.from_dict({"code": {"source": "x=1"}, "argType": "fqn"})
    target_pod = {
        "spec": {
            "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "data-target-0"}},
                {"name": "scratch", "emptyDir": {}},
            ],
            "containers": [
                {
                    "volumeMounts": [
                        {"name": "data", "mountPath": "/data"},
                        {"name": "scratch", "mountPath": "/scratch"},
                    ]
                }
            ],
        }
    }
    pod = build(spec, target_pod=target_pod)
    mounts = pod["spec"]["containers"][0]["volumeMounts"]
    assert {
        "name": "target-data",
        "mountPath": "/data/buckets",
        "subPath": "buckets",
        "readOnly": True,
    } in mounts
    assert all(m["mountPath"] != "/scratch" for m in mounts)
    vol = next(v for v in pod["spec"]["volumes"] if v["name"] == "target-data")
    assert vol["persistentVolumeClaim"] == {"claimName": "data-target-0", "readOnly": True}


def test_an_aistore_class_etl_runs_in_the_runtime_with_the_targets_files():
    """What the gateway makes of init_class(direct_file_access=True): the runtime
    image (never an AIStore one), the class in SLUICE_ETL_SPEC, the data mounted."""
    spec = EtlSpec.from_dict(
        {
            "code": {"aisClass": "Y2xhc3M=", "pythonVersion": "3.11"},
            "argType": "fqn",
            "env": {"ETL_DIRECT_FQN": "true"},
            "workers": 2,
        }
    )
    target_pod = {
        "spec": {
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "d-0"}}],
            "containers": [{"volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
        }
    }
    pod = build(spec, target_pod=target_pod)
    (container,) = pod["spec"]["containers"]
    assert container["image"] == "img:1"
    env = env_of(pod)
    assert EtlSpec.from_dict(json.loads(env["SLUICE_ETL_SPEC"]["value"])) == spec
    assert env["ETL_DIRECT_FQN"]["value"] == "true"
    assert {
        "name": "target-data",
        "mountPath": "/data/buckets",
        "subPath": "buckets",
        "readOnly": True,
    } in (container["volumeMounts"])


def test_token_secret_is_owned_and_round_trips():
    secret = pods.token_secret(REF, "s3cret")
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert base64.b64decode(secret["data"]["token"]) == b"s3cret"
    assert pods.secret_token(secret) == "s3cret"


def test_operator_defaults_apply_and_spec_resources_and_image_win():
    plain = EtlSpec.from_dict({"code": {"source": "x=1"}})
    defaults = {"requests": {"cpu": "500m"}, "limits": {"memory": "2Gi"}}
    kw: dict[str, Any] = {
        "resources": defaults,
        "pull_policy": "Always",
        "pull_secrets": ("regcred", "other"),
    }
    pod = pods.transformer_pod(REF, plain, TARGET, image="img:1", with_token=False, **kw)
    c = pod["spec"]["containers"][0]
    assert c["image"] == "img:1"
    assert c["resources"] == defaults
    assert c["imagePullPolicy"] == "Always"
    assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}, {"name": "other"}]
    # spec.resources replaces the default document as a whole; spec.image the image.
    own = EtlSpec.from_dict({"code": {"source": "x=1"}, "image": "mine:2", **_RES})
    c = pods.transformer_pod(REF, own, TARGET, image="img:1", with_token=False, **kw)["spec"][
        "containers"
    ][0]
    assert c["resources"] == _RES["resources"] and c["image"] == "mine:2"
    assert c["imagePullPolicy"] == "Always"
    # No defaults: no resources, IfNotPresent, no pull secrets.
    bare = pods.transformer_pod(REF, plain, TARGET, image="img:1", with_token=False)
    assert "resources" not in bare["spec"]["containers"][0]
    assert bare["spec"]["containers"][0]["imagePullPolicy"] == "IfNotPresent"
    assert "imagePullSecrets" not in bare["spec"]


_RES = {"resources": {"limits": {"cpu": "1"}}}


def test_pod_carries_prometheus_scrape_annotations_for_its_own_port():
    pod = build()
    ann = pod["metadata"]["annotations"]
    port = pod["spec"]["containers"][0]["ports"][0]["containerPort"]
    assert ann["prometheus.io/scrape"] == "true"
    assert ann["prometheus.io/port"] == str(port)
    assert ann["prometheus.io/path"] == "/metrics"


IMAGE_SPEC = EtlSpec.from_dict(
    {
        "commType": "hpush://",
        "image": "me/md5-etl:1",
        "command": ["python3", "/app/server.py"],
        "env": {"MODE": "x", "AIS_TARGET_URL": "not-mine"},
    }
)


def test_an_aistore_style_image_is_the_transformer_container_as_aistore_makes_it():
    pod = build(IMAGE_SPEC, share_target_data=True, pull_policy="Never")
    (c,) = pod["spec"]["containers"]
    assert c["image"] == "me/md5-etl:1" and c["imagePullPolicy"] == "Never"
    assert c["command"] == ["python3", "/app/server.py"]
    assert c["ports"][0]["containerPort"] == 8000
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": 8000}
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["AIS_TARGET_URL"] == "http://10.0.0.5:8080" and env["DIRECT_PUT"] == "false"
    assert env["MODE"] == "x" and not any(k.startswith("SLUICE_") for k in env)
    # no token, no target data (targets push the bytes), no /metrics to scrape
    assert c["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["tmp"]
    assert "prometheus.io/scrape" not in pod["metadata"]["annotations"]
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["spec"]["securityContext"]["runAsUser"] == 10001
    # its own entrypoint when the init message names no command
    bare = EtlSpec.from_dict({"commType": "hpush://", "image": "me/md5-etl:1"})
    assert "command" not in build(bare)["spec"]["containers"][0]
