"""The chart renders, lints and wires its parts together as the architecture says.

Each test renders ``helm/sluice`` with the real ``helm template`` and checks
what an operator of the cluster would rely on: the processes run with the
contract's flags and env, Services select the right pods, storage survives,
pods are locked down, and a typo in values is refused.
"""

from __future__ import annotations

import base64
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helm.chart import (
    CHART,
    COMPONENTS,
    REPO,
    Manifest,
    container,
    env_of,
    helm,
    pod_spec,
    render,
    set_args,
)

COMBOS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "token-peering-lb": {
        "auth.token": "s3cret",
        "operator.replicas": 2,
        "gateway.service.type": "LoadBalancer",
        "gateway.service.loadBalancerSourceRanges": ["10.0.0.0/8"],
        "target.replicas": 5,
        "target.storage.storageClassName": "fast-ssd",
        "target.storage.size": "500Gi",
        "target.nodeSelector": {"disk": "nvme"},
        "target.tolerations": [{"key": "storage", "operator": "Exists", "effect": "NoSchedule"}],
        "target.podAntiAffinity": "hard",
    },
    "existing-secrets-no-netpol": {
        "auth.existingSecret": "my-token",
        "auth.existingSecretKey": "value",
        "clusterKey.existingSecret": "my-key",
        "networkPolicy.enabled": False,
        "gateway.service.type": "NodePort",
        "gateway.service.nodePort": 30080,
        "operator.peering.enabled": True,
        "etl.shareTargetData": False,
    },
    "registry-digest-resources": {
        "images.registry": "registry.example.com/ml",
        "images.tag": "1.2.3",
        "images.pullSecrets": ["regcred"],
        "images.runtime.digest": "sha256:" + "a" * 64,
        "transformer.resources.limits": {"cpu": "4", "memory": "8Gi"},
        "transformer.imagePullPolicy": "Always",
        "transformer.imagePullSecrets": ["regcred", "gpu-registry"],
        "etl.redirectBytes": 4194304,
        "networkPolicy.transformerClients": [{"podSelector": {"matchLabels": {"ml": "trainer"}}}],
        "gateway.affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                    ]
                }
            }
        },
        "fullnameOverride": "sluice",
        "listenAddress": "0.0.0.0",
    },
}


@pytest.fixture(scope="module", params=sorted(COMBOS))
def combo(request: pytest.FixtureRequest) -> tuple[dict[str, Any], Manifest]:
    values = COMBOS[request.param]
    return values, render(values)


def test_lint_is_clean_for_every_values_combination() -> None:
    for name, values in COMBOS.items():
        proc = helm("lint", "--strict", str(CHART), *set_args(values), check=False)
        assert proc.returncode == 0, f"{name}: {proc.stdout}{proc.stderr}"
        assert "0 chart(s) failed" in proc.stdout, proc.stdout


def test_misspelt_value_is_refused() -> None:
    proc = helm(
        "template",
        "x",
        str(CHART),
        "--set",
        "target.replica=3",
        check=False,
    )
    assert proc.returncode != 0
    assert "replica" in proc.stderr


def test_every_object_carries_the_standard_labels(combo: tuple[dict, Manifest]) -> None:
    _, m = combo
    for o in m.objects:
        if o["kind"] == "CustomResourceDefinition" and o["metadata"]["name"] == "etls.sluice.dev":
            continue  # comes from crds/ verbatim, shared with `kubectl apply -f crds/`
        labels = o["metadata"].get("labels", {})
        for key in (
            "app.kubernetes.io/name",
            "app.kubernetes.io/instance",
            "app.kubernetes.io/version",
            "app.kubernetes.io/managed-by",
            "helm.sh/chart",
        ):
            assert key in labels, f"{o['kind']}/{o['metadata']['name']} lacks {key}"
        if o["kind"] not in ("CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"):
            assert o["metadata"]["namespace"] == "data", o["metadata"]["name"]


