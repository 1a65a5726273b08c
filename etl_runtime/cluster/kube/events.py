"""``PodEvents``: Kubernetes Events recorded on a target's own Pod.

What a target finds on its own (a scrub's corrupted, missing and orphaned
copies, see ``jobs/scrub.py``) is shown where an operator already looks:
``kubectl get events`` and ``kubectl describe pod <target>``. Like every
Event they are best effort: the apiserver expires them (after an hour by
default), and a failure to record one is logged, never raised. A caller
records at most ``limit`` Events through one ``budget()`` (a scrub job takes
one per target), so a bucket of rotten objects is a few Events and a summary,
not thousands.

RBAC: ``events`` create in the target's namespace (the chart's target Role);
no read of pods: the pod's uid comes from the Downward API (``POD_UID``).
"""

from __future__ import annotations

import datetime
import logging
import os
import uuid
from typing import Any

import anyio.to_thread
from kubernetes import client

from etl_runtime.cluster.kube.config import api_client, default_namespace

log = logging.getLogger(__name__)

NORMAL, WARNING = "Normal", "Warning"
COMPONENT = "sluice-target"
_MESSAGE_MAX = 1024  # Events are for people: keep each one short


class EventBudget:
    """At most ``limit`` Events through this budget; the rest are counted, not sent."""

    def __init__(self, events: PodEvents, limit: int) -> None:
        self.events, self.limit = events, limit
        self.sent = 0
        self.dropped = 0

    async def record(self, reason: str, message: str, type: str = WARNING) -> None:
        if self.sent >= self.limit:
            self.dropped += 1
            return
        self.sent += 1
        await self.events.record(reason, message, type)


class PodEvents:
    """Events whose ``involvedObject`` is the Pod ``pod`` in ``namespace``."""

    def __init__(
        self, pod: str, namespace: str | None = None, api: client.ApiClient | None = None
    ) -> None:
        self.pod = pod
        self.namespace = namespace or default_namespace()
        self._api = api
        # ``kubectl describe pod`` shows the Events of the pod's uid (the chart passes
        # metadata.uid as POD_UID); without one, ``kubectl get events`` shows them.
        self._uid = os.environ.get("POD_UID") or None

    def budget(self, limit: int) -> EventBudget:
        return EventBudget(self, limit)

    def _body(self, reason: str, message: str, type: str) -> client.CoreV1Event:
        now = datetime.datetime.now(datetime.UTC)
        return client.CoreV1Event(
            metadata=client.V1ObjectMeta(
                name=f"{self.pod}.{uuid.uuid4().hex[:12]}", namespace=self.namespace
            ),
            involved_object=client.V1ObjectReference(
                kind="Pod", name=self.pod, namespace=self.namespace, uid=self._uid, api_version="v1"
            ),
            reason=reason,
            message=message[:_MESSAGE_MAX],
            type=type,
            source=client.V1EventSource(component=COMPONENT),
            reporting_component=COMPONENT,
            reporting_instance=self.pod,
            first_timestamp=now,
            last_timestamp=now,
            count=1,
        )

    def _send(self, reason: str, message: str, type: str) -> None:
        if self._api is None:
            self._api = api_client()
        core = client.CoreV1Api(self._api)
        core.create_namespaced_event(self.namespace, self._body(reason, message, type))

    async def record(self, reason: str, message: str, type: str = WARNING) -> None:
        try:
            await anyio.to_thread.run_sync(self._send, reason, message, type)
        except Exception as e:  # noqa: BLE001 - best effort, like the operator's Events
            log.warning("could not record event %s on pod %s: %s", reason, self.pod, e)


def events_from_option(value: str | None, pod: str) -> Any:
    """``--events`` / ``SLUICE_EVENTS``: ``kubernetes`` records Events on ``pod``; unset: none."""
    if not value:
        return None
    if value == "kubernetes":
        return PodEvents(pod)
    raise ValueError(f"--events must be 'kubernetes' or unset, got {value!r}")
