"""Exact, elastic resume: save a loader mid-epoch with W workers x R ranks, go on with W' x R'.

Ranks are simulated in one process (``rank``/``world_size`` arguments), each
with a ``torchdata`` ``StatefulDataLoader`` whose workers are real processes;
the shards go through a per-sample (``mode="wds"``) ETL.
"""

from __future__ import annotations

from collections import Counter
from itertools import islice

import httpx
import pytest

from etl_runtime.pytorch import (
    BatchIterDataset,
    DatasetError,
    ObjectIterDataset,
    ShardReader,
    Source,
    merge_positions,
)
from tests.pytorch.conftest import OBJECTS, PER_SHARD, SHARDS, make_shard, sample_key

pytestmark = pytest.mark.torch
stateful = pytest.importorskip("torchdata.stateful_dataloader")
Loader = stateful.StatefulDataLoader

ALL_KEYS = Counter(sample_key(s, i) for s in range(SHARDS) for i in range(PER_SHARD))


def shard_reader(shards, etl: str, rank: int, world: int) -> ShardReader:
    template = Source(shards, template=f"shard-{{0..{SHARDS - 1}}}.tar")
    return ShardReader(template, etl_name=etl, shuffle=True, seed=5, rank=rank, world_size=world)


def run_ranks(make, world: int, workers: int, take: int | None, state=None, epoch=None):
    """Each rank reads ``take`` samples (all with None); its loader state and what it read."""
    states, seen = [], []
    for rank in range(world):
        dataset = make(rank, world)
        if state is not None:
            dataset.load_state_dict(state)
        if epoch is not None:
            dataset.set_epoch(epoch)
        loader = Loader(dataset, batch_size=None, num_workers=workers)
        it = iter(loader)
        seen += list(islice(it, take))
        states.append(loader.state_dict())
        del it, loader  # the workers are killed: what they prefetched is lost
    return states, seen


@pytest.mark.parametrize("then", [(3, 1), (1, 4)])
def test_shards_2x2_resume_as_other_layouts_read_every_sample_once(shards, etls, then) -> None:
    def make(rank: int, world: int) -> ShardReader:
        return shard_reader(shards, etls[1], rank, world)

    # 4 samples per rank: its two workers each stop inside their first shard.
    states, first = run_ranks(make, world=2, workers=2, take=4)
    position = merge_positions(states)
    _, rest = run_ranks(make, world=then[0], workers=then[1], take=None, state=position)
    keys = [key for key, _ in first + rest]
    assert len(first) == 8
    assert Counter(keys) == ALL_KEYS  # every sample once: none lost, none twice
    for key, fields in first + rest:
        assert fields["tag"] == f"tagged {key}".encode()  # the ETL ran on resumed shards too


def test_same_layout_resume_through_the_loader_and_a_changed_one_refused(shards, etls) -> None:
    dataset = shard_reader(shards, etls[1], 0, 1)
    loader = Loader(dataset, batch_size=None, num_workers=2)
    it = iter(loader)
    first = [key for key, _ in islice(it, 7)]
    state = loader.state_dict()
    del it, loader

    again = Loader(shard_reader(shards, etls[1], 0, 1), batch_size=None, num_workers=2)
    again.load_state_dict(state)
    rest = [key for key, _ in again]
    assert Counter(first + rest) == ALL_KEYS

    # torchdata refuses another worker count itself; a loader state of 1 rank loaded
    # on rank 0 of 2 is refused by the dataset, naming the way out.
    other = Loader(shard_reader(shards, etls[1], 0, 2), batch_size=None, num_workers=2)
    other.load_state_dict(state)
    with pytest.raises(DatasetError, match="merge_positions"):
        list(other)
    # ...and a merge that lacks a rank is refused too.
    states, _ = run_ranks(lambda r, w: shard_reader(shards, etls[1], r, w), 2, 1, take=2)
    with pytest.raises(DatasetError, match="rank 1 worker 0"):
        merge_positions(states[:1])


