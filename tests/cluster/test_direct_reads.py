"""Reads sent straight to a target that does not own the object, and AIStore's Smap.

The official aistore SDK places a direct read itself, with AIStore's HRW over
the Smap (``GET /v1/daemon?what=smap``), not Sluice's: the target that gets a
read it does not own answers 307 to the owner, once (docs/aistore.md,
"Cluster map and direct reads"). Real servers on loopback sharing one cluster map.
"""

from __future__ import annotations

import httpx
import requests

from tests.cluster.conftest import MapCluster

READ = "r-secret"
NAMES = [f"o{i}" for i in range(8)]


def setup(c: MapCluster, read_token: str | None = None) -> dict[str, str]:
    urls = {t: c.add_target(t, read_token=read_token).url for t in ("t0", "t1")}
    c.start_gateway(read_token=read_token)
    with c.client() as http:
        assert http.post("/v1/buckets/bkt", json={"action": "create-bck"}).status_code == 200
        for n in NAMES:
            assert http.put(f"/v1/objects/bkt/{n}", content=n.encode()).status_code == 200
    return urls


def owner_and_other(c: MapCluster, name: str) -> tuple[str, str]:
    owner = c.cmap.get().owners("bkt", name)[0]
    return owner, "t1" if owner == "t0" else "t0"


def test_a_target_redirects_a_read_it_does_not_own_once(map_cluster: MapCluster) -> None:
    c = map_cluster
    urls = setup(c)
    for n in NAMES:
        owner, other = owner_and_other(c, n)
        url = f"{urls[other]}/v1/objects/bkt/{n}"
        r = httpx.get(url, params={"provider": "ais"})
        assert r.status_code == 307, r.text
        location = r.headers["location"]
        assert location.startswith(f"{urls[owner]}/v1/objects/bkt/{n}?"), location
        assert "provider=ais" in location and f"sluice_from={other}" in location
        assert httpx.get(url, follow_redirects=True).content == n.encode()
        head = httpx.head(url, follow_redirects=True)
        assert head.status_code == 200 and head.headers["content-length"] == str(len(n))
        # a read a target already redirected that still lands on a non-owner: 503, no loop
        r = httpx.get(url, params={"sluice_from": owner})
        assert r.status_code == 503 and r.json()["kind"] == "Misdirected", r.text
        assert r.headers["retry-after"]
        # writes are never redirected by a target
        assert httpx.put(url, content=b"x").status_code == 503
        assert httpx.get(f"{urls[owner]}/v1/objects/bkt/{n}").content == n.encode()
    r = httpx.get(f"{urls['t0']}/v1/objects/nosuch/x", follow_redirects=True)
    assert r.status_code == 404 and r.json()["kind"] == "BucketNotFound"


def test_with_a_read_token_the_targets_redirect_is_signed(map_cluster: MapCluster) -> None:
    c = map_cluster
    urls = setup(c, read_token=READ)
    for n in NAMES[:4]:
        _owner, other = owner_and_other(c, n)
        url = f"{urls[other]}/v1/objects/bkt/{n}"
        assert httpx.get(url).status_code == 401  # no redirect before the token is checked
        # requests drops Authorization when the port changes: the signature carries the read
        r = requests.get(url, headers={"Authorization": f"Bearer {READ}"}, timeout=30)
        assert r.status_code == 200 and r.content == n.encode(), r.text
        assert "sluice_sig" in r.history[0].headers["location"]


def test_smap_and_readiness(map_cluster: MapCluster) -> None:
    from aistore.sdk import Client
    from aistore.sdk.types import Smap

    c = map_cluster
    urls = setup(c)
    smap = Smap.model_validate(httpx.get(f"{c.url}/v1/daemon", params={"what": "smap"}).json())
    assert {t: n.public_net.direct_url for t, n in smap.tmap.items() if n.public_net} == urls
    assert all(n.flags == 0 and n.daemon_type == "target" for n in smap.tmap.values())
    assert smap.proxy_si.public_net and smap.proxy_si.public_net.direct_url == c.url
    assert smap.version == c.cmap.get().version
    assert httpx.get(f"{c.url}/v1/cluster", params={"what": "smap"}).json()["tmap"].keys() == {
        "t0",
        "t1",
    }
    # a target answers it too, from its own map (the SDK asks it again after a 404)
    on_target = Smap.model_validate(httpx.get(f"{urls['t0']}/v1/daemon?what=smap").json())
    assert sorted(on_target.tmap) == ["t0", "t1"] and on_target.proxy_si.public_net is None
    r = httpx.get(f"{urls['t0']}/v1/daemon", params={"what": "log"})
    assert r.status_code == 400 and "'log'" in r.json()["error"]
    assert Client(c.url).cluster().is_ready()

    c.live.down.add("t1")  # away: flagged, so the SDK's placement skips it; not ready
    smap = Smap.model_validate(httpx.get(f"{c.url}/v1/daemon?what=smap").json())
    assert smap.tmap["t1"].in_maint_or_decomm() and not smap.tmap["t0"].in_maint_or_decomm()
    assert smap.get_target_for_object("ais/@#/b/o1").daemon_id == "t0"
    r = httpx.get(f"{c.url}/v1/health", params={"prr": "true"})
    assert r.status_code == 503 and r.json()["target"] == "t1" and r.headers["retry-after"]
    assert httpx.get(f"{c.url}/v1/health").status_code == 200  # liveness is unchanged
    # (the SDK's is_ready() is then False, after its own retries of the 503: ~10 s)
