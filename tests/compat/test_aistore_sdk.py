"""The official ``aistore`` SDK (2.0.x) and ``aistore.pytorch`` against a real ``sluice up``.

The seeds' training code uses these calls unchanged; each must work with the
right data (docs/aistore.md).
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from etl_runtime import Client as SluiceClient
from etl_runtime.local import LocalCluster

aistore = pytest.importorskip("aistore")
torch = pytest.importorskip("torch")
from aistore.pytorch import (  # noqa: E402
    AISIterDataset,
    AISMapDataset,
    AISShardReader,
    DynamicBatchSampler,
)
from aistore.sdk import Client  # noqa: E402
from aistore.sdk.etl import ETLConfig  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402


def upper(data: bytes) -> bytes:
    return data.upper()


def shard(keys: list[str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for k in keys:
            for ext, payload in (("txt", f"text {k}".encode()), ("cls", k[-1:].encode())):
                info = tarfile.TarInfo(f"{k}.{ext}")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    return buf.getvalue()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with LocalCluster(tmp_path_factory.mktemp("ais") / "data", targets=2) as c:
        SluiceClient(c.endpoint).etl("upcase").init_code(transform=upper)
        yield c.endpoint


def test_sdk_calls_the_seeds_use(cluster: str, tmp_path: Path) -> None:
    ais = Client(cluster)
    bck = ais.bucket("seed")
    bck.create(exist_ok=True)
    for i in range(12):
        bck.object(f"img/{i:03d}.txt").get_writer().put_content(f"object {i}".encode())
    src = tmp_path / "file.bin"
    src.write_bytes(b"from a file")
    bck.object("other/file.bin").get_writer().put_file(str(src))
    assert [e.name for e in bck.list_all_objects(prefix="img/")] == [
        f"img/{i:03d}.txt" for i in range(12)
    ]
    page = bck.list_objects(prefix="img/", page_size=5)
    assert len(page.entries) == 5 and page.continuation_token == "img/004.txt"
    assert [e.size for e in page.entries] == [len(f"object {i}") for i in range(5)]
    assert len(list(bck.list_objects_iter(prefix="img/", page_size=5))) == 12
    assert len(list(bck.list_objects_iter())) == 13
    obj = bck.object("img/003.txt")
    assert obj.get_reader().read_all() == b"object 3"
    assert obj.get_reader(etl=ETLConfig("upcase")).read_all() == b"OBJECT 3"
    # the answer comes from the transformer (a 307 from the target): followed too
    big = bck.object("big.txt")
    big.get_writer().put_content(b"abc" * 200_000)
    assert big.get_reader(etl=ETLConfig("upcase")).read_all() == b"ABC" * 200_000
    assert obj.props.size == len(b"object 3")
    assert bck.object("other/file.bin").get_reader().read_all() == b"from a file"
    names = [b.name for b in ais.cluster().list_buckets()]
    assert "seed" in names
    etls = ais.cluster().list_etls()
    assert [e.id for e in etls] == ["upcase"] and etls[0].stage == "Running"
    details = ais.etl("upcase").view()
    assert details.init_msg.name == "upcase"


def test_pytorch_datasets_in_dataloader(cluster: str) -> None:
    ais = Client(cluster)
    bck = ais.bucket("torch")
    bck.create(exist_ok=True)
    for i in range(10):
        bck.object(f"o{i}").get_writer().put_content(bytes([65 + i]) * 1000)
    for s in range(3):
        keys = [f"s{s}-{k}" for k in range(4)]
        bck.object(f"shards/shard-{s}.tar").get_writer().put_content(shard(keys))

    it = AISIterDataset(ais_source_list=bck, prefix_map={bck: "o"}, etl_name="upcase")
    seen = sorted(
        name for batch in DataLoader(it, batch_size=None, num_workers=2) for name in [batch[0]]
    )
    assert seen == [f"o{i}" for i in range(10)]

    ds = AISMapDataset(ais_source_list=bck, prefix_map={bck: "o"})
    sampler = DynamicBatchSampler(data_source=ds, max_batch_size=4000)
    loader = DataLoader(ds, batch_sampler=sampler, num_workers=2, collate_fn=lambda b: b)
    batches = list(loader)
    assert [len(b) for b in batches] == [4, 4, 2]
    assert sorted(name for b in batches for name, _ in b) == [f"o{i}" for i in range(10)]

    reader = AISShardReader(bucket_list=bck, prefix_map={bck: "shards/"})
    # A comprehension, not list(): list() asks len(), which aistore 2.0.0's
    # AISShardReader computes with an attribute its own Object lacks.
    samples = [s for s in DataLoader(reader, batch_size=None, num_workers=2)]
    keys = sorted(k for k, _ in samples)
    assert keys == sorted(f"s{s}-{k}" for s in range(3) for k in range(4))
    assert all(content["txt"] == f"text {k}".encode() for k, content in samples)
