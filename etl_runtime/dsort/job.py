"""dSort as a job kind: every target runs the same four phases on its own data.

1. **index** — each target reads the input shards it owns (HRW primary) and
   finds their records (``records.index_shard``: byte ranges, no copies);
2. **inventory** — each target sends its records' metadata (key, offset,
   size per shard: a few dozen bytes a record) to every member; after the
   ``inventory`` barrier every target holds the same inventory and computes
   the same plan (``plan.make_plan``: the seed is fixed at start);
3. **send** — for every output shard, each target streams the bytes of its
   own records in that shard, in plan order, to the shard's builder (HRW
   owner of the output name). The builder knows the final layout from the
   sizes, so it writes each record straight to its offset in a sparse file
   in the job's workdir — records from different targets arrive at once, in
   any order, and nothing is held in memory;
4. **publish** — after the ``sent`` barrier the builder stores each of its
   output shards (with the bucket's copies) and counts it in the progress.

No process ever holds more than one chunk of record bytes, and each byte
crosses the network at most once (never for a record already on its builder).
A target that restarts mid-job resumes: the phases it reached, the inventories
and the received record bytes (fsynced before each send is acknowledged) are
on its disk; it sends its records again (idempotent: same bytes, same
offsets) unless it had reached ``sent``, and publishes only the output shards
its checkpoint does not list.
"""

from __future__ import annotations

import asyncio
import json
import os
import struct
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import IO, Any

import anyio.to_thread

from etl_runtime.cluster.clustermap import BucketProps, hrw_order, refuse_view_jobs
from etl_runtime.core.bucket_rules import check_new_bucket
from etl_runtime.core.durable import fsync_dir, make_dirs, write_atomic
from etl_runtime.core.errors import DsortFailed, NotFound, bucket_not_found
from etl_runtime.dsort.plan import OutputShard, make_plan
from etl_runtime.dsort.records import Record, copy_range, index_shard
from etl_runtime.dsort.spec import DsortSpec
from etl_runtime.jobs import JobContext, JobFailed, register_kind

KIND = "dsort"
INDEX_WORKERS = 2
SEND_WORKERS = 4
CHUNK = 1 << 20
_LEN = struct.Struct(">Q")
STAMPS = "stamps.json"  # size, mtime, inode of each input shard this target indexed


# -- gateway side ----------------------------------------------------------------------


async def validate(gw: Any, raw: dict[str, Any]) -> dict[str, Any]:
    """Check the spec (400 naming the field), fix a shuffle's seed, create the output bucket."""
    spec = DsortSpec.from_dict(raw).with_seed()
    if gw.cmap is not None:
        buckets = gw.cmap.get().buckets
        if spec.input_bck not in buckets:
            raise bucket_not_found(spec.input_bck)
        refuse_view_jobs(buckets, spec.input_bck, spec.output_bck, "dsort")
        if spec.output_bck not in buckets:
            check_new_bucket(spec.output_bck)  # S3's bucket-name rules for a bucket made here
            props = BucketProps(created=time.time())
            gw.cmap.update(lambda m: m.with_bucket(spec.output_bck, props))
    return spec.to_dict()


# -- target side -----------------------------------------------------------------------


def _out_file(ctx: JobContext, index: int) -> Path:
    return _workdir(ctx) / f"out-{index:08d}.tar"


def _owner(ctx: JobContext, bucket: str, name: str) -> str:
    """HRW owner among the job's members, fixed at its start: every target agrees on it
    even if the cluster map changes mid-job, so no shard is read twice or skipped."""
    return hrw_order(ctx.members, f"{bucket}/{name}")[0]


def _workdir(ctx: JobContext) -> Path:
    make_dirs(ctx.workdir)  # received records are acknowledged: their directory too
    return ctx.workdir


