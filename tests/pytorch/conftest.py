"""A real local cluster (gateway + 2 targets) with objects, shards and two ETLs.

Everything is made once per package: cluster start-up and ETL start-up are
the slow parts, the datasets themselves are quick.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator

import pytest

from etl_runtime import Bucket, Client
from tests.e2e.local import running_cluster

pytest.importorskip("torch")

OBJECTS = {f"{d}/obj-{i:03d}.txt": f"object {d} {i}".encode() for d in "ab" for i in range(12)}
SHARDS = 5
PER_SHARD = 6


def sample_key(shard: int, i: int) -> str:
    return f"s{shard}/sample-{i:02d}"


def make_shard(shard: int, samples: int = PER_SHARD, pad: int = 0, boom: bool = False) -> bytes:
    """A WebDataset tar: ``<key>.txt`` and ``<key>.cls`` per sample.

    ``pad`` bytes of ``.bin`` per sample; ``boom`` adds a ``.boom`` field to the
    last sample, on which the ``tag`` ETL raises.
    """
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for i in range(samples):
            fields = [("txt", f"text {shard}.{i}".encode()), ("cls", str(i).encode())]
            fields += [("bin", b"x" * pad)] if pad else []
            fields += [("boom", b"")] if boom and i == samples - 1 else []
            for ext, data in fields:
                info = tarfile.TarInfo(f"{sample_key(shard, i)}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def upper(data: bytes) -> bytes:
    return data.upper()


def tag(sample: dict) -> dict:
    if "boom" in sample:
        raise ValueError("boom")
    sample["tag"] = b"tagged " + sample["__key__"].encode()
    return sample


@pytest.fixture(scope="package")
def endpoint(tmp_path_factory) -> Iterator[str]:
    with running_cluster(tmp_path_factory.mktemp("cluster"), targets=2) as url:
        yield url


@pytest.fixture(scope="package")
def client(endpoint: str) -> Iterator[Client]:
    with Client(endpoint) as c:
        # Start the ETLs now: they come up while the data is uploaded.
        c.etl("pt-upper").init_code(transform=upper, workers=1, wait=False)
        c.etl("pt-tag").init_code(transform=tag, mode="wds", workers=1, wait=False)
        c.etl("pt-tag-cached").init_code(  # test_etl_skip: answers the targets keep
            transform=tag, mode="wds", workers=1, wait=False, cache=True
        )
        yield c


@pytest.fixture(scope="package")
def objects(client: Client) -> Bucket:
    bucket = client.bucket("pt-objects").create()
    for name, data in OBJECTS.items():
        bucket.object(name).put_content(data)
    return bucket


@pytest.fixture(scope="package")
def shards(client: Client) -> Bucket:
    bucket = client.bucket("pt-shards").create()
    for s in range(SHARDS):
        bucket.object(f"shard-{s}.tar").put_content(make_shard(s))
    return bucket


@pytest.fixture(scope="package")
def etls(client: Client) -> tuple[str, str]:
    """An object ETL (upper-case) and a wds ETL (adds a ``tag`` field)."""
    client.etl("pt-upper").wait_until_running(120)
    client.etl("pt-tag").wait_until_running(120)
    return "pt-upper", "pt-tag"
