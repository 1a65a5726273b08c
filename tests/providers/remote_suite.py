"""What every remote provider's buckets must do, against its real emulator and a real ``sluice up``.

``test_gcp.py`` (fake-gcs-server) and ``test_azure.py`` (Azurite) import these
tests; each module gives the fixtures ``emu`` (``tests.providers.emulators``)
and ``cluster`` (the endpoint of a module-scoped ``LocalCluster`` whose servers
have the emulator's environment), and the module attributes ``SCHEME`` (the
CLI's alias: ``gs``, ``az``) and ``SDK_PROVIDER`` (a spelling the SDKs take).
Each test seeds its own bucket with the provider's official client, which the
targets never use; backend fetches are counted by the targets' ``/metrics``.
"""

from __future__ import annotations

import concurrent.futures
import http.server
import io
import json
import os
import subprocess
import sys
import tarfile
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import webdataset as wds

from etl_runtime import Client
from tests.providers.conftest import metric
from tests.providers.emulators import Emulator
from tests.providers.test_remote import eventually

FETCHES = "sluice_remote_backend_fetches_total"


def new_bucket(emu: Emulator, objects: dict[str, bytes]) -> str:
    name = f"rb-{uuid.uuid4().hex[:10]}"
    emu.create_bucket(name)
    for key, data in objects.items():
        emu.put(name, key, data)
    return name


def get(cluster: str, emu: Emulator, bucket: str, name: str, **params: str) -> httpx.Response:
    return httpx.get(
        f"{cluster}/v1/objects/{bucket}/{name}",
        params={"provider": emu.provider, **params},
        follow_redirects=True,
        timeout=60,
    )