async def run(ctx: JobContext) -> None:
    spec = DsortSpec.from_dict(ctx.spec)
    me = ctx.target_id
    phases = ctx.part.phases if ctx.resumed else []
    if "inventory" not in phases:
        try:
            mine = await _index(ctx, spec)
        except DsortFailed as e:
            raise JobFailed(str(e)) from None
        wire = json.dumps({s: [r.to_wire() for r in recs] for s, recs in mine.items()}).encode()
        await asyncio.gather(*(ctx.send(t, {"op": "inventory"}, wire) for t in ctx.members))
    await ctx.barrier("inventory")

    inventory: dict[str, dict[str, list[Record]]] = {}
    for t in ctx.members:
        doc = json.loads((ctx.workdir / f"inventory-{t}.json").read_bytes())
        inventory[t] = {s: [Record.from_wire(w) for w in recs] for s, recs in doc.items()}
    try:
        plan = make_plan(spec, inventory, lambda name: _owner(ctx, spec.output_bck, name))
    except DsortFailed as e:
        raise JobFailed(str(e)) from None
    del inventory

    stamps = json.loads((ctx.workdir / STAMPS).read_bytes())

    async def send(index: int) -> None:
        await _send_records(ctx, spec, index, plan[index], stamps)

    if "sent" not in phases:  # sends are idempotent: a resumed target sends all again
        todo = [i for i, shard in enumerate(plan) if any(p.target == me for p in shard.records)]
        await ctx.map(todo, send, workers=spec.create_concurrency or SEND_WORKERS)
    await ctx.barrier("sent")

    built = [i for i, shard in enumerate(plan) if shard.owner == me]
    ctx.set_output(total=len(built))  # summed over targets: every output shard
    published = set(ctx.checkpoint.get("published", []))
    lock = asyncio.Lock()

    async def publish(index: int) -> None:
        shard = plan[index]
        path = _out_file(ctx, index)
        if not path.is_file() or path.stat().st_size != shard.size:
            raise JobFailed(f"output shard {shard.name!r} is incomplete on target {me!r}")
        size = await ctx.put_object(spec.output_bck, shard.name, _file_chunks(path))
        async with lock:
            published.add(index)
            ctx.progress.add(objects=1, bytes=size, records=len(shard.records))
            await ctx.save_checkpoint({"published": sorted(published)})
        path.unlink()

    todo = [i for i in built if i not in published]
    await ctx.map(todo, publish, workers=min(2, spec.create_concurrency or 2))
    ctx.set_output(
        bucket=spec.output_bck,
        shards=len(built),
        records=sum(len(plan[i].records) for i in built),
        seed=spec.algorithm.seed,
    )


async def _index(ctx: JobContext, spec: DsortSpec) -> dict[str, list[Record]]:
    """The records of every input shard this target owns (its part of the inventory)."""
    found: dict[str, list[Record]] = {}
    stamps: dict[str, list[int]] = {}
    mine = [n for n in spec.input_names() if _owner(ctx, spec.input_bck, n) == ctx.target_id]

    async def one(name: str) -> None:
        try:
            path = await anyio.to_thread.run_sync(ctx.store.object_file, spec.input_bck, name)
        except NotFound:
            where = f"{spec.input_bck}/{name}"
            if spec.missing_shards == "abort":
                raise DsortFailed(
                    f"input shard {where} does not exist (missing_shards: abort); "
                    "fix input_format or set missing_shards to warn or ignore"
                ) from None
            if spec.missing_shards == "warn":
                ctx.error(name, f"input shard {where} does not exist: skipped")
            return
        before = _stamp(os.stat(path))
        found[name] = await anyio.to_thread.run_sync(index_shard, path, name)
        if _stamp(os.stat(path)) != before:
            raise DsortFailed(f"input shard {spec.input_bck}/{name} changed while being read")
        stamps[name] = before

    await ctx.map(mine, one, workers=spec.extract_concurrency or INDEX_WORKERS)
    # what was indexed: the sends check that they read these very files
    data = json.dumps(stamps).encode()
    await anyio.to_thread.run_sync(write_atomic, _workdir(ctx) / STAMPS, data)
    return found


def _stamp(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ino]


async def _send_records(
    ctx: JobContext,
    spec: DsortSpec,
    index: int,
    shard: OutputShard,
    stamps: dict[str, list[int]],
) -> None:
    """Stream this target's records of output shard ``index`` to the shard's builder."""
    offsets: list[tuple[int, str, Record]] = []
    at = 0
    for p in shard.records:
        if p.target == ctx.target_id:
            offsets.append((at, p.shard, p.record))
        at += p.record.size
    layout = json.dumps([[o, r.size] for o, _s, r in offsets]).encode()
    paths: dict[str, Path] = {}
    for _o, name, _r in offsets:
        if name not in paths:
            paths[name] = ctx.store.object_file(spec.input_bck, name)

    def body() -> AsyncIterator[bytes]:
        return _record_stream(layout, paths, offsets, spec.input_bck, stamps)

    meta = {"op": "records", "index": index, "size": shard.size}
    got = await ctx.send(shard.owner, meta, body)
    expected = sum(r.size for _o, _s, r in offsets)
    if not isinstance(got, dict) or got.get("bytes") != expected:
        raise JobFailed(
            f"output shard {shard.name!r}: target {shard.owner!r} took {got!r}, "
            f"sent {expected} bytes"
        )


