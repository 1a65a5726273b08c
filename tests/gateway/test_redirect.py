"""Object calls through the gateway: 307 to the HRW owner, with real HTTP clients."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
import requests

from etl_runtime.cluster.hrw import hrw_owner
from tests.gateway.conftest import TOKEN, Cluster


def mkbucket(c: Cluster, b: str = "bkt") -> None:
    assert c.client.post(f"/v1/buckets/{b}", json={"action": "create-bck"}).status_code == 200


def curl(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["curl", "-sSL", *args], capture_output=True, timeout=60)


def test_redirect_goes_to_hrw_owner_with_query(cluster: Cluster) -> None:
    mkbucket(cluster)
    r = httpx.get(f"{cluster.url}/v1/objects/bkt/dir/x.bin?etl_name=e&etl_args=a%20b&provider=")
    assert r.status_code == 307
    loc = urlsplit(r.headers["location"])
    owner = hrw_owner(cluster.targets, "bkt/dir/x.bin")
    assert f"{loc.scheme}://{loc.netloc}" == owner.url
    assert loc.path == "/v1/objects/bkt/dir/x.bin"
    assert parse_qs(loc.query, keep_blank_values=True) == {
        "etl_name": ["e"],
        "etl_args": ["a b"],
        "provider": [""],
    }
    assert "sluice_sig" not in loc.query  # no token configured, nothing to sign


def test_httpx_put_get_head_delete_follow_redirects(cluster: Cluster) -> None:
    mkbucket(cluster)
    c = cluster.client
    blobs = {f"dir/{i}/obj.bin": os.urandom(1 << 20 if i == 0 else 1000 + i) for i in range(20)}
    for name, data in blobs.items():
        r = c.put(f"/v1/objects/bkt/{name}", content=data)
        assert r.status_code == 200, r.text
        assert not r.history  # the gateway streamed it to the owner: sent once
        assert r.json()["etag"] == hashlib.md5(data).hexdigest()
    for name, data in blobs.items():
        owner = hrw_owner(cluster.targets, f"bkt/{name}").id
        assert name in cluster.objects_on(owner, "bkt")  # stored on its owner only
        other = next(t.id for t in cluster.targets if t.id != owner)
        assert name not in cluster.objects_on(other, "bkt")
        assert c.get(f"/v1/objects/bkt/{name}").content == data
        assert c.head(f"/v1/objects/bkt/{name}").headers["content-length"] == str(len(data))
    assert all(cluster.objects_on(t.id, "bkt") for t in cluster.targets)  # both got some
    assert c.delete("/v1/objects/bkt/dir/0/obj.bin").status_code == 200
    r = c.get("/v1/objects/bkt/dir/0/obj.bin")
    assert r.status_code == 404 and r.json()["object"] == "dir/0/obj.bin"


def test_curl_follows(cluster: Cluster, tmp_path: Path) -> None:
    mkbucket(cluster)
    src = tmp_path / "in.bin"
    src.write_bytes(os.urandom(3 << 20))  # big enough for curl to use Expect: 100-continue
    url = f"{cluster.url}/v1/objects/bkt/curl/obj.bin"
    put = curl("-T", str(src), url)
    assert put.returncode == 0, put.stderr
    assert b'"etag"' in put.stdout
    small = curl("-X", "PUT", "--data-binary", "small body", f"{url}.small")
    assert small.returncode == 0 and b'"size":10' in small.stdout
    get = curl(url)
    assert get.returncode == 0 and get.stdout == src.read_bytes()
    assert curl(f"{url}.small").stdout == b"small body"


def test_requests_follows(cluster: Cluster) -> None:
    mkbucket(cluster)
    url = f"{cluster.url}/v1/objects/bkt/req/o.bin"
    data = os.urandom(200_000)
    r = requests.put(url, data=data, timeout=30)
    assert r.status_code == 200 and not r.history  # proxied, not redirected
    assert requests.get(url, timeout=30).content == data
    assert requests.delete(url, timeout=30).status_code == 200
    assert requests.get(url, timeout=30).status_code == 404


@pytest.mark.parametrize(
    "path",
    [
        "/v1/objects/bkt/a//b",
        "/v1/objects/bkt/%2E%2E/x",
        "/v1/objects/bkt/a%00",
        "/v1/objects/bkt/",
        "/v1/objects/b",
        "/v1/objects/b%21/x",
    ],
)
def test_bad_names_are_400_at_the_gateway(cluster: Cluster, path: str) -> None:
    for method in ("GET", "PUT", "DELETE"):
        r = httpx.request(method, cluster.url + path, content=b"x" if method == "PUT" else None)
        assert r.status_code == 400, (method, path)
        assert r.json()["kind"] == "InvalidName"


def test_no_live_targets_is_503(cluster: Cluster) -> None:
    cluster.discovery.live = []
    r = httpx.get(f"{cluster.url}/v1/objects/bkt/o")
    assert r.status_code == 503 and r.json()["kind"] == "NoTargets"
    assert "retry-after" in r.headers
    assert httpx.get(f"{cluster.url}/v1/buckets").status_code == 503
    assert httpx.get(f"{cluster.url}/v1/health").json()["targets"] == 0


def test_token_signed_redirects(secured: Cluster) -> None:
    mkbucket(secured)
    url = f"{secured.url}/v1/objects/bkt/sec/o.bin"
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    # no or wrong token: refused at the gateway, nothing stored
    r = httpx.put(url, content=b"x", follow_redirects=True)
    assert r.status_code == 401 and not r.history
    r = requests.put(url, data=b"x", headers={"Authorization": "Bearer no"}, timeout=30)
    assert r.status_code == 401
    assert curl("-X", "PUT", "--data-binary", "x", url).stdout.count(b"Unauthorized") == 1
    assert httpx.get(url, follow_redirects=True).status_code == 404
    # a PUT without Expect is proxied, with the caller's token
    r = httpx.put(url, content=b"v1", headers=bearer, follow_redirects=True)
    assert r.status_code == 200 and not r.history, r.text
    # the token holder's redirect is signed, so the target accepts it without the header
    r = requests.put(url, data=b"v2", headers={**bearer, "Expect": "100-continue"}, timeout=30)
    assert r.status_code == 200, r.text
    assert "sluice_sig" in str(r.history[0].headers["location"])
    assert "authorization" not in {k.lower() for k in r.request.headers}  # requests dropped it
    put = curl("-X", "PUT", "-H", f"Authorization: Bearer {TOKEN}", "--data-binary", "v3", url)
    assert put.returncode == 0 and b'"etag"' in put.stdout, put.stdout
    assert httpx.get(url, follow_redirects=True).content == b"v3"  # reads are open
    # a signed location cannot be replayed for another method
    loc = httpx.put(url, headers={**bearer, "Expect": "100-continue"}).headers["location"]
    assert httpx.delete(loc).status_code == 401
    assert httpx.delete(url, headers=bearer, follow_redirects=True).status_code == 200


def test_an_empty_put_is_redirected_not_proxied(cluster: Cluster) -> None:
    """Sluice's SDK probes with an empty PUT to learn the owner: that must write nothing.

    Proxying the probe wrote an empty object first; when the real upload then
    failed, the last acknowledged version had been replaced by nothing.
    """
    mkbucket(cluster)
    c = cluster.client
    assert c.put("/v1/objects/bkt/kept", content=b"v1").status_code == 200
    r = httpx.put(f"{cluster.url}/v1/objects/bkt/kept", content=b"")
    assert r.status_code == 307 and r.headers["location"].endswith("/v1/objects/bkt/kept")
    assert c.get("/v1/objects/bkt/kept").content == b"v1"
    from etl_runtime import Client

    with Client(cluster.url) as sdk:
        sdk.bucket("bkt").object("kept").put_content(b"v2")
    assert c.get("/v1/objects/bkt/kept").content == b"v2"
