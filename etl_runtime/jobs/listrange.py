"""Jobs over a list or range of objects: ``delete-listrange`` (and its names for ``evict``).

AIStore's SDK deletes (and evicts) many objects at once with
``bucket.objects(obj_names=[...] | obj_range=... | obj_template=...).delete()``:
``DELETE /v1/buckets/{b}`` with ``{"action": "delete-listrange", "value":
{"objnames": [...]}}`` or ``{"value": {"template": "a-{000..009}.tar"}}``. The
gateway (``gateway/buckets.py``) starts this job and answers its id, which
``Job.wait()`` follows (``gateway/aisjobs.py``).

The spec every target gets::

    {"bucket": B, "objnames": [...]}     # these names
    {"bucket": B, "template": T}         # brace ranges ({0..9}, {00..90..10});
                                         # a template without one is a prefix

The primary HRW owner of each object deletes it as ``DELETE
/v1/objects/{b}/{o}`` does (its copies, a previous owner's while a rebalance
runs, the backend's object for a remote bucket). A name that exists nowhere is
counted as ``skipped`` and listed in the job's output (``missing``): the
objects asked to be gone are gone. A prefix walks what each target stores
(and, for a remote bucket, the backend's listing).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio.to_thread
from braceexpand import braceexpand

from etl_runtime.core.errors import BucketNotFound, InvalidRequest, ObjectNotFound, SluiceError
from etl_runtime.core.names import validate_bucket, validate_names
from etl_runtime.jobs.context import JobContext, JobFailed, Target
from etl_runtime.jobs.kinds import register_kind

MAX_NAMES = 1_000_000
DELETE_WORKERS = 8
MAX_MISSING_LISTED = 100
_FIELDS = ("bucket", "objnames", "template")


def listrange_spec(bucket: str, value: Any) -> dict[str, Any]:
    """AIStore's ``value`` of a list/range action (``objnames`` or ``template``) as a spec;
    a 400 naming the bucket and the field for anything else."""
    if not isinstance(value, dict):
        raise InvalidRequest(
            f"bucket {bucket!r}: 'value' must be an object with 'objnames' (a list) or "
            "'template' (a string)",
            bucket=bucket,
        )
    unknown = sorted(set(value) - {"objnames", "template"})
    if unknown:
        raise InvalidRequest(
            f"bucket {bucket!r}: unknown field(s) {', '.join(unknown)} of a list/range "
            "action; known: objnames, template",
            bucket=bucket,
        )
    names, template = value.get("objnames"), value.get("template")
    if (names is None) == (template is None):
        raise InvalidRequest(
            f"bucket {bucket!r}: give either 'objnames' or 'template', not "
            + ("both" if names is not None else "neither"),
            bucket=bucket,
        )
    if names is not None:
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise InvalidRequest(
                f"bucket {bucket!r}: 'objnames' must be a list of strings", bucket=bucket
            )
        if not names:
            raise InvalidRequest(f"bucket {bucket!r}: 'objnames' is empty", bucket=bucket)
        for n in names:
            validate_names(bucket, n)
        return {"bucket": bucket, "objnames": list(dict.fromkeys(names))}
    if not isinstance(template, str):
        raise InvalidRequest(f"bucket {bucket!r}: 'template' must be a string", bucket=bucket)
    expand(bucket, template)  # a 400 now, not on every target
    return {"bucket": bucket, "template": template}


def expand(bucket: str, template: str) -> list[str] | None:
    """The names of a template with brace ranges; None for a plain prefix."""
    names = list(dict.fromkeys(braceexpand(template)))
    if names == [template]:
        return None
    if len(names) > MAX_NAMES:
        raise InvalidRequest(
            f"bucket {bucket!r}: template {template!r} expands to more than {MAX_NAMES} names",
            bucket=bucket,
        )
    for n in names:
        validate_names(bucket, n)
    return names


def _parsed(spec: dict[str, Any]) -> tuple[str, list[str] | None, str]:
    unknown = sorted(set(spec) - set(_FIELDS))
    if unknown or not isinstance(spec.get("bucket"), str):
        raise InvalidRequest(
            f"a list/range job needs 'bucket' and 'objnames' or 'template'; unknown: "
            f"{', '.join(unknown) or 'none'}"
        )
    bucket = validate_bucket(spec["bucket"])
    if "objnames" in spec:
        return bucket, listrange_spec(bucket, {"objnames": spec["objnames"]})["objnames"], ""
    template = str(spec.get("template", ""))
    return bucket, expand(bucket, template), template


async def validate_delete(gw: Any, spec: dict[str, Any]) -> dict[str, Any]:
    bucket, _, _ = _parsed(spec)
    if gw.cmap is not None:
        props = gw.cmap.get().buckets.get(bucket)
        if props is None:
            raise BucketNotFound(f"bucket {bucket!r} does not exist", bucket=bucket)
        if props.view:
            raise InvalidRequest(
                f"bucket {bucket!r} is an ETL view, read-only: delete from its source "
                f"{props.view.get('of')!r}",
                bucket=bucket,
            )
    return spec


async def delete_object(target: Target, bucket: str, name: str) -> None:
    """Delete ``bucket/name`` as its owner: everywhere it is (copies, a previous
    owner, the backend); ``ObjectNotFound`` if it is nowhere."""
    remote = target.remote
    if remote is not None and (props := remote.props(bucket)) is not None:
        await remote.delete(bucket, name, props)
        return
    placement = target.placement
    if placement is None:
        await anyio.to_thread.run_sync(target.store.delete_object, bucket, name)
        return
    others = placement.check_owner(bucket, name)
    elsewhere = await placement.delete_elsewhere(bucket, name, others)
    try:
        await anyio.to_thread.run_sync(target.store.delete_object, bucket, name)
    except ObjectNotFound:
        if not elsewhere:  # not here, and not at a previous owner either
            raise


async def _names(ctx: JobContext, bucket: str, names: list[str] | None, prefix: str) -> Any:
    """(name, primary) for every name this target acts on."""
    if names is not None:
        for n in names:
            if ctx.owns(bucket, n):
                yield n, True
        return
    remote = ctx.target.remote
    if remote is not None and (props := remote.props(bucket)) is not None:
        backend = remote.backend(bucket, props)
        start_after = ""
        while True:
            page, nxt = await backend.list_page(prefix, start_after, 1000)
            for meta in page:
                if ctx.owns(bucket, meta.name):
                    yield meta.name, True
            if nxt is None:
                return
            start_after = nxt
    async for n, primary in _stored(ctx, bucket, prefix):
        yield n, primary


async def _stored(ctx: JobContext, bucket: str, prefix: str) -> AsyncIterator[tuple[str, bool]]:
    start_after = ""
    while True:
        page, nxt = await anyio.to_thread.run_sync(
            ctx.store.list_objects, bucket, prefix, start_after, 1000
        )
        for info in page:
            yield info.name, ctx.owns(bucket, info.name)
        if nxt is None or not page:
            return
        start_after = page[-1].name


async def run_delete(ctx: JobContext) -> None:
    bucket, names, prefix = _parsed(ctx.spec)
    missing: list[str] = []

    async def one(item: tuple[str, bool]) -> None:
        name, primary = item
        if not primary:  # a copy the owner's listing may not show (a prefix walk)
            try:
                await anyio.to_thread.run_sync(ctx.store.delete_object, bucket, name)
            except ObjectNotFound:
                pass
            return
        try:
            await delete_object(ctx.target, bucket, name)
        except ObjectNotFound:
            ctx.progress.add(skipped=1)
            if len(missing) < MAX_MISSING_LISTED:
                missing.append(name)
            return
        except SluiceError as e:
            ctx.error(name, e.message)
            return
        ctx.progress.add(objects=1)

    try:
        await ctx.map(_names(ctx, bucket, names, prefix), one, workers=DELETE_WORKERS)
    except SluiceError as e:  # a remote bucket's listing failed (credentials, backend down)
        raise JobFailed(e.message) from None
    ctx.set_output(bucket=bucket, missing=missing)


register_kind("delete-listrange", run_delete, validate=validate_delete)