async def _record_stream(
    layout: bytes,
    paths: dict[str, Path],
    offsets: list[tuple[int, str, Record]],
    bucket: str,
    stamps: dict[str, list[int]],
) -> AsyncIterator[bytes]:
    yield _LEN.pack(len(layout)) + layout

    def chunks() -> Iterator[bytes]:
        files: dict[str, IO[bytes]] = {}
        try:
            batch: list[bytes] = []
            size = 0
            for _o, name, rec in offsets:
                f = files.get(name)
                if f is None:
                    f = files[name] = open(paths[name], "rb")  # noqa: SIM115 - closed below
                    if _stamp(os.fstat(f.fileno())) != stamps.get(name):
                        raise DsortFailed(
                            f"input shard {bucket}/{name} changed during the job "
                            "(its records were indexed from another version); run it again"
                        )
                for data in copy_range(f, rec.offset, rec.size, CHUNK):
                    batch.append(data)
                    size += len(data)
                    if size >= CHUNK:
                        yield b"".join(batch)
                        batch, size = [], 0
            if batch:
                yield b"".join(batch)
        finally:
            for f in files.values():
                f.close()

    it = chunks()
    done = object()
    while (chunk := await anyio.to_thread.run_sync(next, it, done)) is not done:
        yield chunk  # type: ignore[misc]


async def receive(
    ctx: JobContext, sender: str, meta: dict[str, Any], body: AsyncIterator[bytes]
) -> Any:
    op = meta.get("op")
    if op == "inventory":
        data = b"".join([chunk async for chunk in body])
        await anyio.to_thread.run_sync(
            write_atomic, _workdir(ctx) / f"inventory-{sender}.json", data
        )
        return {"ok": True}
    if op == "records":
        return await _receive_records(ctx, int(meta["index"]), int(meta["size"]), body)
    raise DsortFailed(f"unknown dsort message {op!r} from target {sender!r}")


async def _receive_records(
    ctx: JobContext, index: int, size: int, body: AsyncIterator[bytes]
) -> dict[str, int]:
    """Write a sender's records at their offsets in output shard ``index`` (a sparse file)."""
    buf = bytearray()
    layout: list[list[int]] | None = None
    fd = os.open(_out_file(ctx, index), os.O_RDWR | os.O_CREAT, 0o644)
    written = 0
    slot = 0
    pos = 0  # offset inside the current slot
    try:
        if os.fstat(fd).st_size != size:
            os.ftruncate(fd, size)  # sparse; the end-of-archive zeros come free
        async for chunk in body:
            if layout is None:
                buf += chunk
                if len(buf) < _LEN.size:
                    continue
                (n,) = _LEN.unpack_from(buf)
                if len(buf) < _LEN.size + n:
                    continue
                layout = json.loads(bytes(buf[_LEN.size : _LEN.size + n]))
                chunk = bytes(buf[_LEN.size + n :])
                buf = bytearray()
            view = memoryview(chunk)
            while view:
                if slot >= len(layout):
                    raise DsortFailed(f"output shard #{index}: more bytes than the layout holds")
                offset, length = layout[slot]
                take = min(length - pos, len(view))
                os.pwrite(fd, view[:take], offset + pos)
                view = view[take:]
                pos += take
                written += take
                if pos == length:
                    slot, pos = slot + 1, 0
        # durable before the sender hears it arrived: a restarted target resumes from it
        await anyio.to_thread.run_sync(_sync, fd, _out_file(ctx, index).parent)
    finally:
        os.close(fd)
    return {"bytes": written}


def _sync(fd: int, directory: Path) -> None:
    os.fsync(fd)
    fsync_dir(directory)


async def _file_chunks(path: Path) -> AsyncIterator[bytes]:
    async with await anyio.open_file(path, "rb") as f:
        while chunk := await f.read(CHUNK):
            yield chunk


register_kind(KIND, run, validate=validate, receive=receive, resumable=True)
