"""Where an epoch stands, across every rank and DataLoader worker: exact, elastic resume.

An epoch is a fixed sequence of *units* (objects, or whole shards), the seeded
order of ``split.epoch_order``; a ``Position`` says which of them have been
read (a set of order positions, stored as ranges) and, for shards read in
part, how many samples of each were read, the key of the last one and the
byte offset where it starts in the shard (so a resume reads from there).

Reading splits what is left of the position between the readers: rank ``r``
of ``R`` takes every ``R``-th remaining unit from ``r`` and its worker ``w``
of ``W`` every ``W``-th of those (``BatchIterDataset`` cuts the rank's share
into batches first, and deals batches). Each reader's ``state_dict()`` is the
position it started from (its *base*), its slot in the split, how many of its
units it has read (``taken``) and how far into the next one (``at``), so

* with the same layout, each worker takes its own state back (what
  ``torchdata``'s ``StatefulDataLoader.load_state_dict`` does) and goes on;
* with another one, ``merge_positions`` joins the states of every worker of
  every rank into one position (what was read by anyone), which any layout
  re-splits: every unit of the epoch is read exactly once across the run,
  and a shard read in part goes on at its next sample.

A position whose epoch is complete is the start of the next epoch, so a
checkpoint taken after the last batch neither repeats nor skips an epoch.
States are plain dicts of ints, strings and lists (JSON-able, ``torch.save``-able).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from etl_runtime.pytorch.errors import DatasetError
from etl_runtime.pytorch.split import Part, epoch_order

FORMAT = 1
# A shard read in part: samples read, the last one's key and its byte offset (None: unknown).
At = tuple[int, str | None, int | None]


def at_of(saved: Sequence[Any]) -> At:
    """A saved ``[count, key]`` or ``[count, key, offset]`` as an ``At``."""
    if len(saved) not in (2, 3):
        raise ValueError(f"a shard position is [count, key, offset], not {list(saved)!r}")
    offset = saved[2] if len(saved) == 3 else None
    return int(saved[0]), saved[1], int(offset) if offset is not None else None


def ranges_of(mask: np.ndarray) -> list[list[int]]:
    """``[[start, stop), ...]`` of the ``True`` runs of a boolean array."""
    padded = np.concatenate(([False], mask.astype(bool), [False]))
    edges = np.flatnonzero(padded[1:] != padded[:-1])
    return [[int(a), int(b)] for a, b in zip(edges[::2], edges[1::2], strict=True)]


def mask_of(ranges: Iterable[Sequence[int]], n: int) -> np.ndarray:
    mask = np.zeros(n, dtype=bool)
    for start, stop in ranges:
        if not 0 <= start <= stop <= n:
            raise DatasetError(f"position: range [{start}, {stop}) is outside 0..{n}")
        mask[start:stop] = True
    return mask


@dataclass
class Position:
    """What of epoch ``epoch`` has been read: ``done`` units, ``partial`` shards."""

    epoch: int
    items: int
    shuffle: bool
    seed: int
    done: np.ndarray  # bool per order position
    partial: dict[int, At] = field(default_factory=dict)

    @classmethod
    def start(cls, epoch: int, items: int, shuffle: bool, seed: int) -> Position:
        return cls(epoch, items, shuffle, seed, np.zeros(items, dtype=bool))

    def order(self) -> np.ndarray:
        """Catalog index of each order position."""
        return epoch_order(self.items, self.shuffle, self.seed, self.epoch)

    def remaining(self) -> np.ndarray:
        """Order positions not read yet, in order."""
        return np.flatnonzero(~self.done)

    def complete(self) -> bool:
        return bool(self.done.all())

    def read(self) -> int:
        """Units read (whole ones)."""
        return int(self.done.sum())

    def to_state(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "epoch": self.epoch,
            "items": self.items,
            "shuffle": self.shuffle,
            "seed": self.seed,
            "done": ranges_of(self.done),
            "partial": [[p, *at] for p, at in sorted(self.partial.items())],
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> Position:
        try:
            if state.get("format") != FORMAT:
                raise DatasetError(f"position: format {state.get('format')!r}, expected {FORMAT}")
            items = int(state["items"])
            done = mask_of(state["done"], items)
            partial = {int(p[0]): at_of(p[1:]) for p in state["partial"]}
            return cls(
                int(state["epoch"]),
                items,
                bool(state["shuffle"]),
                int(state["seed"]),
                done,
                partial,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise DatasetError(f"not a dataset position: {type(exc).__name__}: {exc}") from exc

    def same_epoch_of(self, other: Position) -> bool:
        return (self.epoch, self.items, self.shuffle, self.seed) == (
            other.epoch,
            other.items,
            other.shuffle,
            other.seed,
        )


@dataclass
class Slot:
    """One reader's share of a split: its units and how far it has read them."""

    part: Part
    skip: int = 0  # BatchIterDataset.resume(): the rank's first batches, read before
    taken: int = 0
    at: At | None = None
    group: int = 0  # units are batches of this many objects (BatchIterDataset), else single
    drop_last: bool = False

    def matches(self, part: Part) -> bool:
        return self.part == part

    def to_state(self) -> dict[str, Any]:
        p = self.part
        return {
            "world_size": p.world_size,
            "num_workers": p.num_workers,
            "rank": p.rank,
            "worker": p.worker,
            "skip": self.skip,
            "taken": self.taken,
            "at": list(self.at) if self.at is not None else None,
            "batch": self.group,
            "drop_last": self.drop_last,
        }

    @classmethod
    def from_state(cls, s: Mapping[str, Any]) -> Slot:
        part = Part(int(s["rank"]), int(s["world_size"]), int(s["worker"]), int(s["num_workers"]))
        at = s.get("at")
        return cls(
            part,
            int(s.get("skip", 0)),
            int(s["taken"]),
            at_of(at) if at is not None else None,
            int(s.get("batch", 0)),
            bool(s.get("drop_last", False)),
        )


