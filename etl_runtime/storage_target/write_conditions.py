"""A native PUT's conditions, as S3's conditional PutObject: ``If-None-Match: *`` and ``If-Match``.

``PUT /v1/objects/{bucket}/{name}`` with ``If-None-Match: *`` stores nothing and
answers 412 ``PreconditionFailed`` when the object exists; with ``If-Match:
ETAG[, ETAG...]`` (or ``*``) 412 when it is another version and 404
``ObjectNotFound`` when there is none. Checked at the owner just before the
write, as the S3 API checks its PutObject (``gateway/s3/objects.py``); an
``If-None-Match`` other than ``*`` is a 400 naming it (no store answers a PUT's
ETag list). The body is not read when a condition fails.
"""

from __future__ import annotations

from collections.abc import Mapping

import anyio.to_thread

from etl_runtime.core.errors import InvalidRequest, ObjectNotFound, PreconditionFailed
from etl_runtime.storage.store import ObjectInfo
from etl_runtime.storage_target.context import Target


def _tags(header: str) -> list[str]:
    return [t.strip().removeprefix("W/").strip('"') for t in header.split(",") if t.strip()]


async def check_write(target: Target, headers: Mapping[str, str], bucket: str, name: str) -> None:
    """Raise unless the PUT's ``If-None-Match`` / ``If-Match`` hold for the stored object."""
    if_match, if_none = headers.get("if-match"), headers.get("if-none-match")
    if if_match is None and if_none is None:
        return
    if if_none is not None and if_none.strip() != "*":
        raise InvalidRequest(
            f"If-None-Match on a PUT of {bucket}/{name} takes only '*', not {if_none!r}",
            bucket=bucket,
            object=name,
        )
    if target.placement is not None:
        await target.placement.ensure_local(bucket, name)
    info: ObjectInfo | None
    try:
        info = await anyio.to_thread.run_sync(target.store.stat_object, bucket, name)
    except ObjectNotFound:
        info = None
    if if_none is not None and info is not None:
        raise PreconditionFailed(
            f"If-None-Match: *: {bucket}/{name} exists", bucket=bucket, object=name
        )
    if if_match is not None:
        if info is None:
            raise ObjectNotFound(
                f"If-Match: {bucket}/{name} does not exist", bucket=bucket, object=name
            )
        tags = _tags(if_match)
        if "*" not in tags and info.etag not in tags:
            raise PreconditionFailed(
                f"If-Match: {bucket}/{name} is another version (ETag {info.etag})",
                bucket=bucket,
                object=name,
            )
