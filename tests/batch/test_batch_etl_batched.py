"""GetBatch through an ETL with the batched transform request, against a real ``sluice up``.

A target sends its share's objects to its transformer in one request and
reads all outputs from one framed answer (``wire/formats/bulk.py``). What a user
sees must not change: every item's transformed bytes, in request order, with
the inline default and with worker processes (``SLUICE_INLINE=0``), for
bytes results, iterable results (several frames per item) and outputs big
enough to spill to disk; an item the ETL raises on is that item's error
entry naming it while the others are right; a transformer that dies
mid-batch gives errors naming the ETL and object, never short data; and the
transformer is used again once it was replaced.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import requests

from etl_runtime import Client as SluiceClient
from etl_runtime.local import LocalCluster
from tests.batch.test_batch_etl import read_tar

N = 120  # more than one batched request per target
BIG = {17: 3 << 20, 40: 200 << 10}  # outputs past a target's 1 MiB per item, past 64 KiB
WORKERS = {"SLUICE_INLINE": "0"}
# One inline server: each of several servers counts its own sluice_http_* series and
# a scrape is answered by one of them (docs/metrics.md), so the count
# of batched requests that batch_requests reads is whole only with one.
ONE_SERVER = {"SLUICE_SERVERS": "1"}


def data_of(i: int) -> bytes:
    return f"o-{i:03d}|".encode() * (1 + i * 31 % 300) + b"x" * BIG.get(i, 0)


def rev(data: bytes) -> bytes:
    return data[::-1]


def chunked(data: bytes) -> Iterator[bytes]:
    for k in range(0, len(data), 1000):  # one frame per chunk
        yield data[k : k + 1000].upper()


def picky(data: bytes) -> bytes:
    if data.startswith((b"o-007|", b"o-031|")):
        raise ValueError(f"refusing {data[:5].decode()}")
    return data[::-1]


def killer(data: bytes) -> bytes:
    if data.startswith(b"o-013|"):
        os.kill(os.getpid(), signal.SIGKILL)  # inline: the server process; else a worker
    return data[::-1]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data = tmp_path_factory.mktemp("batched") / "data"
    with LocalCluster(data, targets=3) as c:
        url = c.endpoint.rstrip("/")
        sc = SluiceClient(url)
        for name, fn in (("rev", rev), ("chunked", chunked), ("picky", picky)):
            sc.etl(name).init_code(transform=fn, env=ONE_SERVER if name == "rev" else None,
                                   timeout=180)  # fmt: skip
            sc.etl(f"{name}-w").init_code(transform=fn, env=WORKERS, timeout=180)
        sc.etl("killer").init_code(transform=killer, timeout=180)
        sc.etl("killer-w").init_code(transform=killer, env=WORKERS, timeout=180)
        with httpx.Client(base_url=url, timeout=120, trust_env=False) as h:
            h.post("/v1/buckets/src", json={"action": "create-bck"}).raise_for_status()
            for i in range(N):
                h.put(f"/v1/objects/src/o{i:03d}", content=data_of(i)).raise_for_status()
        yield url


def moss(url: str, names: list[str], etl: str, **body: Any) -> requests.Response:
    items = [{"objname": n, "bucket": "src"} for n in names]
    return requests.get(
        f"{url}/v1/ml/moss", params={"etl_name": etl}, json={"in": items, "strm": True, **body},
        timeout=120,
    )  # fmt: skip


def batch_requests(url: str, etl: str) -> float:
    """The batched requests the transformers of ``etl`` answered (their /metrics)."""
    total = 0.0
    for tf in httpx.get(f"{url}/v1/etl/{etl}", timeout=30).json()["transformers"]:
        assert httpx.get(f"{tf['endpoint']}/health", timeout=30).json()["servers"] == 1
        for line in httpx.get(f"{tf['endpoint']}/metrics", timeout=30).text.splitlines():
            if line.startswith("sluice_http_requests_total") and "/_sluice/batch" in line:
                total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.mark.parametrize("suffix", ["", "-w"], ids=["inline", "workers"])
def test_every_item_transformed_in_request_order(cluster: str, suffix: str) -> None:
    order = [(i * 37) % N for i in range(N)]  # every object, shuffled
    wanted = [("src", f"o{i:03d}") for i in order]
    before = batch_requests(cluster, f"rev{suffix}")
    got = list(SluiceClient(cluster).get_batch(wanted, etl_name=f"rev{suffix}"))
    assert [(g.name, g.data) for g in got] == [(f"o{i:03d}", data_of(i)[::-1]) for i in order]
    assert batch_requests(cluster, f"rev{suffix}") > before  # the batched path, not per object
    # an iterable result: several frames per item, one of them a 3 MiB output
    r = moss(cluster, [n for _, n in wanted], f"chunked{suffix}")
    assert r.status_code == 200, r.text
    assert [(n, d) for n, d, _ in read_tar(r.content)] == [
        (f"src/o{i:03d}", data_of(i).upper()) for i in order
    ]


@pytest.mark.parametrize("suffix", ["", "-w"], ids=["inline", "workers"])
def test_an_item_the_etl_raises_on_is_its_own_error(cluster: str, suffix: str) -> None:
    names = [f"o{i:03d}" for i in range(40)]
    r = moss(cluster, names, f"picky{suffix}", coer=True)
    assert r.status_code == 200, r.text
    got = read_tar(r.content)
    refused = {7, 31}
    assert [(n, d) for n, d, _ in got] == [
        (f"__404__/src/o{i:03d}", b"") if i in refused else (f"src/o{i:03d}", data_of(i)[::-1])
        for i in range(40)
    ]
    for i in refused:
        why = got[i][2].get("comment", "")
        assert f"ais://src/o{i:03d}" in why and f"refusing o-{i:03d}" in why, why
        assert f"picky{suffix}" in why, why
    # without coer: a JSON error naming the first failing item and the ETL
    r = moss(cluster, names, f"picky{suffix}")
    assert r.status_code == 422, r.text
    assert "ais://src/o007" in r.json()["error"] and "refusing o-007" in r.json()["error"]


@pytest.mark.parametrize("suffix", ["", "-w"], ids=["inline", "workers"])
def test_a_transformer_killed_mid_batch_gives_errors_not_short_data(
    cluster: str, suffix: str
) -> None:
    etl = f"killer{suffix}"
    names = [f"o{i:03d}" for i in range(40)]
    for coer in (False, True):
        r = moss(cluster, names, etl, coer=coer)
        # never an archive: a dead server (inline) or worker fails the items it
        # owed, naming the ETL and the object; no placeholder hides it (not a 4xx)
        assert r.status_code >= 500, (r.status_code, r.content[:300])
        body = r.json()
        err = body["error"]
        assert "ais://src/o0" in err and (etl in err or body.get("etl") == etl), body
        if not suffix:
            assert "broke off on target" in err, err  # the server died mid-answer
    # the transformer goes on (inline: its server replaced): the other items are whole
    ok = [n for n in names if n != "o013"]
    deadline = time.monotonic() + 60
    while True:
        r = moss(cluster, ok, etl)
        if r.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert r.status_code == 200, r.text
    assert [(n, d) for n, d, _ in read_tar(r.content)] == [
        (f"src/{n}", data_of(int(n[1:]))[::-1]) for n in ok
    ]


def test_a_batch_request_without_the_etl_token_is_refused(cluster: str) -> None:
    tf = httpx.get(f"{cluster}/v1/etl/rev", timeout=30).json()["transformers"][0]["endpoint"]
    r = httpx.post(f"{tf}/_sluice/batch", json={"items": []}, timeout=30)
    assert r.status_code == 401, r.text