def rank_units(
    remaining: np.ndarray, part: Part, group: int = 0, drop_last: bool = False
) -> list[np.ndarray]:
    """The rank's units of the remaining order positions: one each, or batches of ``group``."""
    mine = remaining[part.rank :: part.world_size]
    if group <= 0:
        return [mine[i : i + 1] for i in range(len(mine))]
    batches = [mine[k : k + group] for k in range(0, len(mine), group)]
    if drop_last and batches and len(batches[-1]) < group:
        batches.pop()
    return batches


def slot_units(position: Position, slot: Slot) -> list[np.ndarray]:
    """What ``slot`` reads of ``position``: its units (arrays of order positions), in order."""
    units = rank_units(position.remaining(), slot.part, slot.group, slot.drop_last)
    return units[slot.skip + slot.part.worker :: slot.part.num_workers]


def reader_state(position: Position, slot: Slot) -> dict[str, Any]:
    return {**position.to_state(), "slot": slot.to_state()}


def split_state(state: Mapping[str, Any]) -> tuple[Position, Slot | None]:
    slot = state.get("slot")
    try:
        return Position.from_state(state), Slot.from_state(slot) if slot is not None else None
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise DatasetError(f"not a dataset position: {type(exc).__name__}: {exc}") from exc


def reader_states(states: Iterable[Any]) -> list[Mapping[str, Any]]:
    """The readers' states in ``states``: dataset states, or ``StatefulDataLoader`` ones."""
    out: list[Mapping[str, Any]] = []
    for state in states:
        if not isinstance(state, Mapping):
            raise DatasetError(f"a position is a dict, not {type(state).__name__}")
        if "format" in state:
            out.append(state)
        elif "_snapshot" in state:  # torchdata StatefulDataLoader, worker processes
            snapshot = state["_snapshot"]
            workers = snapshot.get("_worker_snapshots") or {}
            for worker in workers.values():
                out.extend(reader_states([worker["dataset_state"]]))
            if not workers:
                out.extend(reader_states([snapshot["_main_snapshot"]["dataset_state"]]))
        elif "dataset_state" in state:  # StatefulDataLoader with num_workers=0
            out.extend(reader_states([state["dataset_state"]]))
        elif "mix" in state:
            raise DatasetError("a Mix position: merge it with Mix.merge_positions")
        else:
            raise DatasetError(f"not a dataset position (keys {sorted(state)[:6]})")
    return out


def merge_positions(states: Iterable[Any]) -> dict[str, Any]:
    """One position out of the states of every worker of every rank (what anyone read).

    ``states``: dataset ``state_dict()``s or ``StatefulDataLoader.state_dict()``s,
    one per rank or per worker, in any order. Every slot of the layout they
    were saved with must be there (a missing one would read its samples
    again); the result loads into a dataset of any layout.
    """
    readers = [split_state(s) for s in reader_states(states)]
    if not readers:
        raise DatasetError("merge_positions: no state given")
    base = readers[0][0]
    done = base.done.copy()
    partial = dict(base.partial)
    layouts = {
        (s.part.world_size, s.part.num_workers, s.group, s.drop_last)
        for _, s in readers
        if s is not None
    }
    if len(layouts) > 1:
        raise DatasetError(f"merge_positions: states of different layouts {sorted(layouts)}")
    seen: set[tuple[int, int]] = set()
    for position, slot in readers:
        if not position.same_epoch_of(base) or not np.array_equal(position.done, base.done):
            raise DatasetError(
                "merge_positions: states of different datasets or of different resumes"
            )
        if slot is None:
            continue
        seen.add((slot.part.rank, slot.part.worker))
        units = slot_units(position, slot)
        if slot.skip:
            rank = rank_units(position.remaining(), slot.part, slot.group, slot.drop_last)
            for unit in rank[: slot.skip]:
                done[unit] = True
        for unit in units[: slot.taken]:
            done[unit] = True
            for p in unit.tolist():
                partial.pop(p, None)
        if slot.at is not None and slot.taken < len(units):
            p = int(units[slot.taken][0])
            if slot.at[0] > partial.get(p, (0, None, None))[0]:
                partial[p] = slot.at
    if layouts:
        world, workers, _, _ = layouts.pop()
        missing = [
            f"rank {r} worker {w}"
            for r in range(world)
            for w in range(workers)
            if (r, w) not in seen
        ]
        if missing:
            raise DatasetError(
                f"merge_positions: the states of {world} rank(s) x {workers} worker(s) "
                f"lack {', '.join(missing[:4])}{'...' if len(missing) > 4 else ''}: "
                "pass the loader state of every rank"
            )
    merged = Position(base.epoch, base.items, base.shuffle, base.seed, done, partial)
    return merged.to_state()
