"""ObjectDataset and ObjectIterDataset in real DataLoader workers over a real cluster."""

from __future__ import annotations

import sys
from collections import Counter

import pytest

from etl_runtime import NotFound
from etl_runtime.pytorch import (
    DynamicBatchSampler,
    EmptySource,
    ObjectDataset,
    ObjectIterDataset,
    Source,
)
from tests.pytorch.conftest import OBJECTS

pytestmark = pytest.mark.torch
torch_data = pytest.importorskip("torch.utils.data")


def loader(dataset, **kw):
    return torch_data.DataLoader(dataset, num_workers=2, collate_fn=list, **kw)


def test_object_dataset_sources_etl_and_dynamic_batches(objects, etls) -> None:
    some_b = [n for n in OBJECTS if n.startswith("b/")][:5]
    # Several sources at once: a prefix, and names from the other "directory".
    dataset = ObjectDataset(
        [Source(objects, prefix="a/"), Source(objects, names=some_b)],
        etl_name=etls[0],
        transform=lambda name, data: (name, data.decode()),
    )
    expected = {n: d.decode().upper() for n, d in OBJECTS.items() if n.startswith("a/")}
    expected.update({n: OBJECTS[n].decode().upper() for n in some_b})
    assert len(dataset) == len(expected)

    # Sizes: the listing's for the prefix, one listing for the named objects.
    assert dataset.sizes() == [len(OBJECTS[n]) for n in dataset.names]
    limit = 3 * max(dataset.sizes())
    sampler = DynamicBatchSampler(dataset, max_batch_size=limit, shuffle=True, seed=7)
    batches = list(loader(dataset, batch_sampler=sampler))
    seen = Counter(name for batch in batches for name, _ in batch)
    assert seen == Counter(list(expected))  # every sample exactly once
    assert all(sum(len(OBJECTS[n]) for n, _ in b) <= limit for b in batches)
    assert dict(item for batch in batches for item in batch) == expected


def test_object_iter_dataset_splits_workers_and_reshuffles_per_epoch(objects, etls) -> None:
    plain = ObjectIterDataset(objects)
    assert Counter(n for b in loader(plain, batch_size=4) for n, _ in b) == Counter(list(OBJECTS))

    dataset = ObjectIterDataset(objects, prefix_map={objects: ["b/"]}, etl_name=etls[0])
    dataset.shuffle, dataset.seed = True, 11
    expected = {n: d.upper() for n, d in OBJECTS.items() if n.startswith("b/")}
    orders = []
    for epoch in range(2):
        dataset.set_epoch(epoch)
        items = [item for batch in loader(dataset, batch_size=3) for item in batch]
        assert Counter(n for n, _ in items) == Counter(list(expected))
        assert dict(items) == expected
        orders.append([n for n, _ in items])
    assert orders[0] != orders[1]


def test_missing_bucket_and_empty_prefix_name_what_is_wrong(client, objects) -> None:
    with pytest.raises(NotFound) as nf:
        ObjectIterDataset(client.bucket("pt-no-such-bucket"))
    assert "pt-no-such-bucket" in str(nf.value)
    with pytest.raises(EmptySource) as empty:
        ObjectDataset(Source(objects, prefix="typo/"))
    assert "pt-objects" in str(empty.value) and "typo/" in str(empty.value)
    # A named object that is not there: NotFound naming it when its size is asked.
    with pytest.raises(NotFound) as missing:
        ObjectDataset(Source(objects, names=["a/obj-000.txt", "a/gone.txt"])).sizes()
    assert "a/gone.txt" in str(missing.value)


def test_importing_the_package_does_not_import_torch() -> None:
    import subprocess

    code = (
        "import sys, etl_runtime, etl_runtime.pytorch;"
        "from etl_runtime.pytorch import Source;"
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
