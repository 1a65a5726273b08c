"""The direct answer: a big object's ETL GET is a 307 from the target to its transformer.

A real target (uvicorn, on the loop under test) and a real transformer child
(same loop; worker processes on asyncio, ``--inline`` on uvloop, so both code
paths run) sharing a data dir. What a client notices: a big object's answer
comes from the transformer, a small one's from the target, both transformed;
the transformer serves only what a target signed, for that object, file and
arguments; a failure keeps its JSON error or aborted connection.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit

import httpx
import pytest

from etl_runtime.core import auth
from etl_runtime.etl.forward import REDIRECT_ENV, redirect_bytes_from_env
from etl_runtime.storage_target import create_target_app
from tests.servers import serve_in_thread
from tests.storage_target.conftest import RunningTarget
from tests.storage_target.fakes import CLUSTER_KEY, DictRegistry, record
from tests.webserver.conftest import LOOP_TEST_CODE, source_code, transformer

THRESHOLD = 64 << 10
BIG = bytes(range(256)) * 1024  # 256 KiB: over the threshold set below
SMALL = b"a small object"


@pytest.fixture(scope="module")
def shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("direct")


@pytest.fixture(scope="module")
def transformer_url(shared_dir: Path, loop_name: str) -> Iterator[str]:
    spec = {"mode": "object", "code": source_code(LOOP_TEST_CODE["object"])}
    token = auth.transformer_token(CLUSTER_KEY, "object", "uid-1")
    env = {
        "SLUICE_LOOP": loop_name,
        "SLUICE_DATA_ROOTS": str(shared_dir),
        "SLUICE_ETL_TOKEN": token,
        "SLUICE_INLINE": "1" if loop_name == "uvloop" else "0",
    }
    with transformer("object", spec, workers=1, **env) as url:
        yield url


@pytest.fixture
def target(
    shared_dir: Path, transformer_url: str, loop_name: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[RunningTarget]:
    monkeypatch.setenv("SLUICE_ETL_FQN", "always")
    monkeypatch.setenv(REDIRECT_ENV, str(THRESHOLD))
    registry = DictRegistry()
    registry.put(record("object", {"t0": transformer_url}))
    data = shared_dir / f"data-{loop_name}"
    app = create_target_app("t0", data, registry, cluster_key=CLUSTER_KEY)
    with (
        serve_in_thread(app, loop=loop_name) as url,
        httpx.Client(base_url=url, timeout=30) as client,
    ):
        client.post("/v1/buckets/bkt", json={"action": "create-bck"})
        assert client.put("/v1/objects/bkt/big", content=BIG).is_success
        assert client.put("/v1/objects/bkt/small", content=SMALL).is_success
        yield RunningTarget(url, data, registry, client)


def _location(target: RunningTarget, obj: str, **params: str) -> str:
    r = target.client.get(f"/v1/objects/bkt/{obj}", params={"etl_name": "object", **params})
    assert r.status_code == 307, r.text
    return r.headers["location"]


def test_big_objects_are_answered_by_the_transformer(
    target: RunningTarget, transformer_url: str
) -> None:
    location = _location(target, "big")
    assert location.startswith(f"{transformer_url}/bkt/big?")  # the transformer, not the target
    r = httpx.get(f"{target.url}/v1/objects/bkt/big?etl_name=object", follow_redirects=True)
    assert r.status_code == 200 and r.content == BIG.upper()
    assert r.headers["content-length"] == str(len(BIG)) and r.headers["x-sluice-etl"] == "object"
    # etl_args travel signed; a generator result streams (chunked) on the direct path too
    url = f"{target.url}/v1/objects/bkt/big?etl_name=object&etl_args=pieces"
    r = httpx.get(url, follow_redirects=True)
    assert r.content == BIG.upper() and r.headers["transfer-encoding"] == "chunked"
    # small objects are still relayed by the target: no extra hop for them
    r = target.client.get("/v1/objects/bkt/small", params={"etl_name": "object"})
    assert r.status_code == 200 and r.content == SMALL.upper()
    stats = httpx.get(f"{transformer_url}/stats", headers=_bearer()).json()
    assert stats["objects"] >= 3


def _bearer() -> dict[str, str]:
    return {"Authorization": f"Bearer {auth.transformer_token(CLUSTER_KEY, 'object', 'uid-1')}"}


def test_the_transformer_serves_only_what_a_target_signed(
    target: RunningTarget, transformer_url: str
) -> None:
    location = _location(target, "big")
    base, query = location.split("?", 1)
    params = dict(parse_qsl(query))
    assert httpx.get(location).content == BIG.upper()

    def get(path: str, **changes: str | None) -> httpx.Response:
        q = {k: v for k, v in {**params, **changes}.items() if v is not None}
        return httpx.get(f"{transformer_url}{path}?{urlencode(q)}")

    other = str((target.data_dir / "buckets").resolve())  # another file under the data root
    for bad in (
        get("/bkt/small"),  # the signature names the object
        get("/bkt/big", etl_fqn=params["etl_fqn"].replace("big", "small")),  # ... and the file
        get("/bkt/big", etl_args="pieces"),  # ... and the arguments
        get("/bkt/big", sluice_sig=None),
        get("/bkt/big", sluice_sig="0" * 64),
        get("/bkt/big", etl_fqn=other),
    ):
        assert bad.status_code == 401, bad.text
        assert bad.json()["etl"] == "object" and "gateway" in bad.json()["error"]
    expired = auth.sign_direct(
        auth.transformer_token(CLUSTER_KEY, "object", "uid-1"),
        "b/big",
        params["etl_fqn"],
        None,
        now=1_000_000,
    )
    assert get("/bkt/big", **expired).status_code == 401
    unknown = get("/bkt/big", etl_name="object")
    assert unknown.status_code == 400 and "etl_name" in unknown.json()["error"]
    twice = httpx.get(f"{location}&{urlencode({'etl_fqn': params['etl_fqn']})}")
    assert twice.status_code == 400 and twice.json()["kind"] == "InvalidRequest"
    assert twice.json()["error"] == "query parameter 'etl_fqn' given 2 times; give it once"
    assert urlsplit(base).path == "/bkt/big"


def test_failures_keep_their_rules_on_the_direct_path(target: RunningTarget) -> None:
    # a failure after the first byte aborts the client's connection: never a clean short body
    url = f"{target.url}/v1/objects/bkt/big?etl_name=object&etl_args=failmid"
    got = bytearray()
    with pytest.raises(httpx.RemoteProtocolError):
        with httpx.stream("GET", url, follow_redirects=True, timeout=30) as r:
            assert r.status_code == 200
            for chunk in r.iter_bytes():
                got += chunk
    assert 0 < len(got) <= 200_000
    # the object went away between the 307 and the transformer's read: a 404 naming it
    location = _location(target, "big")
    assert target.client.delete("/v1/objects/bkt/big").is_success
    r = httpx.get(location)
    assert r.status_code == 404, r.text
    assert (r.json()["bucket"], r.json()["object"], r.json()["etl"]) == ("bkt", "big", "object")


def test_redirect_threshold_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    assert redirect_bytes_from_env("") == 0  # every object the transformer can read
    assert redirect_bytes_from_env("0") == 0
    assert redirect_bytes_from_env(" OFF ") is None
    with pytest.raises(ValueError, match=REDIRECT_ENV):
        redirect_bytes_from_env("1MiB")
    monkeypatch.setenv(REDIRECT_ENV, "off")
    monkeypatch.setenv("SLUICE_ETL_FQN", "always")
    app = create_target_app("t0", Path("/nonexistent-unused"), DictRegistry())
    assert app.state.target.forwarder.redirect_bytes is None


def test_a_transformer_process_that_dies_is_a_503_to_retry(target: RunningTarget) -> None:
    """The function kills the process running it: a worker process (asyncio here) or
    the inline server process (uvloop). Either way the client gets 503 + Retry-After
    naming the ETL and object, never a 500, and a retry is served once the process
    is replaced."""
    r = target.client.get(
        "/v1/objects/bkt/small", params={"etl_name": "object", "etl_args": "exit"}
    )
    assert r.status_code == 503, r.text
    assert int(r.headers["retry-after"]) > 0
    body = r.json()
    assert body["kind"] in ("WorkerDied", "EtlNotReady"), body
    assert (body["etl"], body["object"]) == ("object", "small"), body
    for _ in range(30):  # what a client does with Retry-After
        r = target.client.get("/v1/objects/bkt/small", params={"etl_name": "object"})
        if r.status_code != 503:
            break
        time.sleep(1)
    assert r.status_code == 200 and r.content == SMALL.upper(), r.text
