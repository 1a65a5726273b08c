"""Offline transform or copy, bucket -> bucket: ``etl-bck``, ``etl-listrange``,
``copy-bck`` and ``copy-listrange``.

The four kinds are one runner: ``etl`` names the ETLs (an empty list for the
copies: the bytes as stored), and ``objnames`` (the ``-listrange`` kinds, or
a brace ``template``) picks the objects instead of the whole bucket or
``prefix``. A name of ``objnames`` that does not exist is an error naming it.

Each target takes the objects of the source bucket it is the primary owner of
(``prefix``, and the names of a brace ``template`` if given), sends each
through its own transformer(s) — one ETL or a pipeline, as a GET with
``etl_pipeline`` would — and stores the result at the result's HRW owner in
the destination bucket (with the destination's copies). ``ext`` renames
extensions (``{"jpg": "npy"}``), ``prepend`` prefixes output names.

* ``skip_existing``: an object whose output exists and is at least as new as
  the input is skipped (counted as ``skipped``), so a re-run is incremental.
  After a target restart its part resumes the same way.
* ``dry_run``: count what would be transformed, write nothing.
* ``continue_on_error`` (default true): a failing object is counted and listed
  in the job's errors and the job goes on; false: the first one fails the job.
* ``num_workers``: objects in flight per target (default 4).

The spec every target gets (``validate`` normalizes the request)::

    {"etl": ["a", "b"], "etl_args": null, "src": "raw", "dst": "out",
     "prefix": "", "template": "", "prepend": "", "ext": {"jpg": "npy"},
     "skip_existing": false, "dry_run": false, "num_workers": 4,
     "continue_on_error": true}
"""

from __future__ import annotations

import email.utils
import time
from typing import Any

import anyio.to_thread
import httpx
from braceexpand import braceexpand

from etl_runtime.cluster.clustermap import BucketProps, refuse_view_jobs
from etl_runtime.core.access import object_url
from etl_runtime.core.bucket_rules import broken_rule, check_new_bucket
from etl_runtime.core.errors import (
    EtlStopped,
    InvalidRequest,
    ObjectNotFound,
    Unavailable,
    bucket_not_found,
)
from etl_runtime.core.names import validate_bucket
from etl_runtime.etl.pipeline import MAX_STEPS, check_chain_async, transform_chain
from etl_runtime.jobs.context import JobAborted, JobContext, JobFailed
from etl_runtime.jobs.kinds import register_kind

KIND = "etl-bck"
COPY_KINDS = ("copy-bck", "copy-listrange")  # no ETL: the objects as they are
ETL_KINDS = (KIND, "etl-listrange")
KINDS = (*ETL_KINDS, *COPY_KINDS)
READ_CHUNK = 1 << 20
DEFAULT_WORKERS = 4
MAX_WORKERS = 64
MAX_TEMPLATE_NAMES = 1_000_000
FIELDS: dict[str, Any] = {
    "etl": list,
    "etl_args": (str, type(None)),
    "src": str,
    "dst": str,
    "prefix": str,
    "template": str,
    "objnames": (list, type(None)),
    "prepend": str,
    "ext": dict,
    "skip_existing": bool,
    "dry_run": bool,
    "num_workers": int,
    "continue_on_error": bool,
}


def output_name(spec: dict[str, Any], name: str) -> str:
    """``prepend`` + the name with its extension mapped by ``ext``."""
    base, dot, ext = name.rpartition(".")
    if dot and "/" not in ext and ext in spec["ext"]:
        name = f"{base}.{spec['ext'][ext]}"
    return spec["prepend"] + name


def template_names(template: str) -> set[str] | None:
    if not template:
        return None
    names: set[str] = set()
    for n in braceexpand(template):
        names.add(n)
        if len(names) > MAX_TEMPLATE_NAMES:
            raise InvalidRequest(
                f"template {template!r} expands to more than {MAX_TEMPLATE_NAMES} names"
            )
    return names


# -- on the gateway -------------------------------------------------------------------


