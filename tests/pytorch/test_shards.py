"""ShardReader over real shards: DataLoader workers, ETL, decoding, failures."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest

from etl_runtime import Client, NotFound, TransformError
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


def test_the_next_shard_is_asked_for_while_one_is_read_and_its_error_comes_in_turn() -> None:
    """A server that sends the first half of shard 0, then waits (up to 20 s) for the
    GET of shard 1 before the rest; shard 2 is missing (404)."""
    first = make_shard(0, pad=50_000)
    second = make_shard(1)
    asked: list[str] = []

    async def app(scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        if path == "/v1/buckets/ahead":
            names = [{"name": f"s{i}.tar", "size": 1} for i in range(3)]
            body = json.dumps({"objects": names, "next": None}).encode()
            headers = [(b"content-type", b"application/json")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        asked.append(path.rsplit("/", 1)[1])
        if path.endswith("s2.tar"):
            body = json.dumps({"error": "object 'ahead/s2.tar' not found", "kind": "NotFound"})
            headers = [(b"content-type", b"application/json")]
            await send({"type": "http.response.start", "status": 404, "headers": headers})
            await send({"type": "http.response.body", "body": body.encode()})
            return
        data = first if path.endswith("s0.tar") else second
        headers = [(b"content-length", str(len(data)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        if data is first:
            await send({"type": "http.response.body", "body": data[:60_000], "more_body": True})
            for _ in range(400):
                if "s1.tar" in asked:
                    break
                await asyncio.sleep(0.05)
            asked.append("s0.tar rest")
        await send({"type": "http.response.body", "body": data[60_000:] if data is first else data})

    with serve_in_thread(app) as url, Client(url) as client:
        got: list[str] = []
        with pytest.raises(NotFound, match="ahead/s2.tar"):
            for key, _ in ShardReader(client.bucket("ahead"), read_ahead=True):
                got.append(key)
    # Shard 1 was asked for before the rest of shard 0 was sent; every sample of the
    # shards before the missing one came first.
    assert asked[:3] == ["s0.tar", "s1.tar", "s0.tar rest"]
    assert got == [sample_key(s, i) for s in range(2) for i in range(PER_SHARD)]