def test_targets_are_a_statefulset_with_a_volume_per_target_behind_a_headless_service(
    combo: tuple[dict, Manifest],
) -> None:
    values, m = combo
    sts = m.component("StatefulSet", "target")
    assert sts["spec"]["replicas"] == values.get("target.replicas", 3)
    svc = m.get("Service", sts["spec"]["serviceName"])
    assert svc["spec"]["clusterIP"] == "None"
    pod_labels = sts["spec"]["template"]["metadata"]["labels"]
    assert pod_labels["sluice.dev/role"] == "target"
    assert _selects(svc["spec"]["selector"], pod_labels)
    assert _selects(sts["spec"]["selector"]["matchLabels"], pod_labels)

    (claim,) = sts["spec"]["volumeClaimTemplates"]
    mounts = {v["name"]: v["mountPath"] for v in container(sts)["volumeMounts"]}
    assert mounts[claim["metadata"]["name"]] == "/data"
    assert claim["spec"]["resources"]["requests"]["storage"] == values.get(
        "target.storage.size", "10Gi"
    )
    assert claim["spec"].get("storageClassName") == values.get("target.storage.storageClassName")
    # Data outlives the release: uninstall and scale-down keep the claims.
    assert sts["spec"]["persistentVolumeClaimRetentionPolicy"] == {
        "whenDeleted": "Retain",
        "whenScaled": "Retain",
    }


def test_target_and_gateway_run_the_contract_commands(combo: tuple[dict, Manifest]) -> None:
    values, m = combo
    host = values.get("listenAddress", "$(POD_IP)")
    sts = m.component("StatefulSet", "target")
    target = container(sts)
    # Gateways and targets share one cluster map: the chart's ConfigMap.
    (cm,) = m.of_kind("ConfigMap")
    cluster_map = cm["metadata"]["name"]
    assert "data" not in cm  # the gateways write it; an upgrade must not reset it
    assert target["command"] == [
        "sluice-target",
        "--host",
        host,
        "--port",
        "8080",
        "--id",
        "$(POD_NAME)",
        "--data-dir",
        "/data",
        "--registry",
        "kubernetes",
        "--cluster-map",
        f"kubernetes:{cluster_map}",
        "--target-statefulset",
        sts["metadata"]["name"],
        "--events",
        "kubernetes",
    ]
    # The S3 keys: the chart's Secret, without data (the gateways write it; kept on upgrade).
    (keys,) = [s for s in m.of_kind("Secret") if s["metadata"]["name"].endswith("-s3-keys")]
    s3_keys = keys["metadata"]["name"]
    assert "data" not in keys
    gateway = container(m.component("Deployment", "gateway"))
    assert gateway["command"] == [
        "sluice-gateway",
        "--host",
        host,
        "--port",
        "8080",
        "--kubernetes",
        "--cluster-map",
        f"kubernetes:{cluster_map}",
        "--target-statefulset",
        sts["metadata"]["name"],
        "--s3-keys",
        f"kubernetes:{s3_keys}",
        "--batch-assembly",
        "target",
    ]
    for c in (target, gateway):
        env = env_of(c)
        assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
        assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
        assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert ports["http"] == 8080
        for probe in ("readinessProbe", "livenessProbe"):
            assert c[probe]["httpGet"] == {"path": "/v1/health", "port": "http"}


def test_cluster_key_secret_is_shared_by_all_components(combo: tuple[dict, Manifest]) -> None:
    values, m = combo
    refs = set()
    for kind, comp in (
        ("StatefulSet", "target"),
        ("Deployment", "gateway"),
        ("Deployment", "operator"),
    ):
        ref = env_of(container(m.component(kind, comp)))["SLUICE_CLUSTER_KEY"]
        refs.add(
            (ref["valueFrom"]["secretKeyRef"]["name"], ref["valueFrom"]["secretKeyRef"]["key"])
        )
    assert len(refs) == 1, refs
    ((name, key),) = refs
    if values.get("clusterKey.existingSecret"):
        assert name == values["clusterKey.existingSecret"]
        assert not [s for s in m.of_kind("Secret") if s["metadata"]["name"] == name]
    else:
        secret = m.get("Secret", name)
        assert len(base64.b64decode(secret["data"][key])) >= 32


def test_generated_cluster_key_is_random_per_install() -> None:
    keys = {
        m.get("Secret", "sl-sluice-cluster-key")["data"]["cluster-key"]
        for m in (render(), render())
    }
    assert len(keys) == 2


def test_user_token_reaches_targets_and_gateway_only_when_configured(
    combo: tuple[dict, Manifest],
) -> None:
    values, m = combo
    for kind, comp in (("StatefulSet", "target"), ("Deployment", "gateway")):
        env = env_of(container(m.component(kind, comp)))
        if values.get("auth.existingSecret"):
            ref = env["SLUICE_TOKEN"]["valueFrom"]["secretKeyRef"]
            assert ref == {"name": "my-token", "key": values["auth.existingSecretKey"]}
        elif values.get("auth.token"):
            ref = env["SLUICE_TOKEN"]["valueFrom"]["secretKeyRef"]
            secret = m.get("Secret", ref["name"])
            assert base64.b64decode(secret["data"][ref["key"]]).decode() == values["auth.token"]
        else:
            assert "SLUICE_TOKEN" not in env
    assert "SLUICE_TOKEN" not in env_of(container(m.component("Deployment", "operator")))