def validator(kind: str) -> Any:
    """``validate`` for ``kind``: a copy names no ETL, a transform at least one."""

    async def check(gw: Any, spec: dict[str, Any]) -> dict[str, Any]:
        return await validate(gw, spec, copy=kind in COPY_KINDS)

    return check


async def validate(gw: Any, spec: dict[str, Any], copy: bool = False) -> dict[str, Any]:
    unknown = sorted(set(spec) - set(FIELDS))
    if unknown:
        raise InvalidRequest(
            f"unknown field(s) {', '.join(unknown)} of an offline transform; known: "
            f"{', '.join(FIELDS)}"
        )
    out: dict[str, Any] = {
        "etl_args": None,
        "prefix": "",
        "template": "",
        "objnames": None,
        "prepend": "",
        "ext": {},
        "skip_existing": False,
        "dry_run": False,
        "num_workers": DEFAULT_WORKERS,
        "continue_on_error": True,
        **spec,
    }
    for key, typ in FIELDS.items():
        if key not in out:
            raise InvalidRequest(f"an offline transform needs {key!r}")
        if not isinstance(out[key], typ) or (typ is int and isinstance(out[key], bool)):
            raise InvalidRequest(f"{key!r} of an offline transform has the wrong type")
    chain = out["etl"]
    if copy and chain:
        raise InvalidRequest("a copy names no ETL: transform with etl-bck or etl-listrange")
    names = out["objnames"]
    if names is not None and not (names and all(isinstance(n, str) and n for n in names)):
        raise InvalidRequest("'objnames' must be a non-empty list of object names")
    if not copy and (
        not chain or len(chain) > MAX_STEPS or not all(isinstance(n, str) and n for n in chain)
    ):
        raise InvalidRequest(f"'etl' must name 1..{MAX_STEPS} ETLs")
    src, dst = validate_bucket(out["src"]), validate_bucket(out["dst"])
    if src == dst and not out["dry_run"]:
        raise InvalidRequest(
            f"source and destination are both bucket {src!r}: transform into another bucket",
            bucket=src,
        )
    out["ext"] = {str(k).lstrip("."): str(v).lstrip(".") for k, v in out["ext"].items()}
    workers = out["num_workers"]
    out["num_workers"] = DEFAULT_WORKERS if workers == 0 else 1 if workers < 0 else workers
    if out["num_workers"] > MAX_WORKERS:
        raise InvalidRequest(f"num_workers must be at most {MAX_WORKERS}")
    template_names(out["template"])  # 400 now, not on every target
    for record in await check_chain_async(gw.backend.get, chain) if chain else []:
        if record.spec.stopped or record.phase == "Stopped":
            raise EtlStopped(f"ETL {record.name!r} is stopped; start it first", etl=record.name)
    await _check_buckets(gw, src, dst)
    return out


async def _check_buckets(gw: Any, src: str, dst: str) -> None:
    """404 for a missing source; the destination is created if missing (as in AIStore)."""
    if gw.cmap is not None:
        buckets = gw.cmap.get().buckets
        if src not in buckets:
            raise bucket_not_found(src)
        refuse_view_jobs(buckets, src, dst, "etl-bck")  # same rule for copies
        if dst not in buckets:
            check_new_bucket(dst)  # S3's bucket-name rules for a bucket made here
            gw.cmap.update(lambda m: m.with_bucket(dst, BucketProps(created=time.time())))
    else:
        if not await _on_targets(gw, src):
            raise bucket_not_found(src)
        if broken_rule(dst) and not await _on_targets(gw, dst):
            check_new_bucket(dst)
    await gw.fanout("POST", f"/v1/buckets/{dst}", json={"action": "create-bck"})


async def _on_targets(gw: Any, bucket: str) -> bool:
    found = False
    for _, r in await gw.fanout("HEAD", f"/v1/buckets/{bucket}"):
        found = found or (isinstance(r, httpx.Response) and r.status_code == 200)
    return found


# -- on every target ------------------------------------------------------------------


