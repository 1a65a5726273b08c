"""A list+watch cache in a background thread, like client-go's informer.

``WatchCache`` lists a collection, then watches it from the list's
resourceVersion, keeping ``name -> object`` (plain dicts) current. On ``410
Gone`` or any connection error it relists after a short backoff, so the cache
heals from apiserver restarts. Readers get a consistent snapshot of a dict
without touching the network.

A watch that receives nothing for ``SLUICE_KUBE_WATCH_INACTIVITY_S`` seconds
(default 70, kopf's ``inactivity_timeout``) is given up and the collection
relisted: on a half-open connection (a NAT entry or a load balancer gone, the
apiserver's host frozen) no error ever arrives, and without this limit the
cache would stay stale for good. A healthy watch is never that quiet: the
apiserver sends a bookmark about once a minute to every watch that asks for
them. Lists and watches use the same limit as the socket's read timeout.
Each relist is logged and counted by reason (``relists()``; every server's
``/metrics`` serves them as ``sluice_kube_watch_relists_total{watch,reason}``).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException
from prometheus_client.core import CounterMetricFamily, Metric
from urllib3.exceptions import ReadTimeoutError

from etl_runtime.core import metrics

log = logging.getLogger(__name__)

# A generated list call, e.g. ``CoreV1Api.list_namespaced_pod``.
ListFn = Callable[..., Any]

INACTIVITY_ENV = "SLUICE_KUBE_WATCH_INACTIVITY_S"
DEFAULT_INACTIVITY_S = 70.0  # kopf's; above the apiserver's one-minute bookmarks
CONNECT_TIMEOUT_S = 10.0

_relists: Counter[tuple[str, str]] = Counter()  # (what, reason) -> relists, this process
_relists_lock = threading.Lock()


def inactivity_timeout() -> float:
    """``SLUICE_KUBE_WATCH_INACTIVITY_S`` (seconds, > 0), else the default."""
    raw = os.environ.get(INACTIVITY_ENV, "").strip()
    if not raw:
        return DEFAULT_INACTIVITY_S
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise ValueError(f"{INACTIVITY_ENV}={raw!r}: expected a number of seconds above 0")
    return value


def relists() -> dict[tuple[str, str], int]:
    """Relists since start, by ``(what, reason)``: ``inactive``, ``gone``, ``error``."""
    with _relists_lock:
        return dict(_relists)


def _count_relist(what: str, reason: str) -> None:
    with _relists_lock:
        _relists[(what, reason)] += 1


class WatchCollector:
    """``sluice_kube_watch_relists_total{watch,reason}`` for a server's registry."""

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "sluice_kube_watch_relists",
            "Relists of a Kubernetes watch cache, by reason (inactive: nothing received "
            "within the inactivity timeout; gone: 410; error: any other failure)",
            labels=["watch", "reason"],
        )
        for (what, reason), n in sorted(relists().items()):
            family.add_metric([what, reason], n)
        yield family


metrics.PROCESS_COLLECTORS.append(WatchCollector())  # every server's /metrics


