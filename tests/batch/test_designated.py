"""GetBatch's designated target: the gateway redirects, a target assembles (``sluice up``)."""

from __future__ import annotations

import io
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
import requests

from etl_runtime.cluster.clustermap import ClusterMap, MemoryClusterMap
from etl_runtime.cluster.records import TargetInfo
from etl_runtime.gateway.context import Gateway
from etl_runtime.gateway.getbatch_routes import designate
from etl_runtime.local import LocalCluster
from tests.gateway.conftest import DictBackend, DictRegistry, StaticDiscovery

WRITE, READ = "w-secret", "r-secret"
BIG = 300 << 10
AUTH = {"Authorization": f"Bearer {WRITE}"}


def _names(raw: bytes) -> list[tuple[str, bytes]]:
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r|") as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar]  # type: ignore[union-attr]


@pytest.fixture(scope="module", params=["uvloop", "asyncio"])
def secured(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """``sluice up`` with tokens, on each event loop (a target's own share is read on it)."""
    data = tmp_path_factory.mktemp("dt") / "data"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SLUICE_LOOP", request.param)  # read by the servers `sluice up` starts
        with LocalCluster(data, targets=3, token=WRITE, read_token=READ) as c:
            env.delenv("SLUICE_LOOP")
            yield _fill(c.endpoint.rstrip("/"))


def _fill(url: str) -> str:
    r = httpx.post(f"{url}/v1/buckets/bkt", json={"action": "create-bck"}, headers=AUTH)
    assert r.status_code == 200, r.text
    for i in range(12):
        r = httpx.put(
            f"{url}/v1/objects/bkt/o{i:02d}",
            content=bytes([65 + i]) * (100 + i),
            headers=AUTH,
            follow_redirects=True,
        )
        assert r.status_code == 200, r.text
    for i in range(6):  # over the 64 KiB a share reads into memory: sent from the file
        r = httpx.put(
            f"{url}/v1/objects/bkt/big{i}",
            content=bytes([97 + i]) * (BIG + i),
            headers=AUTH,
            follow_redirects=True,
        )
        assert r.status_code == 200, r.text
    return url


BODY = {"in": [{"objname": f"o{i:02d}"} for i in (7, 3, 11, 0, 5)], "strm": True}
WANT = [(f"bkt/o{i:02d}", bytes([65 + i]) * (100 + i)) for i in (7, 3, 11, 0, 5)]


def test_the_gateway_redirects_a_batch_to_a_target_that_assembles_it(secured: str) -> None:
    targets = {
        t["id"]: t["url"]
        for t in httpx.get(f"{secured}/v1/cluster", headers=AUTH).json()["targets"]
    }
    ports = {urlsplit(u).port for u in targets.values()}
    chosen = set()
    for _ in range(30):
        r = requests.get(
            f"{secured}/v1/ml/moss/bkt", json=BODY, headers=AUTH, allow_redirects=False, timeout=30
        )
        assert r.status_code == 307, r.text
        loc = urlsplit(r.headers["location"])
        assert loc.port in ports and loc.path == "/v1/ml/moss/bkt"
        chosen.add(loc.port)
    assert len(chosen) > 1  # at random among the members: the work is spread
    # requests follows the 307 with the body, and drops Authorization (another port):
    # the redirect's signature lets the target serve it
    r = requests.get(f"{secured}/v1/ml/moss/bkt", json=BODY, headers=AUTH, timeout=30)
    assert r.status_code == 200, r.text
    assert r.history and r.history[0].status_code == 307
    assert "authorization" not in {k.lower() for k in r.request.headers}
    assert _names(r.content) == WANT


def test_a_redirect_is_signed_for_its_body_alone(secured: str) -> None:
    r = requests.get(
        f"{secured}/v1/ml/moss/bkt", json=BODY, headers=AUTH, allow_redirects=False, timeout=30
    )
    location = r.headers["location"]
    assert {"sluice_sig", "sluice_exp", "sluice_map"} <= set(parse_qs(urlsplit(location).query))
    same = requests.get(location, json=BODY, timeout=30)
    assert same.status_code == 200 and _names(same.content) == WANT
    other = {"in": [{"objname": "o01"}], "strm": True}  # another item, same signature
    r = requests.get(location, json=other, timeout=30)
    assert r.status_code == 401 and "SLUICE_READ_TOKEN" in r.json()["error"]
    # the same body with another query (an ETL, a provider) is not what was signed
    for extra in ("&etl_name=x", "&provider=aws"):
        r = requests.get(location + extra, json=BODY, timeout=30)
        assert r.status_code == 401, (extra, r.text)
    unsigned = location.split("&sluice_exp")[0]
    r = requests.get(unsigned, json=BODY, timeout=30)
    assert r.status_code == 401
    # a caller with the read token may send a batch to any target
    r = requests.get(unsigned, json=other, headers={"Authorization": f"Bearer {READ}"}, timeout=30)
    assert r.status_code == 200 and _names(r.content) == [("bkt/o01", b"B" * 101)]


def test_a_designated_target_refuses_a_parameter_it_does_not_know(secured: str) -> None:
    r = requests.get(
        f"{secured}/v1/ml/moss/bkt", json=BODY, headers=AUTH, allow_redirects=False, timeout=30
    )
    # the redirect's signature does not cover an added parameter: with the caller's
    # token (credentials come first: tests/auth/test_routes.py) it is a 400 naming it
    r = requests.get(r.headers["location"] + "&bogus=1", json=BODY, headers=AUTH, timeout=30)
    assert r.status_code == 400 and "bogus" in r.json()["error"], r.text
    # and the gateway refuses the parameters only it may add
    r = requests.get(f"{secured}/v1/ml/moss/bkt?sluice_map=1", json=BODY, headers=AUTH, timeout=30)
    assert r.status_code == 400 and "sluice_map" in r.json()["error"]


def _sendfile_bytes(base: str) -> float:
    text = httpx.get(f"{base}/metrics", headers={"Authorization": f"Bearer {READ}"}).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("sluice_sendfile_bytes_total")
    )