async def _output_mtime(ctx: JobContext, bucket: str, name: str) -> float | None:
    """When the output was written (None: it does not exist)."""
    owners = ctx.owners(bucket, name)
    if ctx.target_id in owners:
        try:
            info = await anyio.to_thread.run_sync(ctx.store.stat_object, bucket, name)
        except ObjectNotFound:
            return None
        return info.mtime
    token = ctx.target.token or ctx.target.read_token
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    url = object_url(ctx.manager.url(ctx.part, owners[0]), bucket, name)
    r = await ctx.retrying(f"HEAD {bucket}/{name}", lambda: _head(ctx, url, headers))
    if r.status_code == 404:
        return None
    if r.status_code != 200:
        raise OSError(f"HEAD {bucket}/{name} on target {owners[0]!r} answered {r.status_code}")
    # Last-Modified has whole seconds: round up, so an output written in the same
    # second as its input counts as newer (the input is older or as old).
    return email.utils.parsedate_to_datetime(r.headers["last-modified"]).timestamp() + 0.999


async def _head(ctx: JobContext, url: str, headers: dict[str, str]) -> httpx.Response:
    r = await ctx.manager.http.head(url, headers=headers)
    if r.status_code == 503:
        raise Unavailable(f"HEAD {url} answered 503")
    return r


async def run(ctx: JobContext) -> None:
    spec = ctx.spec
    src, dst, chain = spec["src"], spec["dst"], spec["etl"]
    wanted = template_names(spec["template"])
    incremental = spec["skip_existing"] or ctx.resumed
    ctx.set_output(bucket=dst)

    async def one(name: str) -> None:
        obj = f"{src}/{name}"
        out = output_name(spec, name)
        try:
            info = await anyio.to_thread.run_sync(ctx.store.stat_object, src, name)
            if incremental:
                mtime = await _output_mtime(ctx, dst, out)
                if mtime is not None and mtime >= info.mtime:
                    ctx.progress.add(skipped=1)
                    return
            if spec["dry_run"]:
                ctx.progress.add(objects=1, bytes=info.size)
                return

            async def attempt() -> int:
                if not chain:
                    return await ctx.put_object(dst, out, _stored(ctx, src, name))
                body = await transform_chain(ctx.forwarder, src, name, chain, spec["etl_args"])
                return await ctx.put_object(dst, out, body)

            # A transformer not ready yet (its target just restarted), an owner away:
            # wait for it (up to the job's target timeout) rather than fail the object.
            size = await ctx.retrying(obj, attempt)
            ctx.progress.add(objects=1, bytes=size)
        except ObjectNotFound:
            if spec["objnames"] is not None:  # asked for by name: the caller should know
                ctx.error(obj, f"object {obj} does not exist")
                if not spec["continue_on_error"]:
                    raise JobFailed(f"{obj}: it does not exist") from None
            return  # else: deleted while the job ran
        except (JobAborted, JobFailed):
            raise
        except Exception as e:  # one object's failure; the job decides to go on or stop
            message = getattr(e, "message", None) or f"{type(e).__name__}: {e}"
            ctx.error(obj, message)
            if not spec["continue_on_error"]:
                raise JobFailed(f"{obj}: {message}") from None

    async def names() -> Any:
        if spec["objnames"] is not None:
            for name in spec["objnames"]:
                if ctx.owns(src, name):
                    yield name
            return
        async for name in ctx.owned_objects(src, spec["prefix"]):
            if wanted is None or name in wanted:
                yield name

    await ctx.map(names(), one, spec["num_workers"])


async def _stored(ctx: JobContext, bucket: str, name: str) -> Any:
    """The stored bytes of ``bucket/name``, read off the event loop."""
    f, _ = await anyio.to_thread.run_sync(ctx.store.open_object, bucket, name)
    try:
        while chunk := await anyio.to_thread.run_sync(f.read, READ_CHUNK):
            yield chunk
    finally:
        f.close()


for _kind in KINDS:
    register_kind(_kind, run, validate=validator(_kind))
