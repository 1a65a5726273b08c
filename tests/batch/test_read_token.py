"""GetBatch is a read: with a read token set it needs that token (or the user token)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import httpx

from tests.gateway.conftest import run_cluster

WRITE, READ = "w-secret", "r-secret"


def test_get_batch_needs_a_read_token(tmp_path: Path) -> None:
    with run_cluster(tmp_path, token=WRITE, read_token=READ) as c:
        auth = {"Authorization": f"Bearer {WRITE}"}
        httpx.post(f"{c.url}/v1/buckets/bkt", json={"action": "create-bck"}, headers=auth)
        for name in ("x", "y"):
            r = httpx.put(f"{c.url}/v1/objects/bkt/{name}", content=name.encode() * 3, headers=auth)
            assert r.status_code == 200, r.text
        body = {"in": [{"objname": "y"}, {"objname": "x"}], "strm": True}
        r = httpx.request("GET", f"{c.url}/v1/ml/moss/bkt", json=body)
        assert r.status_code == 401 and "SLUICE_READ_TOKEN" in r.json()["error"]
        for token in (READ, WRITE):
            r = httpx.request(
                "GET",
                f"{c.url}/v1/ml/moss/bkt",
                json=body,
                headers={"Authorization": f"Bearer {token}"},
            )
            assert r.status_code == 200, r.text
            with tarfile.open(fileobj=io.BytesIO(r.content), mode="r|") as tar:
                got = [(m.name, tar.extractfile(m).read()) for m in tar]  # type: ignore[union-attr]
            assert got == [("bkt/y", b"yyy"), ("bkt/x", b"xxx")]
