"""GetBatch's redirect answered inside the gateway's HTTP protocol (``gateway/inprotocol.py``).

A gateway app with a cluster map of one real target, served as ``run_server``
serves it (the guarded zero-copy protocol with the gateway's answerer) next to
the same app served without the answerer, on asyncio and on uvloop: the inline
307 must be the route's, header for header; every request the answerer
declines (an unknown, repeated or bad parameter, an ETL, a bad bucket, a read
without the token) must get the route's answer; a signed redirect must take
the client to its batch; the metrics must count the redirect as the route's.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from etl_runtime.cluster.clustermap import ClusterMap, MemoryClusterMap
from etl_runtime.cluster.records import TargetInfo
from etl_runtime.gateway import create_gateway_app
from etl_runtime.storage_target import create_target_app
from etl_runtime.wire.http import connections, zerocopy
from etl_runtime.wire.http.connections import Limits
from tests.gateway.conftest import DictBackend, StaticDiscovery
from tests.servers import serve_in_thread
from tests.storage_target.fakes import CLUSTER_KEY, DictRegistry
from tests.storage_target.test_inline import _metric

BODY = (
    b'{"in": [{"objname": "o1", "bucket": "bkt"}, {"objname": "o0", "bucket": "bkt"}],'
    b' "strm": true}'
)
READ = "r-secret"


@dataclass
class Served:
    inline: httpx.Client
    route: httpx.Client
    target: str
    answers: list[bool]  # per request the answerer took up: True if it answered
    version: int  # of the cluster map


def _serve(tmp_path: Path, loop: str, read_token: str | None) -> Iterator[Served]:
    registry = DictRegistry()
    cmap = MemoryClusterMap(ClusterMap(version=3, members=("t0",)))
    target = create_target_app(
        "t0",
        tmp_path / "t0",
        registry,
        cluster_key=CLUSTER_KEY,
        cluster_map=cmap,
        read_token=read_token,
    )
    with serve_in_thread(target, loop=loop) as turl:
        cmap.update(lambda m: replace(m, urls={"t0": turl}))

        def gateway() -> Any:
            return create_gateway_app(
                StaticDiscovery([TargetInfo(id="t0", url=turl)]),
                DictBackend(registry),
                cluster_key=CLUSTER_KEY,
                cluster_map=cmap,
                read_token=read_token,
            )

        app, plain = gateway(), gateway()  # one app per server: its tasks are on its loop
        answerer = app.state.answerer
        answers: list[bool] = []

        def counted(scope: dict[str, Any]) -> Any:
            answer = answerer(scope)
            if answer is None:
                return None

            def with_body(body: bytes) -> Any:
                outcome = answer(body)
                answers.append(outcome is not None)
                return outcome

            return with_body

        with_inline = connections.http_protocol(zerocopy.http_protocol({}), Limits(), counted)
        without = connections.http_protocol(zerocopy.http_protocol({}), Limits())
        with (
            serve_in_thread(app, loop=loop, http=with_inline) as inline_url,
            serve_in_thread(plain, loop=loop, http=without) as route_url,
            httpx.Client(base_url=inline_url, timeout=30) as inline,
            httpx.Client(base_url=route_url, timeout=30) as route,
        ):
            route.post("/v1/buckets/bkt", json={"action": "create-bck"}).raise_for_status()
            for i in range(2):
                route.put(
                    f"/v1/objects/bkt/o{i}", content=b"%d" % i * 10, follow_redirects=True
                ).raise_for_status()
            yield Served(inline, route, turl, answers, cmap.get().version)


@pytest.fixture
def served(tmp_path: Path, loop_name: str) -> Iterator[Served]:
    yield from _serve(tmp_path, loop_name, None)


@pytest.fixture
def secured(tmp_path: Path, loop_name: str) -> Iterator[Served]:
    yield from _serve(tmp_path, loop_name, READ)


def _get(c: httpx.Client, url: str, body: bytes = BODY, **headers: str) -> httpx.Response:
    return c.request("GET", url, content=body, headers=headers)


def _same(a: httpx.Response, b: httpx.Response) -> None:
    assert a.status_code == b.status_code
    assert a.content == b.content
    assert [(k, v) for k, v in a.headers.items() if k != "date"] == [
        (k, v) for k, v in b.headers.items() if k != "date"
    ]


def _names(raw: bytes) -> list[tuple[str, bytes]]:
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r|") as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar]  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "url",
    [
        "/v1/ml/moss/bkt",
        "/v1/ml/moss/bkt?provider=ais&coloc=1",
        "/v1/ml/moss?provider=",  # each item names its bucket
        "/v1/ml/moss/bkt?sluice_exp=1&sluice_sig=x",  # a caller's signature: dropped
    ],
)
def test_the_inline_redirect_is_the_routes(served: Served, url: str) -> None:
    inline, route = _get(served.inline, url), _get(served.route, url)
    assert inline.status_code == 307
    _same(inline, route)
    assert served.answers == [True]
    location = inline.headers["location"]
    assert location.startswith(served.target + urlsplit(url).path + "?")
    assert parse_qs(urlsplit(location).query)["sluice_map"] == [str(served.version)]
    # the redirect takes the client to its batch
    r = _get(httpx.Client(timeout=30), location)
    assert r.status_code == 200, r.text
    assert _names(r.content) == [("bkt/o1", b"1" * 10), ("bkt/o0", b"0" * 10)]


@pytest.mark.parametrize(
    "url",
    [
        "/v1/ml/moss/bkt?bogus=1",  # the route's 400 names it
        "/v1/ml/moss/bkt?provider=ais&provider=ais",
        "/v1/ml/moss/bkt?provider=oci",  # a provider Sluice does not serve
        "/v1/ml/moss/bkt?sluice_map=1",  # only the gateway adds it
        "/v1/ml/moss/bkt?etl_name=nope",  # the ETL is looked up: no such ETL
        "/v1/ml/moss/bkt?etl_args=x",  # no ETL to pass them to
        "/v1/ml/moss/Bad%20Name",
        "/v1/ml/mossy",
    ],
)
def test_what_the_answerer_declines_gets_the_routes_answer(served: Served, url: str) -> None:
    inline, route = _get(served.inline, url), _get(served.route, url)
    assert inline.status_code in (400, 404), inline.text
    _same(inline, route)
    assert served.answers == []


def test_a_body_the_answerer_does_not_wait_for_gets_the_routes_redirect(served: Served) -> None:
    big = b'{"in": [' + b",".join([b'{"objname": "o0"}'] * 5000) + b'], "strm": true}'
    assert len(big) > 64 << 10  # more than a body answered inline

    def chunked() -> Iterator[bytes]:
        yield BODY

    for c in (served.inline, served.route):
        assert _get(c, "/v1/ml/moss/bkt", big).status_code == 307
        r = c.request("GET", "/v1/ml/moss/bkt", content=chunked())
        assert r.status_code == 307
    assert served.answers == []


def test_a_read_needs_the_token_and_the_redirect_is_signed(secured: Served) -> None:
    r = _get(secured.inline, "/v1/ml/moss/bkt")
    assert r.status_code == 401 and "SLUICE_READ_TOKEN" in r.json()["error"]
    _same(r, _get(secured.route, "/v1/ml/moss/bkt"))
    assert secured.answers == []
    r = _get(secured.inline, "/v1/ml/moss/bkt", Authorization=f"Bearer {READ}")
    assert r.status_code == 307 and secured.answers == [True]
    location = r.headers["location"]
    assert {"sluice_exp", "sluice_sig", "sluice_map"} <= set(parse_qs(urlsplit(location).query))
    with httpx.Client(timeout=30) as c:  # no token: the signature lets the target serve it
        assert _names(_get(c, location).content) == [("bkt/o1", b"1" * 10), ("bkt/o0", b"0" * 10)]
        other = b'{"in": [{"objname": "o0"}], "strm": true}'  # signed for its body alone
        assert _get(c, location, other).status_code == 401


def test_the_inline_redirect_is_counted_as_the_routes(served: Served) -> None:
    labels = {"route": "/v1/ml/moss/{bucket}", "op": "get", "role": "gateway", "status": "307"}
    before = _metric(served.inline, "sluice_http_requests_total", **labels)
    received = _metric(served.inline, "sluice_http_received_bytes_total", route=labels["route"])
    for _ in range(3):
        assert _get(served.inline, "/v1/ml/moss/bkt").status_code == 307
    assert served.answers == [True] * 3
    assert _metric(served.inline, "sluice_http_requests_total", **labels) - before == 3
    assert _metric(
        served.inline, "sluice_http_received_bytes_total", route=labels["route"]
    ) - received == 3 * len(BODY)
