"""The global plan: record order, output shards, and who builds each one.

Every target indexes the input shards it owns and reports, per shard, its
records' keys and byte sizes — metadata only, never the bytes. From the whole
inventory and the spec the plan is a pure function, so any process that holds
the same inventory computes the same plan:

1. canonical order: input shards in ``input_format`` order, records in tar
   order (this is kind ``none``);
2. ``alphanumeric``: a stable sort by key (``decreasing`` reverses it);
   ``shuffle``: ``random.Random(seed).shuffle`` of the canonical order — one
   global permutation over all shards and targets, the same for the same seed;
3. records are cut into output shards in that order, by AIStore's rule: a
   record goes into the open shard, which is closed once its size (the tar's,
   end blocks included) reaches ``output_shard_size``; so each shard is at
   least the target size and less than one record over it, and only the
   last one may be smaller (1,000 records of 10 KiB in 100 KiB shards: 100);
4. output shard ``i`` is named by ``output_format`` and built by the HRW
   owner of ``output_bck/name``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from etl_runtime.core.errors import DsortFailed
from etl_runtime.dsort.records import END_OF_ARCHIVE, Record
from etl_runtime.dsort.spec import DsortSpec


@dataclass(frozen=True)
class Placed:
    """A record and where its bytes are: ``target`` holds input ``shard``."""

    target: str
    shard: str
    record: Record


@dataclass(frozen=True)
class OutputShard:
    name: str
    owner: str
    records: tuple[Placed, ...]

    @property
    def size(self) -> int:
        return sum(p.record.size for p in self.records) + len(END_OF_ARCHIVE)


Inventory = Mapping[str, Mapping[str, list[Record]]]  # target -> input shard -> records


def order_records(spec: DsortSpec, inventory: Inventory) -> list[Placed]:
    holder: dict[str, str] = {}
    for target in sorted(inventory):
        for shard in inventory[target]:
            if shard in holder:
                raise DsortFailed(
                    f"input shard {shard!r} was indexed twice (by {holder[shard]!r} and {target!r})"
                )
            holder[shard] = target
    placed = [
        Placed(holder[shard], shard, rec)
        for shard in spec.input_names()
        if shard in holder
        for rec in inventory[holder[shard]][shard]
    ]
    algo = spec.algorithm
    if algo.kind == "alphanumeric":
        placed.sort(key=lambda p: p.record.key, reverse=algo.decreasing)
    elif algo.kind == "shuffle":
        if not algo.seed:
            raise DsortFailed("a shuffle needs its seed fixed first (DsortSpec.with_seed)")
        random.Random(algo.seed).shuffle(placed)
    return placed


def cut_shards(ordered: list[Placed], target_size: int) -> list[list[Placed]]:
    shards: list[list[Placed]] = []
    current: list[Placed] = []
    size = len(END_OF_ARCHIVE)
    for p in ordered:
        current.append(p)
        size += p.record.size
        if size >= target_size:
            shards.append(current)
            current, size = [], len(END_OF_ARCHIVE)
    if current:
        shards.append(current)
    return shards


def make_plan(
    spec: DsortSpec, inventory: Inventory, owner: Callable[[str], str]
) -> list[OutputShard]:
    """The output shards in order; ``owner(name)`` picks the target that builds one."""
    groups = cut_shards(order_records(spec, inventory), spec.output_shard_size)
    names = spec.output_names()
    inputs = set(spec.input_names()) if spec.output_bck == spec.input_bck else set()
    plan: list[OutputShard] = []
    for group in groups:
        name = next(names, None)
        if name is None:
            raise DsortFailed(
                f"output_format {spec.output_format!r} yields only {len(plan)} names, "
                f"but the records fill {len(groups)} shards: widen its range"
            )
        if name in inputs:
            raise DsortFailed(
                f"output shard {spec.output_bck}/{name} would overwrite an input shard: "
                "pick another output_format or output_bck"
            )
        plan.append(OutputShard(name, owner(name), tuple(group)))
    return plan
