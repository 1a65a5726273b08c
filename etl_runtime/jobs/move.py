"""The ``move-bck`` job: AIStore's ``bucket.rename(to)``, a bucket under a new name.

``{"src": OLD, "dst": NEW}``. The gateway's check refuses a source that is
missing, remote (an ``aws`` bucket keeps its backend's name) or an ETL view
(or one a view reads), and a destination that exists (409); it then creates
``NEW`` with ``OLD``'s props (copies). Every target copies the objects it is
the primary owner of, as ``copy-bck`` does (``jobs/transform.py``: to each
name's owner under ``NEW``, with its copies and checksums). When the job has
finished the gateway drops ``OLD`` (``gateway/ais_move.py``), before it
reports the job ended, so ``Job.wait()`` returns with ``OLD`` gone. A job
that failed or was aborted leaves ``OLD`` as it was (and ``NEW`` with what
was copied).
"""

from __future__ import annotations

from typing import Any

from etl_runtime.cluster.clustermap import BucketProps
from etl_runtime.core.bucket_rules import check_new_bucket
from etl_runtime.core.errors import BucketExists, InvalidRequest, bucket_not_found
from etl_runtime.core.names import validate_bucket
from etl_runtime.jobs import transform
from etl_runtime.jobs.kinds import register_kind

KIND = "move-bck"


async def validate_move(gw: Any, spec: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(spec) - {"src", "dst"})
    if unknown:
        raise InvalidRequest(f"{KIND}: unknown field(s) {', '.join(unknown)}; known: src, dst")
    src, dst = validate_bucket(str(spec.get("src"))), validate_bucket(str(spec.get("dst")))
    if gw.cmap is None:
        raise InvalidRequest(
            f"renaming bucket {src!r} needs the cluster map (sluice up, or the chart's map)",
            bucket=src,
        )
    buckets = gw.cmap.get().buckets
    props = buckets.get(src)
    if props is None:
        raise bucket_not_found(src)
    if src == dst:
        raise InvalidRequest(f"bucket {src!r} already has that name", bucket=src)
    if props.provider != "ais":
        raise InvalidRequest(
            f"bucket {src!r} is a remote ({props.provider}) bucket: only ais buckets are renamed",
            bucket=src,
        )
    if props.view or any((p.view or {}).get("of") == src for p in buckets.values()):
        raise InvalidRequest(
            f"bucket {src!r} is an ETL view or the source of one: it is not renamed", bucket=src
        )
    if dst in buckets:
        raise BucketExists(f"bucket ais://{dst} already exists: rename into a new name", bucket=dst)
    check_new_bucket(dst)  # S3's bucket-name rules for the new name
    gw.cmap.update(
        lambda m: m.with_bucket(dst, BucketProps(copies=props.copies, created=props.created))
    )
    checked = await transform.validate(gw, {"src": src, "dst": dst, "etl": []}, copy=True)
    checked["continue_on_error"] = False  # a move that lost an object must not drop the source
    checked["src_created"] = props.created  # which OLD the gateway drops: this one only
    return checked


register_kind(KIND, transform.run, validate=validate_move)
