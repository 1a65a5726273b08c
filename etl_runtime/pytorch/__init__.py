"""PyTorch datasets and samplers over Sluice buckets, optionally through an ETL.

::

    from etl_runtime import Client
    from etl_runtime.pytorch import ObjectDataset, ShardReader, Source, DynamicBatchSampler

    bucket = Client(endpoint).bucket("cifar")
    train = ObjectDataset(Source(bucket, prefix="train/"), etl_name="decode-png")
    shards = ShardReader(Source(bucket, template="shard-{000..099}.tar"), decode="torchrgb")

* ``ObjectDataset`` (map-style) and ``ObjectIterDataset`` (iterable): one
  sample per object, ``(name, bytes)`` or ``transform(name, bytes)``;
* ``ShardReader`` (iterable): ``(key, {ext: bytes or decoded})`` per
  WebDataset sample of tar shards;
* ``BatchIterDataset`` (iterable): whole batches, one GetBatch request each,
  resumable from the index of the next batch;
* ``DynamicBatchSampler``: batches bounded in bytes, AIStore's rule;
* ``Mix``: several iterable datasets interleaved by weight;
* ``merge_positions``: one position out of every rank's loader state, to
  resume with another number of workers or ranks (``position.py``);
* ``Source``: a prefix, names or a brace template of a bucket; the errors
  ``DatasetError``, ``EmptySource``, ``ShardError``.

The iterable datasets split their work across DDP ranks and DataLoader
workers (``split.py``), so each sample is read once per epoch.

Importing this package does not import torch: each name is loaded from its
module on first use (PEP 562), and ``etl_runtime`` itself never imports it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from etl_runtime.pytorch.batches import BatchIterDataset
    from etl_runtime.pytorch.datasets import ObjectDataset, ObjectIterDataset
    from etl_runtime.pytorch.errors import DatasetError, EmptySource, ShardError
    from etl_runtime.pytorch.mix import Mix
    from etl_runtime.pytorch.position import merge_positions
    from etl_runtime.pytorch.sampler import DynamicBatchSampler, dynamic_batches
    from etl_runtime.pytorch.shards import ShardReader
    from etl_runtime.pytorch.sources import Source

_WHERE = {
    "BatchIterDataset": "batches",
    "ObjectDataset": "datasets",
    "ObjectIterDataset": "datasets",
    "ShardReader": "shards",
    "DynamicBatchSampler": "sampler",
    "dynamic_batches": "sampler",
    "Source": "sources",
    "DatasetError": "errors",
    "EmptySource": "errors",
    "ShardError": "errors",
    "Mix": "mix",
    "merge_positions": "position",
}

__all__ = [
    "BatchIterDataset",
    "DatasetError",
    "DynamicBatchSampler",
    "EmptySource",
    "Mix",
    "ObjectDataset",
    "ObjectIterDataset",
    "ShardError",
    "ShardReader",
    "Source",
    "dynamic_batches",
    "merge_positions",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
