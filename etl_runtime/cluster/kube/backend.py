"""``KubeEtlBackend``: the gateway's ``/v1/etl`` API written onto ETL custom resources.

The gateway only writes specs and reads status; the operator does the rest.
The ``kubernetes`` client is blocking, so every call runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from etl_runtime.cluster.kube.config import api_client, default_namespace
from etl_runtime.cluster.kube.records import (
    ETL_API_VERSION,
    ETL_GROUP,
    ETL_KIND,
    ETL_PLURAL,
    ETL_VERSION,
    record_from_cr,
)
from etl_runtime.cluster.records import EtlRecord
from etl_runtime.core.spec import EtlSpec, InvalidSpec, validate_name

log = logging.getLogger(__name__)

_CONFLICT_RETRIES = 5


class KubeEtlBackend:
    """``EtlBackend`` over the ETL CRs of one namespace.

    RBAC: ``etls`` get, list, create, update, patch, delete.
    """

    platform = "kubernetes"  # what the gateway's refusals say (gateway/aisetl.py)

    def __init__(self, namespace: str | None = None, api: client.ApiClient | None = None) -> None:
        self.namespace = namespace or default_namespace()
        self._api = api or api_client()
        self._crs = client.CustomObjectsApi(self._api)

    def _coords(self) -> dict[str, Any]:
        return {
            "group": ETL_GROUP,
            "version": ETL_VERSION,
            "namespace": self.namespace,
            "plural": ETL_PLURAL,
        }

    # -- blocking halves -------------------------------------------------

    def _get_cr(self, name: str) -> dict[str, Any] | None:
        try:
            return _as_dict(self._crs.get_namespaced_custom_object(name=name, **self._coords()))
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def _init_sync(self, name: str, spec: EtlSpec) -> EtlRecord:
        validate_name(name)
        body = {
            "apiVersion": ETL_API_VERSION,
            "kind": ETL_KIND,
            "metadata": {"name": name},
            "spec": spec.to_dict(),
        }
        for _ in range(_CONFLICT_RETRIES):
            current = self._get_cr(name)
            try:
                if current is None:
                    created = self._crs.create_namespaced_custom_object(body=body, **self._coords())
                    return record_from_cr(_as_dict(created))
                old_hash = _spec_hash(current)
                current["spec"] = spec.to_dict()
                replaced = self._crs.replace_namespaced_custom_object(
                    name=name, body=current, **self._coords()
                )
            except ApiException as e:
                if e.status == 409:  # raced with another writer: read again
                    continue
                if e.status == 422:
                    raise InvalidSpec(_api_message(e)) from e
                raise
            record = record_from_cr(_as_dict(replaced))
            if old_hash != spec.content_hash() and record.phase != "Stopped":
                # The operator has not seen the new spec yet; say so rather
                # than echoing the old generation's "Running".
                record = _with_phase(record, "Initializing", "spec changed; replacing transformers")
            return record
        raise RuntimeError(f"ETL {name!r}: too many concurrent updates, try again")

    def _list_sync(self) -> list[EtlRecord]:
        result = _as_dict(self._crs.list_namespaced_custom_object(**self._coords()))
        records = []
        for obj in result.get("items") or ():
            try:
                records.append(record_from_cr(obj))
            except (InvalidSpec, KeyError, TypeError, ValueError) as e:
                log.warning("skipping ETL %s: %s", obj.get("metadata", {}).get("name"), e)
        return sorted(records, key=lambda r: r.name)

    def _get_sync(self, name: str) -> EtlRecord | None:
        obj = self._get_cr(name)
        return None if obj is None else record_from_cr(obj)

    def _set_stopped_sync(self, name: str, stopped: bool) -> EtlRecord:
        try:
            obj = self._crs.patch_namespaced_custom_object(
                name=name, body={"spec": {"stopped": stopped}}, **self._coords()
            )
        except ApiException as e:
            if e.status == 404:
                raise KeyError(name) from e
            raise
        record = record_from_cr(_as_dict(obj))
        if not stopped and record.phase == "Stopped":
            record = _with_phase(record, "Initializing", "starting transformers")
        return record

    def _delete_sync(self, name: str) -> None:
        try:
            self._crs.delete_namespaced_custom_object(name=name, **self._coords())
        except ApiException as e:
            if e.status == 404:
                raise KeyError(name) from e
            raise

    # -- EtlBackend --------------------------------------------------------

    async def init(self, name: str, spec: EtlSpec) -> EtlRecord:
        return await asyncio.to_thread(self._init_sync, name, spec)

    async def list(self) -> list[EtlRecord]:
        return await asyncio.to_thread(self._list_sync)

    async def get(self, name: str) -> EtlRecord | None:
        return await asyncio.to_thread(self._get_sync, name)

    async def set_stopped(self, name: str, stopped: bool) -> EtlRecord:
        return await asyncio.to_thread(self._set_stopped_sync, name, stopped)

    async def delete(self, name: str) -> None:
        await asyncio.to_thread(self._delete_sync, name)


def _as_dict(obj: object) -> dict[str, Any]:
    """Custom-object calls answer plain JSON dicts; say so to the type checker."""
    if not isinstance(obj, dict):
        raise TypeError(f"expected a JSON object from the apiserver, got {type(obj).__name__}")
    return obj


def _spec_hash(obj: dict[str, Any]) -> str | None:
    try:
        return EtlSpec.from_dict(obj.get("spec") or {}).content_hash()
    except InvalidSpec:
        return None


def _with_phase(record: EtlRecord, phase: str, message: str) -> EtlRecord:
    return EtlRecord(
        name=record.name,
        uid=record.uid,
        spec=record.spec,
        phase=phase,
        message=message,
        transformers=record.transformers,
    )


def _api_message(e: ApiException) -> str:
    """The apiserver's own message from an error body (e.g. a CRD validation failure)."""
    try:
        return str(json.loads(e.body or "{}").get("message") or e.reason)
    except ValueError:
        return str(e.reason)
