"""``ShardReader``: WebDataset samples from tar shards, split across ranks and workers.

Shards (whole objects) are the unit of work: every epoch the shard list is put
in an order (shuffled with ``(seed, epoch)`` if asked), split across DDP ranks
and DataLoader workers (``split.py``), and each reader streams its shards with
the SDK's ``Object.open`` (optionally through an ETL) and groups the tar
members into samples with webdataset's own ``tar_file_expander`` and
``group_by_keys``, so a sample is exactly what ``wds.WebDataset`` would yield.

It yields ``(key, {ext: bytes})``; with ``decode=`` the fields are decoded by
webdataset's ``autodecode.Decoder``, built as ``WebDataset(...).decode(...)``
builds it (a string is an image spec: ``"pil"``, ``"rgb"``, ``"torchrgb"``...;
anything else is a decoder handler).

A shard that fails after its first byte (a cut connection, a corrupt tar, a
field that does not decode) raises ``ShardError`` naming it: the epoch never
ends silently short. Errors before the first byte keep their SDK class
(``NotFound``, ``TransformError``...), which names the object too.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from torch.utils.data import IterableDataset, get_worker_info
from webdataset import autodecode, tariterators

from etl_runtime.pytorch import tar
from etl_runtime.pytorch.errors import DatasetError, ShardError
from etl_runtime.pytorch.sources import PrefixMap, Sources, build_catalog
from etl_runtime.pytorch.stateful import Resumable
from etl_runtime.sdk.client import EtlArgs, quote_path
from etl_runtime.sdk.errors import HTTPError
from etl_runtime.sdk.object import ObjectReader

VIEW = "x-sluice-view"  # a view's HEAD: "<source>|<etl>"
Decode = str | Callable[..., Any] | Sequence[str | Callable[..., Any]] | None
READ_BUFFER = 1 << 20


def make_decoder(decode: Decode) -> Callable[[dict[str, Any]], dict[str, Any]] | None:
    """webdataset's decoder for ``decode`` (as ``WebDataset.decode(*decode)`` makes it)."""
    if decode is None:
        return None
    specs = [decode] if isinstance(decode, str) or callable(decode) else list(decode)
    handlers = [autodecode.imagehandler(s) if isinstance(s, str) else s for s in specs]
    return autodecode.Decoder(handlers)