class WatchCache:
    """Objects of one collection by name, kept current by a daemon thread.

    ``on_change(snapshot)`` (optional) runs in the watch thread after every
    change with the new ``{name: object}`` dict; keep it cheap.
    """

    def __init__(
        self,
        api: client.ApiClient,
        list_fn: ListFn,
        what: str,
        on_change: Callable[[dict[str, dict[str, Any]]], None] | None = None,
        timeout_seconds: int = 300,
        inactivity_s: float | None = None,
        **list_kwargs: Any,
    ) -> None:
        self._api = api
        self._list_fn = list_fn
        self._list_kwargs = list_kwargs
        self._what = what
        self._on_change = on_change
        self._timeout = timeout_seconds
        self.inactivity_s = inactivity_s if inactivity_s is not None else inactivity_timeout()
        # urllib3's read timeout is per socket read: exactly an inactivity limit.
        self._request_timeout = (CONNECT_TIMEOUT_S, self.inactivity_s)
        self._objects: dict[str, dict[str, Any]] = {}
        self._synced = threading.Event()
        self._stop = threading.Event()
        self._watch: watch.Watch | None = None
        self._thread = threading.Thread(target=self._run, name=f"watch-{what}", daemon=True)

    def start(self) -> WatchCache:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()

    def wait_synced(self, timeout: float | None = None) -> bool:
        """Block until the first list has landed; True if it has."""
        return self._synced.wait(timeout)

    @property
    def objects(self) -> dict[str, dict[str, Any]]:
        """The current ``{name: object}`` (replaced, never mutated in place)."""
        return self._objects

    def _to_dict(self, obj: Any) -> dict[str, Any]:
        return obj if isinstance(obj, dict) else self._api.sanitize_for_serialization(obj)

    def _list_raw(self) -> dict[str, Any]:
        """The list as the apiserver sent it (JSON), skipping model conversion."""
        resp = self._list_fn(
            _preload_content=False, _request_timeout=self._request_timeout, **self._list_kwargs
        )
        data = resp.data if hasattr(resp, "data") else resp.read()
        return json.loads(data)

    def _publish(self, objects: dict[str, dict[str, Any]]) -> None:
        self._objects = objects
        if self._on_change is not None:
            try:
                self._on_change(objects)
            except Exception:  # a bad callback must not kill the watch
                log.exception("on_change callback for %s failed", self._what)

    def _run(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            wait = backoff
            try:
                resource_version = self._relist()
                self._synced.set()
                backoff = 0.5
                self._follow(resource_version)
            except ReadTimeoutError:
                if self._stop.is_set():
                    return
                log.warning(
                    "watch %s: nothing from the apiserver for %g s (%s); relisting",
                    self._what,
                    self.inactivity_s,
                    INACTIVITY_ENV,
                )
                _count_relist(self._what, "inactive")
                wait = 0.1  # the next connection is likely fine: do not wait long
            except ApiException as e:
                if self._stop.is_set():
                    return
                if e.status != 410:
                    log.warning("watch %s: %s %s; relisting", self._what, e.status, e.reason)
                _count_relist(self._what, "gone" if e.status == 410 else "error")
            except Exception as e:
                if self._stop.is_set():
                    return
                log.warning("watch %s failed: %s; relisting", self._what, e)
                _count_relist(self._what, "error")
            if self._stop.wait(wait):
                return
            backoff = min(backoff * 2, 10.0)

    def _relist(self) -> str:
        result = self._list_raw()
        items = result.get("items") or []
        self._publish({o["metadata"]["name"]: o for o in items})
        return str((result.get("metadata") or {}).get("resourceVersion") or "")

    def _follow(self, resource_version: str) -> None:
        while not self._stop.is_set():
            self._watch = watch.Watch()
            stream = self._watch.stream(
                self._list_fn,
                resource_version=resource_version,
                timeout_seconds=self._timeout,
                allow_watch_bookmarks=True,
                _request_timeout=self._request_timeout,
                **self._list_kwargs,
            )
            for event in stream:
                kind = event["type"]
                obj = event.get("raw_object") or self._to_dict(event["object"])
                meta = obj.get("metadata") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise ApiException(status=410, reason="Gone")
                    raise RuntimeError(f"watch error: {obj.get('message')}")
                resource_version = meta.get("resourceVersion") or resource_version
                if kind == "BOOKMARK":
                    continue
                objects = dict(self._objects)
                if kind == "DELETED":
                    objects.pop(meta["name"], None)
                else:
                    objects[meta["name"]] = obj
                self._publish(objects)
            # Server closed the watch after timeout_seconds: resume where we were.
        if self._watch is not None:
            self._watch.stop()


def wait_until(pred: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    """Poll ``pred`` until true or ``timeout`` seconds pass; return its last value."""
    deadline = time.monotonic() + timeout
    while True:
        if pred():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
