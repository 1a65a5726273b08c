"""Manifests the operator creates: one transformer pod per (ETL, target), one token Secret.

Plain functions from an ETL (name, uid, ``EtlSpec``) and a target to the
dicts the apiserver takes; nothing here talks to Kubernetes, so the shape of
a transformer pod is unit-tested directly. The contract (names, labels, env)
is in docs/architecture.md, section "Kubernetes".
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from etl_runtime.cluster.kube.records import ETL_API_VERSION, ETL_KIND, TLS_SECRET_ENV
from etl_runtime.cluster.reconcile import transformer_name
from etl_runtime.cluster.records import TargetInfo
from etl_runtime.core.spec import EtlSpec

ETL_LABEL = "sluice.dev/etl"
TARGET_LABEL = "sluice.dev/target"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "sluice-operator"
SPEC_HASH_ANNOTATION = "sluice.dev/spec-hash"
RESTARTS_ANNOTATION = "sluice.dev/restarts"
# Why the previous pod of this transformer was replaced (a restart's cause).
LAST_FAILURE_ANNOTATION = "sluice.dev/last-failure"
TOKEN_KEY = "token"
TRANSFORMER_PORT = 8000
# Prometheus' conventional pod annotations: scrape the transformer's GET /metrics.
SCRAPE_ANNOTATIONS = {
    "prometheus.io/scrape": "true",
    "prometheus.io/port": str(TRANSFORMER_PORT),
    "prometheus.io/path": "/metrics",
}
CONTAINER_NAME = "transformer"
DEPS_DIR = "/var/lib/sluice/deps"
TLS_DIR = "/etc/sluice/tls"  # the tls Secret (tls.crt, tls.key, ca.crt) under TLS
DEFAULT_IMAGE = "ghcr.io/sluice-dev/sluice-runtime:0.1.0"
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
# Numeric so runAsNonRoot can be verified whatever USER the image declares.
RUN_AS_USER = 10001
# Env names the operator sets; spec.env may not override them.
_RESERVED_ENV = {
    "POD_IP",
    "POD_NAME",
    "POD_NAMESPACE",
    "SLUICE_HOST",
    "SLUICE_PORT",
    "SLUICE_ETL_NAME",
    "SLUICE_ETL_SPEC",
    "SLUICE_ETL_TOKEN",
    "SLUICE_DEPS_DIR",
    "SLUICE_DATA_ROOTS",
}


@dataclass(frozen=True)
class EtlRef:
    """The ETL a manifest belongs to: what ownerReferences and names need."""

    name: str
    namespace: str
    uid: str

    def owner_reference(self) -> dict[str, Any]:
        return {
            "apiVersion": ETL_API_VERSION,
            "kind": ETL_KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


def label_value(value: str) -> str:
    """``value`` as a valid label value (<= 63 chars, alphanumeric ends)."""
    clean = re.sub(r"[^A-Za-z0-9._-]", "-", value).strip("-._")
    if len(clean) <= 63:
        return clean
    digest = hashlib.sha256(value.encode()).hexdigest()[:8]
    return f"{clean[:54].rstrip('-._')}-{digest}"


def pod_name(etl: str, target: str, spec_hash: str) -> str:
    """Deterministic pod name for one transformer generation.

    ``transformer_name(etl, target)`` plus the spec hash: a spec change gets a
    new name, so the new pod starts while the old one still serves, and an
    operator restarted mid-way finds exactly the pods it would have created.
    """
    return transformer_name(etl, f"{target}-{spec_hash[:6]}")


def secret_name(etl: str) -> str:
    return f"sluice-etl-{etl}-token"


def common_labels(etl: str) -> dict[str, str]:
    return {ETL_LABEL: label_value(etl), MANAGED_BY_LABEL: MANAGED_BY}


def token_secret(ref: EtlRef, token: str) -> dict[str, Any]:
    """The Secret holding the ETL's transformer token, owned (and so collected) with the ETL."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": secret_name(ref.name),
            "namespace": ref.namespace,
            "labels": common_labels(ref.name),
            "ownerReferences": [ref.owner_reference()],
        },
        "type": "Opaque",
        "data": {TOKEN_KEY: base64.b64encode(token.encode()).decode()},
    }


def secret_token(secret: dict[str, Any]) -> str | None:
    raw = (secret.get("data") or {}).get(TOKEN_KEY)
    return base64.b64decode(raw).decode() if raw else None


def shares_data(spec: EtlSpec, share_target_data: bool) -> bool:
    """Whether the transformer of ``spec`` mounts its target's data volumes.

    Always for ``argType: fqn`` (the target passes file paths); for every
    ETL when the operator shares target data (``SLUICE_SHARE_TARGET_DATA``,
    the chart's ``etl.shareTargetData``): the targets then send ``etl_fqn``
    for every ETL and no object bytes travel to the transformer.
    """
    return not spec.foreign and (spec.arg_type == "fqn" or share_target_data)


