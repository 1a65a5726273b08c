"""Read access control: with a read token, reads need it (or the user token).

On the gateway and on a target directly: 401 naming what is needed without
one, 200 with either token; the read token does not allow writes; a signed
redirect carries a read through clients that drop ``Authorization`` on the
redirect (httpx, requests); ETL logs need a token.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import requests

from etl_runtime import Client
from tests.gateway.conftest import Cluster, run_cluster

WRITE, READ = "w-secret", "r-secret"


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[Cluster]:
    with run_cluster(tmp_path, token=WRITE, read_token=READ) as c:
        yield c


def bearer(t: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {t}"}


def test_reads_need_a_token_on_the_gateway_and_the_targets(guarded: Cluster) -> None:
    url = guarded.url
    assert httpx.post(f"{url}/v1/buckets/bkt", json={"action": "create-bck"}, headers=bearer(WRITE))
    r = httpx.put(f"{url}/v1/objects/bkt/o", content=b"data", headers=bearer(WRITE))
    assert r.status_code == 200, r.text
    for path in ("/v1/objects/bkt/o", "/v1/buckets/bkt", "/v1/buckets", "/v1/etl"):
        r = httpx.get(url + path, follow_redirects=True)
        assert r.status_code == 401 and "SLUICE_READ_TOKEN" in r.json()["error"], path
        assert httpx.get(url + path, headers=bearer("wrong")).status_code == 401, path
        for t in (READ, WRITE):
            r = httpx.get(url + path, headers=bearer(t), follow_redirects=True)
            assert r.status_code == 200, (path, t, r.text)
    assert httpx.head(f"{url}/v1/buckets/bkt").status_code == 401
    # The read token reads, and only reads.
    assert (
        httpx.put(f"{url}/v1/objects/bkt/o", content=b"x", headers=bearer(READ)).status_code == 401
    )
    # httpx and requests drop Authorization on the redirect: the signature carries the read.
    r = httpx.get(f"{url}/v1/objects/bkt/o", headers=bearer(READ), follow_redirects=True)
    assert r.content == b"data" and "sluice_sig" in str(r.history[0].headers["location"])
    r = requests.get(f"{url}/v1/objects/bkt/o", headers=bearer(READ), timeout=30)
    assert r.status_code == 200 and r.content == b"data"
    assert "authorization" not in {k.lower() for k in r.request.headers}
    with Client(url, token=READ) as sdk:
        assert sdk.bucket("bkt").object("o").get_bytes() == b"data"
    # A target, asked directly.
    target = guarded.targets[0].url
    for path in ("/v1/buckets", "/v1/buckets/bkt", "/v1/_etl/x/logs", "/v1/_etl/x/stats"):
        assert httpx.get(target + path).status_code == 401, path
    assert httpx.get(f"{target}/v1/buckets", headers=bearer(READ)).status_code == 200
    owner = next(t.url for t in guarded.targets if "o" in guarded.objects_on(t.id, "bkt"))
    assert httpx.get(f"{owner}/v1/objects/bkt/o").status_code == 401
    assert httpx.get(f"{owner}/v1/objects/bkt/o", headers=bearer(READ)).content == b"data"


def test_without_a_read_token_reads_stay_open(tmp_path: Path) -> None:
    with run_cluster(tmp_path, token=WRITE) as c:
        httpx.post(f"{c.url}/v1/buckets/bkt", json={"action": "create-bck"}, headers=bearer(WRITE))
        httpx.put(f"{c.url}/v1/objects/bkt/o", content=b"open", headers=bearer(WRITE))
        assert httpx.get(f"{c.url}/v1/objects/bkt/o", follow_redirects=True).content == b"open"
        assert httpx.get(f"{c.url}/v1/etl/x/logs").status_code == 401  # logs: token holders
