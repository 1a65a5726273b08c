"""``state_dict()``/``load_state_dict()`` of the iterable datasets (``position.py``'s rules).

A dataset holds the epoch to read, the position it starts from (``None``: the
epoch's start) and, once a position saved by one reader has been loaded, that
reader's slot. Iterating makes a live copy of the slot that advances as
samples are yielded, so ``state_dict()`` in a DataLoader worker (where
``StatefulDataLoader`` asks for it after each batch) says exactly what has
been handed out; iterating again without ``set_epoch`` starts again from the
loaded position, as an epoch without a position starts again from its start.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from etl_runtime.pytorch.errors import DatasetError
from etl_runtime.pytorch.position import (
    Position,
    Slot,
    rank_units,
    reader_state,
    slot_units,
    split_state,
)
from etl_runtime.pytorch.split import Part, current_part


def describe(part: Part) -> str:
    return (
        f"rank {part.rank} worker {part.worker} of {part.world_size} rank(s) "
        f"x {part.num_workers} worker(s)"
    )


class Resumable:
    """The position-keeping part of ``ShardReader``, ``ObjectIterDataset``, ``BatchIterDataset``."""

    shuffle: bool
    seed: int
    epoch: int
    rank: int | None
    world_size: int | None
    _group = 0  # BatchIterDataset: units are batches of this many objects
    _drop_last = False

    def _init_position(
        self, shuffle: bool, seed: int, rank: int | None, world_size: int | None
    ) -> None:
        if (rank is None) != (world_size is None):
            raise ValueError("give both rank and world_size, or neither")
        if rank is not None and world_size is not None and not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not within world_size {world_size}")
        self.shuffle, self.seed, self.epoch = shuffle, seed, 0
        self.rank, self.world_size = rank, world_size
        self._epoch_set = False
        self._base: Position | None = None
        self._loaded: Slot | None = None
        self._live: Slot | None = None
        self._skip = 0

    def _items(self) -> int:
        raise NotImplementedError

    def set_epoch(self, epoch: int) -> None:
        """Read epoch ``epoch`` next: a loaded position of that epoch is kept, any other dropped."""
        if self._base is None or self._base.epoch != epoch:
            self._base, self._loaded, self._skip = None, None, 0
        self._live = None
        self.epoch, self._epoch_set = epoch, True

    def part(self) -> Part:
        """This reader's slot: rank (the dataset's, DDP's or ``RANK``) × DataLoader worker."""
        return current_part(self.rank, self.world_size)

    def position(self) -> Position:
        """The position iteration starts from."""
        if self._base is not None:
            return self._base
        return Position.start(self.epoch, self._items(), self.shuffle, self.seed)

    def state_dict(self) -> dict[str, Any]:
        """This reader's position: where it started, its slot and what it has yielded."""
        slot = self._live or self._loaded or self._slot(self.part(), self._skip)
        return reader_state(self.position(), slot)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Start from a saved position: a reader's own state, or ``merge_positions``'."""
        position, slot = split_state(state)
        want = (self._items(), self.shuffle, self.seed)
        got = (position.items, position.shuffle, position.seed)
        if got != want:
            raise DatasetError(
                f"this position is of {got[0]} items (shuffle={got[1]}, seed={got[2]}); "
                f"the dataset has {want[0]} (shuffle={want[1]}, seed={want[2]})"
            )
        if self._epoch_set and position.epoch != self.epoch:
            # set_epoch() chose another epoch (e.g. the one after a completed checkpoint):
            # a position of the old one no longer applies.
            return
        if slot is None and position.complete():
            position = Position.start(position.epoch + 1, *want)
        self.epoch = position.epoch
        self._base, self._loaded, self._live, self._skip = position, slot, None, 0

    def _slot(self, part: Part, skip: int = 0) -> Slot:
        return Slot(part, skip=skip, group=self._group, drop_last=self._drop_last)

    def _begin(self) -> tuple[Slot, list[np.ndarray], np.ndarray, Position]:
        """A live slot for this reader, its units (order positions) and the epoch's order."""
        part = self.part()
        loaded = self._loaded
        if loaded is not None and not loaded.matches(part):
            raise DatasetError(
                f"this position was saved by {describe(loaded.part)}; this reader is "
                f"{describe(part)}: to change the layout, load "
                "merge_positions(<the loader states of every rank>) into the dataset instead"
            )
        if loaded is not None and (loaded.group, loaded.drop_last) != (
            self._group,
            self._drop_last,
        ):
            raise DatasetError(
                f"this position was saved with batches of {loaded.group} "
                f"(drop_last={loaded.drop_last}); this reader makes batches of {self._group} "
                f"(drop_last={self._drop_last}): load merge_positions(<the states>) instead"
            )
        start = loaded or self._slot(part, self._skip)
        live = Slot(part, start.skip, start.taken, start.at, self._group, self._drop_last)
        self._live = live
        base = self.position()
        return live, slot_units(base, live), base.order(), base

    def _rank_units(self) -> list[np.ndarray]:
        units = rank_units(self.position().remaining(), self.part(), self._group, self._drop_last)
        return units[self._skip :]
