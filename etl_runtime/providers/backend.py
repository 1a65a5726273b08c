"""The seam of remote providers: one small protocol, one module per provider, found by name.

A provider is a module of ``etl_runtime.providers`` (``aws``, ``gcp``,
``azure``) named by the one list of providers, ``etl_runtime.core.providers``;
its ``BACKEND`` class implements ``Backend`` and has ``for_bucket(bucket,
props, env=None)``. ``backend_class(name)`` imports it on first use, the way
``etl_runtime.jobs.kinds`` finds job kinds, so adding a provider is one module
plus one line in that list. Everything above this layer (the cache, the
gateway's listing, the prefetch job) talks to a ``Backend`` and never to a
provider's client library.
"""

from __future__ import annotations

import datetime as dt
import importlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from etl_runtime.core import providers as registry
from etl_runtime.core.errors import InvalidRequest

if TYPE_CHECKING:
    from etl_runtime.cluster.clustermap import BucketProps, ClusterMapStore


@dataclass(frozen=True)
class RemoteMeta:
    """What the backend says about an object: the validators the cache keeps."""

    name: str
    size: int
    etag: str
    last_modified: float

    @classmethod
    def of(cls, meta: Mapping[str, Any]) -> RemoteMeta:
        lm = meta.get("last_modified")
        return cls(
            name=str(meta["path"]),
            size=int(meta["size"]),
            etag=str(meta.get("e_tag") or "").strip('"'),
            last_modified=lm.timestamp() if isinstance(lm, dt.datetime) else 0.0,
        )


class Backend(Protocol):
    """The calls a remote bucket's cache, listing and prefetch make of its backend."""

    where: str  # the backend's endpoint, for messages
    provider: str  # its provider's name (aws, gcp, azure)

    def uri(self, name: str | None = None) -> str: ...  # gcp://bucket/name, for messages

    async def head(self, name: str) -> RemoteMeta | None: ...

    async def open(self, name: str) -> tuple[RemoteMeta, AsyncIterator[bytes]]: ...

    async def put_file(self, name: str, path: Path) -> RemoteMeta: ...

    async def delete(self, name: str) -> None: ...

    async def list_page(
        self, prefix: str, start_after: str, limit: int
    ) -> tuple[list[RemoteMeta], str | None]: ...

    async def check_bucket(self) -> None: ...


def backend_class(provider: str) -> Any:
    """The backend class of ``provider`` (its module's ``BACKEND``); 400 if unknown."""
    found = registry.find(provider)
    if found is None:
        raise InvalidRequest(
            f"unknown provider {provider!r}; known: {', '.join(registry.names())}",
            provider=provider,
        )
    return importlib.import_module(found.module).BACKEND


def remote_props(cmap: ClusterMapStore | None, bucket: str) -> BucketProps | None:
    """The props of ``bucket`` if the cluster map lists it as a remote bucket."""
    if cmap is None:
        return None
    props = cmap.get().buckets.get(bucket)
    return props if props is not None and props.remote else None