def pod_hash(spec: EtlSpec, share_target_data: bool) -> str:
    """The hash a current transformer pod of ``spec`` carries (name and annotation).

    ``spec.content_hash()``, with the data mounts folded in when they are
    there only because the operator shares target data: turning sharing on
    or off then rolls the transformers like a spec change, so no transformer
    without the mount is left beside a target that sends it paths.
    """
    base = spec.content_hash()
    if spec.arg_type == "fqn" or not share_target_data or spec.foreign:
        return base
    return hashlib.sha256(f"{base}+target-data".encode()).hexdigest()[:16]


OBJECTS_DIR = "buckets"  # the target's objects under its data dir (storage/store.py)


def data_mounts(target_pod: dict[str, Any] | None) -> tuple[list[dict], list[dict]]:
    """Volumes and read-only mounts that let a transformer read its target's files.

    When the target passes a file path (``etl_fqn``) instead of the bytes,
    the transformer mounts the target's persistent volumes (PVC or hostPath;
    both pods share a node, which ReadWriteOnce allows) read-only at the
    same paths, so the path the target sends is valid in the transformer --
    only their ``buckets`` directory (``subPath``): the objects, not the
    target's ETL output cache (other ETLs' answers), temp files or jobs.
    """
    if not target_pod:
        return [], []
    spec = target_pod.get("spec") or {}
    shareable = {
        v["name"]: v
        for v in spec.get("volumes") or ()
        if "persistentVolumeClaim" in v or "hostPath" in v
    }
    volumes: list[dict] = []
    mounts: list[dict] = []
    for container in (spec.get("containers") or ())[:1]:
        for m in container.get("volumeMounts") or ():
            vol = shareable.get(m.get("name", ""))
            if vol is None:
                continue
            name = f"target-{vol['name']}"[:63]
            if all(v["name"] != name for v in volumes):
                volumes.append({**_readonly(vol), "name": name})
            path = f"{m['mountPath'].rstrip('/')}/{OBJECTS_DIR}"
            mounts.append(
                {"name": name, "mountPath": path, "subPath": OBJECTS_DIR, "readOnly": True}
            )
    return volumes, mounts


def data_roots(pod: dict[str, Any]) -> str:
    """The transformer pod's ``SLUICE_DATA_ROOTS`` ("" when none or unset)."""
    for container in pod["spec"]["containers"][:1]:
        for e in container.get("env") or ():
            if e["name"] == "SLUICE_DATA_ROOTS":
                return str(e.get("value") or "")
    return ""


def _readonly(volume: dict[str, Any]) -> dict[str, Any]:
    out = dict(volume)
    if "persistentVolumeClaim" in out:
        out["persistentVolumeClaim"] = {**out["persistentVolumeClaim"], "readOnly": True}
    return out


