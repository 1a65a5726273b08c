"""A local-path volume provisioner for the process kubelet's nodes.

Real clusters ship one (kind has rancher's local-path-provisioner); without
it a StatefulSet's ``volumeClaimTemplates`` stay Pending forever.  This one
creates the default StorageClass ``standard`` (``WaitForFirstConsumer``), and
for every Pending claim of that class that the scheduler has placed
(``volume.kubernetes.io/selected-node``) creates a ``hostPath``
PersistentVolume in ``<state>/pv/<pv name>`` pinned to that node.  The real
PV controller binds it; the kubelet mounts the directory.  Released volumes
are deleted with their directory (reclaim policy ``Delete``).

Real nodes (``tests/k8s/realnode.py``) run it too, with ``root_of`` putting each
volume under its node's state dir (``<state>/node-i/pv/<pv name>``).  As
rancher's local-path-provisioner does, the directory is made mode 0777: a
hostPath volume gets no ``fsGroup`` ownership change from the kubelet, and the
chart's pods run as UID 10001, not as the root that made the directory.
"""

from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.k8s.api import Api, ApiError

log = logging.getLogger("sluice.kubelet")
JSON = dict[str, Any]
PROVISIONER = "sluice.dev/local-path"
CLASS = "standard"


class LocalPathProvisioner:
    """Polls claims every ``interval`` seconds and provisions hostPath volumes."""

    def __init__(
        self,
        api: Api,
        state_dir: Path,
        interval: float = 1.0,
        root_of: Callable[[str], Path] | None = None,
    ) -> None:
        self.api, self.interval = api, interval
        self.root_of = root_of or (lambda node: state_dir / "pv")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="provisioner", daemon=True)

    def start(self) -> None:
        storage_class = {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {
                "name": CLASS,
                "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
            },
            "provisioner": PROVISIONER,
            "reclaimPolicy": "Delete",
            "volumeBindingMode": "WaitForFirstConsumer",
        }
        try:
            self.api.post("/apis/storage.k8s.io/v1/storageclasses", storage_class)
        except ApiError as e:
            if e.status != 409:
                raise
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sync()
            except Exception as e:  # noqa: BLE001 - keep polling; the apiserver may blip
                log.warning("provisioner: %s", e)

    def sync(self) -> None:
        """One pass: provision placed Pending claims, delete Released volumes."""
        classes = self.api.get("/apis/storage.k8s.io/v1/storageclasses")["items"]
        ours = {c["metadata"]["name"] for c in classes if c.get("provisioner") == PROVISIONER}
        for pvc in self.api.get("/api/v1/persistentvolumeclaims")["items"]:
            if pvc["spec"].get("storageClassName") in ours and not pvc["spec"].get("volumeName"):
                self._provision(pvc)
        for pv in self.api.get("/api/v1/persistentvolumes")["items"]:
            annotations = pv["metadata"].get("annotations", {})
            released = pv.get("status", {}).get("phase") == "Released"
            if released and annotations.get("pv.kubernetes.io/provisioned-by") == PROVISIONER:
                path = pv["spec"].get("hostPath", {}).get("path")
                if path:
                    shutil.rmtree(path, ignore_errors=True)
                self.api.delete(f"/api/v1/persistentvolumes/{pv['metadata']['name']}")

    def _provision(self, pvc: JSON) -> None:
        meta = pvc["metadata"]
        node = meta.get("annotations", {}).get("volume.kubernetes.io/selected-node")
        if node is None:  # WaitForFirstConsumer: the scheduler has not placed a pod yet
            return
        name = f"pvc-{meta['uid']}"
        path = self.root_of(node) / name
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(0o777)  # any pod user may write (hostPath gets no fsGroup change)
        on_node = {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}
        pv = {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {
                "name": name,
                "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER},
            },
            "spec": {
                "capacity": {"storage": pvc["spec"]["resources"]["requests"]["storage"]},
                "accessModes": pvc["spec"]["accessModes"],
                "persistentVolumeReclaimPolicy": "Delete",
                "storageClassName": pvc["spec"]["storageClassName"],
                "hostPath": {"path": str(path), "type": "DirectoryOrCreate"},
                "claimRef": {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "namespace": meta["namespace"],
                    "name": meta["name"],
                    "uid": meta["uid"],
                },
                "nodeAffinity": {"required": {"nodeSelectorTerms": [
                    {"matchExpressions": [on_node]}
                ]}},
            },
        }  # fmt: skip
        try:
            self.api.post("/api/v1/persistentvolumes", pv)
            log.info("provisioned %s for %s/%s on %s", name, meta["namespace"], meta["name"], node)
        except ApiError as e:
            if e.status != 409:
                raise
