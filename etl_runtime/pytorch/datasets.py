"""Object datasets: one sample per object, optionally read through an ETL.

``ObjectDataset`` is map-style (``dataset[i]``), for samplers such as
``RandomSampler``, ``DistributedSampler`` or ``DynamicBatchSampler``.
``ObjectIterDataset`` is iterable and splits its objects across DDP ranks and
DataLoader workers itself (``split.py``), shuffled per epoch with a seed.

Both yield ``(name, bytes)``, or ``transform(name, bytes)`` when a transform is
given; with ``etl_name`` every GET carries ``?etl_name=`` (and ``etl_args``),
so the bytes arrive already transformed by the storage target.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import Dataset, IterableDataset

from etl_runtime.pytorch.sources import Catalog, PrefixMap, Sources, build_catalog
from etl_runtime.pytorch.stateful import Resumable
from etl_runtime.sdk.client import EtlArgs

Transform = Callable[[str, bytes], Any]


class _ObjectReading:
    """What both object datasets share: the catalog and how to GET one object."""

    catalog: Catalog
    etl_name: str | None
    etl_args: EtlArgs
    transform: Transform | None

    def _setup(
        self,
        sources: Sources,
        prefix_map: PrefixMap | None,
        etl_name: str | None,
        etl_args: EtlArgs,
        transform: Transform | None,
    ) -> None:
        self.catalog = build_catalog(sources, prefix_map)
        self.etl_name = etl_name
        self.etl_args = etl_args
        self.transform = transform

    def _read(self, index: int) -> Any:
        bucket, name = self.catalog.buckets[index], self.catalog.names[index]
        client = self.catalog.connection.client()
        data = client.bucket(bucket).object(name).get_bytes(self.etl_name, self.etl_args)
        return self.transform(name, data) if self.transform is not None else (name, data)

    @property
    def names(self) -> list[str]:
        """Object names in catalog order (index ``i`` is ``dataset[i]``)."""
        return self.catalog.names

    def sizes(self) -> list[int]:
        """Stored object sizes in catalog order, from the listing (``DynamicBatchSampler``)."""
        return self.catalog.resolved_sizes()


class ObjectDataset(_ObjectReading, Dataset[Any]):
    """Map-style dataset of objects: ``dataset[i]`` GETs the ``i``-th object.

    ``sources``: a ``Bucket``, a ``Source`` (prefix, names or template) or a list
    of them; ``prefix_map`` narrows whole buckets as AIStore's does. Buckets and
    prefixes are listed once, here; a missing bucket raises ``NotFound``.
    """

    def __init__(
        self,
        sources: Sources,
        *,
        prefix_map: PrefixMap | None = None,
        etl_name: str | None = None,
        etl_args: EtlArgs = None,
        transform: Transform | None = None,
    ) -> None:
        self._setup(sources, prefix_map, etl_name, etl_args, transform)

    def __len__(self) -> int:
        return len(self.catalog)

    def __getitem__(self, index: int) -> Any:
        if not -len(self.catalog) <= index < len(self.catalog):
            raise IndexError(f"index {index} out of range for {len(self.catalog)} objects")
        return self._read(index % len(self.catalog))


class ObjectIterDataset(_ObjectReading, Resumable, IterableDataset[Any]):
    """Iterable dataset of objects, split across DDP ranks and DataLoader workers.

    Each object is read exactly once per epoch over all ranks and workers. With
    ``shuffle=True`` the order is a permutation seeded by ``(seed, epoch)``:
    call ``set_epoch(e)`` before each epoch (as with ``DistributedSampler``).
    ``rank``/``world_size`` stand for DDP's when given. ``state_dict()`` /
    ``load_state_dict()`` save and restore the position (``position.py``).
    """

    def __init__(
        self,
        sources: Sources,
        *,
        prefix_map: PrefixMap | None = None,
        etl_name: str | None = None,
        etl_args: EtlArgs = None,
        transform: Transform | None = None,
        shuffle: bool = False,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        self._setup(sources, prefix_map, etl_name, etl_args, transform)
        self._init_position(shuffle, seed, rank, world_size)

    def _items(self) -> int:
        return len(self.catalog)

    def __len__(self) -> int:
        """Objects this rank still reads this epoch (its DataLoader workers together)."""
        return len(self._rank_units())

    def __iter__(self) -> Iterator[Any]:
        slot, units, order, _ = self._begin()
        for k in range(slot.taken, len(units)):
            item = self._read(int(order[units[k][0]]))
            slot.taken = k + 1
            yield item