@pytest.mark.parametrize("strm", [True, False])
def test_every_target_assembles_the_same_batch(secured: str, strm: bool) -> None:
    """Each target as the designated one: its own items read in its process (small ones
    from memory, big ones sent from the file), the others' over HTTP; a missing item
    is a placeholder either way."""
    order = ["big3", "o02", "big0", "nope", "o09", "big5", "o04", "big1", "big2", "big4"]
    body = {"in": [{"objname": n} for n in order], "strm": strm, "coer": True}

    def want(n: str) -> bytes:
        if n.startswith("big"):
            i = int(n[3:])
            return bytes([97 + i]) * (BIG + i)
        i = int(n[1:])
        return bytes([65 + i]) * (100 + i)

    targets = [t["url"] for t in httpx.get(f"{secured}/v1/cluster", headers=AUTH).json()["targets"]]
    assert len(targets) == 3
    read = {"Authorization": f"Bearer {READ}"}
    for base in targets:
        # Items not matched lately (integrity.VERIFIED: a file settled for a second, then
        # checked) are read through the hash; once matched, its own big ones go by sendfile.
        deadline = time.monotonic() + 20
        while True:
            sent = _sendfile_bytes(base)
            r = requests.get(f"{base}/v1/ml/moss/bkt", json=body, headers=read, timeout=60)
            assert r.status_code == 200, r.text
            if not strm or _sendfile_bytes(base) > sent:
                break
            assert time.monotonic() < deadline, "its own big items never went by sendfile"
            time.sleep(0.3)
        raw = r.content
        if not strm:  # multipart: the archive is the second part
            raw = raw.split(b'filename="batch.tar"')[1].split(b"\r\n\r\n", 1)[1]
        got = _names(raw)
        assert [name for name, _ in got] == [
            "__404__/bkt/nope" if n == "nope" else f"bkt/{n}" for n in order
        ]
        for (_, data), n in zip(got, order, strict=True):
            assert data == (b"" if n == "nope" else want(n)), (base, n)


