"""GetBatch (``GET /v1/ml/moss``) through the official ``aistore`` SDK against a real ``sluice up``.

Three targets, two buckets: items come back in exactly the order asked, from
whichever target owns them; missing items with and without ``cont_on_err``;
files inside shards; every item through an object ETL; and
``AISBatchIterDataset`` in a ``DataLoader`` with two workers.
"""

from __future__ import annotations

import io
import random
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import urllib3

from etl_runtime import Client as SluiceClient
from etl_runtime.getbatch.shares import PART
from etl_runtime.local import LocalCluster

aistore = pytest.importorskip("aistore")
pytest.importorskip("aistore.sdk.batch.batch", reason="this aistore SDK has no GetBatch")
from aistore.sdk import Client  # noqa: E402
from aistore.sdk.batch.batch import Batch  # noqa: E402
from aistore.sdk.errors import AISError, ErrObjNotFound  # noqa: E402

N = 30  # objects per bucket: more than one window (16) of items in flight


def upper(data: bytes) -> bytes:
    return data.upper()


def picky(data: bytes) -> bytes:
    if data.startswith(b"one-007;"):
        raise ValueError("refusing object 7")
    return data


def dies(data: bytes) -> bytes:
    if data.startswith(b"one-009;"):
        import os

        os._exit(3)  # the process running the function dies
    return data


def payload(bucket: str, i: int) -> bytes:
    return f"{bucket}-{i:03d};".encode() * (1 + i * 37 % 200)


def make_shard(members: dict[str, bytes], gz: bool = False) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz" if gz else "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


