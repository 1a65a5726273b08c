"""GetBatch through an ETL, against a real ``sluice up`` with 3 targets, on uvloop and asyncio.

Every item is transformed on the target that holds it (through that target's
share of the batch) and comes back in request order; files picked out of
shards transformed per sample (wds); an item the ETL refuses, with
``cont_on_err`` (a placeholder naming the object and the ETL's error, no
data) and without (a JSON error, or an archive no tar reader takes for
whole); an ETL view named in a batch; and the official aistore SDK's
``client.batch(...)``, which carries no ETL parameter (the ETL is added to
its requests) but reads views unchanged.
"""

from __future__ import annotations

import io
import json
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import requests
import urllib3

from etl_runtime import Client as SluiceClient
from etl_runtime.getbatch.shares import ETL_PART
from etl_runtime.local import LocalCluster

N = 3 * ETL_PART + 40  # more than one part per target


def shout(data: bytes, args: str) -> bytes:
    return data.upper() + (args.encode() if args else b"")


def picky(data: bytes) -> bytes:
    if data.startswith(b"o-007|") or data.startswith(b"o-135|"):
        raise ValueError(f"refusing {data[:5].decode()}")
    return data[::-1]


def upper_txt(sample: dict[str, Any]) -> dict[str, Any]:
    return {**sample, "txt": sample["txt"].upper()}


def data_of(i: int) -> bytes:
    return f"o-{i:03d}|".encode() * (1 + i * 31 % 300)


def make_shard(s: int, samples: int = 5) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for i in range(samples):
            for ext, payload in (("txt", f"sample {s}-{i}".encode()), ("cls", str(i).encode())):
                info = tarfile.TarInfo(f"s{s}-{i:03d}.{ext}")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    return buf.getvalue()


def read_tar(raw: bytes) -> list[tuple[str, bytes, dict[str, str]]]:
    out = []
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r|") as tar:
        for m in tar:
            f = tar.extractfile(m)
            out.append((m.name, f.read() if f is not None else b"", dict(m.pax_headers)))
    return out


@pytest.fixture(scope="module", params=["uvloop", "asyncio"])
def cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Path]]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SLUICE_LOOP", request.param)  # read by the servers `sluice up` starts
        data = tmp_path_factory.mktemp("batchetl") / "data"
        with LocalCluster(data, targets=3) as c:
            env.delenv("SLUICE_LOOP")
            url = c.endpoint.rstrip("/")
            sc = SluiceClient(url)
            # the four ETLs start together, and while the objects are uploaded
            sc.etl("shout").init_code(transform=shout, wait=False)
            sc.etl("picky").init_code(transform=picky, wait=False)
            sc.etl("wds-up").init_code(transform=upper_txt, mode="wds", wait=False)
            sc.etl("shout-cached").init_code(transform=shout, cache=True, wait=False)
            with httpx.Client(base_url=url, timeout=120, trust_env=False) as h:
                for b in ("src", "shards"):
                    h.post(f"/v1/buckets/{b}", json={"action": "create-bck"}).raise_for_status()
                for i in range(N):
                    h.put(f"/v1/objects/src/o{i:03d}", content=data_of(i)).raise_for_status()
                for s in range(4):
                    h.put(f"/v1/objects/shards/s{s}.tar", content=make_shard(s)).raise_for_status()
            for name in ("shout", "picky", "wds-up", "shout-cached"):
                sc.etl(name).wait_until_running(180)
            sc.bucket("loud").create(view_of="src", etl="shout", etl_args="!")
            yield url, data


def moss(url: str, body: dict[str, Any], **params: str) -> requests.Response:
    return requests.get(f"{url}/v1/ml/moss", params=params, json=body, timeout=120)


def test_every_item_transformed_on_its_target_in_request_order(
    cluster: tuple[str, Path],
) -> None:
    url, data = cluster
    holders = {t.name for t in (data / "targets").iterdir() if any((t / "buckets/src").glob("o*"))}
    assert len(holders) == 3, holders
    order = [(i * 37) % N for i in range(N)]  # every object, shuffled
    got = list(SluiceClient(url).get_batch([("src", f"o{i:03d}") for i in order],
                                           etl_name="shout", etl_args="?"))  # fmt: skip
    assert [(g.name, g.data) for g in got] == [
        (f"o{i:03d}", data_of(i).upper() + b"?") for i in order
    ]
    # the multipart answer (strm false): MossOut sizes are the transformed sizes
    r = moss(url, {"in": [{"objname": "o003", "bucket": "src"}]}, etl_name="shout", etl_args="??")
    assert r.status_code == 200, r.text
    meta = r.content.split(b"\r\n\r\n", 1)[1].split(b"\n", 1)[0]
    assert json.loads(meta)["out"][0]["size"] == len(data_of(3)) + 2


