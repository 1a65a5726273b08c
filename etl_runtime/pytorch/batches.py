"""``BatchIterDataset``: whole training batches, each read with one GetBatch request.

::

    data = BatchIterDataset(Source(bucket, prefix="train/"), batch_size=64,
                            etl_name="decode", shuffle=True, seed=7)
    loader = DataLoader(data, batch_size=None, num_workers=4)   # it yields batches
    for epoch in range(E):
        data.set_epoch(epoch)
        for step, batch in enumerate(loader):   # batch: [(name, bytes)] or transform's
            ...; save(epoch, step + 1)          # the index of the next batch
    # after a restart:  data.resume(epoch, next_batch)  -> that epoch from that batch

Every rank computes the same epoch order (``split.epoch_order``: the seeded
shuffle), takes every R-th object from position r as ``ObjectIterDataset``
does, and cuts its share into batches of ``batch_size`` (the last one shorter,
or dropped with ``drop_last``). Batches, not objects, are dealt to the
DataLoader's workers round-robin (worker w reads batches w, w+W, ...), which
is the order in which ``DataLoader`` takes their results: the loader yields
the rank's batches in order, so the number of batches consumed is a position
to resume from, whatever ``num_workers`` is. Each batch is one
``Client.get_batch`` call (``sdk/batch.py``): its objects come from their
targets in parallel, through the ETL when one is named, in order.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data import IterableDataset

from etl_runtime.pytorch.datasets import Transform
from etl_runtime.pytorch.sources import PrefixMap, Sources, build_catalog
from etl_runtime.pytorch.split import current_part, epoch_order
from etl_runtime.sdk.client import EtlArgs


class BatchIterDataset(IterableDataset[list[Any]]):
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
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.catalog = build_catalog(sources, prefix_map)
        self.batch_size = batch_size
        self.etl_name, self.etl_args, self.transform = etl_name, etl_args, transform
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.epoch = 0
        self.next_batch = 0

    def set_epoch(self, epoch: int) -> None:
        """A new epoch, from its first batch (call before each epoch)."""
        self.epoch, self.next_batch = epoch, 0

    def resume(self, epoch: int, next_batch: int) -> None:
        """Go on with ``epoch`` at batch ``next_batch`` (the count of batches consumed)."""
        if next_batch < 0:
            raise ValueError(f"next_batch must be >= 0, got {next_batch}")
        self.epoch, self.next_batch = epoch, next_batch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "next_batch": self.next_batch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.resume(state["epoch"], state["next_batch"])

    def rank_batches(self) -> list[list[int]]:
        """This rank's batches of the current epoch (catalog indices), in order."""
        part = current_part()
        order = epoch_order(len(self.catalog), self.shuffle, self.seed, self.epoch)
        mine = order[part.rank :: part.world_size].tolist()
        batches = [mine[k : k + self.batch_size] for k in range(0, len(mine), self.batch_size)]
        if self.drop_last and batches and len(batches[-1]) < self.batch_size:
            batches.pop()
        return batches

    def __len__(self) -> int:
        """Batches this rank still reads this epoch (from ``next_batch``)."""
        return max(0, len(self.rank_batches()) - self.next_batch)

    def __iter__(self) -> Iterator[list[Any]]:
        part = current_part()
        batches = self.rank_batches()
        client = self.catalog.connection.client()
        cat = self.catalog
        for b in range(self.next_batch + part.worker, len(batches), part.num_workers):
            items = [(cat.buckets[i], cat.names[i]) for i in batches[b]]
            got = client.get_batch(items, etl_name=self.etl_name, etl_args=self.etl_args)
            out = []
            for item in got:
                assert item.data is not None  # not missing_ok: a missing object raised
                sample = (item.name, item.data)
                out.append(self.transform(*sample) if self.transform is not None else sample)
            yield out
