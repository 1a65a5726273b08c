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

A prefetch takes ``"objnames": [...]`` too (the SDK's ``objects(...).prefetch()``,
``prefetch-listrange``): each name's owner fetches it; a name the backend
does not have is an error naming it. ``continue_on_error`` (false by default
for a list) counts such errors and goes on; without it the first one fails
the job. ``num_workers`` (1..64) bounds the fetches at once on each target.
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
PREFETCH_FIELDS = frozenset({"objnames", "continue_on_error", "num_workers"})
MAX_WORKERS = 64


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
    bucket, prefix = _spec(spec, EVICT_FIELDS if not count else PREFETCH_FIELDS)
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
    for key, kind in (("continue_on_error", bool), ("num_workers", int)):
        if key in spec:
            got = spec[key]
            if not isinstance(got, kind) or (kind is int and not 1 <= got <= MAX_WORKERS):
                raise InvalidRequest(
                    f"{key}={got!r} of a prefetch of {bucket!r}: "
                    + ("true or false" if kind is bool else f"1..{MAX_WORKERS}"),
                    bucket=bucket,
                )
            out[key] = got
    if count and "objnames" not in out:
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
    bucket, prefix = _spec(ctx.spec, PREFETCH_FIELDS)
    cache = _cache(ctx, bucket)
    props = cache.props(bucket)
    backend = cache.backend(bucket, props)
    workers = int(ctx.spec.get("num_workers") or PREFETCH_WORKERS)
    if "objnames" in ctx.spec:
        await _prefetch_names(ctx, cache, bucket, props, workers)
        return

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
        await ctx.map(mine(), one, workers=workers)
    except SluiceError as e:  # the listing itself failed (credentials, backend down)
        raise JobFailed(e.message) from None
    ctx.set_output(bucket=bucket)


async def _prefetch_names(
    ctx: JobContext, cache: Any, bucket: str, props: Any, workers: int
) -> None:
    """``objnames``: the ones this target owns, each fetched unless cached."""
    names = [n for n in ctx.spec["objnames"] if ctx.owns(bucket, n)]
    coer = bool(ctx.spec.get("continue_on_error", False))

    async def one(name: str) -> None:
        try:
            fetched = await cache.prefetch_one(bucket, name, props)
        except SluiceError as e:
            ctx.error(name, e.message)
            if not coer:
                raise JobFailed(f"prefetching {bucket}/{name}: {e.message}") from None
            return
        ctx.progress.add(**({"objects": 1} if fetched else {"skipped": 1}))

    await ctx.map(names, one, workers=workers)
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