def test_gateway_service_selects_only_gateway_pods(combo: tuple[dict, Manifest]) -> None:
    values, m = combo
    svc = m.component("Service", "gateway")
    assert svc["spec"]["type"] == values.get("gateway.service.type", "ClusterIP")
    gw_labels = m.component("Deployment", "gateway")["spec"]["template"]["metadata"]["labels"]
    assert _selects(svc["spec"]["selector"], gw_labels)
    for w in m.workloads():
        if w["metadata"]["labels"]["app.kubernetes.io/component"] != "gateway":
            assert not _selects(
                svc["spec"]["selector"], w["spec"]["template"]["metadata"]["labels"]
            )
    if "gateway.service.nodePort" in values:
        assert svc["spec"]["ports"][0]["nodePort"] == values["gateway.service.nodePort"]


def test_pods_run_non_root_with_a_read_only_root_filesystem(combo: tuple[dict, Manifest]) -> None:
    _, m = combo
    workloads = list(m.workloads())
    assert {w["metadata"]["labels"]["app.kubernetes.io/component"] for w in workloads} == set(
        COMPONENTS
    )
    for w in workloads:
        spec = pod_spec(w)
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] > 0
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert "hostNetwork" not in spec and "hostPID" not in spec
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"]["drop"] == ["ALL"]
            assert c["resources"]["requests"], c["name"]
            # Python needs somewhere to write temp files when / is read-only.
            assert "/tmp" in {v["mountPath"] for v in c["volumeMounts"]}


