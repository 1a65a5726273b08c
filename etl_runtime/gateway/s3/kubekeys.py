"""``KubeKeyStore``: the S3 API's keys in one Kubernetes Secret, for every gateway replica.

The Secret (``SLUICE_S3_KEYS_SECRET``, the chart's ``<release>-sluice-s3-keys``)
holds the same JSON as the local key file (``keys.KeyStore``) under the data
key ``s3-keys.json``. Reads — one per signed S3 request — come from a watch
cache (``cluster.kube.watch.WatchCache`` on that one Secret), so a request
never waits on the apiserver, and a key made through one gateway replica is
known to the others as soon as their watch sees it (well under a second). A
write (``POST``/``DELETE /v1/s3/keys``) is a read-modify-write with the
resourceVersion read, retried on ``409 Conflict``, as the cluster map's
(``cluster/kube/clustermap.py``); the Secret is created on the first key.

RBAC (chart ``rbac.yaml``): the gateway may get/list/watch/update that Secret
by name and create Secrets (create cannot be limited to a name).
"""

from __future__ import annotations

import base64
import json
import logging
import random
import time
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from etl_runtime.cluster.kube.config import api_client, default_namespace
from etl_runtime.cluster.kube.watch import WatchCache
from etl_runtime.core.errors import Unavailable
from etl_runtime.gateway.s3.keys import KeyStore

log = logging.getLogger(__name__)

DATA_KEY = "s3-keys.json"
UPDATE_ATTEMPTS = 20


class KubeKeyStore(KeyStore):
    """``KeyStore`` whose JSON document is the Secret ``name`` of ``namespace``."""

    def __init__(
        self, name: str, namespace: str | None = None, api: client.ApiClient | None = None
    ) -> None:
        super().__init__(None)
        self.name = name
        self.namespace = namespace or default_namespace()
        self._api = api or api_client()
        self._core = client.CoreV1Api(self._api)
        self._cache = WatchCache(
            self._api,
            self._core.list_namespaced_secret,
            what=f"secrets/{self.namespace}/{name}",
            on_change=self._seen,
            namespace=self.namespace,
            field_selector=f"metadata.name={name}",
        ).start()

    @property
    def enabled(self) -> bool:
        return True

    def close(self) -> None:
        self._cache.stop()

    def wait_synced(self, timeout: float | None = None) -> bool:
        return self._cache.wait_synced(timeout)

    def _seen(self, objects: dict[str, dict[str, Any]]) -> None:
        obj = objects.get(self.name)
        keys = self._parse(obj) if obj is not None else {}
        with self._lock:
            self._keys = keys

    def _parse(self, obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
        raw = (obj.get("data") or {}).get(DATA_KEY)
        if not raw:
            return {}
        try:
            keys = json.loads(base64.b64decode(raw)).get("keys", {})
        except (ValueError, TypeError, AttributeError) as e:
            log.error("Secret %s/%s: %s is not a key file: %s", self.namespace, self.name,
                      DATA_KEY, e)  # fmt: skip
            return self._keys
        return dict(keys) if isinstance(keys, dict) else {}

    def _load(self) -> dict[str, dict[str, Any]]:
        return self._keys  # the watch keeps it current (under self._lock)

    def _read(self) -> dict[str, Any] | None:
        try:
            resp: Any = self._core.read_namespaced_secret(
                self.name, self.namespace, _preload_content=False
            )
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return dict(json.loads(resp.data))

    def _save(self, keys: dict[str, dict[str, Any]]) -> None:
        """Write ``keys`` as the Secret's document (compare-and-swap on its resourceVersion).

        Called under ``self._lock`` with the keys changed from what ``_load`` gave;
        another replica's concurrent change is merged by re-reading on a conflict.
        """
        wanted, before = keys, dict(self._keys)
        for attempt in range(UPDATE_ATTEMPTS):
            obj = self._read()
            stored = self._parse(obj) if obj is not None else {}
            merged = {k: v for k, v in stored.items() if k in wanted or k not in before}
            merged.update(wanted)
            doc = json.dumps({"keys": merged}, indent=1).encode()
            data = {DATA_KEY: base64.b64encode(doc).decode()}
            try:
                if obj is None:
                    body: Any = {"metadata": {"name": self.name}, "type": "Opaque", "data": data}
                    self._core.create_namespaced_secret(self.namespace, body)
                else:
                    body = {**obj, "data": {**(obj.get("data") or {}), **data}}
                    self._core.replace_namespaced_secret(self.name, self.namespace, body)
            except ApiException as e:
                if e.status != 409:
                    raise Unavailable(
                        f"the S3 key Secret {self.namespace}/{self.name} could not be "
                        f"written ({e.status} {e.reason}); retry",
                        retry_after=1,
                    ) from None
                time.sleep(random.uniform(0, 0.05 * (attempt + 1)))
                continue
            self._keys = merged
            return
        raise Unavailable(
            f"the S3 key Secret {self.namespace}/{self.name}: too many concurrent writes; retry",
            retry_after=1,
        )
