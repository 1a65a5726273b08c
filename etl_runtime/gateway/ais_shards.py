"""Files inside shards, as AIStore lists and reads them for the official SDK.

* ``ARCH_DIR`` (``bucket.list_archive(shard)``): each ``.tar``, ``.tgz`` /
  ``.tar.gz`` or ``.zip`` object of a listing page is followed by its files,
  ``shard.tar/member`` with the member's size, sorted by name; the shard gets
  AIStore's archive flag (``apc.EntryIsArchive``), its files the shard's
  flags with ``apc.EntryInArch``. Directories are not listed (as AIStore's).
* ``GET /v1/objects/{b}/{shard}?archpath=member`` or ``?archregx=&archmode=``
  (``get_reader(archive_config=ArchiveConfig(...))``): that file's bytes, or a
  tar of the matching files (``getbatch/archread.py``).

The gateway reads the shard from a target that holds it (a GET, streamed; the
target checks the bytes as it sends them). Unsafe member names (absolute, with
``..``) are left out of a listing. An ETL view's shards are refused (a 400):
they are transformed when read, whole.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from etl_runtime.core.errors import InvalidRequest
from etl_runtime.core.params import refuse_unknown
from etl_runtime.gateway import views
from etl_runtime.gateway.context import Gateway
from etl_runtime.gateway.placement import object_bytes
from etl_runtime.getbatch import archread
from etl_runtime.getbatch.archread import is_arch_read, shard_kind

__all__ = ["expand", "is_arch_read", "members", "read"]


def _refuse_view(gw: Gateway, bucket: str, name: str | None = None) -> None:
    if views.view_of(gw, bucket) is not None:
        raise InvalidRequest(
            f"bucket {bucket!r} is an ETL view: its shards are transformed on reading, so "
            "files inside them are not listed or read one by one; use its source bucket",
            bucket=bucket,
            object=name,
        )


def _source(gw: Gateway, bucket: str, name: str) -> archread.Source:
    """The stored bytes of ``bucket/name``, from a target that holds it."""

    def chunks() -> AsyncIterator[bytes]:
        return object_bytes(gw, bucket, name, f"reading shard ais://{bucket}/{name}")

    return chunks


async def members(gw: Gateway, bucket: str, name: str) -> list[tuple[str, int]]:
    """The files of shard ``bucket/name`` (safe names only, normalized), sorted."""
    return await archread.members(_source(gw, bucket, name), bucket, name)


async def expand(gw: Gateway, bucket: str, objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """An ``ARCH_DIR`` page: every shard followed by its files."""
    _refuse_view(gw, bucket)
    out: list[dict[str, Any]] = []
    for o in objects:
        out.append(o)
        if o.get("dir") or shard_kind(o["name"]) is None:
            continue
        files = await members(gw, bucket, o["name"])
        o["archive"] = True
        for member, size in files:
            out.append(
                {
                    "name": f"{o['name']}/{member}",
                    "size": size,
                    "in_arch": True,
                    "cached": o.get("cached", False),
                }
            )
    return out


async def read(gw: Gateway, request: Request, bucket: str, name: str) -> Response:
    """``?archpath=`` (one file's bytes) or ``?archregx=&archmode=`` (a tar of matches)."""
    gw.require_read(request, bucket)
    refuse_unknown(request, archread.READ_PARAMS, bucket=bucket, object=name)
    plan = archread.parse(request.query_params, bucket, name)
    _refuse_view(gw, bucket, name)
    return await plan.answer(_source(gw, bucket, name))
