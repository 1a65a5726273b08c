"""DynamicBatchSampler: AIStore's batching rule, on the seed's examples and random sizes."""

from __future__ import annotations

import random

import numpy as np
import pytest

pytestmark = pytest.mark.torch
pytest.importorskip("torch")

from etl_runtime.pytorch import DynamicBatchSampler, ObjectDataset  # noqa: E402

MB = 1_000_000


def aistore_rule(sizes, order, limit, drop_last, saturation, allow_oversized):
    """AIStore's DynamicBatchSampler loop, one sample at a time (the reference)."""
    batches, batch, total, k = [], [], 0, 0
    while k < len(order):
        i = order[k]
        if sizes[i] > limit:
            if allow_oversized:
                batches.append([i])
            k += 1
        elif total + sizes[i] < limit:
            batch.append(i)
            total += sizes[i]
            k += 1
        else:
            if total + sizes[i] == limit:
                batch.append(i)
                k += 1
            batches.append(batch)
            batch, total = [], 0
    if (batch and not drop_last) or (drop_last and total / limit > saturation):
        batches.append(batch)
    return batches


def test_the_seeds_examples_from_a_real_listing(client) -> None:
    bucket = client.bucket("pt-sizes").create()
    for i in range(10):
        bucket.object(f"mb-{i}").put_content(bytes(MB))
    dataset = ObjectDataset(bucket)
    assert [len(b) for b in DynamicBatchSampler(dataset, max_batch_size=4 * MB)] == [4, 4, 2]
    sampler = DynamicBatchSampler(dataset, max_batch_size=3 * MB)
    assert [len(b) for b in sampler] == [3, 3, 3, 1] and len(sampler) == 4
    assert [b for batch in sampler for b in batch] == list(range(10))
    dropped = DynamicBatchSampler(dataset, max_batch_size=3 * MB, drop_last=True)
    assert [len(b) for b in dropped] == [3, 3, 3]  # the last batch is only 1/3 full


def test_random_sizes_follow_the_rule_and_the_byte_limit() -> None:
    rng = random.Random(1234)
    for trial in range(300):
        n, limit = rng.randint(0, 60), rng.randint(1, 40)
        sizes = [rng.choice([rng.randint(1, limit), rng.randint(1, 3 * limit)]) for _ in range(n)]
        allow, drop, shuffle = rng.random() < 0.5, rng.random() < 0.5, rng.random() < 0.5
        saturation = rng.random()
        sampler = DynamicBatchSampler(
            sizes,
            limit,
            shuffle=shuffle,
            drop_last=drop,
            saturation_factor=saturation,
            allow_oversized=allow,
            seed=trial,
        )
        batches = list(sampler)
        for batch in batches:
            weight = sum(sizes[i] for i in batch)
            assert weight <= limit or (allow and len(batch) == 1), (trial, batch, weight)
        flat = [i for b in batches for i in b]
        assert len(flat) == len(set(flat))  # nothing twice
        order = np.random.default_rng((trial, 0)).permutation(n).tolist() if shuffle else range(n)
        assert batches == aistore_rule(sizes, list(order), limit, drop, saturation, allow), trial
        if not drop:  # only oversized samples (without allow_oversized) are left out
            assert set(flat) == {i for i in range(n) if allow or sizes[i] <= limit}


def test_shuffle_is_seeded_per_epoch() -> None:
    sizes = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5] * 20
    a = DynamicBatchSampler(sizes, 10, shuffle=True, seed=3)
    b = DynamicBatchSampler(sizes, 10, shuffle=True, seed=3)
    assert list(a) == list(b)
    first = list(a)
    a.set_epoch(1)
    assert list(a) != first and sorted(i for x in a for i in x) == list(range(len(sizes)))
