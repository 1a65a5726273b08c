"""Conversions between Kubernetes objects and Sluice's cluster records.

One place knows the ETL resource coordinates and how a custom resource or a
target pod maps onto ``EtlRecord`` / ``TargetInfo``; the registry, discovery,
backend and the operator all call these.
"""

from __future__ import annotations

import os
from typing import Any

from etl_runtime.cluster.records import EtlRecord, TargetInfo, TransformerStatus
from etl_runtime.core import tls
from etl_runtime.core.spec import EtlSpec

ETL_GROUP = "sluice.dev"
ETL_VERSION = "v1alpha1"
ETL_PLURAL = "etls"
ETL_KIND = "ETL"
ETL_API_VERSION = f"{ETL_GROUP}/{ETL_VERSION}"
# Label every storage target pod carries; an ETL selects these by default.
TARGET_ROLE_LABEL = "sluice.dev/role"
TARGET_SELECTOR = f"{TARGET_ROLE_LABEL}=target"
DEFAULT_TARGET_LABELS = {TARGET_ROLE_LABEL: "target"}
DEFAULT_TARGET_PORT = 8080


def record_from_cr(obj: dict[str, Any]) -> EtlRecord:
    """An ``EtlRecord`` from an ETL custom resource (raises ``InvalidSpec`` on a bad spec).

    ``spec.stopped`` wins over a status the operator has not updated yet, so a
    stop takes effect on the targets as soon as it is written.
    """
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    spec = EtlSpec.from_dict(obj.get("spec") or {})
    phase = status.get("phase") or "Initializing"
    message = status.get("message")
    if spec.stopped and phase != "Stopped":
        phase, message = "Stopped", "stopped by user"
    transformers = tuple(
        TransformerStatus.from_dict(t)
        for t in status.get("transformers") or ()
        if isinstance(t, dict) and t.get("target")
    )
    return EtlRecord(
        name=meta["name"],
        uid=meta.get("uid") or "",
        spec=spec,
        phase=phase,
        message=message,
        transformers=transformers,
    )


def label_selector(labels: dict[str, str]) -> str:
    """``matchLabels``-style dict -> ``a=b,c=d`` selector string."""
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def parse_selector(selector: str) -> dict[str, str]:
    """``a=b,c=d`` -> dict (equality selectors only)."""
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in selector.split(","))):
        key, _, value = part.partition("=")
        out[key.strip()] = value.lstrip("=").strip()
    return out


def labels_match(labels: dict[str, str] | None, selector: dict[str, str]) -> bool:
    have = labels or {}
    return all(have.get(k) == v for k, v in selector.items())


def pod_is_ready(pod: dict[str, Any]) -> bool:
    """Ready condition True, not being deleted."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    for cond in (pod.get("status") or {}).get("conditions") or ():
        if cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return False


def pod_http_port(pod: dict[str, Any], default: int = DEFAULT_TARGET_PORT) -> int:
    """The container port named ``http``, else the first declared one, else ``default``."""
    ports = [
        p
        for c in (pod.get("spec") or {}).get("containers") or ()
        for p in c.get("ports") or ()
        if p.get("containerPort")
    ]
    for p in ports:
        if p.get("name") == "http":
            return int(p["containerPort"])
    return int(ports[0]["containerPort"]) if ports else default


TLS_SECRET_ENV = "SLUICE_TLS_SECRET"  # the operator: the Secret its transformer pods mount


def pod_url(pod: dict[str, Any], port: int) -> str | None:
    """Where a pod serves: ``http://IP:PORT``; under TLS (``SLUICE_TLS_CERT``, or the
    operator's ``SLUICE_TLS_SECRET``) by a name its certificate covers:
    ``POD.SUBDOMAIN.NAMESPACE.svc`` (a StatefulSet's pods under their headless
    Service), else ``A-B-C-D.NAMESPACE.pod`` (the cluster DNS's pod names)."""
    ip = (pod.get("status") or {}).get("podIP")
    if not ip:
        return None
    if not (tls.serving() or os.environ.get(TLS_SECRET_ENV)):
        return f"http://{ip}:{port}"
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    ns = meta.get("namespace") or "default"
    if spec.get("subdomain") and meta.get("name"):
        return f"https://{meta['name']}.{spec['subdomain']}.{ns}.svc:{port}"
    return f"https://{ip.replace('.', '-').replace(':', '-')}.{ns}.pod:{port}"


def target_from_pod(pod: dict[str, Any]) -> TargetInfo | None:
    """A ``TargetInfo`` for a target pod that has an IP (``None`` otherwise)."""
    url = pod_url(pod, pod_http_port(pod))
    if url is None:
        return None
    return TargetInfo(
        id=pod["metadata"]["name"],
        url=url,
        node=(pod.get("spec") or {}).get("nodeName"),
    )