MEMBERS = {
    "a/1.txt": b"first file",
    "a/2.bin": bytes(range(256)) * 300,
    "deep/" + "x" * 120 + "/long.txt": b"a name longer than ustar's 100 bytes",
    "a/3.txt": b"last",
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    data = tmp_path_factory.mktemp("batch") / "data"
    with LocalCluster(data, targets=3) as c:
        SluiceClient(c.endpoint).etl("upcase").init_code(transform=upper)
        SluiceClient(c.endpoint).etl("picky1").init_code(transform=picky)
        SluiceClient(c.endpoint).etl("dies").init_code(transform=dies)
        ais = Client(c.endpoint)
        for name in ("one", "two"):
            bck = ais.bucket(name)
            bck.create(exist_ok=True)
            for i in range(N):
                bck.object(f"obj-{i:03d}").get_writer().put_content(payload(name, i))
        one = ais.bucket("one")
        one.object("shards/s.tar").get_writer().put_content(make_shard(MEMBERS))
        one.object("shards/s.tar.gz").get_writer().put_content(make_shard(MEMBERS, gz=True))
        yield c.endpoint.rstrip("/"), data


def test_order_across_three_targets_and_two_buckets(cluster: tuple[str, Path]) -> None:
    url, data = cluster
    holders = {
        t.name
        for t in (data / "targets").iterdir()
        if any((t / "buckets" / b).glob("obj-*") for b in ("one", "two"))
    }
    assert len(holders) == 3, holders  # the items really come from three targets
    wanted = [(b, i) for b in ("one", "two") for i in range(N)]
    random.Random(7).shuffle(wanted)
    ais = Client(url)
    for streaming in (True, False):
        batch = ais.batch(bucket=ais.bucket("one"), streaming_get=streaming, cont_on_err=False)
        for b, i in wanted:
            batch.add(f"obj-{i:03d}", bck=b, provider="ais", opaque=f"{b}:{i}".encode())
        got = [(m.bucket, m.obj_name, m.opaque, data) for m, data in batch.get()]
        assert got == [(b, f"obj-{i:03d}", f"{b}:{i}".encode(), payload(b, i)) for b, i in wanted]

    # the raw archive: names <bucket>/<object>, or <object> with only_obj_name
    batch = ais.batch(["obj-001", "obj-000"], bucket=ais.bucket("two"), only_obj_name=True)
    with tarfile.open(fileobj=batch.get(raw=True), mode="r|") as tar:
        assert [m.name for m in tar] == ["obj-001", "obj-000"]
    r = requests.get(
        f"{url}/v1/ml/moss/two",
        json={"in": [{"objname": "obj-002"}, {"objname": "obj-003"}], "mime": ".tgz", "strm": True},
    )
    assert r.status_code == 200 and r.headers["content-type"] == "application/gzip"
    with tarfile.open(fileobj=io.BytesIO(r.content), mode="r:gz") as tar:
        assert tar.getnames() == ["two/obj-002", "two/obj-003"]
        f = tar.extractfile("two/obj-003")
        assert f is not None and f.read() == payload("two", 3)


def test_missing_items_with_cont_on_err(cluster: tuple[str, Path]) -> None:
    url, _ = cluster
    ais = Client(url)
    bck = ais.bucket("one")
    for streaming in (True, False):
        batch = ais.batch(bucket=bck, cont_on_err=True, streaming_get=streaming)
        batch.add("obj-000").add("no-such-object").add("obj-001")
        batch.add("shards/s.tar", archpath="not/there").add("no-shard.tar", archpath="a/1.txt")
        got = [(m.obj_name, m.archpath or "", bool(m.err_msg), data) for m, data in batch.get()]
        assert got == [
            ("obj-000", "", False, payload("one", 0)),
            ("no-such-object", "", True, b""),
            ("obj-001", "", False, payload("one", 1)),
            ("shards/s.tar", "not/there", True, b""),
            ("no-shard.tar", "a/1.txt", True, b""),
        ]
    batch = ais.batch(bucket=bck, cont_on_err=True)
    batch.add("no-such-object").add("shards/s.tar", archpath="nope").add("gone.tar", archpath="x")
    with tarfile.open(fileobj=batch.get(raw=True), mode="r|") as tar:
        assert [(m.name, m.size) for m in tar] == [
            ("__404__/one/no-such-object", 0),
            ("__404__/one/shards/s.tar/nope", 0),
            ("__404__/one/gone.tar", 0),  # the shard itself is missing: no archpath
        ]


def test_missing_item_without_cont_on_err(cluster: tuple[str, Path]) -> None:
    url, _ = cluster
    ais = Client(url)
    bck = ais.bucket("one")
    # among the first items: a clean 404 before any byte of the answer
    for streaming in (True, False):
        batch = ais.batch(bucket=bck, cont_on_err=False, streaming_get=streaming)
        batch.add("obj-000").add("no-such-object")
        with pytest.raises(ErrObjNotFound, match="ais://one/no-such-object"):
            list(batch.get())

    # also inside the first part of its target's share (every target says what it
    # lacks before it sends a byte): still a clean 404
    names = [f"obj-{i % N:03d}" for i in range(40)] + ["no-such-object"]
    body = {"in": [{"objname": n} for n in names], "strm": True, "coer": False}
    r = requests.get(f"{url}/v1/ml/moss/one", json=body)
    assert r.status_code == 404 and "ais://one/no-such-object" in r.json()["error"]

    # far into the batch (past the first parts of every share): the answer has
    # started, so it must break: a header that promises bytes that never come,
    # then an abort
    far = 4 * 3 * PART
    names = [f"obj-{i % N:03d}" for i in range(far)] + ["no-such-object"]
    body = {"in": [{"objname": n} for n in names], "strm": True, "coer": False}
    r = requests.get(f"{url}/v1/ml/moss/one", json=body, stream=True)
    assert r.status_code == 200
    raw = bytearray()
    with pytest.raises(requests.exceptions.ChunkedEncodingError):
        for chunk in r.iter_content(65536):
            raw += chunk
    seen = []
    with pytest.raises(tarfile.ReadError):
        with tarfile.open(fileobj=io.BytesIO(bytes(raw)), mode="r|") as tar:
            for m in tar:
                seen.append(m.name)
                f = tar.extractfile(m)
                assert f is not None
                f.read()
    assert seen[:far] == [f"one/{n}" for n in names[:far]]
    assert seen[far:] == ["one/no-such-object"]  # declared, never delivered
    batch = ais.batch(bucket=bck, cont_on_err=False)
    for n in names:
        batch.add(n)
    with pytest.raises((urllib3.exceptions.ProtocolError, requests.RequestException)):
        list(batch.get())  # the SDK reads the body with urllib3: "Connection broken"


def test_files_inside_shards(cluster: tuple[str, Path]) -> None:
    url, _ = cluster
    ais = Client(url)
    bck = ais.bucket("one")
    for shard in ("shards/s.tar", "shards/s.tar.gz"):
        batch = ais.batch(bucket=bck, cont_on_err=False)
        order = ["a/3.txt", "a/1.txt", next(k for k in MEMBERS if k.startswith("deep/")), "a/2.bin"]
        for name in order:
            batch.add(shard, archpath=name)
        batch.add("obj-004")
        got = [(m.obj_name, m.archpath, data) for m, data in batch.get()]
        assert got == [(shard, n, MEMBERS[n]) for n in order] + [("obj-004", "", payload("one", 4))]
    # byte ranges: of an object, and of a file in a shard
    batch = ais.batch(bucket=bck, cont_on_err=False)
    batch.add("shards/s.tar", archpath="a/2.bin", start=1000, length=300)
    batch.add("shards/s.tar", archpath="a/1.txt", start=6, length=-1)
    batch.add("obj-010", start=3, length=5)
    got = [data for _, data in batch.get()]
    assert got == [MEMBERS["a/2.bin"][1000:1300], b"file", payload("one", 10)[3:8]]
    names = requests.get(
        f"{url}/v1/ml/moss",
        json={
            "in": [{"objname": "shards/s.tar", "bucket": "one", "archpath": "a/1.txt"}],
            "strm": True,
        },
    )
    assert names.status_code == 200
    with tarfile.open(fileobj=io.BytesIO(names.content), mode="r|") as tar:
        assert [m.name for m in tar] == ["one/shards/s.tar/a/1.txt"]


class WithEtl:
    """The SDK's request client, with ``etl_name`` added to GetBatch calls (a Sluice extension)."""

    def __init__(self, inner: Any, etl_name: str) -> None:
        self._inner, self._etl = inner, etl_name

    def request(self, method: str, path: str, params: dict[str, str] | None = None, **kw: Any):
        return self._inner.request(
            method, path, params={**(params or {}), "etl_name": self._etl}, **kw
        )


def test_every_item_through_an_object_etl(cluster: tuple[str, Path]) -> None:
    url, _ = cluster
    ais = Client(url)
    for streaming in (True, False):
        batch = Batch(
            WithEtl(ais._request_client, "upcase"),
            bucket=ais.bucket("one"),
            streaming_get=streaming,
            cont_on_err=True,
        )
        batch.add("obj-005").add("obj-001", bck="two", provider="ais").add("missing")
        got = [(m.obj_name, bool(m.err_msg), data) for m, data in batch.get()]
        assert got == [
            ("obj-005", False, payload("one", 5).upper()),
            ("obj-001", False, payload("two", 1).upper()),
            ("missing", True, b""),
        ]
    r = requests.get(
        f"{url}/v1/ml/moss/one?etl_name=no-such-etl", json={"in": [{"objname": "obj-000"}]}
    )
    assert r.status_code == 404 and r.json()["kind"] == "EtlNotFound"

    # an item the ETL refuses (422: it would fail the same way again) is an item's failure
    for coer in (True, False):
        batch = Batch(
            WithEtl(ais._request_client, "picky1"), bucket=ais.bucket("one"), cont_on_err=coer
        )
        batch.add("obj-006").add("obj-007").add("obj-008")
        if coer:
            got = [(m.obj_name, m.err_msg, data) for m, data in batch.get()]
            assert got == [
                ("obj-006", None, payload("one", 6)),
                ("obj-007", "Batch entry failed on the server", b""),
                ("obj-008", None, payload("one", 8)),
            ]
        else:
            with pytest.raises(AISError, match="refusing object 7"):
                list(batch.get())


def test_an_item_whose_transformer_dies_is_named_never_a_500(cluster: tuple[str, Path]) -> None:
    """The ETL's function kills the process running it on one item (the inline
    server process, here): the batch fails naming that item, the ETL and the target
    (502: the transformer's answer broke off; a 503 would carry Retry-After), never
    a 500; the process is replaced and the ETL serves the other items afterwards."""
    url, _ = cluster
    body = {"in": [{"objname": f"obj-{i:03d}"} for i in (8, 9, 10)], "strm": True}
    r = requests.get(f"{url}/v1/ml/moss/one?etl_name=dies", json=body, timeout=120)
    assert r.status_code in (502, 503), r.text
    if r.status_code == 503:
        assert int(r.headers["retry-after"]) > 0
    err = r.json()
    assert "in[1] ais://one/obj-009" in err["error"] and err["etl"] == "dies", err
    assert err["target"] and err["target"] in err["error"], err
    others = {"in": [{"objname": f"obj-{i:03d}"} for i in (8, 10)], "strm": True}
    for _ in range(30):  # the replacement process starts
        r = requests.get(f"{url}/v1/ml/moss/one?etl_name=dies", json=others, timeout=120)
        if r.status_code not in (502, 503):
            break
        time.sleep(1)
    assert r.status_code == 200, r.text
    with tarfile.open(fileobj=io.BytesIO(r.content)) as tar:
        assert [m.name for m in tar] == ["one/obj-008", "one/obj-010"]


def test_a_client_that_leaves_early_frees_the_batch(cluster: tuple[str, Path]) -> None:
    url, _ = cluster
    body = {"in": [{"objname": f"obj-{i % N:03d}"} for i in range(200)], "strm": True}
    for _ in range(5):
        r = requests.get(f"{url}/v1/ml/moss/one", json=body, stream=True)
        assert r.status_code == 200
        next(r.iter_content(4096))
        r.close()
    r = requests.get(f"{url}/v1/ml/moss/two", json={**body, "in": body["in"][:3]})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-tar")


def test_bad_requests_name_what_is_wrong(cluster: tuple[str, Path]) -> None:
    url, _ = cluster

    def call(body: Any, query: str = "") -> requests.Response:
        return requests.get(f"{url}/v1/ml/moss/one{query}", json=body)

    r = call({"in": [{"objname": "obj-000"}], "streaming": True, "bogus": 1})
    assert (
        r.status_code == 400
        and "'bogus'" in r.json()["error"]
        and "'streaming'" in r.json()["error"]
    )
    r = call({"in": [{"objname": "obj-000", "archive_path": "x"}]})
    assert (
        r.status_code == 400
        and "'archive_path'" in r.json()["error"]
        and "in[0]" in r.json()["error"]
    )
    r = call({"in": [{"objname": "obj-000"}]}, "?colocation=1")
    assert r.status_code == 400 and "colocation" in r.json()["error"]
    r = call({"in": []})
    assert r.status_code == 400
    r = call({"in": [{"objname": "obj-000"}], "mime": ".7z"})
    assert r.status_code == 400 and ".7z" in r.json()["error"]
    r = call({"in": [{"objname": "obj-000", "bucket": "no-such-bucket", "provider": "ais"}]})
    assert r.status_code == 404 and r.json()["kind"] == "BucketNotFound"
    r = requests.get(f"{url}/v1/ml/moss", json={"in": [{"objname": "obj-000"}]})
    assert r.status_code == 400 and "bucket" in r.json()["error"]
    r = call({"in": [{"objname": "../x"}]})
    assert r.status_code == 400 and r.json()["kind"] == "InvalidName"


def test_ais_batch_iter_dataset_in_dataloader(cluster: tuple[str, Path]) -> None:
    torch_data = pytest.importorskip("torch.utils.data")
    mod = pytest.importorskip("aistore.pytorch.batch_iter_dataset")
    url, _ = cluster
    ais = Client(url)
    one, two = ais.bucket("one"), ais.bucket("two")
    ds = mod.AISBatchIterDataset(
        ais_source_list=[one, two],
        client=ais,
        prefix_map={one: "obj-", two: "obj-"},  # keyed by these very objects
        max_batch_size=7,
    )
    loader = torch_data.DataLoader(ds, batch_size=None, num_workers=2)
    got = sorted((name, bytes(data)) for name, data in loader)
    want = sorted((f"obj-{i:03d}", payload(b, i)) for b in ("one", "two") for i in range(N))
    assert got == want


def test_names_that_are_also_prefixes_in_a_batch_and_through_an_etl(
    cluster: tuple[str, Path],
) -> None:
    """``n3`` and ``n3/inner`` both objects (as S3 allows): each item is itself, plain,
    through an ETL in a batch, and in an ETL GET, on whichever target the pair lands."""
    url, data = cluster
    ais = Client(url)
    bck = ais.bucket("one")
    names = [n for i in range(8) for n in (f"n{i}/inner", f"n{i}")]
    for name in names:
        bck.object(name).get_writer().put_content(name.encode() * 3)
    nested = [p for t in (data / "targets").iterdir() for p in (t / "buckets/one").glob("n*/*")]
    assert any(p.name == ".sluice-object" for p in nested)  # some pair shares a target
    for etl in (None, "upcase"):
        client = ais._request_client if etl is None else WithEtl(ais._request_client, etl)
        for streaming in (True, False):
            batch = Batch(client, bucket=bck, streaming_get=streaming, cont_on_err=False)
            for name in names:
                batch.add(name)
            want = [n.encode() * 3 if etl is None else n.upper().encode() * 3 for n in names]
            assert [body for _, body in batch.get()] == want
    for name in names:
        got = requests.get(f"{url}/v1/objects/one/{name}", params={"etl_name": "upcase"})
        assert got.status_code == 200 and got.content == name.upper().encode() * 3, name
