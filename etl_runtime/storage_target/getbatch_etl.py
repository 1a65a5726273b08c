"""The target's half of GetBatch through an ETL: its share's items transformed here, in parallel.

``storage_target/getbatch_share.py`` calls ``transform_all`` for a share that names an
ETL chain (the batch's ``etl_name``/``etl_pipeline``, or a view's ETL). Every
item goes through the target's own ETL GET path (``etl.pipeline.
transform_chain``, so ``EtlForwarder.transform``: the output cache of a
``cache: true`` ETL, the steps of a pipeline) with up to ``CONCURRENCY``
items of the share in flight at once, so the transformer's workers all have
work; a part's answer starts once all of its items are in, their outcomes in
its manifest as for plain objects. One uncached ETL (the usual case) takes
that path's last step directly (``EtlForwarder.send``: the file by path
where the transformer can read it, else its bytes), with the ETL looked up
and the files found once per share (on the loop, or read in one thread hop):
per object that path cost the target more CPU than the transformer's call.
Objects by path to a Sluice transformer in object mode go up to
``BATCH_ITEMS`` to a request (``_batch``, ``wire/formats/bulk.py``), each output
or error framed in its answer; a transformer that dies mid-answer fails the
items it owes (502). Files in shards, pipelines, ``cache: true`` ETLs,
AIStore-style images (``spec.foreign``), objects sent as bytes and a
transformer without the route (older) keep one request per object.

* object mode: the object's transformed bytes are the entry;
* a file inside a shard (``archpath``): the shard is transformed once per
  part however many of its files were asked for (wds mode: per sample), and
  the files are picked out of the transformed shard as it streams.

Transformed bytes stay in memory up to ``MEMORY`` per answer (and
``ITEM_MEMORY`` per item); the rest goes to unlinked temporary files in the
store's ``.tmp`` (sent with ``os.sendfile`` like objects), so a part of big
outputs holds no more than that in RSS.

An item the ETL fails on is its manifest entry with the status and JSON body
a GET through the ETL would have answered (a transformer's 422 for an input
it refuses: the batch goes on past it with ``coer``); a transformer whose
answer breaks off mid-item is a 502 for that item naming the ETL, object and
target; never bytes in the archive.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import stat
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import IO

import anyio.to_thread

from etl_runtime.cluster.records import EtlRecord, TransformerStatus
from etl_runtime.core import auth
from etl_runtime.core.errors import (
    DuplexError,
    EtlNotReady,
    ObjectNotFound,
    SluiceError,
    TransformerFailed,
)
from etl_runtime.etl.forward import EtlForwarder
from etl_runtime.etl.pipeline import transform_chain
from etl_runtime.storage import integrity
from etl_runtime.storage_target.context import Target
from etl_runtime.wire.clients.duplex import DuplexResponse
from etl_runtime.wire.formats import bulk
from etl_runtime.wire.formats.shardread import ShardReader, same_path

log = logging.getLogger(__name__)

CONCURRENCY = 16  # items of one share answer transformed at once
MEMORY = 16 << 20  # transformed bytes of one answer kept in memory; the rest spills to disk
ITEM_MEMORY = 1 << 20  # one item's bytes kept in memory before it spills
BODY_SEND_MAX = 4 << 20  # an object sent in the transformer's request (not by path) up to this
BATCH_ITEMS = 32  # objects per batched request: a part's (3 parts in flight per target)
BATCH_SLACK = 10.0  # s past requestSeconds the target waits: the transformer's own timeout first
REFUSED_SECONDS = 60.0  # a transformer without batches (older) is sent objects one by one
LOOP_ROWS = 128  # a share this small that reads no file is prepared on the event loop
_refused: dict[str, float] = {}  # transformer endpoint -> until when


@functools.lru_cache(maxsize=64)
def _token(cluster_key: str, etl: str, uid: str) -> str:
    return auth.transformer_token(cluster_key, etl, uid)  # an HMAC: 0.1 ms a request


class Elsewhere:
    """The item is not this target's to answer: the gateway reads it with a plain GET."""


ELSEWHERE = Elsewhere()


@dataclass
class Output:
    """One item's transformed bytes: in memory (``data``), or ``size`` bytes of ``file``."""

    size: int = 0
    data: bytes | None = None
    file: IO[bytes] | None = None


Outcome = Output | SluiceError | Elsewhere


@dataclass
class Budget:
    memory: int = MEMORY
    files: list[IO[bytes]] = field(default_factory=list)  # closed with the share