def test_a_target_reads_its_map_again_when_the_gateway_planned_with_a_newer_one(
    secured: str,
) -> None:
    """``sluice_map``: the map version the gateway chose the target by; a target whose
    own is older reads it past its cache first (here it has no newer one: it serves
    with what it has). A value that is not a version is refused."""
    base = httpx.get(f"{secured}/v1/cluster", headers=AUTH).json()["targets"][0]["url"]
    read = {"Authorization": f"Bearer {READ}"}
    r = requests.get(
        f"{base}/v1/ml/moss/bkt?sluice_map=999999", json=BODY, headers=read, timeout=30
    )
    assert r.status_code == 200, r.text
    assert _names(r.content) == WANT
    r = requests.get(f"{base}/v1/ml/moss/bkt?sluice_map=new", json=BODY, headers=read, timeout=30)
    assert r.status_code == 400 and "sluice_map" in r.json()["error"]


def _gateway(members: tuple[str, ...], live: list[str], **kw: object) -> Gateway:
    urls = {m: f"http://127.0.0.1:{9000 + i}" for i, m in enumerate(members)}
    discovery = StaticDiscovery([TargetInfo(id=m, url=urls[m]) for m in live])
    cmap = MemoryClusterMap(ClusterMap(version=4, members=members, urls=urls))
    return Gateway(discovery, DictBackend(DictRegistry()), cmap=cmap, **kw)  # type: ignore[arg-type]


def test_the_gateway_designates_only_while_every_member_is_up() -> None:
    members = ("t0", "t1", "t2")
    up = _gateway(members, list(members))
    picked = {designate(up) for _ in range(50)}
    assert {(t.id, v) for t, v in picked if t is not None} == {("t0", 4), ("t1", 4), ("t2", 4)}
    assert designate(_gateway(members, ["t0", "t2"])) is None  # t1 down: the gateway does it
    slow = _gateway(members, list(members))
    slow.discovery.suspect_ids = lambda: {"t2"}  # type: ignore[attr-defined]
    assert designate(slow) is None
    assert designate(_gateway((), [])) is None
    # reads need a token, and there is no key to sign the redirect with
    assert designate(_gateway(members, list(members), read_token="r")) is None
    assert designate(_gateway(members, list(members), read_token="r", cluster_key="k"))


def test_without_a_map_the_gateway_assembles(tmp_path: Path) -> None:
    gw = _gateway(("t0",), ["t0"])
    gw.cmap = None
    assert designate(gw) is None


def test_with_gateway_assembly_the_gateway_answers_itself(tmp_path: Path) -> None:
    """``SLUICE_BATCH_ASSEMBLY=gateway`` (``--batch-assembly``), passed on by ``sluice up``."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SLUICE_BATCH_ASSEMBLY", "gateway")
        with LocalCluster(tmp_path / "data", targets=2) as c:
            env.delenv("SLUICE_BATCH_ASSEMBLY")
            url = c.endpoint.rstrip("/")
            httpx.post(f"{url}/v1/buckets/bkt-g", json={"action": "create-bck"}).raise_for_status()
            for n in ("x", "y"):
                httpx.put(
                    f"{url}/v1/objects/bkt-g/{n}", content=n.encode() * 5, follow_redirects=True
                ).raise_for_status()
            body = {"in": [{"objname": "y"}, {"objname": "x"}], "strm": True}
            r = requests.get(
                f"{url}/v1/ml/moss/bkt-g", json=body, allow_redirects=False, timeout=30
            )
            assert r.status_code == 200, r.text  # no 307: assembled where it was asked
            assert _names(r.content) == [("bkt-g/y", b"yyyyy"), ("bkt-g/x", b"xxxxx")]
