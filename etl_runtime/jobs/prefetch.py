"""Job kinds of remote buckets: ``prefetch`` and ``evict`` (``POST /v1/jobs``).

``{"kind": "prefetch", "spec": {"bucket": B, "prefix": P}}`` warms the cache:
every target lists the backend under ``P`` and fetches the objects it owns
(the HRW owner of each name, as a GET would) and does not hold yet; progress
counts objects and bytes fetched, ``skipped`` those already cached; a failed
object is a job error naming it. The gateway's validation adds the
``total`` (objects, bytes under ``P`` on the backend) so a client can draw a
progress bar (``sluice prefetch`` does, with tqdm).

``{"kind": "evict", "spec": {"bucket": B, "prefix": P}}`` drops the cached
copies on every target (the backend keeps the objects); ``"objnames": [...]``
instead of a prefix drops those names' copies (the aistore SDK's
``objects(...).evict()``, ``evict-listrange``).
"""

from __future__ import annotations

from typing import Any

import anyio.to_thread

from etl_runtime.core.errors import BucketNotFound, InvalidRequest, SluiceError
from etl_runtime.core.names import validate_bucket, validate_names
from etl_runtime.jobs import JobContext, JobFailed, register_kind
from etl_runtime.providers.backend import RemoteMeta, backend_class, remote_props

PREFETCH_WORKERS = 4
TOTAL_MAX_OBJECTS = 1_000_000  # beyond this the total is not counted up front
EVICT_FIELDS = frozenset({"objnames"})


def _spec(spec: dict[str, Any], fields: frozenset[str] = frozenset()) -> tuple[str, str]:
    unknown = sorted(set(spec) - {"bucket", "prefix", "total"} - fields)
    if unknown:
        known = ", ".join(["bucket", "prefix", *sorted(fields)])
        raise InvalidRequest(f"unknown field(s) {', '.join(unknown)}; known: {known}")
    bucket, prefix = spec.get("bucket"), spec.get("prefix", "")
    if not isinstance(bucket, str) or not isinstance(prefix, str):
        raise InvalidRequest("'bucket' (a string) and 'prefix' (a string) are required")
    return validate_bucket(bucket), prefix


async def _validate(gw: Any, spec: dict[str, Any], count: bool) -> dict[str, Any]:
    bucket, prefix = _spec(spec, EVICT_FIELDS if not count else frozenset())
    props = remote_props(gw.cmap, bucket)
    if props is None:
        known = gw.cmap is not None and bucket in gw.cmap.get().buckets
        if known:
            raise InvalidRequest(f"bucket {bucket!r} is not a remote bucket", bucket=bucket)
        raise BucketNotFound(
            f"bucket {bucket!r} is not known: read it once with ?provider=PROVIDER (aws, gcp, "
            "azure), or create it with that provider",
            bucket=bucket,
        )
    out: dict[str, Any] = {"bucket": bucket, "prefix": prefix}
    if "objnames" in spec:
        names = spec["objnames"]
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise InvalidRequest("'objnames' must be a list of strings", bucket=bucket)
        out["objnames"] = [validate_names(bucket, n)[1] for n in names]
    if count:
        backend = backend_class(props.provider).for_bucket(bucket, props.backend)
        objects = size = 0
        start_after = ""
        while objects < TOTAL_MAX_OBJECTS:
            page, nxt = await backend.list_page(prefix, start_after, 1000)
            objects += len(page)
            size += sum(m.size for m in page)
            if nxt is None:
                out["total"] = {"objects": objects, "bytes": size}
                break
            start_after = nxt
    return out


async def validate_prefetch(gw: Any, spec: dict[str, Any]) -> dict[str, Any]:
    return await _validate(gw, spec, count=True)


async def validate_evict(gw: Any, spec: dict[str, Any]) -> dict[str, Any]:
    return await _validate(gw, spec, count=False)


def _cache(ctx: JobContext, bucket: str) -> Any:
    cache = ctx.target.remote
    if cache is None or cache.props(bucket) is None:
        raise JobFailed(f"bucket {bucket!r} is not a remote bucket on target {ctx.target_id!r}")
    return cache


async def run_prefetch(ctx: JobContext) -> None:
    bucket, prefix = _spec(ctx.spec)
    cache = _cache(ctx, bucket)
    props = cache.props(bucket)
    backend = cache.backend(bucket, props)

    async def mine() -> Any:
        start_after = ""
        while True:
            page, nxt = await backend.list_page(prefix, start_after, 1000)
            for meta in page:
                if ctx.owns(bucket, meta.name):
                    yield meta
            if nxt is None:
                return
            start_after = nxt

    async def one(meta: RemoteMeta) -> None:
        try:
            fetched = await cache.prefetch_one(bucket, meta.name, props)
        except SluiceError as e:
            ctx.error(meta.name, e.message)
            return
        if fetched:
            ctx.progress.add(objects=1, bytes=meta.size)
        else:
            ctx.progress.add(skipped=1)

    try:
        await ctx.map(mine(), one, workers=PREFETCH_WORKERS)
    except SluiceError as e:  # the listing itself failed (credentials, backend down)
        raise JobFailed(e.message) from None
    ctx.set_output(bucket=bucket)


async def run_evict(ctx: JobContext) -> None:
    bucket, prefix = _spec(ctx.spec, EVICT_FIELDS)
    cache = _cache(ctx, bucket)
    names = ctx.spec.get("objnames")
    objects, size = await anyio.to_thread.run_sync(cache.evict, bucket, prefix, names)
    ctx.progress.add(objects=objects, bytes=size)
    ctx.set_output(bucket=bucket)


register_kind("prefetch", run_prefetch, validate=validate_prefetch)
register_kind("evict", run_evict, validate=validate_evict)
