"""ETLs end to end: closures, etl_args, lifecycle, errors, curl/requests/webdataset."""

from __future__ import annotations

import io
import json
import subprocess
import tarfile

import pytest
import requests

from etl_runtime import (
    BadRequest,
    Client,
    Conflict,
    EtlError,
    HTTPError,
    NotFound,
    TransformError,
)


@pytest.fixture
def client(endpoint: str):
    with Client(endpoint) as c:
        yield c


@pytest.fixture
def texts(client: Client):
    bucket = client.bucket("e2e-etl").create()
    for name in ("a.txt", "deep/b.txt", "deep/c.txt"):
        bucket.object(name).put_content(f"hello {name}".encode())
    return bucket


def test_object_etl_with_a_closure_and_args(client: Client, texts) -> None:
    marker = b" <-"  # captured by the closure: pickled by value

    def shout(data: bytes, args: str) -> bytes:
        opts = json.loads(args) if args else {}
        return data.upper() * int(opts.get("times", 1)) + marker

    details = client.etl("e2e-shout").init_code(transform=shout, timeout=120)
    assert details.phase == "Running" and details.ready == details.total == 3
    assert len(details.transformers) == 3 and all(t["endpoint"] for t in details.transformers)

    obj = texts.object("deep/b.txt")
    assert obj.get_bytes(etl_name="e2e-shout") == b"HELLO DEEP/B.TXT <-"
    assert obj.get_bytes(etl_name="e2e-shout", etl_args={"times": 2}) == (
        b"HELLO DEEP/B.TXTHELLO DEEP/B.TXT <-"
    )
    assert obj.get_bytes() == b"hello deep/b.txt"  # stored object untouched
    with obj.open(etl_name="e2e-shout") as reader:
        assert reader.read() == b"HELLO DEEP/B.TXT <-"

    # The same through plain HTTP clients and the URL the SDK hands out.
    url = obj.url(etl_name="e2e-shout", etl_args={"times": 2})
    curl = subprocess.run(["curl", "-sfL", url], capture_output=True, check=True, timeout=60)
    assert curl.stdout == b"HELLO DEEP/B.TXTHELLO DEEP/B.TXT <-"
    assert requests.get(url, timeout=60).content == curl.stdout

    assert any(e.name == "e2e-shout" and e.phase == "Running" for e in client.list_etls())
    stats = client.etl("e2e-shout").details().stats
    assert stats.get("objects", 0) >= 4


def test_big_objects_come_straight_from_the_transformer(client: Client, texts) -> None:
    """``sluice up``'s transformers read the targets' files, so a target's 307 sends the
    client on to its transformer: two hops from the gateway, and every client follows them."""
    big = bytes(range(256)) * 4096  # 1 MiB
    obj = texts.object("big.bin")
    obj.put_content(big)
    details = client.etl("e2e-rev").init_code(transform=lambda data: data[::-1])
    expected = big[::-1]
    assert obj.get_bytes(etl_name="e2e-rev") == expected
    with obj.open(etl_name="e2e-rev") as reader:
        assert reader.read() == expected
    url = obj.url(etl_name="e2e-rev")
    r = requests.get(url, timeout=60)
    assert r.content == expected and [h.status_code for h in r.history] == [307, 307]
    endpoints = {t["endpoint"].rstrip("/") for t in details.transformers}
    assert any(r.url.startswith(f"{e}/") for e in endpoints)  # the answer came from a transformer
    curl = subprocess.run(["curl", "-sfL", url], capture_output=True, check=True, timeout=60)
    assert curl.stdout == expected
    small = requests.get(texts.object("a.txt").url(etl_name="e2e-rev"), timeout=60)
    assert small.content == b"txt.a olleh" and len(small.history) == 2


def test_stop_start_delete(client: Client, texts) -> None:
    etl = client.etl("e2e-life")
    etl.init_code(transform=lambda data: data[::-1])
    obj = texts.object("a.txt")
    assert obj.get_bytes(etl_name="e2e-life") == b"txt.a olleh"

    assert etl.stop().phase == "Stopped"
    with pytest.raises(Conflict) as cf:
        obj.get_bytes(etl_name="e2e-life")
    assert "e2e-life" in cf.value.message

    etl.start(wait=True)
    assert obj.get_bytes(etl_name="e2e-life") == b"txt.a olleh"

    etl.delete()
    with pytest.raises(NotFound) as nf:
        obj.get_bytes(etl_name="e2e-life")
    assert "e2e-life" in nf.value.message
    with pytest.raises(NotFound):
        etl.details()
    with pytest.raises(NotFound):
        etl.delete()


def test_failing_transform_names_the_object(client: Client, texts) -> None:
    def picky(data: bytes) -> bytes:
        raise ValueError(f"cannot handle {len(data)} bytes")

    client.etl("e2e-picky").init_code(transform=picky)
    with pytest.raises(HTTPError) as exc_info:
        texts.object("a.txt").get_bytes(etl_name="e2e-picky")
    err = exc_info.value
    assert isinstance(err, TransformError) and err.status == 422
    assert "cannot handle 11 bytes" in str(err) + (err.detail or "")
    assert err.etl == "e2e-picky" and err.object == "a.txt"
    last = client.etl("e2e-picky").details()
    assert last.stats.get("errors", 0) >= 1 and last.last_errors
    client.etl("e2e-picky").delete()


def test_bad_etl_inputs_are_400_or_error_phase(client: Client, texts) -> None:
    with pytest.raises(BadRequest) as br:
        client.etl("e2e-bad-mode").init_code(transform=lambda d: d, mode="batch")
    assert "mode" in br.value.message
    with pytest.raises(BadRequest) as br:
        client.etl("Not_A_Valid_Name").init_code(transform=lambda d: d)
    assert "Not_A_Valid_Name" in br.value.message
    with pytest.raises(EtlError) as ee:
        client.etl("e2e-no-entry").init_spec(source="x = 1\n", entrypoint="transform", timeout=60)
    assert "transform" in ee.value.message and ee.value.phase == "Error"
    client.etl("e2e-no-entry").delete()


def _shard(samples: int) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for i in range(samples):
            for ext, payload in (("txt", f"sample {i}".encode()), ("cls", str(i).encode())):
                info = tarfile.TarInfo(f"s{i:04d}.{ext}")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    return buf.getvalue()


def test_webdataset_reads_shards_through_a_wds_etl(client: Client) -> None:
    wds = pytest.importorskip("webdataset")
    bucket = client.bucket("e2e-wds").create()
    for s in range(3):
        bucket.object(f"shards/shard-{s:03d}.tar").put_content(_shard(5))

    def upper(sample: dict) -> dict | None:
        if int(sample["cls"]) == 3:
            return None  # dropped
        return {**sample, "txt": sample["txt"].upper()}

    client.etl("e2e-wds-upper").init_code(transform=upper, mode="wds", decode=None)
    urls = bucket.object_urls("shards/shard-{000..002}.tar", etl_name="e2e-wds-upper")
    assert urls == bucket.list_urls(prefix="shards/", etl_name="e2e-wds-upper")
    got = [(s["__key__"], s["txt"]) for s in wds.WebDataset(urls, shardshuffle=False)]
    expected = [(f"s{i:04d}", f"SAMPLE {i}".encode()) for i in range(5) if i != 3]
    assert got == expected * 3
