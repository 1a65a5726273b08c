"""ShardReader over real shards: DataLoader workers, ETL, decoding, failures."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from etl_runtime import Client, TransformError
from etl_runtime.pytorch import ShardError, ShardReader, Source
from tests.pytorch.conftest import PER_SHARD, SHARDS, make_shard, sample_key
from tests.servers import serve_in_thread

pytestmark = pytest.mark.torch
torch_data = pytest.importorskip("torch.utils.data")

ALL_KEYS = [sample_key(s, i) for s in range(SHARDS) for i in range(PER_SHARD)]


def read_all(dataset) -> list:
    loader = torch_data.DataLoader(dataset, num_workers=2, batch_size=None)
    return list(loader)


def test_shard_reader_every_sample_once_raw_and_through_a_wds_etl(shards, etls) -> None:
    template = Source(shards, template=f"shard-{{0..{SHARDS - 1}}}.tar")
    raw = read_all(ShardReader(template, shuffle=True, seed=1))
    assert Counter(key for key, _ in raw) == Counter(ALL_KEYS)
    key, fields = raw[0]
    shard, i = int(key[1]), int(key[-2:])
    assert fields == {"txt": f"text {shard}.{i}".encode(), "cls": str(i).encode()}

    reader = ShardReader(shards, etl_name=etls[1], decode="rgb")  # whole bucket, decoded
    tagged = read_all(reader)
    assert Counter(key for key, _ in tagged) == Counter(ALL_KEYS)
    for key, fields in tagged:
        # webdataset's decoders: .txt -> str, .cls -> int; the ETL's field arrives too.
        assert fields["tag"] == f"tagged {key}".encode()
        assert fields["cls"] == int(key[-2:]) and fields["txt"].startswith("text ")


def test_a_shard_cut_mid_read_raises_naming_it() -> None:
    """A server that announces a shard's length, then closes the connection halfway."""
    whole = make_shard(7, pad=100_000)

    async def app(scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/v1/buckets/cut":
            body = json.dumps({"objects": [{"name": "s.tar", "size": len(whole)}], "next": None})
            headers = [(b"content-type", b"application/json")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": body.encode()})
            return
        headers = [(b"content-length", str(len(whole)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": whole[: len(whole) // 2]})
        # returning now leaves the body short: uvicorn drops the connection

    with serve_in_thread(app) as url, Client(url) as client:
        with pytest.raises(ShardError) as err:
            read_all(ShardReader(client.bucket("cut")))
    assert "cut/s.tar" in str(err.value)


def test_a_transform_failing_in_a_shard_raises_naming_it(shards, etls) -> None:
    # Big samples first, so the transformer is usually streaming when the last one fails
    # (then the target aborts the connection); either way the shard is named.
    shards.object("broken/shard-boom.tar").put_content(
        make_shard(8, samples=8, pad=200_000, boom=True)
    )
    with pytest.raises((ShardError, TransformError)) as err:
        read_all(ShardReader(Source(shards, prefix="broken/"), etl_name=etls[1]))
    assert "pt-shards/broken/shard-boom.tar" in str(err.value)