def transformer_pod(
    ref: EtlRef,
    spec: EtlSpec,
    target: TargetInfo,
    *,
    image: str,
    with_token: bool,
    restarts: int = 0,
    target_pod: dict[str, Any] | None = None,
    resources: dict[str, Any] | None = None,
    pull_policy: str = "IfNotPresent",
    pull_secrets: Sequence[str] = (),
    last_failure: str | None = None,
    share_target_data: bool = False,
) -> dict[str, Any]:
    """The transformer pod for ``ref`` beside ``target``, pinned to the target's node.

    ``image``, ``resources``, ``pull_policy`` and ``pull_secrets`` are the
    operator's defaults; ``spec.image`` and ``spec.resources`` (the whole
    ``{requests, limits}`` document) replace the first two.

    ``restartPolicy: Never``: the operator, not the kubelet, restarts a
    transformer, so a config error (exit 2) stays visible as phase Error
    instead of crash-looping, and ``restarts`` (carried in an annotation)
    counts transient failures up to ``reconcile.MAX_RESTARTS``.

    ``share_target_data``: mount ``target_pod``'s data volumes read-only for
    every ETL, not only ``argType: fqn`` (see ``shares_data``).
    """
    spec_hash = pod_hash(spec, share_target_data)
    env: list[dict[str, Any]] = [
        _field_env("POD_IP", "status.podIP"),
        _field_env("POD_NAME", "metadata.name"),
        _field_env("POD_NAMESPACE", "metadata.namespace"),
        {"name": "SLUICE_HOST", "value": "$(POD_IP)"},
        {"name": "SLUICE_PORT", "value": str(TRANSFORMER_PORT)},
        {"name": "SLUICE_ETL_NAME", "value": ref.name},
        {"name": "SLUICE_ETL_SPEC", "value": spec.to_json()},
        {"name": "SLUICE_DEPS_DIR", "value": DEPS_DIR},
        # Read-only root filesystem: pip, Python and user code write under /tmp.
        {"name": "HOME", "value": "/tmp"},
        {"name": "TMPDIR", "value": "/tmp"},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
    ]
    if with_token:
        env.append(
            {
                "name": "SLUICE_ETL_TOKEN",
                "valueFrom": {"secretKeyRef": {"name": secret_name(ref.name), "key": TOKEN_KEY}},
            }
        )
    taken = {e["name"] for e in env} | _RESERVED_ENV
    env += [{"name": k, "value": v} for k, v in spec.env if k not in taken]

    volumes: list[dict[str, Any]] = [
        {"name": "deps", "emptyDir": {}},
        {"name": "tmp", "emptyDir": {}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "deps", "mountPath": DEPS_DIR},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    if tls_secret := os.environ.get(TLS_SECRET_ENV):  # HTTPS: the chart's tls Secret
        volumes.append({"name": "tls", "secret": {"secretName": tls_secret}})
        mounts.append({"name": "tls", "mountPath": TLS_DIR, "readOnly": True})
        env += [
            {"name": "SLUICE_TLS_CERT", "value": f"{TLS_DIR}/tls.crt"},
            {"name": "SLUICE_TLS_KEY", "value": f"{TLS_DIR}/tls.key"},
            {"name": "SLUICE_CA", "value": f"{TLS_DIR}/ca.crt"},
        ]
    if shares_data(spec, share_target_data):
        extra_volumes, extra_mounts = data_mounts(target_pod)
        volumes += extra_volumes
        mounts += extra_mounts
        # etl_fqn may only name files on those (the target's data) volumes.
        roots = ":".join(m["mountPath"] for m in extra_mounts)
        env.append({"name": "SLUICE_DATA_ROOTS", "value": roots})

    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": spec.image or image,
        "imagePullPolicy": pull_policy,
        "command": ["sluice-transformer", "--host", "$(POD_IP)", "--port", str(TRANSFORMER_PORT)],
        "ports": [{"name": "http", "containerPort": TRANSFORMER_PORT, "protocol": "TCP"}],
        "env": env,
        # Probed every second (the least Kubernetes allows): a new ETL is Running
        # within a second of its transformers being ready; 6 failures in a row
        # (6 s, as before with 2 s x 3) before a busy transformer is taken out.
        "readinessProbe": {
            "httpGet": {"path": "/health", "port": TRANSFORMER_PORT}
            | ({"scheme": "HTTPS"} if os.environ.get(TLS_SECRET_ENV) else {}),
            "periodSeconds": 1,
            "timeoutSeconds": 2,
            "failureThreshold": 6,
        },
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": mounts,
    }
    if spec.foreign:  # the user's own AIStore-style image is the transformer
        container = image_container(spec, target, pull_policy)
        volumes = [v for v in volumes if v["name"] == "tmp"]
    if spec.resources or resources:
        container["resources"] = spec.resources or resources

    labels = {**common_labels(ref.name), TARGET_LABEL: label_value(target.id)}
    labels["app.kubernetes.io/name"] = "sluice-transformer"
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 10,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS_USER,
            "runAsGroup": RUN_AS_USER,
            "fsGroup": RUN_AS_USER,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": volumes,
    }
    if pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": n} for n in pull_secrets]
    if target.node:
        pod_spec["nodeName"] = target.node
    annotations = {
        **({} if spec.foreign else SCRAPE_ANNOTATIONS),  # an ETL image has no /metrics
        SPEC_HASH_ANNOTATION: spec_hash,
        RESTARTS_ANNOTATION: str(restarts),
        # The label holds a sanitized id; the annotation keeps it exact.
        TARGET_LABEL: target.id,
    }
    if restarts and last_failure:
        annotations[LAST_FAILURE_ANNOTATION] = last_failure
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(ref.name, target.id, spec_hash),
            "namespace": ref.namespace,
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [ref.owner_reference()],
        },
        "spec": pod_spec,
    }


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def image_container(spec: EtlSpec, target: TargetInfo, pull_policy: str) -> dict[str, Any]:
    """The container of an AIStore-style ETL image (``spec.commType`` ``hpush://``).

    As AIStore makes its ETL pods (``ext/etl/api.go``, ``boot.go``): the image with
    its own entrypoint (or ``spec.command``), port 8000, readiness by ``GET /health``
    there, env ``AIS_TARGET_URL`` (the target) and ``DIRECT_PUT=false`` then the init
    message's env. Targets PUT it the object's bytes (``etl/aisimage.py``), so it
    mounts no target data and gets no Sluice token; it runs under the same
    securityContext as Sluice's transformers (UID 10001, read-only root, ``/tmp``
    writable).
    """
    ours = {"AIS_TARGET_URL": target.url, "DIRECT_PUT": "false", "HOME": "/tmp"}
    ours["TMPDIR"] = "/tmp"
    env = [{"name": k, "value": v} for k, v in ours.items()]
    env += [{"name": k, "value": v} for k, v in spec.env if k not in ours]
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": spec.image,
        "imagePullPolicy": pull_policy,
        "ports": [{"name": "http", "containerPort": TRANSFORMER_PORT, "protocol": "TCP"}],
        "env": env,
        "readinessProbe": {
            "httpGet": {"path": "/health", "port": TRANSFORMER_PORT},
            "periodSeconds": 1,
            "timeoutSeconds": 2,
            "failureThreshold": 6,
        },
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
    if spec.command:
        container["command"] = list(spec.command)
    return container