def test_resume_across_an_epoch_boundary_neither_skips_nor_repeats(objects) -> None:
    source = Source(objects, prefix="a/")
    names = Counter(n for n in OBJECTS if n.startswith("a/"))

    def make(rank: int, world: int) -> ObjectIterDataset:
        return ObjectIterDataset(source, shuffle=True, seed=2, rank=rank, world_size=world)

    # Epoch 0 read to its end by 2 x 2, checkpointed after its last sample.
    states, epoch0 = run_ranks(make, world=2, workers=2, take=None, epoch=0)
    assert Counter(n for n, _ in epoch0) == names
    position = merge_positions(states)
    resumed = make(0, 1)
    resumed.load_state_dict(position)
    assert resumed.epoch == 1  # a complete epoch is the start of the next
    # Epoch 1, 5 objects by 1 x 3, then the rest by 2 x 1, then epoch 2 whole.
    states, part1 = run_ranks(make, world=1, workers=3, take=5, state=position)
    _, rest1 = run_ranks(make, world=2, workers=1, take=None, state=merge_positions(states))
    assert Counter(n for n, _ in part1 + rest1) == names
    _, epoch2 = run_ranks(make, world=1, workers=2, take=None, epoch=2)
    assert Counter(n for n, _ in epoch2) == names

    # The loader's own path: set_epoch(1) after a checkpoint taken at epoch 0's end
    # reads epoch 1 (the stale position is dropped), not an empty epoch.
    loader_state = run_ranks(make, world=1, workers=2, take=None, epoch=0)[0][0]
    dataset = make(0, 1)
    dataset.set_epoch(1)
    loader = Loader(dataset, batch_size=None, num_workers=2)
    loader.load_state_dict(loader_state)
    assert Counter(n for n, _ in loader) == names


def test_one_reader_resumed_keeps_the_seeded_order(objects) -> None:
    def make() -> ObjectIterDataset:
        return ObjectIterDataset(Source(objects, prefix="b/"), shuffle=True, seed=9)

    whole = [n for n, _ in make()]
    dataset = make()
    it = iter(dataset)
    head = [n for n, _ in islice(it, 5)]
    state = dataset.state_dict()
    again = make()
    again.load_state_dict(merge_positions([state]))
    assert head + [n for n, _ in again] == whole
    assert len(again) == len(whole) - 5


def test_batches_2x2_resume_as_1x3_read_every_object_once(objects) -> None:
    def make(rank: int, world: int) -> BatchIterDataset:
        return BatchIterDataset(
            objects, batch_size=3, shuffle=True, seed=4, rank=rank, world_size=world
        )

    states, first = run_ranks(make, world=2, workers=2, take=2)
    _, rest = run_ranks(make, world=1, workers=3, take=None, state=merge_positions(states))
    got = [n for batch in first + rest for n, _ in batch]
    assert len(first) == 4
    assert Counter(got) == Counter(list(OBJECTS))


def served_bytes(client) -> float:
    """Bytes the targets have sent for object GETs (their /metrics, all targets)."""
    total = 0.0
    for target in client.cluster()["targets"]:
        for line in httpx.get(f"{target['url']}/metrics").text.splitlines():
            if line.startswith("sluice_http_sent_bytes_total{") and 'op="get"' in line:
                if 'role="target"' in line and "/v1/objects/" in line:
                    total += float(line.rsplit(" ", 1)[1])
    return total


def test_a_mid_shard_resume_reads_from_the_last_sample_not_the_whole_shard(client) -> None:
    bucket = client.bucket("pt-ranged").create()
    pad = 20_000
    shard = make_shard(9, samples=20, pad=pad)
    bucket.object("big.tar").put_content(shard)
    reader = ShardReader(bucket)
    first = [key for key, _ in islice(iter(reader), 18)]
    state = reader.state_dict()

    before = served_bytes(client)
    again = ShardReader(bucket)
    again.load_state_dict(state)
    rest = [key for key, _ in again]
    sent = served_bytes(client) - before
    assert first + rest == [sample_key(9, i) for i in range(20)]
    # The 18th sample (checked to be the one read last) and the two after it, not 20.
    assert 2 * pad < sent < 4 * pad, (sent, len(shard))

    before = served_bytes(client)
    assert len(list(ShardReader(bucket))) == 20
    assert served_bytes(client) - before >= len(shard)

    # The shard rewritten since: the saved sample is not where the position says.
    bucket.object("big.tar").put_content(make_shard(8, samples=20, pad=pad + 1))
    changed = ShardReader(bucket)
    changed.load_state_dict(state)
    with pytest.raises(DatasetError, match="pt-ranged/big.tar' changed since"):
        list(changed)
