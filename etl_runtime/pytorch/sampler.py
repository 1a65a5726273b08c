"""``DynamicBatchSampler``: batches of indices whose objects add up to at most N bytes.

The batching rule is AIStore's (``aistore.pytorch.DynamicBatchSampler``), so
the same sizes give the same batches:

* samples are taken in order (the catalog order, or a shuffle) and added to
  the open batch while it stays under ``max_batch_size``; a sample that makes
  it exactly full is added and closes it; one that would overflow closes it
  and opens the next batch;
* a sample larger than ``max_batch_size`` is yielded alone, at the moment it
  is met (before the batch that is still open), with ``allow_oversized``;
  without it, it is skipped with one warning for all of them;
* the last, partly filled batch is dropped with ``drop_last`` unless it is
  more than ``saturation_factor`` full.

(10 objects of 1 MB give batches of 4, 4, 2 at 4 MB and 3, 3, 3, 1 at 3 MB.)
Unlike AIStore, a zero-byte object is a sample like any other (AIStore skips
it with a warning): every object is read once per epoch.

Sizes come from the dataset's bucket listing (``ObjectDataset.sizes()``), not
one HEAD per object. Batches are cut in numpy: one ``searchsorted`` over the
running total says where a batch opened at each sample would end, and the
only Python loop follows that chain once per batch. Index lists are made as
batches are asked for, so 1,000,000 objects are planned in a fraction of a
second (``bench/pytorch.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import numpy as np
import torch
from torch.utils.data import Sampler

log = logging.getLogger("sluice.pytorch")

SATURATION_FACTOR = 0.8


class Sized(Protocol):
    def sizes(self) -> Sequence[int]: ...


class BatchPlan:
    """One epoch's batches: a flat index array cut at ``bounds`` (lists made on demand).

    Building a million small Python lists up front would cost more in the
    garbage collector than the batching itself, so a plan stays in numpy until
    a batch is asked for.
    """

    def __init__(self, flat: np.ndarray, bounds: np.ndarray) -> None:
        self.flat = flat
        self.bounds = bounds

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def __iter__(self) -> Iterator[list[int]]:
        flat, bounds = self.flat, self.bounds.tolist()
        for start, end in zip(bounds[:-1], bounds[1:], strict=True):
            yield flat[start:end].tolist()

    def batches(self) -> list[list[int]]:
        return list(self)


def plan_batches(
    sizes: Sequence[int] | np.ndarray,
    max_batch_size: float,
    order: np.ndarray | None = None,
    drop_last: bool = False,
    saturation_factor: float = SATURATION_FACTOR,
    allow_oversized: bool = True,
) -> BatchPlan:
    """The batches of one pass over ``sizes`` in ``order`` (default: index order)."""
    all_sizes = np.asarray(sizes, dtype=np.int64)
    order = np.arange(len(all_sizes)) if order is None else np.asarray(order, dtype=np.int64)
    in_order = all_sizes[order]
    oversized = in_order > max_batch_size
    positions = np.flatnonzero(~oversized)  # where each sample that fits is met in ``order``
    normal = order[positions]
    n = len(normal)
    cumulative = np.cumsum(in_order[positions])

    # Where a batch opened at sample i would end: the first sample that reaches the
    # limit ends it, taken in only if it fills the batch exactly.
    base = np.concatenate(([0], cumulative[:-1])) if n else cumulative
    limit = base + max_batch_size
    end = np.searchsorted(cumulative, limit, side="left")
    exact = np.zeros(n, dtype=bool)
    inside = end < n
    exact[inside] = cumulative[end[inside]] == limit[inside]
    end += exact

    # Batches are the chain 0 -> end[0] -> end[end[0]] ...: one step per batch.
    step = end.tolist()
    starts: list[int] = []
    i = 0
    while i < n:
        starts.append(i)
        i = step[i]
    first = np.asarray(starts, dtype=np.int64)
    last = end[first]
    closed = exact[first] | (last < n)  # the last batch may still be open at the end
    if len(first) and not closed[-1] and drop_last:
        total = cumulative[-1] - base[first[-1]]
        if total / max_batch_size <= saturation_factor:
            first, last, closed = first[:-1], last[:-1], closed[:-1]

    big = np.flatnonzero(oversized)
    if len(big) and not allow_oversized:
        log.warning(
            "%d samples are larger than max_batch_size=%d bytes and are skipped "
            "(allow_oversized=True yields each in a batch of its own)",
            len(big),
            max_batch_size,
        )
        big = big[:0]
    if not len(big):
        if not len(first):
            return BatchPlan(normal[:0], np.zeros(1, dtype=np.int64))
        return BatchPlan(normal[: last[-1]], np.append(first, last[-1]))

    # An oversized sample is yielded alone when met, before the batch still open then:
    # a batch is yielded at its last sample if exactly full, else at the sample after.
    yielded_at = np.where(
        exact[first], positions[last - 1], positions[np.minimum(last, n - 1)]
    ).astype(np.float64)
    yielded_at[~closed] = np.inf
    keys = np.concatenate((yielded_at, big.astype(np.float64)))
    sequence = np.argsort(keys, kind="stable")  # batch k < len(first), else an oversized
    lengths = np.concatenate((last - first, np.ones(len(big), dtype=np.int64)))[sequence]
    bounds = np.concatenate(([0], np.cumsum(lengths)))
    out_start = np.empty(len(sequence), dtype=np.int64)
    out_start[sequence] = bounds[:-1]
    flat = np.empty(int(bounds[-1]), dtype=np.int64)
    k = len(first)
    shift = np.repeat(out_start[:k] - first, last - first)
    taken = np.arange(int(last[-1]) if k else 0)
    flat[taken + shift] = normal[taken]
    flat[out_start[k:]] = order[big]
    return BatchPlan(flat, bounds)


def dynamic_batches(
    sizes: Sequence[int] | np.ndarray,
    max_batch_size: float,
    order: np.ndarray | None = None,
    drop_last: bool = False,
    saturation_factor: float = SATURATION_FACTOR,
    allow_oversized: bool = True,
) -> list[list[int]]:
    """The batches (lists of indices into ``sizes``) of one pass in ``order``."""
    plan = plan_batches(sizes, max_batch_size, order, drop_last, saturation_factor, allow_oversized)
    return plan.batches()


class DynamicBatchSampler(Sampler[list[int]]):
    """Batches of dataset indices whose stored sizes sum to at most ``max_batch_size`` bytes.

    ``dataset`` is an ``ObjectDataset`` (or anything with ``sizes()``), or a
    plain sequence of sizes. ``shuffle=True`` shuffles the samples before
    batching: with ``seed=None`` a new order every epoch (drawn from torch's
    RNG, like ``RandomSampler``), with a ``seed`` the order of
    ``(seed, epoch)``, see ``set_epoch``. ``len()`` is the number of batches of
    the coming epoch. See the module docstring for the batching rule.
    """

    def __init__(
        self,
        dataset: Sized | Sequence[int] | np.ndarray,
        max_batch_size: float,
        shuffle: bool = False,
        drop_last: bool = False,
        saturation_factor: float = SATURATION_FACTOR,
        allow_oversized: bool = True,
        seed: int | None = None,
    ) -> None:
        if max_batch_size <= 0:
            raise ValueError(
                f"max_batch_size must be a positive number of bytes, not {max_batch_size}"
            )
        if not 0 <= saturation_factor <= 1:
            raise ValueError(f"saturation_factor must be between 0 and 1, not {saturation_factor}")
        raw: Any = dataset.sizes() if hasattr(dataset, "sizes") else dataset
        self.sizes = np.asarray(raw, dtype=np.int64)
        self.max_batch_size = max_batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.saturation_factor = saturation_factor
        self.allow_oversized = allow_oversized
        self.seed = seed
        self.epoch = 0
        self._planned: BatchPlan | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self._planned = None

    def _order(self) -> np.ndarray | None:
        if not self.shuffle:
            return None
        if self.seed is None:
            seed = int(torch.empty((), dtype=torch.int64).random_().item())
            return np.random.default_rng(seed).permutation(len(self.sizes))
        return np.random.default_rng((self.seed, self.epoch)).permutation(len(self.sizes))

    def _plan(self) -> BatchPlan:
        return plan_batches(
            self.sizes,
            self.max_batch_size,
            self._order(),
            self.drop_last,
            self.saturation_factor,
            self.allow_oversized,
        )

    def __iter__(self) -> Iterator[list[int]]:
        # A plan made by len() is used once; the next pass plans (and reshuffles) anew.
        plan = self._planned if self._planned is not None else self._plan()
        self._planned = None
        return iter(plan)

    def __len__(self) -> int:
        if self._planned is None:
            self._planned = self._plan()
        return len(self._planned)
