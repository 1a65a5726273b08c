"""The Kubernetes calls the operator makes, blocking, in one small class.

``KubeActuator`` reads an ETL, its target pods and transformer pods, and
applies a ``reconcile.Plan`` (create and delete pods), keeps the token Secret,
the finalizer and the status. Idempotent by construction: creating what
exists (409) or deleting what is gone (404) is not an error, so an operator
restarted mid-way simply carries on. The controller calls it from a worker
thread; kopf never sees it.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from etl_operator.pods import ETL_LABEL, label_value, secret_name
from etl_runtime.cluster.kube.records import ETL_GROUP, ETL_PLURAL, ETL_VERSION, label_selector

log = logging.getLogger(__name__)

FINALIZER = "sluice.dev/cleanup"
JSON_PATCH = "application/json-patch+json"


class KubeActuator:
    """Blocking Kubernetes I/O of the operator; every object is a plain JSON dict."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.crs = client.CustomObjectsApi(api)

    # -- reading ---------------------------------------------------------

    def _raw(self, fn: Any, **kwargs: Any) -> dict[str, Any]:
        resp = fn(_preload_content=False, **kwargs)
        return json.loads(resp.data if hasattr(resp, "data") else resp.read())

    def _coords(self, namespace: str) -> dict[str, Any]:
        return {
            "group": ETL_GROUP,
            "version": ETL_VERSION,
            "namespace": namespace,
            "plural": ETL_PLURAL,
        }

    def get_etl(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._raw(
                self.crs.get_namespaced_custom_object, name=name, **self._coords(namespace)
            )
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def list_etls(self, namespace: str | None) -> list[dict[str, Any]]:
        """ETLs in ``namespace``, or in every namespace when it is ``None``."""
        if namespace is None:
            result = self._raw(
                self.crs.list_cluster_custom_object,
                group=ETL_GROUP,
                version=ETL_VERSION,
                plural=ETL_PLURAL,
            )
        else:
            result = self._raw(self.crs.list_namespaced_custom_object, **self._coords(namespace))
        return list(result.get("items") or ())

    def list_pods(self, namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]:
        result = self._raw(
            self.core.list_namespaced_pod,
            namespace=namespace,
            label_selector=label_selector(labels),
        )
        return list(result.get("items") or ())

    def transformer_pods(self, namespace: str, etl: str) -> list[dict[str, Any]]:
        return self.list_pods(namespace, {ETL_LABEL: label_value(etl)})

    def get_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._raw(self.core.read_namespaced_secret, name=name, namespace=namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def peering_status(self, namespace: str | None, name: str) -> dict[str, Any] | None:
        """``status`` of kopf's KopfPeering ``name`` (ClusterKopfPeering if no namespace)."""
        try:
            if namespace is None:
                obj = self._raw(
                    self.crs.get_cluster_custom_object,
                    group="kopf.dev",
                    version="v1",
                    plural="clusterkopfpeerings",
                    name=name,
                )
            else:
                obj = self._raw(
                    self.crs.get_namespaced_custom_object,
                    group="kopf.dev",
                    version="v1",
                    plural="kopfpeerings",
                    namespace=namespace,
                    name=name,
                )
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return dict(obj.get("status") or {})

    # -- writing ---------------------------------------------------------

    def create_pod(self, pod: dict[str, Any]) -> bool:
        """Create ``pod``; False if one of that name already exists."""
        try:
            self.core.create_namespaced_pod(
                namespace=pod["metadata"]["namespace"], body=client.V1Pod.model_validate(pod)
            )
            return True
        except ApiException as e:
            if e.status == 409:
                return False
            raise

    def delete_pod(self, namespace: str, name: str, now: bool = False) -> None:
        """Delete a pod; ``now``: without grace period (it has exited or hung)."""
        try:
            self.core.delete_namespaced_pod(
                name=name, namespace=namespace, grace_period_seconds=0 if now else None
            )
        except ApiException as e:
            if e.status != 404:
                raise

    def put_secret(self, secret: dict[str, Any], exists: bool) -> None:
        meta = secret["metadata"]
        if exists:
            self.core.replace_namespaced_secret(
                name=meta["name"],
                namespace=meta["namespace"],
                body=client.V1Secret.model_validate(secret),
            )
            return
        try:
            self.core.create_namespaced_secret(
                namespace=meta["namespace"], body=client.V1Secret.model_validate(secret)
            )
        except ApiException as e:
            if e.status != 409:
                raise

    def delete_secret(self, namespace: str, etl: str) -> None:
        try:
            self.core.delete_namespaced_secret(name=secret_name(etl), namespace=namespace)
        except ApiException as e:
            if e.status != 404:
                raise

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        try:
            self.crs.patch_namespaced_custom_object_status(
                name=name, body={"status": status}, **self._coords(namespace)
            )
        except ApiException as e:
            if e.status != 404:  # deleted meanwhile: nothing to report on
                raise

    def record_event(self, event: dict[str, Any]) -> None:
        """Create a ``core/v1`` Event (see ``events.event_body``)."""
        self.core.create_namespaced_event(
            namespace=event["metadata"]["namespace"], body=client.CoreV1Event.model_validate(event)
        )

    def set_finalizer(self, etl: dict[str, Any], present: bool) -> None:
        """Add or remove our finalizer, guarded by resourceVersion (409 if it moved)."""
        meta = etl["metadata"]
        current = list(meta.get("finalizers") or ())
        if (FINALIZER in current) == present:
            return
        wanted = current + [FINALIZER] if present else [f for f in current if f != FINALIZER]
        patch = [
            {"op": "test", "path": "/metadata/resourceVersion", "value": meta["resourceVersion"]},
            {
                "op": "replace" if "finalizers" in meta else "add",
                "path": "/metadata/finalizers",
                "value": wanted,
            },
        ]
        try:
            self.crs.patch_namespaced_custom_object(
                name=meta["name"],
                body=patch,
                _content_type=JSON_PATCH,
                **self._coords(meta["namespace"]),
            )
        except ApiException as e:
            if e.status == 404 and not present:
                return
            raise
