"""``RemoteBucket``: a bucket of a remote provider (``aws``, ``gcp``, ``azure``) cached by Sluice.

``client.bucket("name", provider="gcp")`` returns one (any provider or alias of
``etl_runtime.core.providers``). It is a ``Bucket``
(objects, listings, ``object_urls`` for webdataset) whose first call adds the
bucket to the cluster if needed (``?provider=aws``, as AIStore does for a
remote bucket on first touch), plus what only remote buckets have: backend
props, ``prefetch`` and ``evict``. Listings carry ``cached`` per object.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from etl_runtime.core import providers
from etl_runtime.sdk.bucket import Bucket
from etl_runtime.sdk.client import quote_path
from etl_runtime.sdk.errors import SluiceError
from etl_runtime.sdk.object import Object, ObjectInfo

if TYPE_CHECKING:
    from etl_runtime.sdk.client import Client


class JobError(SluiceError):
    """A prefetch or evict job ended Failed or Aborted."""


class RemoteBucket(Bucket):
    def __init__(self, client: Client, name: str, provider: str) -> None:
        super().__init__(client, name)
        found = providers.canonical(provider)
        if found is None or found == providers.AIS:
            raise ValueError(f"{provider!r} is not a remote provider: {providers.described()}")
        self.provider = found
        self._known = False

    def _ensure(self) -> None:
        """Add the bucket to the cluster map on first use (a HEAD with provider=aws)."""
        if not self._known:
            self.client.request(
                "HEAD",
                self._path,
                params={"provider": self.provider},
                context={"bucket": self.name},
            )
            self._known = True

    def create(  # type: ignore[override]
        self,
        exist_ok: bool = True,
        endpoint: str | None = None,
        region: str | None = None,
        secret: str | None = None,
        validate_warm_get: bool | None = None,
        validate_interval: float | None = None,
        project: str | None = None,
        account: str | None = None,
        validate_cold_get: bool | None = None,
    ) -> RemoteBucket:
        """Add the backend bucket to Sluice, with props overriding the targets' environment.

        ``region`` is an ``aws`` prop, ``project`` a ``gcp`` one, ``account`` an
        ``azure`` one. ``secret``: ``anonymous``, the name of a secret mounted on
        the targets, or for ``aws`` ``profile:NAME`` (see docs/remote.md). The
        backend must have the bucket. ``validate_cold_get``: check each fill's bytes
        against the backend's MD5 before serving its last byte (docs/remote.md).
        """
        props = _props(endpoint, region, secret, validate_warm_get, validate_interval)
        props.update(_props(project=project, account=account, validate_cold_get=validate_cold_get))
        body: dict[str, Any] = {"action": "create-bck", "props": props}
        self.client.request_json(
            "POST",
            self._path,
            params={"provider": self.provider},
            json_body=body,
            context={"bucket": self.name},
        )
        self._known = True
        return self

    def set_props(  # type: ignore[override]
        self,
        endpoint: str | None = None,
        region: str | None = None,
        secret: str | None = None,
        validate_warm_get: bool | None = None,
        validate_interval: float | None = None,
        project: str | None = None,
        account: str | None = None,
        validate_cold_get: bool | None = None,
    ) -> dict[str, Any]:
        """Change backend props (only those given)."""
        self._ensure()
        props = _props(endpoint, region, secret, validate_warm_get, validate_interval)
        props.update(_props(project=project, account=account, validate_cold_get=validate_cold_get))
        data = self.client.request_json(
            "POST",
            self._path,
            json_body={"action": "set-bprops", "props": props},
            context={"bucket": self.name},
        )
        return dict(data.get("props") or {})

    def object(self, name: str) -> Object:
        self._ensure()
        return super().object(name)

    def list_objects(self, prefix: str = "", page_size: int = 1000) -> Iterator[ObjectInfo]:
        self._ensure()
        return super().list_objects(prefix, page_size)

    def list_entries(self, prefix: str = "", page_size: int = 1000) -> Iterator[dict[str, Any]]:
        """Every backend object under ``prefix`` as a dict with ``cached`` (sorted by name)."""
        self._ensure()
        start_after = ""
        while True:
            params = {"prefix": prefix, "limit": str(page_size), "start_after": start_after}
            data = self.client.request_json(
                "GET", self._path, params=params, context={"bucket": self.name}
            )
            yield from data.get("objects", [])
            start_after = data.get("next") or ""
            if not start_after:
                return

    def prefetch(
        self,
        prefix: str = "",
        wait: bool = True,
        on_progress: Callable[[dict[str, Any]], None] | None = None,
        poll: float = 0.5,
    ) -> dict[str, Any]:
        """Warm the cache with every backend object under ``prefix``: a ``prefetch`` job.

        Returns the job (``GET /v1/jobs/{id}``: ``state``, ``progress`` with
        ``objects``/``bytes`` fetched and ``skipped``, ``spec.total``); with
        ``wait`` once it ended, calling ``on_progress(job)`` at every poll.
        A failed or aborted job raises ``JobError`` naming the reason.
        """
        return self._job("prefetch", prefix, wait, on_progress, poll)

    def evict(self, prefix: str = "", wait: bool = True) -> dict[str, Any]:
        """Drop the cached copies (under ``prefix``) on every target: an ``evict`` job.

        The backend keeps the objects; the next GET fetches them again."""
        return self._job("evict", prefix, wait, None, 0.2)

    def _job(
        self,
        kind: str,
        prefix: str,
        wait: bool,
        on_progress: Callable[[dict[str, Any]], None] | None,
        poll: float,
    ) -> dict[str, Any]:
        self._ensure()
        spec = {"bucket": self.name, "prefix": prefix}
        ctx = {"bucket": self.name}
        started = self.client.request_json(
            "POST", "/v1/jobs", json_body={"kind": kind, "spec": spec}, context=ctx
        )
        path = f"/v1/jobs/{quote_path(started['id'])}"
        while True:
            job = self.client.request_json("GET", path, context=ctx)
            if on_progress is not None:
                on_progress(job)
            if not wait or job["state"] != "Running":
                break
            time.sleep(poll)
        if job["state"] in ("Failed", "Aborted"):
            raise JobError(
                f"{kind} job {job['id']} of bucket {self.name!r} {job['state'].lower()}: "
                f"{job.get('reason')}",
                bucket=self.name,
            )
        return job

    def __repr__(self) -> str:
        return f"RemoteBucket({self.name!r}, provider={self.provider!r})"


def _props(
    endpoint: str | None = None,
    region: str | None = None,
    secret: str | None = None,
    validate_warm_get: bool | None = None,
    validate_interval: float | None = None,
    **more: str | bool | None,
) -> dict[str, Any]:
    given = {
        "endpoint": endpoint,
        "region": region,
        "secret": secret,
        "validate_warm_get": validate_warm_get,
        "validate_interval": validate_interval,
        **more,
    }
    return {k: v for k, v in given.items() if v is not None}