class _Sink:
    """Collects one output: memory first, a temp file past the budget."""

    def __init__(self, budget: Budget, tmp_dir: str) -> None:
        self._budget, self._tmp = budget, tmp_dir
        self._chunks: list[bytes] = []
        self._file: IO[bytes] | None = None
        self.size = 0

    async def write(self, chunk: bytes | bytearray | memoryview) -> None:
        if not chunk:
            return
        n = len(chunk)
        self.size += n
        if self._file is None:
            kept = self.size - n
            if kept + n <= ITEM_MEMORY and self._budget.memory >= n:
                self._budget.memory -= n
                self._chunks.append(bytes(chunk))
                return
            self._file = await anyio.to_thread.run_sync(self._spill)
        await anyio.to_thread.run_sync(self._file.write, chunk)

    def _spill(self) -> IO[bytes]:
        f = tempfile.TemporaryFile(dir=self._tmp)  # noqa: SIM115 - closed with the share
        self._budget.files.append(f)
        for c in self._chunks:
            f.write(c)
            self._budget.memory += len(c)
        self._chunks = []
        return f

    async def output(self) -> Output:
        if self._file is None:
            return Output(self.size, b"".join(self._chunks))
        await anyio.to_thread.run_sync(self._file.flush)
        return Output(self.size, file=self._file)


async def _body(response: DuplexResponse) -> AsyncIterator[bytes | bytearray]:
    try:
        length = response.headers.get("content-length", "")
        if length.isdigit() and int(length) <= ITEM_MEMORY:
            yield await response.read(int(length))  # one piece: no copy when it is one read
        else:
            async for chunk in response.aiter_bytes():
                yield chunk
    finally:
        await response.aclose()


def _broken(e: Exception, etl: str, bucket: str, name: str, target: str) -> SluiceError:
    what = f"ETL {etl!r} for ais://{bucket}/{name}"
    why = f"broke off on target {target!r} ({type(e).__name__}: {e})"
    err = SluiceError(f"the answer of {what} {why}", etl=etl, bucket=bucket, object=name)
    err.context["target"] = target
    err.status, err.kind = 502, "TransformerFailed"
    return err


