"""A big WebDataset shard through a real target and a real wds transformer.

The transformer streams its output while it still reads the shard, and stops
reading when its output is not consumed (bounded memory). A target that sent
the whole shard before reading any of the answer deadlocked here once the
socket buffers filled; the target's full-duplex client (``target.duplex``)
reads the answer while it sends.
"""

from __future__ import annotations

import io
import os
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import webdataset as wds

from tests.storage_target.conftest import RunningTarget
from tests.storage_target.fakes import CLUSTER_KEY, record
from tests.webserver.conftest import source_code, transformer

SAMPLE_BYTES = 256 << 10
SAMPLES = 256  # 64 MiB of payload: far more than loopback socket buffers hold
IDENTITY = """
def transform(sample):
    if sample["__key__"] == "poison":
        raise ValueError("poisoned sample")
    return sample
"""


def shard(path: Path, samples: int, first: str | None = None) -> None:
    block = os.urandom(SAMPLE_BYTES)
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        if first is not None:
            info = tarfile.TarInfo(f"{first}.cls")
            info.size = 1
            tar.addfile(info, io.BytesIO(b"0"))
        for i in range(samples):
            info = tarfile.TarInfo(f"s{i:06d}.bin")
            info.size = SAMPLE_BYTES
            tar.addfile(info, io.BytesIO(block))
            info = tarfile.TarInfo(f"s{i:06d}.cls")
            info.size = len(str(i))
            tar.addfile(info, io.BytesIO(str(i).encode()))


@pytest.fixture(scope="module")
def wds_identity() -> Iterator[str]:
    spec = {"mode": "wds", "code": source_code(IDENTITY)}
    with transformer("ident", spec, workers=2, SLUICE_ETL_TOKEN=_token()) as url:
        yield url


def _token() -> str:
    from etl_runtime.core import auth

    return auth.transformer_token(CLUSTER_KEY, "ident", "uid-1")


@pytest.mark.timeout(180)
def test_big_shard_streams_through_target(
    target: RunningTarget, wds_identity: str, tmp_path: Path
) -> None:
    c = target.client
    c.post("/v1/buckets/bkt", json={"action": "create-bck"})
    target.registry.put(record("ident", {"t0": wds_identity}))
    path = tmp_path / "in.tar"
    shard(path, SAMPLES)
    with open(path, "rb") as f:
        assert c.put("/v1/objects/bkt/big.tar", content=f).status_code == 200
    url = f"{target.url}/v1/objects/bkt/big.tar?etl_name=ident"
    # webdataset's own http opener is curl without a time limit: the same curl
    # with -m turns a regression (deadlock) into a failure instead of a hang
    ds = wds.WebDataset(f"pipe:curl -m 120 -f -s -L '{url}'", shardshuffle=False)
    keys = [(s["__key__"], len(s["bin"]), int(s["cls"])) for s in ds]
    assert keys == [(f"s{i:06d}", SAMPLE_BYTES, i) for i in range(SAMPLES)]


@pytest.mark.timeout(120)
def test_failing_sample_is_not_retried_by_webdataset(
    target: RunningTarget, wds_identity: str, tmp_path: Path
) -> None:
    """A transform failure is 422, which curl's ``--retry`` (webdataset's opener) skips."""
    c = target.client
    c.post("/v1/buckets/bkt", json={"action": "create-bck"})
    target.registry.put(record("ident", {"t0": wds_identity}))
    path = tmp_path / "bad.tar"
    shard(path, 2, first="poison")
    with open(path, "rb") as f:
        assert c.put("/v1/objects/bkt/bad.tar", content=f).status_code == 200
    r = c.get("/v1/objects/bkt/bad.tar", params={"etl_name": "ident"})
    assert r.status_code == 422, r.text
    assert r.json()["kind"] == "TransformError" and r.json()["sample"] == "poison"
    url = f"{target.url}/v1/objects/bkt/bad.tar?etl_name=ident"
    started = time.monotonic()
    # curl -f writes nothing on an HTTP error: webdataset reports "empty file"
    # (or curl's exit 22); either way at once, not after curl's retries
    with pytest.raises((OSError, tarfile.ReadError)):
        list(wds.WebDataset(url, shardshuffle=False))
    assert time.monotonic() - started < 10  # 500 would have meant 30 retries, 2 s apart
