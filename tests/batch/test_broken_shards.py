"""GetBatch on broken shards: a 4xx naming the shard, never a drop, never "not in shard".

A real ``sluice up`` (three targets), read through the official ``aistore``
SDK's ``client.batch(...)`` and the gateway's ``/v1/ml/moss`` route. Each
shard is broken in one way a disk, a cut upload or a hostile writer produces:
cut inside a member, cut on a member boundary (no end-of-archive blocks), not
a tar at all, a member header with a bad checksum, gzip cut short or corrupt,
and a 64 MiB pax header.
"""

from __future__ import annotations

import gzip
import io
import tarfile
from collections.abc import Iterator

import pytest
import requests
from aistore.sdk import Client
from aistore.sdk.errors import AISError

from etl_runtime.local import LocalCluster

MEMBERS = {"a/1.txt": b"first file" * 100, "a/2.txt": b"second file" * 100, "a/3.txt": b"last"}


def tar_of(members: dict[str, bytes], fmt: int = tarfile.GNU_FORMAT) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def huge_pax() -> bytes:
    """``a/1.txt`` behind a pax header whose one record is 64 MiB long."""
    value = b"x" * (64 << 20)
    body = b" comment=" + value + b"\n"
    n = len(body)
    n += len(str(n + len(str(n))))
    record = str(n).encode() + body
    info = tarfile.TarInfo("././@PaxHeader")
    info.type = tarfile.XHDTYPE
    info.size = len(record)
    head = info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "surrogateescape")
    pad = b"\0" * (-len(record) % 512)
    return head + record + pad + tar_of(MEMBERS)


def broken_shards() -> dict[str, bytes]:
    whole = tar_of(MEMBERS)
    second = whole.index(b"a/2.txt")  # the second member's header
    bad_header = bytearray(whole)
    bad_header[second + 124 : second + 135] = b"7777777777x"  # size field: checksum off
    return {
        "cut-in-member.tar": whole[: second + 512 + 300],
        "cut-on-boundary.tar": whole[: whole.index(b"a/3.txt") + 1024],  # no end blocks
        "garbage.tar": b"this is not a tar shard at all\n" * 200,
        "bad-header.tar": bytes(bad_header),
        "cut.tar.gz": gzip.compress(whole, mtime=0)[:-12],  # the end of the deflate data
        "corrupt.tar.gz": gzip.compress(whole)[:20] + b"\x00garbage" * 64,
        "huge-pax.tar": huge_pax(),
    }


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data = tmp_path_factory.mktemp("broken") / "data"
    with LocalCluster(data, targets=3) as c:
        bck = Client(c.endpoint).bucket("bkt-sh")
        bck.create(exist_ok=True)
        bck.object("good.tar").get_writer().put_content(tar_of(MEMBERS))
        for name, data_ in broken_shards().items():
            bck.object(name).get_writer().put_content(data_)
        yield c.endpoint.rstrip("/")


# the wanted file is the first one (1.txt), the last (3.txt), or none (9.txt: read to the end)
CASES = [(name, path) for name in broken_shards() for path in ("a/1.txt", "a/3.txt", "a/9.txt")]
# a file before the break is found before the reader gets there: it is whole
READABLE = {("cut-in-member.tar", "a/1.txt"), ("bad-header.tar", "a/1.txt")}
READABLE |= {("cut-on-boundary.tar", "a/1.txt"), ("cut-on-boundary.tar", "a/3.txt")}
READABLE |= {("cut.tar.gz", "a/1.txt"), ("cut.tar.gz", "a/3.txt")}


@pytest.mark.parametrize(("shard", "path"), CASES)
def test_moss_names_the_broken_shard(cluster: str, shard: str, path: str) -> None:
    for strm in (True, False):
        body = {"in": [{"objname": "good.tar", "archpath": "a/2.txt"}]}
        body["in"].append({"objname": shard, "archpath": path})
        r = requests.get(f"{cluster}/v1/ml/moss/bkt-sh", json={**body, "strm": strm}, timeout=60)
        if (shard, path) in READABLE:
            assert r.status_code == 200, r.text
            continue
        assert 400 <= r.status_code < 500, (r.status_code, r.text[:300])
        err = r.json()
        assert f"ais://bkt-sh/{shard}" in err["error"], err
        assert "not in shard" not in err["error"], err
        assert err["object"] == shard and err["kind"] in ("NotATar", "UnsafeShard"), err
        if shard == "huge-pax.tar":
            assert r.status_code == 422 and "pax header" in err["error"]


def test_sdk_batch_reports_the_shard(cluster: str) -> None:
    ais = Client(cluster)
    bck = ais.bucket("bkt-sh")
    for streaming in (True, False):
        batch = ais.batch(bucket=bck, cont_on_err=False, streaming_get=streaming)
        batch.add("good.tar", archpath="a/1.txt").add("garbage.tar", archpath="a/1.txt")
        with pytest.raises(AISError) as e:
            list(batch.get())
        assert e.value.status_code == 400 and "ais://bkt-sh/garbage.tar" in str(e.value)

    # with cont_on_err the batch goes on: the broken shard's item carries its error
    # (AIStore's multipart answer: one MossOut per item, with its err_msg)
    batch = ais.batch(bucket=bck, cont_on_err=True, streaming_get=False)
    batch.add("cut-in-member.tar", archpath="a/3.txt").add("good.tar", archpath="a/3.txt")
    got = [(m.obj_name, m.err_msg or "", data) for m, data in batch.get()]
    assert [(name, data) for name, _, data in got] == [
        ("cut-in-member.tar", b""),
        ("good.tar", b"last"),
    ]
    assert "ais://bkt-sh/cut-in-member.tar is a broken tar shard" in got[0][1], got[0]
    assert "truncated" in got[0][1] and not got[1][1]


def test_a_whole_shard_still_reads_and_a_missing_file_is_404(cluster: str) -> None:
    r = requests.get(
        f"{cluster}/v1/ml/moss/bkt-sh",
        json={"in": [{"objname": "good.tar", "archpath": "a/3.txt"}], "strm": True},
        timeout=60,
    )
    assert r.status_code == 200
    with tarfile.open(fileobj=io.BytesIO(r.content), mode="r|") as tar:
        got = [(m.name, tar.extractfile(m).read()) for m in tar]  # type: ignore[union-attr]
    assert got == [("bkt-sh/good.tar/a/3.txt", b"last")]
    r = requests.get(
        f"{cluster}/v1/ml/moss/bkt-sh",
        json={"in": [{"objname": "good.tar", "archpath": "a/9.txt"}], "strm": True},
        timeout=60,
    )
    assert r.status_code == 404 and "is not in shard ais://bkt-sh/good.tar" in r.json()["error"]
