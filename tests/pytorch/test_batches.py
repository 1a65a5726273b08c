"""BatchIterDataset (one GetBatch per batch) in real DataLoader workers over a real cluster,
and the SDK's ``Client.get_batch`` it stands on."""

from __future__ import annotations

import pytest

from etl_runtime import Client
from etl_runtime.pytorch import BatchIterDataset, Source
from etl_runtime.pytorch.split import epoch_order
from etl_runtime.sdk.errors import NotFound
from tests.pytorch.conftest import OBJECTS

torch_data = pytest.importorskip("torch.utils.data")


def test_get_batch_keeps_order_transforms_and_names_missing_objects(client, objects, etls) -> None:
    names = sorted(OBJECTS)[::-1][:9] + sorted(OBJECTS)[:3]  # some twice, out of order
    items = [("pt-objects", n) for n in names]
    assert [(g.bucket, g.name, g.data) for g in client.get_batch(items)] == [
        ("pt-objects", n, OBJECTS[n]) for n in names
    ]
    upper, _ = etls
    got = client.get_batch(items[:4], etl_name=upper)
    assert [g.data for g in got] == [OBJECTS[n].upper() for n in names[:4]]

    with_gap = [*items[:2], ("pt-objects", "no/such-object"), items[2]]
    got_list = list(client.get_batch(with_gap, missing_ok=True))
    assert [g.data for g in got_list] == [
        OBJECTS[names[0]],
        OBJECTS[names[1]],
        None,
        OBJECTS[names[2]],
    ]
    with pytest.raises(NotFound, match="no/such-object"):
        list(client.get_batch(with_gap))


def batches_of(dataset: BatchIterDataset, workers: int) -> list[list[tuple[str, bytes]]]:
    loader = torch_data.DataLoader(dataset, batch_size=None, num_workers=workers)
    return list(loader)


def test_batch_iter_dataset_in_order_across_workers_and_resumes(objects, etls) -> None:
    data = BatchIterDataset(Source(objects, prefix="a/"), batch_size=5, shuffle=True, seed=3)
    names = data.catalog.names  # a/obj-000.txt ... a/obj-011.txt: 12 objects
    data.set_epoch(2)
    want = [names[i] for i in epoch_order(len(names), True, 3, 2)]
    epoch = batches_of(data, workers=2)
    assert [len(b) for b in epoch] == [5, 5, 2]
    assert [n for b in epoch for n, _ in b] == want  # the seeded order, batch after batch
    assert all(d == OBJECTS[n] for b in epoch for n, d in b)
    assert len(data) == 3

    # a restart after two batches: the same epoch goes on with its third batch
    again = BatchIterDataset(Source(objects, prefix="a/"), batch_size=5, shuffle=True, seed=3)
    again.load_state_dict({"epoch": 2, "next_batch": 2})
    assert len(again) == 1
    assert batches_of(again, workers=2) == epoch[2:]

    # through an ETL, last short batch dropped, one worker
    upper, _ = etls
    through = BatchIterDataset(
        Source(objects, prefix="a/"), batch_size=5, etl_name=upper, drop_last=True
    )
    got = batches_of(through, workers=1)
    assert [[d for _, d in b] for b in got] == [
        [OBJECTS[n].upper() for n in names[k : k + 5]] for k in (0, 5)
    ]


def test_client_get_batch_of_nothing_asks_nothing(endpoint: str) -> None:
    with Client(endpoint) as c:
        assert list(c.get_batch([])) == []
