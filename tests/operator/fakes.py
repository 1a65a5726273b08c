"""An in-memory stand-in for ``KubeActuator``: the controller's logic without a cluster.

End-to-end behaviour is covered against a real apiserver in ``test_e2e.py``;
this fake lets unit tests drive exact pod states (ready, exit code 2, ...).
"""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any

from etl_operator.actuator import FINALIZER
from etl_operator.pods import ETL_LABEL, label_value, secret_name
from etl_runtime.cluster.kube.records import labels_match


class FakeKube:
    def __init__(self) -> None:
        self.etls: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.secrets: dict[tuple[str, str], dict[str, Any]] = {}
        self.created: list[str] = []
        self.deleted: list[str] = []
        self.deleted_now: list[str] = []  # deleted without grace period
        self.events: list[dict[str, Any]] = []

    # -- test setup --------------------------------------------------------

    def add_etl(self, name: str, spec: dict, namespace: str = "ns", uid: str = "u1") -> dict:
        obj = {
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": uid,
                "generation": 1,
                "resourceVersion": "1",
            },
            "spec": spec,
        }
        self.etls[(namespace, name)] = obj
        return obj

    def add_target(self, name: str, node: str | None, namespace: str = "ns", **labels) -> None:
        self.pods[(namespace, name)] = {
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {"sluice.dev/role": "target", **labels},
            },
            "spec": {"nodeName": node},
            "status": {"phase": "Running", "podIP": "10.0.0.1"},
        }

    def transformer(self, target: str, namespace: str = "ns") -> dict:
        """The one transformer pod beside ``target`` (fails if there are several)."""
        (pod,) = [
            p
            for p in self.pods.values()
            if p["metadata"].get("labels", {}).get("sluice.dev/target") == target
            and p["metadata"]["namespace"] == namespace
        ]
        return pod

    def set_ready(self, pod: dict, ready: bool = True) -> None:
        pod["status"] = {
            "phase": "Running",
            "podIP": "10.1.0.1",
            "conditions": [{"type": "Ready", "status": str(ready)}],
        }

    def set_hung(self, pod: dict, started: str = "2020-01-01T00:00:00Z") -> None:
        """Running since ``started`` and never ready (e.g. stuck installing dependencies)."""
        pod["status"] = {
            "phase": "Running",
            "podIP": "10.1.0.1",
            "startTime": started,
            "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": started}],
        }

    def set_exit(self, pod: dict, code: int, message: str = "", ran_for: float = 1.0) -> None:
        """The pod's container exited with ``code`` after running ``ran_for`` seconds."""
        end = "2026-01-01T00:10:00+00:00"
        start = (dt.datetime.fromisoformat(end) - dt.timedelta(seconds=ran_for)).isoformat()
        terminated = {"exitCode": code, "message": message, "startedAt": start, "finishedAt": end}
        pod["status"] = {
            "phase": "Failed",
            "containerStatuses": [{"state": {"terminated": terminated}}],
        }

    # -- KubeActuator --------------------------------------------------------

    def get_etl(self, namespace: str, name: str) -> dict | None:
        obj = self.etls.get((namespace, name))
        return copy.deepcopy(obj) if obj else None

    def list_pods(self, namespace: str, labels: dict[str, str]) -> list[dict]:
        return [
            copy.deepcopy(p)
            for (ns, _), p in sorted(self.pods.items())
            if ns == namespace and labels_match(p["metadata"].get("labels"), labels)
        ]

    def transformer_pods(self, namespace: str, etl: str) -> list[dict]:
        return self.list_pods(namespace, {ETL_LABEL: label_value(etl)})

    def get_secret(self, namespace: str, name: str) -> dict | None:
        return copy.deepcopy(self.secrets.get((namespace, name)))

    def create_pod(self, pod: dict) -> bool:
        key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
        if key in self.pods:
            return False
        self.pods[key] = {**copy.deepcopy(pod), "status": {"phase": "Pending"}}
        self.created.append(pod["metadata"]["name"])
        return True

    def delete_pod(self, namespace: str, name: str, now: bool = False) -> None:
        if self.pods.pop((namespace, name), None) is not None:
            self.deleted.append(name)
            if now:
                self.deleted_now.append(name)

    def put_secret(self, secret: dict, exists: bool) -> None:
        meta = secret["metadata"]
        self.secrets[(meta["namespace"], meta["name"])] = {
            **secret,
            "metadata": {**meta, "resourceVersion": "1"},
        }

    def delete_secret(self, namespace: str, etl: str) -> None:
        self.secrets.pop((namespace, secret_name(etl)), None)

    def patch_status(self, namespace: str, name: str, status: dict) -> None:
        if (namespace, name) in self.etls:
            self.etls[(namespace, name)]["status"] = copy.deepcopy(status)

    def record_event(self, event: dict[str, Any]) -> None:
        self.events.append(event)

    def reasons(self) -> list[str]:
        return [e["reason"] for e in self.events]

    def set_finalizer(self, etl: dict, present: bool) -> None:
        meta = self.etls[(etl["metadata"]["namespace"], etl["metadata"]["name"])]["metadata"]
        fins = [f for f in meta.get("finalizers", []) if f != FINALIZER]
        meta["finalizers"] = fins + [FINALIZER] if present else fins
        if not present and meta.get("deletionTimestamp") and not meta["finalizers"]:
            del self.etls[(meta["namespace"], meta["name"])]
