"""``Bucket``: create, list (all pages, transparently), delete, and URLs for loaders.

``object_urls()`` and ``list_urls()`` hand out plain HTTP GET URLs on the
gateway, optionally through an ETL, so ``wds.WebDataset(urls)`` (or curl, or a
browser) can read a transformed dataset without the SDK in the loop.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from braceexpand import braceexpand

from etl_runtime.sdk.client import EtlArgs, encode_etl_args, quote_path
from etl_runtime.sdk.errors import Conflict, NotFound
from etl_runtime.sdk.object import Object, ObjectInfo

if TYPE_CHECKING:
    from etl_runtime.sdk.client import Client
    from etl_runtime.sdk.job import Job

PAGE_SIZE = 1000


class Bucket:
    """A handle on one bucket; nothing is fetched until you call a method."""

    def __init__(self, client: Client, name: str) -> None:
        if not name:
            raise ValueError("bucket name must not be empty")
        self.client = client
        self.name = name

    @property
    def _path(self) -> str:
        return f"/v1/buckets/{quote_path(self.name)}"

    def create(
        self,
        exist_ok: bool = True,
        copies: int | None = None,
        *,
        view_of: str | None = None,
        etl: str | None = None,
        etl_args: EtlArgs = None,
    ) -> Bucket:
        """Create the bucket; with ``exist_ok=False`` an existing one raises ``Conflict``.

        ``copies`` (1-3): how many targets hold each object; every write reaches
        all of them before it is acknowledged, so reads survive one target away.

        ``view_of`` and ``etl`` make an ETL view instead: a read-only bucket that
        lists ``view_of``'s objects and returns each one transformed by ``etl``
        (with ``etl_args``), computed on the target that holds it. Any client
        reads it unchanged (S3 clients, webdataset URLs, the aistore SDK).
        """
        body: dict[str, Any] = {"action": "create-bck"}
        if view_of is not None or etl is not None:
            if copies is not None:
                raise ValueError("a view stores nothing: copies does not apply to it")
            view: dict[str, Any] = {"view_of": view_of, "etl": etl}
            if (args := encode_etl_args(etl_args)) is not None:
                view["etl_args"] = args
            body["props"] = view
        elif copies is not None:
            body["props"] = {"copies": copies}
        data = self.client.request_json(
            "POST", self._path, json_body=body, context={"bucket": self.name}
        )
        if not exist_ok and data.get("created") is False:
            raise Conflict(f"bucket {self.name!r} already exists", status=409, bucket=self.name)
        return self

    def set_props(self, copies: int) -> dict[str, Any]:
        """Change the bucket's props; more copies start a repair that adds them."""
        data = self.client.request_json(
            "POST",
            self._path,
            json_body={"action": "set-bprops", "props": {"copies": copies}},
            context={"bucket": self.name},
        )
        return dict(data.get("props") or {})

    def props(self) -> dict[str, Any]:
        """The bucket's props (``copies``, ``created``) from the cluster map."""
        buckets = self.client.cluster().get("buckets") or {}
        if self.name not in buckets:
            raise NotFound(f"bucket {self.name!r} does not exist", status=404, bucket=self.name)
        return dict(buckets[self.name])

    def delete(self, missing_ok: bool = False) -> None:
        """Delete the bucket and every object in it."""
        try:
            self.client.request("DELETE", self._path, context={"bucket": self.name})
        except NotFound:
            if not missing_ok:
                raise

    def exists(self) -> bool:
        try:
            self.client.request(
                "GET", self._path, params={"limit": "1"}, context={"bucket": self.name}
            )
        except NotFound:
            return False
        return True

    def object(self, name: str) -> Object:
        return Object(self, name)

    def list_objects(self, prefix: str = "", page_size: int = PAGE_SIZE) -> Iterator[ObjectInfo]:
        """Every object whose name starts with ``prefix``, sorted by name.

        Pages are fetched lazily as you iterate; a missing bucket raises
        ``NotFound`` on the first step.
        """
        start_after: str | None = None
        while True:
            params = {"prefix": prefix, "limit": str(page_size)}
            if start_after is not None:
                params["start_after"] = start_after
            data = self.client.request_json(
                "GET", self._path, params=params, context={"bucket": self.name}
            )
            for entry in data.get("objects", []):
                yield ObjectInfo.from_dict(entry)
            start_after = data.get("next")
            if not start_after:
                return

    def object_urls(
        self, pattern: str, etl_name: str | None = None, etl_args: EtlArgs = None
    ) -> list[str]:
        """GET URLs for ``pattern`` brace-expanded exactly as webdataset does.

        ``bucket.object_urls("shard-{000..099}.tar", etl_name="resize")`` gives
        100 URLs. The objects are not checked for existence.
        """
        return [self.object(name).url(etl_name, etl_args) for name in braceexpand(pattern)]

    def list_urls(
        self, prefix: str = "", etl_name: str | None = None, etl_args: EtlArgs = None
    ) -> list[str]:
        """GET URLs for every object listed under ``prefix`` (sorted by name)."""
        return [self.object(o.name).url(etl_name, etl_args) for o in self.list_objects(prefix)]

    def transform(
        self,
        etl_name: str | Sequence[str],
        to_bucket: str,
        prefix: str = "",
        template: str = "",
        prepend: str = "",
        ext: Mapping[str, str] | None = None,
        skip_existing: bool = False,
        dry_run: bool = False,
        num_workers: int = 0,
        continue_on_error: bool = True,
        etl_args: EtlArgs = None,
    ) -> Job:
        """Transform this bucket into ``to_bucket`` on the targets (an ``etl-bck`` job).

        ``etl_name`` may be a list (a pipeline). ``template`` (``"a-{000..099}.tar"``)
        and ``prefix`` select objects; ``ext={"jpg": "npy"}`` and ``prepend`` name
        the outputs; ``skip_existing`` skips objects whose output is newer.
        ``num_workers``: objects in flight per target (0: the default, 4).
        """
        from etl_runtime.sdk.client import encode_etl_args
        from etl_runtime.sdk.job import Job

        chain = [etl_name] if isinstance(etl_name, str) else list(etl_name)
        value: dict[str, Any] = {
            "id": chain[0],
            "pipeline": chain[1:],
            "to_bucket": to_bucket,
            "prefix": prefix,
            "template": template,
            "prepend": prepend,
            "ext": dict(ext or {}),
            "skip_existing": skip_existing,
            "dry_run": dry_run,
            "num-workers": num_workers,
            "coer": continue_on_error,
            "etl_args": encode_etl_args(etl_args),
        }
        data = self.client.request_json(
            "POST",
            self._path,
            json_body={"action": "etl-bck", "value": value},
            context={"bucket": self.name, "etl": ",".join(chain)},
        )
        return Job(self.client, str(data["id"]))

    def __repr__(self) -> str:
        return f"Bucket({self.name!r})"