def test_files_from_shards_transformed_per_sample(cluster: tuple[str, Path]) -> None:
    url, _ = cluster
    want = [("s2.tar", "s2-003.txt"), ("s0.tar", "s0-001.txt"), ("s2.tar", "s2-003.cls"),
            ("s3.tar", "s3-000.txt"), ("s0.tar", "s0-004.txt"), ("s0.tar", "nope.txt")]  # fmt: skip
    items = [{"objname": s, "bucket": "shards", "archpath": a} for s, a in want]
    items.append({"objname": "gone.tar", "bucket": "shards", "archpath": "x.txt"})
    r = moss(url, {"in": items, "strm": True, "coer": True}, etl_name="wds-up")
    assert r.status_code == 200, r.text
    got = [(name, payload) for name, payload, _ in read_tar(r.content)]
    assert got == [
        ("shards/s2.tar/s2-003.txt", b"SAMPLE 2-3"),
        ("shards/s0.tar/s0-001.txt", b"SAMPLE 0-1"),
        ("shards/s2.tar/s2-003.cls", b"3"),
        ("shards/s3.tar/s3-000.txt", b"SAMPLE 3-0"),
        ("shards/s0.tar/s0-004.txt", b"SAMPLE 0-4"),
        ("__404__/shards/s0.tar/nope.txt", b""),  # the file is missing from the shard
        ("__404__/shards/gone.tar", b""),  # the shard itself is missing
    ]


def test_an_item_the_etl_refuses_with_cont_on_err(cluster: tuple[str, Path]) -> None:
    url, _ = cluster
    names = [f"o{i:03d}" for i in (5, 7, 9)]
    r = moss(url, {"in": [{"objname": n, "bucket": "src"} for n in names], "strm": True,
                   "coer": True}, etl_name="picky")  # fmt: skip
    assert r.status_code == 200, r.text
    got = read_tar(r.content)
    assert [(n, d) for n, d, _ in got] == [
        ("src/o005", data_of(5)[::-1]),
        ("__404__/src/o007", b""),  # a placeholder: never the error as data
        ("src/o009", data_of(9)[::-1]),
    ]
    why = got[1][2].get("comment", "")
    assert "ais://src/o007" in why and "refusing o-007" in why and "picky" in why, why
    # Sluice's SDK: the failed item has no data and says why
    items = list(SluiceClient(url).get_batch([("src", n) for n in names], etl_name="picky",
                                             missing_ok=True))  # fmt: skip
    assert [i.data for i in items] == [data_of(5)[::-1], None, data_of(9)[::-1]]
    assert items[1].error is not None and "refusing o-007" in items[1].error
    # multipart: the item's MossOut names the error
    r = moss(url, {"in": [{"objname": n, "bucket": "src"} for n in names], "coer": True},
             etl_name="picky")  # fmt: skip
    assert r.status_code == 200 and b"refusing o-007" in r.content


def test_an_item_the_etl_refuses_without_cont_on_err(cluster: tuple[str, Path]) -> None:
    url, _ = cluster
    # among the first items: a plain JSON error naming the object and the ETL
    r = moss(url, {"in": [{"objname": f"o{i:03d}", "bucket": "src"} for i in (5, 7)],
                   "strm": True}, etl_name="picky")  # fmt: skip
    assert r.status_code == 422, r.text
    err = r.json()
    assert "ais://src/o007" in err["error"] and "refusing o-007" in err["error"], err
    assert err["etl"] == "picky"
    # far into the batch (o135 last, in a part its target is asked for only once the
    # answer is under way: more than ETL_AHEAD parts before it): the stream breaks off,
    # never a whole-looking archive, never the error as data
    order = [i for i in range(N) if i not in (7, 135)] * 4 + [135]
    seen: list[tuple[str, bytes]] = []
    with requests.get(
        f"{url}/v1/ml/moss",
        params={"etl_name": "picky"},
        json={"in": [{"objname": f"o{i:03d}", "bucket": "src"} for i in order], "strm": True},
        stream=True,
        timeout=120,
    ) as r:
        assert r.status_code == 200, r.text
        broken = (tarfile.TarError, requests.RequestException, urllib3.exceptions.HTTPError)
        with pytest.raises(broken):
            with tarfile.open(fileobj=r.raw, mode="r|") as tar:
                for m in tar:
                    f = tar.extractfile(m)
                    seen.append((m.name, f.read() if f is not None else b""))
    assert len(order) - 20 < len(seen) < len(order), len(seen)
    assert seen == [(f"src/o{i:03d}", data_of(i)[::-1]) for i in order[: len(seen)]]


