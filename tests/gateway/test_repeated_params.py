"""A query parameter given twice is a 400 naming it, on the gateway and on a target.

``request.query_params.get`` keeps one value and drops the others, so
``?etl_name=upper&etl_name=reverse`` answered 200 with only ``reverse``
applied. Every route that refuses unknown parameters (``core/params.py``)
now refuses repeats too, and so do the listings.
"""

from __future__ import annotations

import httpx
import pytest

from etl_runtime.core import auth
from etl_runtime.storage.peers import INTERNAL_HEADER
from tests.gateway.conftest import Cluster
from tests.storage_target.fakes import CLUSTER_KEY


@pytest.fixture
def stored(cluster: Cluster) -> Cluster:
    cluster.client.post("/v1/buckets/bkt", json={"action": "create-bck"})
    for name in ("a/1", "a/2", "b/1"):
        assert cluster.client.put(f"/v1/objects/bkt/{name}", content=b"data").status_code == 200
    return cluster


def refused(r: httpx.Response, name: str, times: int = 2) -> None:
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["kind"] == "InvalidRequest"
    assert body["error"] == f"query parameter {name!r} given {times} times; give it once"


@pytest.mark.parametrize("server", ["gateway", "target"])
def test_repeated_parameters_are_400_by_name(stored: Cluster, server: str) -> None:
    # the target owning nothing in particular: each refuses before reading anything
    base = stored.url if server == "gateway" else stored.targets[0].url
    refused(httpx.get(f"{base}/v1/objects/bkt/a/1?etl_name=upper&etl_name=reverse"), "etl_name")
    refused(
        httpx.get(f"{base}/v1/objects/bkt/a/1?etl_name=x&etl_args=1&etl_args=2&etl_args=3"),
        "etl_args",
        times=3,
    )
    refused(httpx.get(f"{base}/v1/buckets/bkt?prefix=a/&prefix=b/"), "prefix")
    refused(
        httpx.put(f"{base}/v1/objects/bkt/c?provider=ais&provider=ais", content=b"x"), "provider"
    )
    r = httpx.delete(f"{base}/v1/objects/bkt/a/1?provider=ais&provider=aws")
    refused(r, "provider")
    assert httpx.head(f"{base}/v1/objects/bkt/a/1?provider=ais&provider=ais").status_code == 400
    both = httpx.get(f"{base}/v1/buckets/bkt?prefix=a/&limit=1&prefix=b/&limit=2")
    assert both.status_code == 400
    assert both.json()["error"] == (
        "query parameters 'limit' (2 times), 'prefix' (2 times) given more than once; "
        "give each once"
    )
    # an unknown parameter is still named as unknown, repeated or not
    r = httpx.get(f"{base}/v1/objects/bkt/a/1?etl_pipline=a&etl_pipline=b")
    assert r.status_code == 400 and "unknown query parameter(s) etl_pipline" in r.json()["error"]


@pytest.mark.parametrize("server", ["gateway", "target"])
def test_etl_args_without_an_etl_is_400(stored: Cluster, server: str) -> None:
    """``?etl_args=`` alone answered the object (or the batch) untransformed, a 200
    that looked like the ETL had run."""
    base = stored.url if server == "gateway" else stored.targets[0].url
    calls = [
        httpx.get(f"{base}/v1/objects/bkt/a/1?etl_args=x"),
        httpx.get(f"{base}/v1/objects/bkt/a/1?etl_args=x&etl_name="),
        httpx.get(f"{base}/v1/objects/bkt/a/1?etl_args=x&etl_pipeline=p"),
    ]
    if server == "gateway":  # a target's GetBatch route takes the gateway's signature
        body = {"in": [{"objname": "a/1"}], "strm": True}
        calls.append(httpx.request("GET", f"{base}/v1/ml/moss/bkt?etl_args=x", json=body))
    for r in calls:
        assert r.status_code == 400, r.text
        assert r.json()["error"] == (
            "etl_args='x' needs etl_name (the ETL it is passed to); drop etl_args, or name the ETL"
        )
        assert r.json()["object" if "objects" in str(r.url) else "bucket"] == (
            "a/1" if "objects" in str(r.url) else "bkt"
        )


def test_single_parameters_still_work(stored: Cluster) -> None:
    c = stored.client
    listing = c.get("/v1/buckets/bkt", params={"prefix": "a/", "limit": 10})
    assert listing.status_code == 200
    assert [o["name"] for o in listing.json()["objects"]] == ["a/1", "a/2"]
    assert c.get("/v1/objects/bkt/a/1", params={"provider": "ais"}).content == b"data"
    assert c.head("/v1/objects/bkt/b/1", params={"provider": "ais"}).status_code == 200
    target = httpx.get(f"{stored.targets[0].url}/v1/buckets/bkt", params={"prefix": "a/"})
    assert target.status_code == 200


def test_internal_target_routes_refuse_unknown_and_repeated_parameters(stored: Cluster) -> None:
    """The routes targets and the gateway call on each other read their parameters
    the same way: a repeat or an unknown one was dropped silently."""
    base = stored.targets[0].url
    inside = {INTERNAL_HEADER: auth.internal_token(CLUSTER_KEY)}
    r = httpx.put(f"{base}/v1/_replica/bkt/x?if_absent=1&if_absent=0", content=b"x", headers=inside)
    refused(r, "if_absent")
    r = httpx.get(f"{base}/v1/_replica/bkt/a/1?if_absent=1", headers=inside)
    assert r.status_code == 400 and "unknown query parameter(s) if_absent" in r.json()["error"]
    refused(httpx.get(f"{base}/v1/_jobs?kind=a&kind=b", headers=inside), "kind")
    r = httpx.get(f"{base}/v1/_jobs?knd=a", headers=inside)
    assert r.status_code == 400 and "knd" in r.json()["error"]
    r = httpx.get(f"{base}/v1/_rebalance?verbose=1")
    assert r.status_code == 400 and "verbose" in r.json()["error"]
    refused(httpx.get(f"{base}/v1/_etl/upper/logs?tail=1&tail=5"), "tail")
    assert httpx.get(f"{base}/v1/_replica/bkt/a/1", headers=inside).content == b"data"
