"""Where a dataset's objects come from, resolved once into a flat ``Catalog``.

A source is a whole bucket (a ``Bucket`` handle), or a ``Source``: a bucket
with a prefix, a list of object names, or a brace template
(``"shard-{000..099}.tar"``, expanded as webdataset does). A dataset takes one
source or a list of them, and AIStore's ``prefix_map`` (``{bucket: prefix or
[prefixes]}``) to narrow a whole-bucket source.

Resolution is torch-free and happens once, in the process that builds the
dataset: buckets and prefixes are listed (the listing carries each object's
size, which ``DynamicBatchSampler`` needs); names and templates are taken as
given, and their sizes are looked up with one listing per bucket only if
someone asks for them. DataLoader workers and DDP ranks then split the catalog
without listing again.

Datasets travel to DataLoader workers (forked or pickled), so they hold a
``Connection`` (endpoint, token, timeout) and open one ``Client`` per process
instead of sharing a connection pool across a fork.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from braceexpand import braceexpand

from etl_runtime.pytorch.errors import EmptySource
from etl_runtime.sdk.bucket import Bucket
from etl_runtime.sdk.client import Client
from etl_runtime.sdk.errors import NotFound


@dataclass(frozen=True)
class Source:
    """Part of a bucket: ``prefix``, explicit ``names``, or a brace ``template``.

    Give at most one of them; none means the whole bucket.
    """

    bucket: Bucket
    prefix: str | None = None
    names: Sequence[str] | None = None
    template: str | None = None

    def __post_init__(self) -> None:
        given = [k for k in ("prefix", "names", "template") if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"Source({self.bucket.name!r}): give one of {given}, not several")
        if isinstance(self.names, str):
            raise TypeError(f"Source({self.bucket.name!r}): names must be a list, not a string")

    def describe(self) -> str:
        if self.template is not None:
            return f"template {self.bucket.name}/{self.template}"
        if self.names is not None:
            return f"{len(self.names)} names in bucket {self.bucket.name!r}"
        return f"bucket {self.bucket.name!r}" + (
            f" under prefix {self.prefix!r}" if self.prefix else ""
        )


SourceLike = Bucket | Source
Sources = SourceLike | Iterable[SourceLike]
PrefixMap = Mapping[Bucket | str, str | Sequence[str]]


class Connection:
    """How to reach the cluster; one ``Client`` per process, never pickled."""

    def __init__(self, endpoint: str, token: str | None, timeout: float) -> None:
        self.endpoint = endpoint
        self.token = token
        self.timeout = timeout
        self._client: Client | None = None
        self._pid = 0

    @classmethod
    def of(cls, client: Client) -> Connection:
        return cls(client.endpoint, client.token, client.timeout)

    def client(self) -> Client:
        if self._client is None or self._pid != os.getpid():
            # A forked worker must not reuse the parent's sockets: open its own pool.
            self._client = Client(self.endpoint, token=self.token, timeout=self.timeout)
            self._pid = os.getpid()
        return self._client

    def __getstate__(self) -> dict[str, Any]:
        return {"endpoint": self.endpoint, "token": self.token, "timeout": self.timeout}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["endpoint"], state["token"], state["timeout"])  # type: ignore[misc]


class Catalog:
    """The objects of a dataset in a fixed order: parallel lists of bucket, name, size.

    ``sizes`` holds ``-1`` where a source gave names without sizes;
    ``resolved_sizes()`` fills them in with one listing per bucket.
    """

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.buckets: list[str] = []
        self.names: list[str] = []
        self.sizes: list[int] = []

    def __len__(self) -> int:
        return len(self.names)

    def add(self, source: Source) -> None:
        bucket = source.bucket
        start = len(self.names)
        if source.names is not None or source.template is not None:
            names = list(
                source.names if source.names is not None else braceexpand(str(source.template))
            )
            self.names.extend(names)
            self.sizes.extend([-1] * len(names))
        else:
            # One listing; a missing bucket raises the SDK's NotFound naming it.
            for info in bucket.list_objects(prefix=source.prefix or ""):
                self.names.append(info.name)
                self.sizes.append(info.size)
        if len(self.names) == start:
            raise EmptySource(
                f"{source.describe()} holds no object: check the name and prefix",
                bucket=bucket.name,
            )
        self.buckets.extend([bucket.name] * (len(self.names) - start))

    def resolved_sizes(self) -> list[int]:
        """Every object's size, listing each bucket (under the names' common prefix) once."""
        missing: dict[str, list[int]] = {}
        for i, size in enumerate(self.sizes):
            if size < 0:
                missing.setdefault(self.buckets[i], []).append(i)
        client = self.connection.client()
        for bucket_name, indices in missing.items():
            prefix = os.path.commonprefix([self.names[i] for i in indices])
            listed = {o.name: o.size for o in client.bucket(bucket_name).list_objects(prefix)}
            for i in indices:
                if self.names[i] not in listed:
                    raise NotFound(
                        f"object '{bucket_name}/{self.names[i]}' not found",
                        status=404,
                        bucket=bucket_name,
                        object=self.names[i],
                    )
                self.sizes[i] = listed[self.names[i]]
        return self.sizes


def build_catalog(sources: Sources, prefix_map: PrefixMap | None = None) -> Catalog:
    """List/expand every source once, in the order given."""
    items: list[SourceLike] = [sources] if isinstance(sources, Bucket | Source) else list(sources)
    if not items:
        raise ValueError("a dataset needs at least one source (a Bucket or a Source)")
    prefixes = {
        (k.name if isinstance(k, Bucket) else k): ([v] if isinstance(v, str) else list(v))
        for k, v in (prefix_map or {}).items()
    }
    expanded: list[Source] = []
    for item in items:
        if isinstance(item, Bucket):
            for prefix in prefixes.get(item.name, [""]):
                expanded.append(Source(item, prefix=prefix))
        elif isinstance(item, Source):
            expanded.append(item)
        else:
            raise TypeError(f"a source is a Bucket or a Source, not {type(item).__name__}")
    first = expanded[0].bucket.client
    for source in expanded:
        if source.bucket.client.endpoint != first.endpoint:
            raise ValueError(
                f"sources come from one cluster: {source.bucket.client.endpoint} "
                f"differs from {first.endpoint}"
            )
    catalog = Catalog(Connection.of(first))
    for source in expanded:
        catalog.add(source)
    return catalog
