"""``BatchIterDataset``: whole training batches, each read with one GetBatch request.

::

    data = BatchIterDataset(Source(bucket, prefix="train/"), batch_size=64,
                            etl_name="decode", shuffle=True, seed=7)
    loader = DataLoader(data, batch_size=None, num_workers=4)   # it yields batches
    for epoch in range(E):
        data.set_epoch(epoch)
        for step, batch in enumerate(loader):   # batch: [(name, bytes)] or transform's
            ...
    # positions: StatefulDataLoader's state_dict() (position.py: exact, any layout),
    # or, with the same ranks and batch size, data.resume(epoch, next_batch)

Every rank computes the same epoch order (``split.epoch_order``: the seeded
shuffle), takes every R-th object from position r as ``ObjectIterDataset``
does, and cuts its share into batches of ``batch_size`` (the last one shorter,
or dropped with ``drop_last``). Batches, not objects, are dealt to the
DataLoader's workers round-robin (worker w reads batches w, w+W, ...), which
is the order in which ``DataLoader`` takes their results: the loader yields
the rank's batches in order, so the number of batches consumed is a position
to resume from, whatever ``num_workers`` is (``resume``); ``state_dict()``
records which batches each worker yielded, so ``merge_positions`` resumes
with other ranks and workers too. Each batch is one
``Client.get_batch`` call (``sdk/batch.py``): its objects come from their
targets in parallel, through the ETL when one is named, in order.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from torch.utils.data import IterableDataset

from etl_runtime.pytorch.datasets import Transform
from etl_runtime.pytorch.sources import PrefixMap, Sources, build_catalog
from etl_runtime.pytorch.stateful import Resumable
from etl_runtime.sdk.client import EtlArgs


class BatchIterDataset(Resumable, IterableDataset[list[Any]]):
    """Batches of ``batch_size`` samples per GetBatch, split across ranks; resumable."""

    def __init__(
        self,
        sources: Sources,
        batch_size: int,
        *,
        prefix_map: PrefixMap | None = None,
        etl_name: str | None = None,
        etl_args: EtlArgs = None,
        transform: Transform | None = None,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.catalog = build_catalog(sources, prefix_map)
        self.batch_size = batch_size
        self.etl_name, self.etl_args, self.transform = etl_name, etl_args, transform
        self.drop_last = drop_last
        self._group, self._drop_last = batch_size, drop_last
        self._init_position(shuffle, seed, rank, world_size)

    def _items(self) -> int:
        return len(self.catalog)

    @property
    def next_batch(self) -> int:
        """Batches of this rank's epoch skipped by ``resume``."""
        return self._skip

    def resume(self, epoch: int, next_batch: int) -> None:
        """Go on with ``epoch`` at batch ``next_batch`` (the count of batches consumed).

        The layout (ranks, batch size) must be the one the count was taken
        with; ``state_dict()``/``merge_positions`` do not need that.
        """
        if next_batch < 0:
            raise ValueError(f"next_batch must be >= 0, got {next_batch}")
        self.set_epoch(epoch)
        self._base, self._loaded, self._skip = None, None, next_batch

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """A position (``state_dict()``, ``merge_positions``) or ``{epoch, next_batch}``."""
        if "next_batch" in state and "format" not in state:
            self.resume(int(state["epoch"]), int(state["next_batch"]))
        else:
            super().load_state_dict(state)

    def rank_batches(self) -> list[list[int]]:
        """This rank's batches still to read this epoch (catalog indices), in order."""
        order = self.position().order()
        return [order[unit].tolist() for unit in self._rank_units()]

    def __len__(self) -> int:
        """Batches this rank still reads this epoch."""
        return len(self._rank_units())

    def __iter__(self) -> Iterator[list[Any]]:
        slot, units, order, _ = self._begin()
        client = self.catalog.connection.client()
        cat = self.catalog
        for k in range(slot.taken, len(units)):
            items = [(cat.buckets[i], cat.names[i]) for i in order[units[k]].tolist()]
            got = client.get_batch(items, etl_name=self.etl_name, etl_args=self.etl_args)
            out = []
            for item in got:
                assert item.data is not None  # not missing_ok: a missing object raised
                sample = (item.name, item.data)
                out.append(self.transform(*sample) if self.transform is not None else sample)
            slot.taken = k + 1
            yield out