class EtlShare:
    """The items of one share answer through ``chain``: ``outcomes`` in request order."""

    def __init__(
        self,
        target: Target,
        chain: list[str],
        etl_args: str | None,
        rows: list[tuple[str, str, str]],  # (bucket, object, archpath or "")
        owned: Callable[[], list[bool]],  # in a thread: False, the item is not ours (ELSEWHERE)
    ) -> None:
        self._target, self._chain, self._args, self._rows = target, chain, etl_args, rows
        self._find_owned, self._owned = owned, [False] * len(rows)
        self.outcomes: list[Outcome] = [ELSEWHERE] * len(rows)
        self.budget, self._tmp = Budget(), str(target.store.tmp_dir)
        self._gate = asyncio.Semaphore(CONCURRENCY)
        self._to_transformer: tuple[EtlRecord, TransformerStatus, bool] | None = None
        self._ready: dict[tuple[str, str], str | bytes | SluiceError] = {}

    def _direct(self) -> tuple[EtlRecord, TransformerStatus, bool] | None:
        """(record, transformer, by path) when every item can go straight to the transformer:
        one ETL, no output cache. Raises the ETL's error (unknown, stopped, not ready)."""
        fwd = self._target.forwarder
        record = fwd.record(self._chain[0])
        tf = fwd.transformer(record)
        if len(self._chain) > 1 or (record.spec.cache and fwd.cache is not None):
            return None
        by_path = record.spec.arg_type == "fqn" or fwd.fqn_always
        return record, tf, by_path and not record.spec.foreign  # an image gets the bytes

    def _prepare(self, direct: tuple[EtlRecord, TransformerStatus, bool] | None) -> None:
        """Once per share (see ``run``): which items are ours; straight to the
        transformer, each object's path (by path) or its bytes."""
        self._owned = self._find_owned()
        if direct is None:
            return
        fqn, store = direct[2], self._target.store
        real = os.path.realpath(store.buckets_dir)  # once: object paths under it are real
        for i, (bucket, name, _) in enumerate(self._rows):
            if not self._owned[i] or (bucket, name) in self._ready:
                continue
            try:
                path = os.path.join(real, bucket, name)  # the names were validated
                try:
                    st = os.stat(path)
                except OSError:
                    st = None
                if st is None or not stat.S_ISREG(st.st_mode):
                    # BucketNotFound, ObjectNotFound; or the file of a name that is a prefix too
                    path = str(store.object_file(bucket, name))
                    st = os.stat(path)
                cs = integrity.stored(path) if integrity.verify_reads() else None
                if fqn:
                    if cs is not None:  # the transformer never reads bad bytes
                        with open(path, "rb") as f:
                            if not integrity.file_matches(f.fileno(), cs):
                                raise self._corrupted(bucket, name)
                    self._ready[(bucket, name)] = path
                elif st.st_size <= BODY_SEND_MAX:
                    with open(path, "rb") as f:
                        data = f.read()
                    if cs is not None and not cs.matches(data):
                        raise self._corrupted(bucket, name)
                    self._ready[(bucket, name)] = data
            except SluiceError as e:
                self._ready[(bucket, name)] = e
            except OSError as e:
                self._ready[(bucket, name)] = self._fail(e, bucket, name)

    def _corrupted(self, bucket: str, name: str) -> SluiceError:
        integrity.found_bad(bucket, name, self._target.id)
        return integrity.corrupted(bucket, name, self._target.id)

    async def run(self) -> None:
        try:
            direct = self._direct()
        except SluiceError as e:  # every item fails the same way
            self._owned = await anyio.to_thread.run_sync(self._find_owned)
            self.outcomes = [e if mine else ELSEWHERE for mine in self._owned]
            return
        self._to_transformer = direct
        by_path = direct is not None and direct[2] and not integrity.verify_reads()
        if (direct is None or by_path) and len(self._rows) <= LOOP_ROWS:  # stats, no reads:
            self._prepare(direct)  # on the loop (as batch.py's LOOP_ITEMS)
        else:
            await anyio.to_thread.run_sync(self._prepare, direct)
        jobs: list[asyncio.Task[None]] = []
        shards: dict[tuple[str, str], list[int]] = {}
        batched: list[int] = []
        batches = self._batches()
        for i, (bucket, name, archpath) in enumerate(self._rows):
            if not self._owned[i]:
                continue
            if archpath:
                shards.setdefault((bucket, name), []).append(i)
            elif batches and isinstance(self._ready.get((bucket, name)), str):
                batched.append(i)
            else:
                jobs.append(asyncio.create_task(self._object(i, bucket, name)))
        requests = -(-len(batched) // BATCH_ITEMS)  # of even sizes: 40 items are 20 + 20
        for k in range(requests):
            jobs.append(asyncio.create_task(self._batch(batched[k::requests])))
        for (bucket, name), wanted in shards.items():
            jobs.append(asyncio.create_task(self._shard(bucket, name, wanted)))
        try:
            await asyncio.gather(*jobs)
        except BaseException:
            for job in jobs:
                job.cancel()
            raise

    def _batches(self) -> bool:
        """Whether objects go to the transformer in batches: straight to a Sluice
        transformer (not an image's), by path, object mode, one that has batches."""
        if self._to_transformer is None:
            return False
        record, tf, by_path = self._to_transformer
        if not by_path or record.spec.foreign or record.spec.mode != "object":
            return False
        return _refused.get(tf.endpoint or "", 0.0) < time.monotonic()

    async def _batch(self, items: list[int]) -> None:
        """``items`` (objects by path) in one batched request; their outcomes from its frames.
        A transformer without the route (404/405: an older one) gets them one by one."""
        assert self._to_transformer is not None
        record, tf, _ = self._to_transformer
        fwd, etl = self._target.forwarder, record.name
        rows = [(i, *self._rows[i][:2]) for i in items]
        body = json.dumps(
            {
                "etl_args": self._args,
                "items": [_item(fwd, etl, b, n, self._ready[(b, n)]) for _, b, n in rows],
            }
        ).encode()
        token = _token(fwd.cluster_key, etl, record.uid)
        try:
            response = await fwd.duplex.request(
                "POST",
                f"{(tf.endpoint or '').rstrip('/')}{bulk.PATH}",
                body=body,
                headers={"Authorization": f"Bearer {token}"},
                timeout=record.spec.request_timeout_seconds + BATCH_SLACK,
            )
        except DuplexError as e:
            for i, bucket, name in rows:
                self.outcomes[i] = EtlNotReady(
                    f"the transformer of ETL {etl!r} on target {self._target.id!r} did not "
                    f"answer ({type(e).__name__}: {e}); retry shortly",
                    etl=etl,
                    bucket=bucket,
                    object=name,
                    target=self._target.id,
                )
            return
        done = 0
        try:
            if response.status_code in (404, 405):
                _refused[tf.endpoint or ""] = time.monotonic() + REFUSED_SECONDS
                await asyncio.gather(*(self._object(i, b, n) for i, b, n in rows))
                done = len(rows)
                return
            if response.status_code != 200:
                raw = await response.read(bulk.ERROR_MAX)
                for i, bucket, name in rows:
                    err = TransformerFailed.answered(
                        response.status_code, raw, etl, bucket=bucket, object=name
                    )
                    self.outcomes[i] = self._fail(err, bucket, name)
                done = len(rows)
                return
            reader = bulk.FrameReader(response.aiter_bytes())
            for i, bucket, name in rows:
                self.outcomes[i] = await self._frames_of(reader, etl, bucket, name)
                done += 1
            if not await reader.end():
                log.warning("GetBatch: ETL %s: a batch answer went on past its last item", etl)
        except Exception as e:
            for i, bucket, name in rows[done:]:
                self.outcomes[i] = self._fail(e, bucket, name)
        finally:
            await response.aclose()

    async def _frames_of(
        self, reader: bulk.FrameReader, etl: str, bucket: str, name: str
    ) -> Outcome:
        """One item's frames: its output, or its error."""
        sink = _Sink(self.budget, self._tmp)
        while True:
            status, _ = await reader.next_head()
            if status not in (bulk.LAST, bulk.MORE):
                raw = await reader.whole()
                err = TransformerFailed.answered(status, raw, etl, bucket=bucket, object=name)
                return self._fail(err, bucket, name)
            while piece := await reader.piece():
                await sink.write(piece)
            if status == bulk.LAST:
                return await sink.output()

    def close(self) -> None:
        for f in self.budget.files:
            f.close()
        self.budget.files = []

    async def _stream(self, bucket: str, name: str) -> AsyncIterator[bytes | bytearray]:
        fwd = self._target.forwarder
        ready = self._ready.get((bucket, name))
        if self._to_transformer is None or ready is None:
            return await transform_chain(fwd, bucket, name, self._chain, self._args)
        if isinstance(ready, SluiceError):
            raise ready
        # straight to the transformer: what the ETL GET path does for an uncached ETL,
        # less the per-object lookups and thread hop (done once for the share)
        record, tf, fqn = self._to_transformer
        params = {} if self._args is None else {"etl_args": self._args}
        body = b""
        if isinstance(ready, str):  # by path
            params.update(fwd.fqn_params(record.name, ready))
        else:
            body = ready
        response = await fwd.send(record, tf, bucket, name, params, body)
        if response.status_code != 200:
            try:
                raise await fwd._transformer_error(response, record.name, bucket, name)
            finally:
                await response.aclose()
        return _body(response)

    def _fail(self, e: Exception, bucket: str, name: str) -> SluiceError:
        if isinstance(e, SluiceError):
            e.context.setdefault("etl", self._chain[0])
            e.context.setdefault("target", self._target.id)
            return e
        if not isinstance(e, OSError | ConnectionError):
            log.warning("GetBatch: ETL %s on %s/%s: %r", self._chain, bucket, name, e)
        return _broken(e, ",".join(self._chain), bucket, name, self._target.id)

    async def _object(self, i: int, bucket: str, name: str) -> None:
        async with self._gate:
            sink = _Sink(self.budget, self._tmp)
            try:
                body = await self._stream(bucket, name)
                try:
                    async for chunk in body:
                        await sink.write(chunk)
                finally:
                    await body.aclose()  # type: ignore[attr-defined]
                self.outcomes[i] = await sink.output()
            except Exception as e:
                self.outcomes[i] = self._fail(e, bucket, name)

    async def _shard(self, bucket: str, name: str, wanted: list[int]) -> None:
        """Transform the shard once; pick every wanted file out of the output."""
        async with self._gate:
            left = {i: self._rows[i][2] for i in wanted}
            try:
                body = await self._stream(bucket, name)
                try:
                    what = f"the output of ETL {self._chain[0]!r} for ais://{bucket}/{name}"
                    reader = ShardReader(body, what)
                    while left and (found := await reader.next()) is not None:
                        member, size = found
                        hits = [i for i, path in left.items() if same_path(member, path)]
                        if not hits:
                            if not await reader.skip_member(size):
                                break
                            continue
                        sink = _Sink(self.budget, self._tmp)
                        async for chunk in reader.member(size):
                            await sink.write(chunk)
                        await reader.skip_padding(size)
                        out = await sink.output()
                        for i in hits:
                            self.outcomes[i] = out
                            del left[i]
                finally:
                    await body.aclose()  # type: ignore[attr-defined]
            except Exception as e:
                err = self._fail(e, bucket, name)
                for i in left:
                    self.outcomes[i] = err
                return
            for i, path in left.items():
                err = ObjectNotFound(
                    f"file {path!r} is not in the output of ETL {self._chain[0]!r} for shard "
                    f"ais://{bucket}/{name}",
                    bucket=bucket,
                    object=name,
                    etl=self._chain[0],
                    target=self._target.id,
                    in_shard=True,
                )
                self.outcomes[i] = err


def _item(fwd: EtlForwarder, etl: str, bucket: str, name: str, path: object) -> list[str]:
    """A batch item: ``[object, etl_fqn]``, and its grant while the broker runs."""
    return [f"{bucket}/{name}", *fwd.fqn_params(etl, str(path)).values()]
