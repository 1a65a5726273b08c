"""Tokens and S3 keys limited to buckets, on a 3-target ``sluice up`` with a user and a read token.

A token made with ``POST /v1/tokens`` (``sluice token create``) reads, or reads
and writes, the buckets it names: anything else is a 403 naming the bucket, on
the gateway and on each target asked directly, for objects, listings,
GetBatch (every bucket of the batch), jobs and dSort (source and destination),
ETL GETs and a view (its source too). An S3 key made with ``buckets`` is held
to them alike. A token expires, and a revoked one is refused by every server.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
from aistore.sdk import Client as AisClient
from aistore.sdk.errors import AISError
from botocore.config import Config
from botocore.exceptions import ClientError

from etl_runtime import Client, Forbidden
from etl_runtime.cli.commands import main as cli
from etl_runtime.jobs.state import FINISHED, TERMINAL
from etl_runtime.local import LocalCluster

pytestmark = pytest.mark.timeout(300)
ADMIN, READER = "admin-secret", "reader-secret"
NAMES = [f"o{i}.txt" for i in range(6)]
WAIT_SECONDS = 30.0  # a generous bound for revocation and expiry to show everywhere


def upcase(data: bytes) -> bytes:
    return data.upper()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    data = tmp_path_factory.mktemp("scoped") / "data"
    with LocalCluster(data, targets=3, token=ADMIN, read_token=READER) as c:
        with Client(c.endpoint, token=ADMIN) as admin:
            for b in ("mine", "theirs"):
                bucket = admin.bucket(b).create()
                for name in NAMES:
                    bucket.object(name).put_content(f"{b} {name}".encode())
            admin.etl("upcase").init_code(transform=upcase)
            admin.bucket("peek").create(view_of="theirs", etl="upcase")
        yield c


def mint(up: LocalCluster, buckets: list[str], permission: str, ttl: str = "1h") -> str:
    body = {"buckets": buckets, "permission": permission, "ttl": ttl}
    r = httpx.post(f"{up.endpoint}/v1/tokens", json=body, headers=bearer(ADMIN))
    assert r.status_code == 200, r.text
    return str(r.json()["token"])


def targets(up: LocalCluster) -> list[str]:
    urls = json.loads((up.data_dir / "cluster.json").read_text())["urls"]
    assert len(urls) == 3
    return list(urls.values())


def forbidden(r: httpx.Response, bucket: str) -> None:
    assert r.status_code == 403, (r.request.method, r.request.url, r.status_code, r.text)
    if r.request.method == "HEAD":
        return
    assert r.json()["kind"] == "Forbidden" and r.json().get("bucket") == bucket, r.text
    assert repr(bucket) in r.json()["error"]


def test_native_reads_and_writes_stay_in_the_tokens_buckets(up: LocalCluster) -> None:
    reader, writer = mint(up, ["mine"], "read"), mint(up, ["mine"], "write")
    url = up.endpoint
    with Client(url, token=reader) as sdk:
        assert sdk.bucket("mine").object("o1.txt").get_bytes() == b"mine o1.txt"
        assert [o.name for o in sdk.bucket("mine").list_objects()] == NAMES
        with pytest.raises(Forbidden) as err:
            sdk.bucket("theirs").object("o1.txt").get_bytes()
        assert err.value.status == 403 and err.value.bucket == "theirs"
    with httpx.Client(base_url=url, follow_redirects=True, timeout=30) as http:
        forbidden(http.get("/v1/objects/theirs/o1.txt", headers=bearer(writer)), "theirs")
        forbidden(http.head("/v1/objects/theirs/o1.txt", headers=bearer(reader)), "theirs")
        forbidden(http.get("/v1/buckets/theirs", headers=bearer(reader)), "theirs")
        forbidden(http.put("/v1/objects/mine/new", content=b"x", headers=bearer(reader)), "mine")
        forbidden(
            http.put("/v1/objects/theirs/o1.txt", content=b"x", headers=bearer(writer)), "theirs"
        )
        forbidden(http.delete("/v1/objects/theirs/o1.txt", headers=bearer(writer)), "theirs")
        forbidden(http.delete("/v1/buckets/theirs", headers=bearer(writer)), "theirs")
        r = http.put("/v1/objects/mine/new", content=b"written", headers=bearer(writer))
        assert r.status_code == 200, r.text
        assert http.get("/v1/objects/mine/new", headers=bearer(reader)).content == b"written"
        # Calls about no one bucket, and managing ETLs, tokens and keys: the user token only.
        for method, path, body in (
            ("GET", "/v1/buckets", None),
            ("GET", "/v1/etl", None),
            ("POST", "/v1/tokens", {"buckets": ["mine"], "permission": "write"}),
            ("GET", "/v1/tokens", None),
            ("POST", "/v1/s3/keys", {"permission": "read"}),
            ("DELETE", "/v1/etl/upcase", None),
        ):
            r = http.request(method, path, json=body, headers=bearer(writer))
            assert r.status_code == 403 and r.json()["kind"] == "Forbidden", (path, r.text)
    with Client(url, token=ADMIN) as admin:
        assert admin.bucket("theirs").object("o1.txt").get_bytes() == b"theirs o1.txt"
        assert "upcase" in [e.name for e in admin.list_etls()]
    # Each target checks the token itself: a client that goes to one directly.
    for t in targets(up):
        for name in NAMES:
            forbidden(httpx.get(f"{t}/v1/objects/theirs/{name}", headers=bearer(reader)), "theirs")
            r = httpx.put(f"{t}/v1/objects/theirs/{name}", content=b"x", headers=bearer(writer))
            forbidden(r, "theirs")
        forbidden(httpx.get(f"{t}/v1/buckets/theirs", headers=bearer(reader)), "theirs")
        r = httpx.get(f"{t}/v1/objects/mine/o2.txt", headers=bearer(reader), follow_redirects=True)
        assert r.content == b"mine o2.txt"


def test_getbatch_checks_every_bucket_of_the_batch(up: LocalCluster) -> None:
    reader = mint(up, ["mine"], "read")
    with Client(up.endpoint, token=reader) as sdk:
        got = [i.data for i in sdk.get_batch([("mine", "o0.txt"), ("mine", "o3.txt")])]
        assert got == [b"mine o0.txt", b"mine o3.txt"]
        with pytest.raises(Forbidden) as err:
            list(sdk.get_batch([("mine", "o0.txt"), ("theirs", "o3.txt")]))
        assert err.value.status == 403 and err.value.bucket == "theirs"
    body = {"in": [{"objname": "o0.txt", "bucket": "theirs"}], "strm": True}
    for base in [up.endpoint, *targets(up)]:
        r = httpx.request("GET", f"{base}/v1/ml/moss/mine", json=body, headers=bearer(reader))
        forbidden(r, "theirs")


def test_jobs_and_dsort_check_source_and_destination(up: LocalCluster) -> None:
    writer = mint(up, ["mine", "mine-out"], "write")
    url = f"{up.endpoint}/v1/jobs"
    spec = {"etl": ["upcase"], "src": "theirs", "dst": "mine-out"}
    forbidden(
        httpx.post(url, json={"kind": "etl-bck", "spec": spec}, headers=bearer(writer)), "theirs"
    )
    spec = {"etl": ["upcase"], "src": "mine", "dst": "theirs"}
    forbidden(
        httpx.post(url, json={"kind": "etl-bck", "spec": spec}, headers=bearer(writer)), "theirs"
    )
    r = httpx.post(
        f"{up.endpoint}/v1/buckets/mine",
        json={"action": "etl-bck", "value": {"id": "upcase"}},
        params={"bck_to": "ais/@#/theirs/"},
        headers=bearer(writer),
    )
    forbidden(r, "theirs")
    for dsort in (
        {"bck": {"name": "theirs"}, "output_bck": {"name": "mine-out"}},
        {"bck": {"name": "mine"}, "output_bck": {"name": "stolen"}},
    ):
        dsort |= {"extension": ".tar", "input_format": "shard-{0..1}", "output_shard_size": "1KB"}
        r = httpx.post(f"{up.endpoint}/v1/dsort", json=dsort, headers=bearer(writer))
        forbidden(r, "theirs" if dsort["bck"]["name"] == "theirs" else "stolen")
    with Client(up.endpoint, token=ADMIN) as admin:
        assert "stolen" not in admin.list_buckets()  # refused before dSort made its output
        admin.bucket("mine-out").create()
    spec = {"etl": ["upcase"], "src": "mine", "dst": "mine-out"}
    r = httpx.post(url, json={"kind": "etl-bck", "spec": spec}, headers=bearer(writer))
    assert r.status_code == 200, r.text
    job = r.json()["id"]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        state = httpx.get(f"{url}/{job}", headers=bearer(writer)).json()["state"]
        if state in TERMINAL:
            break
        time.sleep(0.2)
    assert state == FINISHED
    with Client(up.endpoint, token=writer) as sdk:
        assert sdk.bucket("mine-out").object("o4.txt").get_bytes() == b"MINE O4.TXT"
    other = mint(up, ["theirs"], "read")
    forbidden(httpx.get(f"{url}/{job}", headers=bearer(other)), "mine")


def test_etl_gets_and_views_check_the_bucket_read(up: LocalCluster) -> None:
    reader = mint(up, ["mine"], "read")
    query = {"etl_name": "upcase"}
    r = httpx.get(
        f"{up.endpoint}/v1/objects/mine/o5.txt",
        params=query,
        headers=bearer(reader),
        follow_redirects=True,
    )
    assert r.content == b"MINE O5.TXT"
    for base in [up.endpoint, *targets(up)]:
        r = httpx.get(f"{base}/v1/objects/theirs/o5.txt", params=query, headers=bearer(reader))
        forbidden(r, "theirs")
    # 'peek' is a view of 'theirs': a token for the view alone does not read its source.
    peeker = mint(up, ["peek"], "read")
    forbidden(httpx.get(f"{up.endpoint}/v1/objects/peek/o1.txt", headers=bearer(peeker)), "theirs")
    forbidden(httpx.get(f"{up.endpoint}/v1/buckets/peek", headers=bearer(peeker)), "theirs")
    both = mint(up, ["peek", "theirs"], "read")
    r = httpx.get(
        f"{up.endpoint}/v1/objects/peek/o1.txt", headers=bearer(both), follow_redirects=True
    )
    assert r.content == b"THEIRS O1.TXT"


def test_s3_keys_limited_to_buckets(up: LocalCluster) -> None:
    def key(permission: str) -> Any:
        r = httpx.post(
            f"{up.endpoint}/v1/s3/keys",
            json={"permission": permission, "buckets": ["mine"]},
            headers=bearer(ADMIN),
        )
        assert r.status_code == 200 and r.json()["buckets"] == ["mine"], r.text
        return boto3.client(
            "s3",
            endpoint_url=f"{up.endpoint}/s3",
            aws_access_key_id=r.json()["access_key"],
            aws_secret_access_key=r.json()["secret_key"],
            region_name="us-east-1",
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
        )

    reader, writer = key("read"), key("write")
    assert reader.get_object(Bucket="mine", Key="o0.txt")["Body"].read() == b"mine o0.txt"
    calls = [
        lambda: reader.get_object(Bucket="theirs", Key="o0.txt"),
        lambda: reader.list_objects_v2(Bucket="theirs"),
        lambda: writer.put_object(Bucket="theirs", Key="x", Body=b"x"),
        lambda: writer.copy_object(
            Bucket="mine", Key="copied", CopySource={"Bucket": "theirs", "Key": "o0.txt"}
        ),
    ]
    for call in calls:
        with pytest.raises(ClientError) as err:
            call()
        assert err.value.response["Error"]["Code"] == "AccessDenied"
        assert "'theirs'" in err.value.response["Error"]["Message"]
    with pytest.raises(ClientError) as err:
        reader.put_object(Bucket="mine", Key="x", Body=b"x")
    assert err.value.response["Error"]["Code"] == "AccessDenied"
    with pytest.raises(ClientError) as err:
        reader.list_buckets()
    assert err.value.response["Error"]["Code"] == "AccessDenied"
    writer.put_object(Bucket="mine", Key="s3.txt", Body=b"by s3")
    assert reader.get_object(Bucket="mine", Key="s3.txt")["Body"].read() == b"by s3"


def test_the_aistore_sdk_with_a_scoped_token(up: LocalCluster) -> None:
    ais = AisClient(up.endpoint, token=mint(up, ["mine"], "read"))
    assert ais.bucket("mine").object("o2.txt").get_reader().read_all() == b"mine o2.txt"
    assert len(list(ais.bucket("mine").list_all_objects())) >= len(NAMES)
    with pytest.raises(AISError) as err:
        ais.bucket("theirs").object("o2.txt").get_reader().read_all()
    assert err.value.status_code == 403 and "theirs" in str(err.value)


def test_a_token_expires(up: LocalCluster) -> None:
    brief = mint(up, ["mine"], "read", ttl="3s")
    path = "/v1/objects/mine/o1.txt"
    r = httpx.get(up.endpoint + path, headers=bearer(brief), follow_redirects=True)
    assert r.content == b"mine o1.txt"
    deadline = time.monotonic() + WAIT_SECONDS
    while (r := httpx.get(up.endpoint + path, headers=bearer(brief))).status_code != 401:
        assert time.monotonic() < deadline, r.text
        time.sleep(0.5)
    assert "expired" in r.json()["error"]


def test_a_revoked_token_is_refused_by_every_server(
    up: LocalCluster, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = ["--endpoint", up.endpoint, "--token", ADMIN, "token"]
    assert cli([*argv, "create", "--bucket", "mine", "--read", "--ttl", "1h"]) == 0
    out = capsys.readouterr().out
    token = out.split("token:", 1)[1].split()[0]
    token_id = out.split("id:", 1)[1].split()[0]
    assert cli([*argv, "list"]) == 0
    assert token_id in capsys.readouterr().out
    servers = [up.endpoint, *targets(up)]
    for base in servers:
        r = httpx.get(
            f"{base}/v1/objects/mine/o3.txt", headers=bearer(token), follow_redirects=True
        )
        assert r.content == b"mine o3.txt", (base, r.text)
    # A 307 the gateway signed for the token names it (sluice_tid): not to be swapped.
    moved = httpx.get(f"{up.endpoint}/v1/objects/mine/o3.txt", headers=bearer(token))
    location = moved.headers["location"]
    assert moved.status_code == 307 and f"sluice_tid={token_id}" in location
    assert httpx.get(location).content == b"mine o3.txt"
    assert httpx.get(location.replace(token_id, "0" * 16)).status_code == 401
    servers.append(location)
    batch = {"in": [{"objname": "o3.txt"}], "strm": True}
    moved = httpx.request(
        "GET", f"{up.endpoint}/v1/ml/moss/mine", json=batch, headers=bearer(token)
    )
    batch_location = moved.headers["location"]
    assert moved.status_code == 307 and f"sluice_tid={token_id}" in batch_location
    assert httpx.request("GET", batch_location, json=batch).status_code == 200
    servers.append(batch_location)
    assert cli([*argv, "revoke", token_id]) == 0
    assert f"revoked {token_id}" in capsys.readouterr().out
    deadline = time.monotonic() + WAIT_SECONDS
    for base in servers:  # every server, each on its own next look at the cluster map
        while True:
            if base == location:  # and the redirects handed out before the revocation
                r = httpx.get(location)
            elif base == batch_location:
                r = httpx.request("GET", batch_location, json=batch)
            else:
                r = httpx.get(f"{base}/v1/objects/mine/o3.txt", headers=bearer(token))
            if r.status_code == 401:
                assert "revoked" in r.json()["error"]
                break
            assert time.monotonic() < deadline, (base, r.status_code, r.text)
            time.sleep(0.2)
    assert cli([*argv, "list"]) == 0
    assert "revoked" in capsys.readouterr().out
    assert cli([*argv, "create", "--read"]) != 0  # no bucket: refused by the CLI itself
    assert "--bucket" in capsys.readouterr().err


# -- every route of every app ------------------------------------------------------

# Routes a token for another bucket may call: each says why.
OPEN = {
    "/v1/health": "liveness",
    "/v1/daemon": "AIStore's cluster map (the aistore SDK reads it before any call)",
    "/metrics": "Prometheus metrics (no object data)",
    "/openapi.json": "FastAPI's API description",
    "/docs": "FastAPI's API description",
    "/docs/oauth2-redirect": "FastAPI's API description",
    "/redoc": "FastAPI's API description",
    "/ui": "the status page's HTML; its data comes from /v1/ui/summary",
}
# Routes that answer this probe otherwise, before any data: (path, status) and why.
EARLIER = {
    ("/v1/objects/{bucket}", 400): "no object name: always a 400 naming it",
    ("/v1/jobs", 400): "the probe's body is no job (a job's buckets: test_jobs_and_dsort...)",
    ("/v1/jobs/{job_id}", 404): "no job 'x' (a job's buckets are checked once it is found)",
    ("/v1/sort", 400): "no ?uuid= (likewise)",
    ("/v1/_rebalance", 200): "a target's rebalance progress: counts, no names",
}
# With an unknown query parameter too (the token's check comes first): but routes whose
# buckets are in their body check the token's permission, then the query, then the
# body's buckets; a 400 for the query there tells a holder nothing of another bucket.
IN_BODY = {"/v1/jobs", "/v1/jobs/{job_id}", "/v1/dsort", "/v1/sort", "/v1/ml/moss"}
PARAMS = {"bucket": "theirs", "name": "o1.txt", "key": "o1.txt"}


def app_routes(app: Any) -> list[tuple[str, str, Any]]:
    """(method, path, endpoint) of every route of ``app``, into included routers."""
    found: list[tuple[str, str, Any]] = []

    def walk(routes: list[Any]) -> None:
        for r in routes:
            if hasattr(r, "original_router"):  # FastAPI's included router
                walk(r.original_router.routes)
            elif hasattr(r, "endpoint"):
                found.extend(
                    (m, r.path, r.endpoint) for m in sorted(r.methods or ()) if m != "HEAD"
                )

    walk(app.routes)
    return found


def concrete(path: str) -> str:
    def fill(part: str) -> str:
        if not part.startswith("{"):
            return part
        return PARAMS.get(part.strip("{}").split(":")[0], "x")

    return "/".join(fill(p) for p in path.split("/"))


def test_every_route_refuses_a_token_for_another_bucket(up: LocalCluster, tmp_path: Path) -> None:
    """Each route of the gateway and of a target, with a write token for 'mine' on
    'theirs' (or on nothing: a cluster-wide call): 401 or 403, never an answer; only
    the routes of ``OPEN`` answer, and those of ``EARLIER`` refuse before, each for its
    reason; with an unknown parameter too, which no route names before the 403. A new
    route that forgets ``core/access.py``'s check fails here."""
    from etl_runtime.cluster.clustermap import MemoryClusterMap
    from etl_runtime.gateway import create_gateway_app
    from etl_runtime.storage_target import create_target_app
    from tests.gateway.conftest import DictBackend, StaticDiscovery
    from tests.storage_target.fakes import DictRegistry

    registry, cmap = DictRegistry(), MemoryClusterMap()
    apps = {
        up.endpoint: create_gateway_app(
            StaticDiscovery([]), DictBackend(registry), cluster_map=cmap, s3_keys=tmp_path / "k"
        ),
        targets(up)[0]: create_target_app("t0", tmp_path / "t0", registry, cluster_map=cmap),
    }
    writer = mint(up, ["mine"], "write")
    answered, count = [], 0
    for base, app in apps.items():
        for method, path, _ in app_routes(app):
            if path in OPEN:
                continue
            count += 1
            url = base + concrete(path)
            r = httpx.request(method, url, headers=bearer(writer), json={}, timeout=30)
            if r.status_code not in (401, 403) and (path, r.status_code) not in EARLIER:
                answered.append(f"{method} {path}: {r.status_code} {r.text[:120]}")
            if path in IN_BODY or path.startswith("/v1/_"):  # internal: the cluster key's
                continue
            r = httpx.request(method, url + "?bogus=1", headers=bearer(writer), timeout=30)
            if r.status_code not in (401, 403) and (path, r.status_code) not in EARLIER:
                answered.append(f"{method} {path}?bogus=1: {r.status_code} {r.text[:120]}")
    assert count > 60
    assert not answered, "\n".join(answered)


def test_transformers_take_their_own_token_only(up: LocalCluster) -> None:
    """A transformer answers its targets (their ETL token) and the 307s they sign; a
    token for buckets, even the object's own, is a 401 on each of its routes."""
    from etl_runtime.wire.formats.bulk import PATH as BULK

    writer = mint(up, ["mine", "theirs"], "write")
    details = httpx.get(f"{up.endpoint}/v1/etl/upcase", headers=bearer(ADMIN)).json()
    endpoints = [t["endpoint"] for t in details["transformers"] if t["endpoint"]]
    assert len(endpoints) == 3, details
    for base in endpoints:
        for method, path in (
            ("GET", "/stats"),
            ("GET", "/logs"),
            ("PUT", "/mine/o1.txt"),
            ("GET", "/mine/o1.txt?etl_fqn=mine/o1.txt"),  # a 307 of a target: signed
            ("POST", BULK),
        ):
            r = httpx.request(method, base + path, headers=bearer(writer), content=b"x")
            assert r.status_code == 401, (base, method, path, r.status_code, r.text)
