"""With a user and a read token, no route of the gateway or of a target answers a caller
without one: every route in the apps' own route tables is called with no token and
with a wrong one, on a real 2-target ``sluice up``, and each answer is a 401 or 403 —
also with an unknown, repeated or malformed parameter and with a bad bucket, object
or ETL name, which the route would refuse with a 400 for a caller with the token: the
credentials are checked first, so no caller without them learns what exists.

The only routes that answer anyone are in ``OPEN``, each with the reason. A route
added later is walked too (it comes from the route table), so one that forgets
``core/access.py``'s check fails here. The aistore SDK and the ``sluice`` CLI still
read the cluster's state with the read token.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from aistore.sdk import Client as AisClient
from aistore.sdk.errors import AISError

from etl_runtime import Client
from etl_runtime.cli.commands import main as cli
from etl_runtime.gateway.app import create_gateway_app
from etl_runtime.local import LocalCluster
from etl_runtime.storage_target.app import create_target_app

pytestmark = pytest.mark.timeout(300)
ADMIN, READER = "admin-secret", "reader-secret"

# (server, path template): why it answers without a token. Nothing here tells a
# caller about buckets, objects, tokens or jobs.
OPEN = {
    ("gateway", "/v1/health"): "liveness and readiness probes (kubelet, sluice up) carry no token",
    ("target", "/v1/health"): "liveness and readiness probes carry no token",
    ("gateway", "/metrics"): "Prometheus scrapes by annotation, without credentials; labels "
    "are route templates, target ids and ETL names",
    ("target", "/metrics"): "the same as the gateway's",
    ("gateway", "/ui"): "a static page; everything it shows comes from /v1/ui/summary, "
    "which needs a token (it asks for one)",
    **{
        (server, path): "the API's description, the same for every cluster (FastAPI's)"
        for server in ("gateway", "target")
        for path in ("/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc")
    },
}
# Query strings that take a route down another branch (each checked on its own).
BRANCHES = {
    "/v1/cluster": ["what=smap", "what=status", "what=running_all", "what=qryxstats"],
    "/v1/daemon": ["what=smap"],
    "/v1/buckets": ["provider=ais"],
}
FILL = {"bucket": "data-1", "name": "o.txt", "key": "o.txt", "target_id": "t0"}
# What a route refuses with a 400 for a caller who may make the call: without the
# token, each is a 401 first (no caller learns which routes and parameters exist).
PROBES = ["bogus=1", "provider=zz", "limit=abc", "bogus=1&bogus=2", "sluice_exp=%C2%B2"]
BAD_NAMES = {"data-1": "BAD..name!", "o.txt": "a%00b/..", "x1": "%2e%2e"}
# S3 at the gateway's root (S3AtRoot): not in the route table, a middleware.
ROOT_S3 = [("GET", "/data-1/o.txt"), ("GET", "/data-1"), ("PUT", "/data-1/new.txt")]


def flatten(routes: list[Any]) -> Iterator[tuple[str, list[str]]]:
    """(path, methods) of every route, the included routers' too (FastAPI 0.165)."""
    for route in routes:
        included = getattr(route, "original_router", None)
        if included is not None:
            prefix = route.include_context.prefix or ""
            yield from ((prefix + p, m) for p, m in flatten(included.routes))
        else:
            yield route.path, sorted(route.methods)


def route_tables(tmp: Path) -> dict[str, list[tuple[str, list[str]]]]:
    secrets = {"token": ADMIN, "read_token": READER, "cluster_key": "k"}
    gateway = create_gateway_app(None, None, **secrets)  # type: ignore[arg-type]
    target = create_target_app("t0", tmp, None, **secrets)  # type: ignore[arg-type]
    return {"gateway": list(flatten(gateway.routes)), "target": list(flatten(target.routes))}


def fill(template: str) -> str:
    return re.sub(r"\{(\w+)(:path)?\}", lambda m: FILL.get(m.group(1), "x1"), template)


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    data = tmp_path_factory.mktemp("routes") / "data"
    with LocalCluster(data, targets=2, token=ADMIN, read_token=READER) as c:
        with Client(c.endpoint, token=ADMIN) as admin:
            admin.bucket("data-1").create().object("o.txt").put_content(b"secret")
        yield c


def target_url(up: LocalCluster) -> str:
    return str(next(iter(json.loads((up.data_dir / "cluster.json").read_text())["urls"].values())))


def test_no_route_answers_a_caller_without_a_token(up: LocalCluster, tmp_path: Path) -> None:
    bases = {"gateway": up.endpoint, "target": target_url(up)}
    tables = route_tables(tmp_path)
    calls: list[tuple[str, str, str]] = [("gateway", m, p) for m, p in ROOT_S3]
    for server, table in tables.items():
        for template, methods in table:
            if (server, template) in OPEN:
                continue
            for method in methods:
                path = fill(template)
                calls.append((server, method, path))
                calls += [(server, method, f"{path}?{q}") for q in BRANCHES.get(template, [])]
                calls += [(server, method, f"{path}?{q}") for q in PROBES]
                for good, bad in BAD_NAMES.items():
                    if good in path.split("/"):
                        calls.append((server, method, path.replace(good, bad)))
    assert len(calls) > 600, len(calls)  # the walk saw the route tables (about 110 routes)
    opened = []
    wrong = ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Bearer sluice1.e30.x"})
    clients = {server: httpx.Client(base_url=base, timeout=30) for server, base in bases.items()}
    for headers in wrong:
        for server, method, path in calls:
            r = clients[server].request(method, path, headers=headers)
            if r.status_code not in (401, 403):
                opened.append((server, method, path, headers, r.status_code, r.text[:120]))
    for client in clients.values():
        client.close()
    assert opened == [], "\n".join(map(str, opened))
    # The allow-list names routes that exist, and they answer with no token indeed.
    everything = {(s, p) for s, table in tables.items() for p, _ in table}
    assert set(OPEN) <= everything, set(OPEN) - everything
    for server, path in OPEN:
        assert httpx.get(bases[server] + path, timeout=30).status_code == 200, (server, path)


def test_cluster_state_is_read_with_a_token(
    up: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    anonymous = httpx.get(f"{up.endpoint}/v1/cluster", timeout=30)
    assert anonymous.status_code == 401 and "data-1" not in anonymous.text
    assert "SLUICE_READ_TOKEN" in anonymous.json()["error"]  # it says what to send
    with Client(up.endpoint, token=READER) as reader:
        assert "data-1" in reader.cluster()["buckets"]
    assert cli(["--endpoint", up.endpoint, "--token", READER, "cluster"]) == 0
    out = capsys.readouterr().out
    assert "t0" in out and "t1" in out
    # The aistore SDK: its cluster map (from the gateway and, for direct reads, the
    # targets), a listing and a read.
    ais = AisClient(up.endpoint, token=READER)
    assert len(ais.cluster().get_info().tmap) == 2
    assert [e.name for e in ais.bucket("data-1").list_all_objects()] == ["o.txt"]
    assert ais.bucket("data-1").object("o.txt").get_reader().read_all() == b"secret"
    with pytest.raises(AISError) as e:
        AisClient(up.endpoint).cluster().get_info()
    assert e.value.status_code == 401