class ShardReader(Resumable, IterableDataset[tuple[str, dict[str, Any]]]):
    """Iterable dataset of WebDataset samples from tar shards in Sluice buckets.

    ``sources``: a ``Bucket``, a ``Source`` (prefix, names, or a brace template
    such as ``"train-{0000..0099}.tar"``) or a list of them; ``prefix_map``
    narrows whole buckets. ``etl_name``/``etl_args`` read every shard through an
    ETL (e.g. a ``mode="wds"`` one transforming each sample on the target).
    ``shuffle=True`` shuffles the shard order per epoch with ``seed``; call
    ``set_epoch(e)`` before each epoch. ``rank``/``world_size`` stand for
    DDP's when given. ``state_dict()``/``load_state_dict()`` save and restore
    the position to the sample: a shard read in part goes on at its next
    sample (``position.py``). ``read_ahead``: open the next shard's GET while
    this one is read, so its target (its ETL) starts on it meanwhile; by
    default only in DataLoader workers (the thread that opens it is no hazard
    there: a process that forks while a thread imports or holds a lock gives
    the child a broken copy of it).
    """

    def __init__(
        self,
        sources: Sources,
        *,
        prefix_map: PrefixMap | None = None,
        etl_name: str | None = None,
        etl_args: EtlArgs = None,
        decode: Decode = None,
        shuffle: bool = False,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        read_ahead: bool | None = None,
    ) -> None:
        self.catalog = build_catalog(sources, prefix_map)
        self.read_ahead = read_ahead
        self.etl_name = etl_name
        self.etl_args = etl_args
        self.decode = decode
        self._init_position(shuffle, seed, rank, world_size)
        self._wds: dict[str, bool] = {}  # ETL: its mode is wds (it skips samples itself)
        self._views: dict[str, str | None] = {}  # bucket: the ETL of a view, None if no view
        make_decoder(decode)  # a bad image spec fails here, not in a worker

    @property
    def shards(self) -> list[str]:
        """``bucket/name`` of every shard, in catalog order."""
        return [f"{b}/{n}" for b, n in zip(self.catalog.buckets, self.catalog.names, strict=True)]

    def _items(self) -> int:
        return len(self.catalog)

    def __iter__(self) -> Iterator[tuple[str, dict[str, Any]]]:
        decoder = make_decoder(self.decode)
        slot, units, order, base = self._begin()
        # The next shard's GET is opened while this one is read (one thread): its
        # target (its ETL) works on it meanwhile, instead of only once asked.
        ahead_ok = self.read_ahead
        if ahead_ok is None:  # a thread in a process that may fork (DataLoader) is a hazard
            ahead_ok = get_worker_info() is not None
        pool = ThreadPoolExecutor(1, "shard-ahead") if ahead_ok else None
        pending: tuple[int, Future[ObjectReader]] | None = None
        try:
            for k in range(slot.taken, len(units)):
                unit = int(units[k][0])
                start = slot.at if k == slot.taken and slot.at is not None else None
                start = start or base.partial.get(unit)
                count, after, offset = start if start is not None else (0, None, None)
                opened = None
                if pending is not None:
                    if pending[0] == k:
                        opened = pending[1]
                    else:
                        _discard(pending[1])
                    pending = None
                samples = self._samples(int(order[unit]), decoder, count, after, offset, opened)
                # One sample ahead: the state after a shard's last sample says it is read.
                ahead = next(samples, None)
                if pool is not None and k + 1 < len(units):  # this one's answer has begun
                    following = int(units[k + 1][0])
                    if base.partial.get(following) is None:  # read from its first byte
                        pending = (k + 1, pool.submit(self._open, int(order[following])))
                while ahead is not None:
                    (key, fields, at), ahead = ahead, next(samples, None)
                    count += 1
                    if ahead is None:
                        slot.taken, slot.at = k + 1, None
                    else:
                        slot.at = (count, key, at)
                    yield key, fields
                slot.taken, slot.at = k + 1, None
        finally:
            if pending is not None:
                _discard(pending[1])
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)

    def _open(self, index: int) -> ObjectReader:
        """The GET of the ``index``-th shard, from its first byte (through the ETL)."""
        bucket, name = self.catalog.buckets[index], self.catalog.names[index]
        obj = self.catalog.connection.client().bucket(bucket).object(name)
        return obj.open(etl_name=self.etl_name, etl_args=self.etl_args)

    def read_shard(
        self,
        index: int,
        decoder: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        *,
        skip: int = 0,
        after: str | None = None,
        offset: int | None = None,
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """The samples of the ``index``-th shard of the catalog, in tar order.

        ``skip``: leave out the first ``skip`` samples (not decoded); ``after``:
        the key the last of them must have (a shard rewritten since a position
        was saved raises ``DatasetError`` rather than resuming elsewhere);
        ``offset``: the byte offset where that last one starts, when known: the
        shard is then read from there (a ``Range`` GET, without an ETL) instead
        of from its first byte. Through a wds ETL the GET asks for the shard
        without its first ``skip`` samples (``etl_skip``): they are neither
        transformed nor sent, and the answer names the last one left out.
        """
        for key, fields, _ in self._samples(index, decoder, skip, after, offset):
            yield key, fields

    def _samples(
        self,
        index: int,
        decoder: Callable[[dict[str, Any]], dict[str, Any]] | None,
        skip: int,
        after: str | None,
        offset: int | None,
        opened: Future[ObjectReader] | None = None,
    ) -> Iterator[tuple[str, dict[str, Any], int | None]]:
        """``read_shard``'s samples with the offset each starts at (None through an ETL);
        ``opened``: its GET from the first byte, opened ahead (``skip`` is 0 then).

        Through a wds ETL the first ``skip`` are left out by the ETL (``etl_skip``);
        if its answer does not say it left out ``skip`` samples ending at ``after``
        (an ETL with ``onError: skip`` dropped one of them, or the shard changed),
        the whole answer is read and the samples skipped here, as without it."""
        etl = self.etl_name
        if skip > 0 and etl is None:  # an ETL view's bytes are no stored bytes: no Range
            etl = self._view_etl(index)
            offset = None if etl is not None else offset
        if skip > 0 and etl is not None and self._etl_skips(etl):
            missed: list[bool] = []
            yield from self._read(index, decoder, skip, after, offset, missed)
            if not missed:
                return
        yield from self._read(index, decoder, skip, after, offset, None, opened)

    def _etl_skips(self, etl: str) -> bool:
        """Whether ``etl`` leaves samples out itself (``etl_skip``: a wds ETL); asked once."""
        if etl not in self._wds:
            client = self.catalog.connection.client()
            self._wds[etl] = client.etl(etl).details().mode == "wds"
        return self._wds[etl]

    def _view_etl(self, index: int) -> str | None:
        """The ETL of the shard's bucket when it is an ETL view (its HEAD says so), else None."""
        bucket, name = self.catalog.buckets[index], self.catalog.names[index]
        if bucket not in self._views:
            path = f"/v1/objects/{quote_path(bucket)}/{quote_path(name)}"
            view = self.catalog.connection.client().request("HEAD", path).headers.get(VIEW)
            self._views[bucket] = view.split("|", 1)[1] if view and "|" in view else None
        return self._views[bucket]

    def _read(
        self,
        index: int,
        decoder: Callable[[dict[str, Any]], dict[str, Any]] | None,
        skip: int,
        after: str | None,
        offset: int | None,
        missed: list[bool] | None,
        opened: Future[ObjectReader] | None = None,
    ) -> Iterator[tuple[str, dict[str, Any], int | None]]:
        """``missed``: ask the ETL to skip; if its answer ends elsewhere, append to it
        and yield nothing."""
        bucket, name = self.catalog.buckets[index], self.catalog.names[index]
        obj = self.catalog.connection.client().bucket(bucket).object(name)
        raw = self.etl_name is None and (skip == 0 or self._view_etl(index) is None)
        resume = offset if raw and skip > 0 and offset else 0
        leave = skip if missed is not None else 0
        key = None
        seen = 0
        try:
            if opened is not None:
                reader = opened.result()  # its error (NotFound...) is raised here
            else:
                reader = obj.open(
                    etl_name=self.etl_name, etl_args=self.etl_args, offset=resume, etl_skip=leave
                )
            with reader:
                if resume and reader.start == resume:
                    seen = skip - 1  # the body starts at sample ``skip`` (the last one read)
                if missed is not None:
                    done = reader.skipped
                    if done is None or done[0] != skip or after not in (None, done[1]):
                        missed.append(True)
                        return
                    seen = skip  # the body starts at sample ``skip + 1``
                src = tar.Chunks(reader.chunks(), offset=reader.start)
                if tar.compressed(src.peek(8)):
                    found: Iterator[tuple[str, dict[str, Any], int | None]] = _tarfile_samples(
                        src, f"{bucket}/{name}"
                    )
                else:
                    found = tar.samples(src)  # type: ignore[assignment]
                for key, fields, at in found:
                    seen += 1
                    if seen <= skip:
                        if seen == skip and after is not None and key != after:
                            raise DatasetError(
                                f"shard '{bucket}/{name}' changed since its position was "
                                f"saved: sample {skip} is {key!r}, not {after!r}"
                            )
                        continue
                    if decoder is not None:
                        sample = decoder({"__key__": key, "__url__": f"{bucket}/{name}", **fields})
                        fields = {k: v for k, v in sample.items() if not k.startswith("__")}
                    yield key, fields, at if raw else None
            if seen < skip:
                raise DatasetError(
                    f"shard '{bucket}/{name}' changed since its position was saved: "
                    f"{seen} samples, the position is at sample {skip}"
                )
        except HTTPError as exc:
            # Keep the SDK class (NotFound, TransformError...), but make sure the
            # message names the shard: DataLoader workers pass on only the message.
            if name not in exc.message:
                exc.message = f"shard '{bucket}/{name}': {exc.message}"
                exc.args = (exc.message,)
            raise
        except DatasetError:
            raise
        except tar.TarFormatError as exc:
            if resume and key is None:  # the saved offset no longer starts a sample
                raise DatasetError(
                    f"shard '{bucket}/{name}' changed since its position was saved: "
                    f"no sample starts at byte {resume} ({exc})"
                ) from exc
            raise self._failed(bucket, name, key, exc) from exc
        except Exception as exc:
            raise self._failed(bucket, name, key, exc) from exc

    def _failed(self, bucket: str, name: str, key: str | None, exc: Exception) -> ShardError:
        after = f" after sample {key!r}" if key is not None else ""
        return ShardError(
            f"shard '{bucket}/{name}' failed{after}: {type(exc).__name__}: {exc}",
            bucket=bucket,
            object=name,
            etl=self.etl_name,
            sample=key,
        )


def _discard(opened: Future[ObjectReader]) -> None:
    """Close a GET opened ahead that will not be read (once it is open)."""

    def close(done: Future[ObjectReader]) -> None:
        if not done.cancelled() and done.exception() is None:
            done.result().close()

    if not opened.cancel():
        opened.add_done_callback(close)


class _ChunksFile(io.RawIOBase):
    """``tar.Chunks`` as a file, for ``tarfile`` (a compressed shard)."""

    def __init__(self, src: tar.Chunks) -> None:
        super().__init__()
        self.src = src

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.src.take(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def _tarfile_samples(src: tar.Chunks, url: str) -> Iterator[tuple[str, dict[str, Any], int | None]]:
    """A compressed shard's samples, through webdataset's own ``tarfile`` path."""
    stream = io.BufferedReader(_ChunksFile(src), READ_BUFFER)
    files = tariterators.tar_file_expander([{"url": url, "stream": stream}])
    for sample in tariterators.group_by_keys(files):
        fields = {k: v for k, v in sample.items() if not k.startswith("__")}
        yield sample["__key__"], fields, None