def test_scheduling_values_reach_the_pods(combo: tuple[dict, Manifest]) -> None:
    values, m = combo
    target = pod_spec(m.component("StatefulSet", "target"))
    assert target.get("nodeSelector") == values.get("target.nodeSelector")
    assert target.get("tolerations") == values.get("target.tolerations")
    anti = target["affinity"]["podAntiAffinity"]
    if values.get("target.podAntiAffinity") == "hard":
        (term,) = anti["requiredDuringSchedulingIgnoredDuringExecution"]
    else:
        term = anti["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    target_labels = m.component("StatefulSet", "target")["spec"]["template"]["metadata"]["labels"]
    assert _selects(term["labelSelector"]["matchLabels"], target_labels)
    gateway = pod_spec(m.component("Deployment", "gateway"))
    if "gateway.affinity" in values:
        assert gateway["affinity"] == values["gateway.affinity"]


def test_images_come_from_the_configured_registry_and_tags(combo: tuple[dict, Manifest]) -> None:
    values, m = combo
    registry = values.get("images.registry")
    tag = values.get("images.tag", "0.1.0")
    prefix = f"{registry}/" if registry else ""
    assert (
        container(m.component("StatefulSet", "target"))["image"] == f"{prefix}sluice/server:{tag}"
    )
    assert (
        container(m.component("Deployment", "gateway"))["image"] == f"{prefix}sluice/server:{tag}"
    )
    operator = container(m.component("Deployment", "operator"))
    assert operator["image"] == f"{prefix}sluice/operator:{tag}"
    runtime = env_of(operator)["SLUICE_TRANSFORMER_IMAGE"]["value"]
    if "images.runtime.digest" in values:
        assert runtime == f"{prefix}sluice/runtime@{values['images.runtime.digest']}"
    else:
        assert runtime == f"{prefix}sluice/runtime:{tag}"
    secrets = values.get("images.pullSecrets")
    for w in m.workloads():
        assert pod_spec(w).get("imagePullSecrets") == (
            [{"name": s} for s in secrets] if secrets else None
        )


def test_operator_gets_transformer_defaults_and_peering(combo: tuple[dict, Manifest]) -> None:
    values, m = combo
    dep = m.component("Deployment", "operator")
    op = container(dep)
    env = env_of(op)
    resources = json.loads(env["SLUICE_TRANSFORMER_RESOURCES"]["value"])
    assert resources["requests"] == {"cpu": "500m", "memory": "512Mi"}
    assert resources["limits"] == values.get(
        "transformer.resources.limits", {"cpu": "2", "memory": "2Gi"}
    )
    # What the operator reads for every transformer pod (OperatorConfig.from_env).
    assert env["SLUICE_TRANSFORMER_PULL_POLICY"]["value"] == values.get(
        "transformer.imagePullPolicy", "IfNotPresent"
    )
    secrets = list(values.get("images.pullSecrets", []))
    secrets += [s for s in values.get("transformer.imagePullSecrets", []) if s not in secrets]
    assert env["SLUICE_TRANSFORMER_PULL_SECRETS"]["value"] == ",".join(secrets)
    from etl_operator.controller import OperatorConfig

    config = OperatorConfig.from_env({k: e["value"] for k, e in env.items() if "value" in e})
    assert config.resources == resources and config.pull_secrets == tuple(secrets)
    assert op["command"][0] == "sluice-operator"
    from etl_operator.__main__ import parse_args

    args = parse_args(op["command"][1:])  # the chart's flags are the CLI's
    assert args.namespace == ["$(POD_NAMESPACE)"]
    assert op["livenessProbe"]["httpGet"]["path"] == "/healthz"
    peering = values.get("operator.replicas", 1) > 1 or values.get("operator.peering.enabled")
    crds = {c["metadata"]["name"] for c in m.of_kind("CustomResourceDefinition")}
    if peering:
        assert op["command"][op["command"].index("--peering") + 1] == "sluice"
        assert op["command"][op["command"].index("--peering-lifetime") + 1] == "60"
        # No fixed --priority: every replica draws its own, so they never tie.
        assert "--priority" not in op["command"]
        assert args.peering == "sluice" and args.peering_lifetime == 60
        assert "kopfpeerings.kopf.dev" in crds
        (peer,) = m.of_kind("KopfPeering")
        assert peer["metadata"]["name"] == "sluice"
        assert "post-install" in peer["metadata"]["annotations"]["helm.sh/hook"]
        assert dep["spec"]["strategy"]["type"] == "RollingUpdate"
    else:
        assert "--standalone" in op["command"] and "--peering" not in op["command"]
        assert "kopfpeerings.kopf.dev" not in crds and not m.of_kind("KopfPeering")
        # Two standalone operators would both handle every ETL: never overlap them.
        assert dep["spec"]["strategy"]["type"] == "Recreate"


def test_network_policy_admits_only_target_pods_to_transformers(
    combo: tuple[dict, Manifest],
) -> None:
    values, m = combo
    policies = m.of_kind("NetworkPolicy")
    if values.get("networkPolicy.enabled") is False:
        assert not policies
        return
    # the ingress one; egress: tests/helm/test_transformer_isolation.py
    (np,) = [p for p in policies if "Ingress" in p["spec"]["policyTypes"]]
    assert np["spec"]["podSelector"] == {
        "matchExpressions": [{"key": "sluice.dev/etl", "operator": "Exists"}]
    }
    assert np["spec"]["policyTypes"] == ["Ingress"]
    rule, *others = np["spec"]["ingress"]
    # only the peers listed for redirected clients (networkPolicy.transformerClients) join them
    clients = values.get("networkPolicy.transformerClients")
    assert others == ([{"from": clients, "ports": rule["ports"]}] if clients else [])
    (peer,) = rule["from"]
    assert set(peer) == {"podSelector"}  # same namespace, no ipBlock, no namespaceSelector
    selector = peer["podSelector"]["matchLabels"]
    for w in m.workloads():
        labels = w["spec"]["template"]["metadata"]["labels"]
        is_target = labels["app.kubernetes.io/component"] == "target"
        assert _selects(selector, labels) is is_target
    assert rule["ports"] == [{"port": 8000, "protocol": "TCP"}]


def test_chart_crd_is_the_repository_crd() -> None:
    chart_crd = CHART / "crds" / "etls.sluice.dev.yaml"
    repo_crd = REPO / "crds" / "etls.sluice.dev.yaml"
    assert repo_crd.is_file(), "crds/etls.sluice.dev.yaml is missing"
    assert chart_crd.read_bytes() == repo_crd.read_bytes()
    try:
        crd = yaml.safe_load(repo_crd.read_text())
    except yaml.YAMLError as e:
        raise AssertionError(f"crds/etls.sluice.dev.yaml is not valid YAML: {e}") from e
    rendered = render(include_crds=True).get("CustomResourceDefinition", "etls.sluice.dev")
    assert rendered == crd


def test_packaged_chart_contains_the_crd_file_itself(tmp_path: Path) -> None:
    helm("package", str(CHART), "--destination", str(tmp_path))
    (tgz,) = tmp_path.glob("sluice-*.tgz")
    with tarfile.open(tgz) as tar:
        member = tar.getmember("sluice/crds/etls.sluice.dev.yaml")
        assert member.isfile(), "helm package kept a symlink instead of the CRD"
        data = tar.extractfile(member)
        assert data is not None
        assert data.read() == (REPO / "crds" / "etls.sluice.dev.yaml").read_bytes()


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())
