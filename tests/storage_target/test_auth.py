"""Token checks on a target: mutating calls need the token or a gateway signature."""

from __future__ import annotations

import httpx

from etl_runtime.core import auth
from tests.storage_target.conftest import RunningTarget
from tests.storage_target.fakes import CLUSTER_KEY

BEARER = {"Authorization": "Bearer s3cret"}


def test_mutations_need_token_and_change_nothing(secured_target: RunningTarget) -> None:
    c = secured_target.client
    r = c.post("/v1/buckets/bkt", json={"action": "create-bck"})
    assert r.status_code == 401 and r.json()["kind"] == "Unauthorized"
    assert c.get("/v1/buckets").json() == {"buckets": []}
    assert (
        c.post("/v1/buckets/bkt", json={"action": "create-bck"}, headers=BEARER).status_code == 200
    )
    assert c.put("/v1/objects/bkt/o", content=b"v1", headers=BEARER).status_code == 200

    wrong = {"Authorization": "Bearer nope"}
    assert c.put("/v1/objects/bkt/o", content=b"v2", headers=wrong).status_code == 401
    assert c.put("/v1/objects/bkt/new", content=b"x").status_code == 401
    assert c.delete("/v1/objects/bkt/o").status_code == 401
    assert c.delete("/v1/buckets/bkt").status_code == 401
    # reads are open, and nothing changed
    assert c.get("/v1/objects/bkt/o").content == b"v1"
    assert c.get("/v1/objects/bkt/new").status_code == 404
    assert c.get("/v1/buckets").json() == {"buckets": ["bkt"]}


def test_signed_redirect_is_accepted_only_for_its_method_and_path(
    secured_target: RunningTarget,
) -> None:
    c = secured_target.client
    c.post("/v1/buckets/bkt", json={"action": "create-bck"}, headers=BEARER)
    sig = auth.sign_redirect(CLUSTER_KEY, "PUT", "/v1/objects/bkt/dir/o")
    assert c.put("/v1/objects/bkt/dir/o", params=sig, content=b"signed").status_code == 200
    assert c.get("/v1/objects/bkt/dir/o").content == b"signed"
    # same signature, other object or other method: refused
    assert c.put("/v1/objects/bkt/dir/other", params=sig, content=b"x").status_code == 401
    assert c.delete("/v1/objects/bkt/dir/o", params=sig).status_code == 401
    bad = {**sig, "sluice_sig": "0" * 64}
    assert c.put("/v1/objects/bkt/dir/o", params=bad, content=b"x").status_code == 401
    expired = auth.sign_redirect(CLUSTER_KEY, "PUT", "/v1/objects/bkt/dir/o", now=1000.0)
    assert c.put("/v1/objects/bkt/dir/o", params=expired, content=b"x").status_code == 401
    forged = auth.sign_redirect("other-key", "PUT", "/v1/objects/bkt/dir/o")
    assert c.put("/v1/objects/bkt/dir/o", params=forged, content=b"x").status_code == 401
    assert c.get("/v1/objects/bkt/dir/o").content == b"signed"
    delete_sig = auth.sign_redirect(CLUSTER_KEY, "DELETE", "/v1/objects/bkt/dir/o")
    assert c.delete("/v1/objects/bkt/dir/o", params=delete_sig).status_code == 200


def test_unauthorized_has_www_authenticate(secured_target: RunningTarget) -> None:
    r = httpx.put(f"{secured_target.url}/v1/objects/bkt/o", content=b"x")
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