def sluice(cluster: str, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "etl_runtime.cli", "--endpoint", cluster, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_cold_get_streams_one_fetch_for_ten_readers_then_warm(cluster: str, emu: Emulator) -> None:
    data = os.urandom(3 << 20)
    bucket = new_bucket(emu, {"dir/shard.bin": data, "dir/ranged.bin": data, "many.bin": data})
    before = metric(cluster, FETCHES)

    url = f"{cluster}/v1/objects/{bucket}/dir/ranged.bin"
    head = httpx.head(url, params={"provider": emu.provider}, follow_redirects=True)
    assert head.status_code == 200 and head.headers["content-length"] == str(len(data))
    ranged = httpx.get(url, headers={"Range": "bytes=100-199"}, follow_redirects=True)
    assert ranged.status_code == 206 and ranged.content == data[100:200]

    cold = get(cluster, emu, bucket, "dir/shard.bin")
    assert cold.status_code == 200 and cold.content == data
    assert cold.headers["x-sluice-cache"] == "miss"
    warm = get(cluster, emu, bucket, "dir/shard.bin")
    assert warm.status_code == 200 and warm.content == data
    assert "x-sluice-cache" not in warm.headers and warm.headers["etag"] == cold.headers["etag"]
    assert metric(cluster, FETCHES) == before + 2  # the ranged one's fill, and this one

    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        answers = list(pool.map(lambda _: get(cluster, emu, bucket, "many.bin"), range(10)))
    assert [r.status_code for r in answers] == [200] * 10
    assert all(r.content == data for r in answers)
    assert metric(cluster, FETCHES) == before + 3

    missing = get(cluster, emu, bucket, "dir/nope.bin")
    assert missing.status_code == 404, missing.text
    body = missing.json()
    assert body["object"] == "dir/nope.bin" and body["bucket"] == bucket
    assert (
        emu.endpoint in body["error"] and f"{emu.provider}://{bucket}/dir/nope.bin" in body["error"]
    )


def test_listing_is_the_backends_with_a_cached_column_in_the_sdk_and_cli(
    cluster: str, emu: Emulator, sdk_provider: str, scheme: str
) -> None:
    names = [f"p/{i}.bin" for i in range(5)] + ["q.bin"]
    bucket = new_bucket(emu, {n: n.encode() for n in names})
    assert get(cluster, emu, bucket, "p/3.bin").status_code == 200

    def listing() -> list[dict]:
        seen: list[dict] = []
        start_after = ""
        while True:
            params = {"provider": emu.provider, "prefix": "p/", "limit": 2}
            r = httpx.get(
                f"{cluster}/v1/buckets/{bucket}", params={**params, "start_after": start_after}
            )
            assert r.status_code == 200, r.text
            page = r.json()
            assert len(page["objects"]) <= 2
            seen += page["objects"]
            if not page["next"]:
                return seen
            start_after = page["next"]

    assert [o["name"] for o in listing()] == names[:5]
    eventually(lambda: {o["name"] for o in listing() if o["cached"]}, {"p/3.bin"})
    with Client(cluster) as client:
        remote = client.bucket(bucket, provider=sdk_provider)
        assert [o.name for o in remote.list_objects()] == names
    ls = sluice(cluster, "ls", f"{scheme}://{bucket}")
    assert ls.returncode == 0, ls.stderr
    assert [line.split()[-2:] for line in ls.stdout.splitlines()] == [
        ["cached" if n == "p/3.bin" else "-", n] for n in names
    ]


def test_put_writes_through_and_delete_deletes_both(
    cluster: str, emu: Emulator, sdk_provider: str
) -> None:
    bucket = new_bucket(emu, {})
    with Client(cluster) as client:
        obj = client.bucket(bucket, provider=sdk_provider).object("new/obj.bin")
        obj.put_content(b"written through" * 1000)
        assert emu.read(bucket, "new/obj.bin") == b"written through" * 1000  # on the backend
        assert obj.get_bytes() == b"written through" * 1000
        obj.delete()
    assert emu.names(bucket) == []
    assert get(cluster, emu, bucket, "new/obj.bin").status_code == 404


def test_prefetch_and_evict_jobs(
    cluster: str, emu: Emulator, sdk_provider: str, scheme: str
) -> None:
    warm = {f"warm/{i}.bin": os.urandom(100_000) for i in range(4)}
    bucket = new_bucket(emu, {**warm, "other.bin": b"o"})
    with Client(cluster) as client:
        remote = client.bucket(bucket, provider=sdk_provider)
        job = remote.prefetch(prefix="warm/")
        assert job["state"] == "Finished", job
        assert job["progress"]["objects"] == 4 and job["progress"]["bytes"] == 400_000
        assert {o["name"] for o in remote.list_entries() if o["cached"]} == set(warm)
        before = metric(cluster, FETCHES)
        assert remote.object("warm/3.bin").get_bytes() == warm["warm/3.bin"]
        assert metric(cluster, FETCHES) == before  # prefetched: served from the cache
    evict = sluice(cluster, "evict", f"{scheme}://{bucket}", "--prefix", "warm/")
    assert evict.returncode == 0, evict.stderr
    assert f"evicted 4 cached object(s), 400000 bytes of {emu.provider}://{bucket}" in evict.stdout
    with Client(cluster) as client:
        assert not any(
            o["cached"] for o in client.bucket(bucket, provider=sdk_provider).list_entries()
        )


def test_an_etl_and_a_view_on_cold_objects(cluster: str, emu: Emulator, sdk_provider: str) -> None:
    """An object ETL on a cold object, and an ETL view of the remote bucket (the wds ETL
    on cold shards is the seed workflow's, below)."""
    bucket = new_bucket(emu, {"hello.txt": b"hello remote"})
    etl = f"upper-{emu.name}"
    with Client(cluster) as client:
        client.etl(etl).init_code(transform=lambda data: data.upper())
        remote = client.bucket(bucket, provider=sdk_provider)
        assert remote.object("hello.txt").get_bytes(etl_name=etl) == b"HELLO REMOTE"
        emu.put(bucket, "later.txt", b"added later")  # cold when the view reads it
        view = client.bucket(f"{bucket}-view").create(view_of=bucket, etl=etl)
        assert view.object("later.txt").get_bytes() == b"ADDED LATER"
        assert [o.name for o in view.list_objects()] == ["hello.txt", "later.txt"]


def test_get_batch_of_remote_objects_cold_and_warm(cluster: str, emu: Emulator) -> None:
    objects = {f"k{i}": f"value-{i}".encode() * (i + 1) for i in range(6)}
    bucket = new_bucket(emu, objects)
    assert get(cluster, emu, bucket, "k0").content == objects["k0"]  # the bucket is known now
    order = ["k3", "k0", "k5", "nope", "k1"]
    body = {"in": [{"objname": n} for n in order], "strm": True, "coer": True}
    for _ in range(2):  # cold, then from the cache
        r = httpx.request(
            "GET",
            f"{cluster}/v1/ml/moss/{bucket}",
            params={"provider": emu.provider},
            json=body,
            follow_redirects=True,
            timeout=60,
        )
        assert r.status_code == 200, r.text
        with tarfile.open(fileobj=io.BytesIO(r.content), mode="r|") as tar:
            got = [(m.name, tar.extractfile(m).read()) for m in tar]  # type: ignore[union-attr]
        assert got == [
            (f"__404__/{bucket}/nope", b"") if n == "nope" else (f"{bucket}/{n}", objects[n])
            for n in order
        ]


def test_validate_warm_get_sees_a_changed_object(cluster: str, emu: Emulator) -> None:
    checked = new_bucket(emu, {"o.txt": b"version 1"})
    trusting = new_bucket(emu, {"o.txt": b"version 1"})
    props = {"action": "create-bck", "props": {"validate_warm_get": True}}
    r = httpx.post(f"{cluster}/v1/buckets/{checked}", params={"provider": emu.provider}, json=props)
    assert r.status_code == 200, r.text
    for b in (checked, trusting):
        assert get(cluster, emu, b, "o.txt").content == b"version 1"
        emu.put(b, "o.txt", b"version 2!")
    assert get(cluster, emu, checked, "o.txt").content == b"version 2!"
    assert get(cluster, emu, trusting, "o.txt").content == b"version 1"  # the cached copy
    emu.delete(checked, "o.txt")
    gone = get(cluster, emu, checked, "o.txt")
    assert gone.status_code == 404 and "no longer exists" in gone.json()["error"]


@pytest.fixture(scope="module")
def refusing() -> Iterator[dict[int, str]]:
    """Loopback servers answering every request 401 or 403 as the provider words it."""
    servers: dict[int, str] = {}
    threads = []
    for status in (401, 403):

        class Handler(http.server.BaseHTTPRequestHandler):
            code = status

            def _answer(self) -> None:
                body = json.dumps({"error": {"code": self.code, "message": "refused"}}).encode()
                self.send_response(self.code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _answer

            def log_message(self, *args: Any) -> None:
                pass

        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        t = threading.Thread(target=srv.serve_forever, daemon=True)
        t.start()
        threads.append(srv)
        servers[status] = f"http://127.0.0.1:{srv.server_address[1]}"
    yield servers
    for srv in threads:
        srv.shutdown()


def test_401_403_404_503_name_the_bucket_and_the_backend(
    cluster: str, emu: Emulator, refusing: dict[int, str]
) -> None:
    for status, url in refusing.items():
        bucket = f"rb-{uuid.uuid4().hex[:10]}"
        r = httpx.post(
            f"{cluster}/v1/buckets/{bucket}",
            params={"provider": emu.provider},
            json={"action": "create-bck", "props": {"endpoint": url}},
        )
        assert r.status_code == status, r.text
        assert bucket in r.json()["error"] and r.json()["backend"] == url

    # A bucket the backend does not have: 404 naming it and the backend.
    r = get(cluster, emu, f"rb-none-{uuid.uuid4().hex[:6]}", "x")
    assert r.status_code == 404, r.text
    assert "has no bucket" in r.json()["error"] and emu.endpoint in r.json()["error"]

    # The backend down: warm objects are served, a cold one is a 503 to retry.
    bucket = new_bucket(emu, {"kept.bin": b"k" * 5000, "cold.bin": b"c"})
    assert get(cluster, emu, bucket, "kept.bin").status_code == 200
    emu.stop()
    try:
        warm = get(cluster, emu, bucket, "kept.bin")
        assert warm.status_code == 200 and warm.content == b"k" * 5000
        cold = get(cluster, emu, bucket, "cold.bin")
        assert cold.status_code == 503, cold.text
        assert cold.headers["retry-after"].isdigit()
        assert cold.json()["object"] == "cold.bin" and emu.endpoint in cold.json()["error"]
    finally:
        emu.start()


# -- the seed workflow: WebDataset shards, a wds ETL on every sample, cold then warm ----------


def png(seed: int) -> bytes:
    from PIL import Image

    img = Image.new("RGB", (16, 8))
    img.putdata([((seed * 7 + i) % 256, i % 256, (seed + 3 * i) % 256) for i in range(16 * 8)])
    out = io.BytesIO()
    img.save(out, format="PNG")
    return out.getvalue()


def augment(sample: dict) -> dict:
    """The seed's ETL: decode each image, flip it left-right, encode it again."""
    import io as _io

    from PIL import Image, ImageOps

    img = Image.open(_io.BytesIO(sample["png"]))
    out = _io.BytesIO()
    ImageOps.mirror(img).save(out, format="PNG")
    sample["png"] = out.getvalue()
    sample["cls"] = str(int(sample["cls"]) + 100).encode()
    return sample


def flipped(data: bytes) -> list[tuple[int, int, int]]:
    from PIL import Image, ImageOps

    return list(ImageOps.mirror(Image.open(io.BytesIO(data)).convert("RGB")).get_flattened_data())


def test_seed_workflow_wds_shards_through_an_augmenting_etl_cold_then_warm(
    cluster: str, emu: Emulator, sdk_provider: str
) -> None:
    from aistore.pytorch import AISIterDataset
    from aistore.sdk import Client as AisClient
    from aistore.sdk.etl import ETLConfig
    from PIL import Image

    shards: dict[str, bytes] = {}
    originals: dict[str, bytes] = {}
    for s in range(2):
        buf = io.BytesIO()
        with wds.TarWriter(buf) as sink:
            for i in range(4):
                key = f"s{s}-{i:02d}"
                originals[key] = png(s * 4 + i)
                sink.write({"__key__": key, "png": originals[key], "cls": str(i)})
        shards[f"train/shard-{s:03d}.tar"] = buf.getvalue()
    bucket = new_bucket(emu, shards)
    etl = f"augment-{emu.name}"
    with Client(cluster) as client:
        client.etl(etl).init_code(transform=augment, mode="wds", decode=None)
        remote = client.bucket(bucket, provider=sdk_provider)
        urls = remote.object_urls("train/shard-{000..001}.tar", etl_name=etl)
        before = metric(cluster, FETCHES)
        for _ in ("cold", "warm"):
            seen = list(wds.WebDataset(urls, shardshuffle=False))
            assert [s["__key__"] for s in seen] == sorted(originals)
            for s in seen:
                want = flipped(originals[s["__key__"]])
                assert (
                    list(Image.open(io.BytesIO(s["png"])).convert("RGB").get_flattened_data())
                    == want
                )
                assert int(s["cls"]) >= 100
        assert metric(cluster, FETCHES) == before + 2  # each shard fetched once, then cached

    # The official SDK and aistore.pytorch read the same bucket by AIStore's name for it.
    bck = AisClient(cluster).bucket(bucket, provider=emu.ais_provider)
    raw = bck.object("train/shard-001.tar").get_reader(etl=ETLConfig(etl)).read_all()
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        member = tar.extractfile("s1-03.png")
        assert member is not None
        got = list(Image.open(member).convert("RGB").get_flattened_data())
    assert got == flipped(originals["s1-03"])
    dataset = AISIterDataset(ais_source_list=bck, prefix_map={bck: "train/"}, etl_name=etl)
    names = []
    for name, data in dataset:
        names.append(name)
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            assert len([m for m in tar if m.name.endswith(".png")]) == 4
    assert sorted(names) == sorted(shards)