def test_a_view_in_a_batch(cluster: tuple[str, Path]) -> None:
    url, _ = cluster
    items = [("loud", "o004"), ("src", "o004"), ("loud", "o100"), ("loud", "missing")]
    got = list(SluiceClient(url).get_batch(items, missing_ok=True))
    assert [(g.bucket, g.name, g.data) for g in got] == [
        ("loud", "o004", data_of(4).upper() + b"!"),
        ("src", "o004", data_of(4)),
        ("loud", "o100", data_of(100).upper() + b"!"),
        ("loud", "missing", None),
    ]
    # a view already names its ETL: a batch-wide one is refused, naming the view
    r = moss(url, {"in": [{"objname": "o004", "bucket": "loud"}]}, etl_name="picky")
    assert r.status_code == 400 and "'loud' is an ETL view" in r.json()["error"]
    r = moss(url, {"in": [{"objname": "o004", "bucket": "loud", "start": 1, "length": 2}]})
    assert r.status_code == 400 and "byte range" in r.json()["error"]


def test_a_pipeline_and_a_cached_etl(cluster: tuple[str, Path]) -> None:
    url, _ = cluster
    sc = SluiceClient(url)
    wanted = [("src", f"o{i:03d}") for i in (11, 3, 60, 98)]
    r = moss(url, {"in": [{"objname": n, "bucket": b} for b, n in wanted], "strm": True},
             etl_name="shout", etl_pipeline="picky", etl_args="+")  # fmt: skip
    assert r.status_code == 200, r.text
    assert [(n, d) for n, d, _ in read_tar(r.content)] == [
        (f"{b}/{n}", (data_of(int(n[1:])).upper() + b"+")[::-1]) for b, n in wanted
    ]
    # cache: true: later epochs are served from the targets' output caches (an entry is
    # published by the cache's threads after the answer went out: wait for the hits)
    deadline = time.monotonic() + 90
    while True:
        got = list(sc.get_batch(wanted, etl_name="shout-cached", etl_args="~"))
        assert [g.data for g in got] == [data_of(int(n[1:])).upper() + b"~" for _, n in wanted]
        stats = sc.etl("shout-cached").details().stats
        if stats["cache_hits"] >= len(wanted) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert stats["cache_hits"] >= len(wanted) and stats["cache_misses"] >= len(wanted), stats


def test_the_official_aistore_sdk(cluster: tuple[str, Path]) -> None:
    pytest.importorskip("aistore.sdk.batch.batch", reason="this aistore SDK has no GetBatch")
    from aistore.sdk import Client
    from aistore.sdk.batch.batch import Batch

    url, _ = cluster
    ais = Client(url)
    # a view: the SDK unchanged
    batch = ais.batch(bucket=ais.bucket("loud"), streaming_get=True)
    for i in (9, 2, 120):
        batch.add(f"o{i:03d}")
    assert [(m.obj_name, d) for m, d in batch.get()] == [
        (f"o{i:03d}", data_of(i).upper() + b"!") for i in (9, 2, 120)
    ]

    # etl_name: the SDK's Batch has no ETL parameter; its requests get one added
    class WithEtl:
        def __init__(self, inner: Any) -> None:
            self._inner = inner

        def request(self, method: str, path: str, params: Any = None, **kw: Any) -> Any:
            params = {**(params or {}), "etl_name": "shout", "etl_args": "#"}
            return self._inner.request(method, path, params=params, **kw)

    for streaming in (True, False):
        batch = Batch(WithEtl(ais._request_client), bucket=ais.bucket("src"),
                      streaming_get=streaming)  # fmt: skip
        for i in range(0, N, 7):
            batch.add(f"o{i:03d}")
        assert [(m.obj_name, d) for m, d in batch.get()] == [
            (f"o{i:03d}", data_of(i).upper() + b"#") for i in range(0, N, 7)
        ]
