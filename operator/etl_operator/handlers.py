"""kopf glue: which ETL to reconcile when something happens. Nothing else.

* an ETL is created, changed, resumed after an operator restart or deleted
  -> reconcile it (finalizer handling lives in ``controller.py``);
* a transformer pod (label ``sluice.dev/etl``) changes or disappears
  -> reconcile its ETL;
* a target pod (``sluice.dev/role=target`` or an ETL's ``targetSelector``)
  appears, changes node or disappears -> reconcile the ETLs that select it;
* every ``SLUICE_RESYNC_SECONDS`` -> reconcile every known ETL, so nothing
  depends on an event never being missed (with peering: only where this
  replica is the active one; kopf's pause stops events, not this loop).

The work itself goes through ``ReconcileQueue`` (coalesced, one run per ETL
at a time) into ``Controller.reconcile``. Run with ``sluice-operator`` or
``kopf run -m etl_operator.handlers [--namespace NS | --all-namespaces]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

import kopf

from etl_operator.actuator import KubeActuator
from etl_operator.controller import Controller, OperatorConfig
from etl_operator.peering import active_namespaces
from etl_operator.pods import ETL_LABEL
from etl_operator.queue import ReconcileQueue
from etl_runtime.cluster.kube.config import api_client
from etl_runtime.cluster.kube.records import (
    DEFAULT_TARGET_LABELS,
    ETL_GROUP,
    ETL_PLURAL,
    ETL_VERSION,
    labels_match,
)

log = logging.getLogger("etl_operator")


class SelectorBook:
    """Known ETLs and the target labels each selects, fed by ETL events."""

    def __init__(self) -> None:
        self.selectors: dict[tuple[str, str], dict[str, str]] = {}

    def put(self, namespace: str, name: str, spec: dict[str, Any]) -> None:
        self.selectors[(namespace, name)] = dict(
            spec.get("targetSelector") or DEFAULT_TARGET_LABELS
        )

    def forget(self, namespace: str, name: str) -> None:
        self.selectors.pop((namespace, name), None)

    def selecting(self, namespace: str, labels: dict[str, str]) -> list[str]:
        return [
            name
            for (ns, name), selector in self.selectors.items()
            if ns == namespace and labels_match(labels, selector)
        ]

    def is_target(self, namespace: str, labels: dict[str, str]) -> bool:
        return labels_match(labels, DEFAULT_TARGET_LABELS) or bool(
            self.selecting(namespace, labels)
        )


@kopf.on.startup()
async def start(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    # kopf waits this long after an event for more of the same object before handling
    # it (default 0.1 s); every step of an ETL start (created, pods created, pods
    # ready) is one event: coalescing is the ReconcileQueue's job anyway.
    settings.batching.batch_window = 0.02
    config = OperatorConfig.from_env()
    if not config.cluster_key:
        log.warning("SLUICE_CLUSTER_KEY is not set: transformers will accept unauthenticated calls")
    controller = Controller(KubeActuator(api_client()), config)
    memo.controller = controller
    memo.book = SelectorBook()
    memo.queue = ReconcileQueue(controller.reconcile)
    memo.resync = asyncio.create_task(_resync(memo, config.resync_seconds))


@kopf.on.cleanup()
async def stop(memo: kopf.Memo, **_: Any) -> None:
    task = getattr(memo, "resync", None)
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _resync(memo: kopf.Memo, every: float) -> None:
    while True:
        await asyncio.sleep(every)
        known = list(memo.book.selectors)
        try:
            active = await asyncio.to_thread(
                active_namespaces,
                getattr(memo, "peering", None),
                {ns for ns, _ in known},
                memo.controller.kube.peering_status,
            )
        except Exception:
            log.exception("cannot read the peering object; skipping this resync")
            continue
        for namespace, name in known:
            if namespace in active:
                memo.queue.request(namespace, name)


@kopf.on.event(ETL_GROUP, ETL_VERSION, ETL_PLURAL)
async def etl_event(
    type: str, namespace: str | None, name: str, spec: kopf.Spec, memo: Any, **_: Any
) -> None:
    if namespace is None:
        return
    if type == "DELETED":
        memo.book.forget(namespace, name)
    else:
        memo.book.put(namespace, name, dict(spec or {}))
    memo.queue.request(namespace, name)


def _interesting_pod(labels: Mapping[str, str], namespace: str | None, memo: Any, **_: Any) -> bool:
    book: SelectorBook | None = getattr(memo, "book", None)
    if ETL_LABEL in labels:
        return True
    return book is not None and namespace is not None and book.is_target(namespace, dict(labels))


@kopf.on.event("", "v1", "pods", when=_interesting_pod)
async def pod_event(labels: Mapping[str, str], namespace: str | None, memo: Any, **_: Any) -> None:
    if namespace is None:
        return
    etl = labels.get(ETL_LABEL)
    if etl:
        memo.queue.request(namespace, etl)
        return
    for name in memo.book.selecting(namespace, dict(labels)):
        memo.queue.request(namespace, name)
