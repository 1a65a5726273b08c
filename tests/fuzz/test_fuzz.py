"""Bounded, seeded fuzzing of the gateway and a target (issues 8 and 14).

schemathesis generates requests from each server's OpenAPI (FastAPI serves
``/openapi.json``), with a fixed number of examples and ``derandomize`` so a
run is repeatable; hand-written hostile cases add what a schema cannot say:
path tricks, broken framing, hostile headers and bodies. Every answer must be
below 500 and every server must still answer its health check afterwards.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.gateway.conftest import Cluster, run_cluster

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402

EXAMPLES = 6  # per operation; with ~20 operations, a few hundred requests


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with run_cluster(tmp_path_factory.mktemp("fuzz")) as c:
        c.client.post("/v1/buckets/bkt", json={"action": "create-bck"})
        c.client.put("/v1/objects/bkt/o", content=b"hello")
        yield c


@pytest.mark.parametrize("server", ["gateway", "target"])
def test_openapi_fuzz_never_500(fuzzed: Cluster, server: str) -> None:
    url = fuzzed.url if server == "gateway" else fuzzed.targets[0].url
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    fives: list[str] = []
    calls = [0]

    for result in schema.get_all_operations():
        operation = result.ok()

        @given(case=operation.as_strategy())
        @settings(
            max_examples=EXAMPLES,
            derandomize=True,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def call(case) -> None:  # type: ignore[no-untyped-def]
            response = case.call(base_url=url, timeout=30)
            calls[0] += 1
            if response.status_code >= 500:
                fives.append(f"{case.method} {case.formatted_path}: {response.text[:200]}")

        call()
    assert calls[0] > 50
    assert not fives, fives
    assert httpx.get(f"{url}/v1/health", timeout=10).status_code == 200


def raw(url: str, request: bytes) -> bytes:
    """Send bytes as they are (no client fixes them up); the answer's first line."""
    u = urlsplit(url)
    with socket.create_connection((u.hostname, u.port), timeout=10) as s:
        s.sendall(request)
        s.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data.split(b"\r\n", 1)[0]


HOSTILE_PATHS = [
    "/v1/objects/bkt/..",
    "/v1/objects/bkt/%2e%2e/%2e%2e/etc/passwd",
    "/v1/objects/bkt/a%00b",
    "/v1/objects/bkt/" + "n" * 4096,
    "/v1/objects/bkt/" + "/".join(["d"] * 600),
    "/v1/buckets/a%0Ab",
    "/v1/objects/a%0Ab/o",
    "/v1/objects/bkt/o?etl_fqn=/etc/passwd",
    "/v1/objects/bkt/o?etl_name=nope&etl_args=%ff%fe",
    "/v1/objects/bkt/o?etl_name=nope&etl_args=" + "x" * 8000,
    "/v1/objects/bkt/o?etl_pipeline=a,b",
    "/v1/etl/..%2f..",
    "/v1/etl/x/logs?tail=-1",
    "/v1/buckets/bkt?limit=0",
]
SPEC_BODIES = [
    {"name": "e", "spec": {"code": {"source": "x"}, "timeouts": "soon"}},
    {"name": "e", "spec": {"code": {"source": "x"}, "env": "A=1"}},
    {"name": "e", "spec": {"code": {"source": 7}}},
    {"name": "e", "spec": {"code": {"source": "x"}, "timeouts": {"initSeconds": "1"}}},
    {"name": "e", "spec": {"code": {"source": "x"}, "workers": "two"}},
    {"name": "e", "spec": {"code": {"source": "x"}, "env": [1, 2]}},
    {"name": "e", "spec": {"code": {"source": "x"}, "dependencies": "numpy"}},
    {"name": "e\n", "spec": {"code": {"source": "x"}}},
    {"name": 5, "spec": []},
    {"name": "e", "spec": {"code": {"source": "x"}, "mode": ["object"]}},
    # AIStore's init message (gateway/aisetl.py), with the wrong types
    {"name": "e", "runtime": 7},
    {"name": "e", "runtime": {"image": 5, "env": "A=1"}},
    {"name": "e", "runtime": {"image": "i"}, "env": [{"name": 1}], "init_timeout": 5},
    {"name": "e", "spec": "cG9k", "communication": ["hpush://"]},
    {"name": "e", "spec": {}, "runtime": {}},
    {
        "name": "e",
        "init_timeout": "1s",
        "runtime": {
            "image": "aistorage/runtime_python:3.11",
            "env": [{"name": "ETL_CLASS_PAYLOAD", "value": "bm90IGEgcGlja2xl"}],
        },
    },
]


def test_hostile_requests_never_500(fuzzed: Cluster, tmp_path: Path) -> None:
    urls = [fuzzed.url, fuzzed.targets[0].url]
    statuses: list[tuple[str, int]] = []
    with httpx.Client(timeout=30) as c:
        for base in urls:
            for path in HOSTILE_PATHS:
                for method in ("GET", "PUT", "DELETE", "HEAD", "POST"):
                    r = c.request(method, base + path, content=b"x" if method == "PUT" else None)
                    statuses.append((f"{method} {path[:60]}", r.status_code))
            # deep JSON, and specs with the wrong types
            deep = "[" * 100_000 + "]" * 100_000
            for body in [deep, *(json.dumps(b) for b in SPEC_BODIES)]:
                r = c.put(base + "/v1/etl", content=body)
                statuses.append((f"PUT /v1/etl {body[:40]}", r.status_code))
            r = c.post(base + "/v1/buckets/bkt", content='{"action": ' + deep + "}")
            statuses.append(("deep bucket action", r.status_code))
            # huge and duplicate headers, broken range and conditionals
            for headers in [
                {"X-Big": "v" * 60_000},
                {"Range": "bytes=" + ",".join(["1-2"] * 2000)},
                {"Range": "bytes=99999999999999999999-"},
                {"If-Match": "*" * 5000, "If-None-Match": '"a", W/"b"'},
                {"If-Range": "Mon, 99 Foo 2099"},
            ]:
                r = c.get(base + "/v1/objects/bkt/o", headers=headers)
                statuses.append((f"GET with {list(headers)}", r.status_code))
        for base in urls:
            host = urlsplit(base).netloc.encode()
            for req in [
                b"PUT /v1/objects/bkt/te HTTP/1.1\r\nHost: " + host + b"\r\n"
                b"Transfer-Encoding: gzip, chunked, zz\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
                b"PUT /v1/objects/bkt/te HTTP/1.1\r\nHost: " + host + b"\r\n"
                b"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\nzz\r\n",
                b"PUT /v1/objects/bkt/cl HTTP/1.1\r\nHost: " + host + b"\r\n"
                b"Content-Length: 5\r\nContent-Length: 7\r\n\r\nabcde",
                b"PUT /v1/objects/bkt/short HTTP/1.1\r\nHost: " + host + b"\r\n"
                b"Content-Length: 100000\r\n\r\ntruncated",
                b"GET /v1/objects/bkt/o HTTP/1.1\r\nHost: "
                + host
                + b"\r\n"
                + b"X-Dup: 1\r\n" * 500
                + b"\r\n",
            ]:
                line = raw(base, req)
                status = int(line.split()[1]) if line.startswith(b"HTTP/") else 0
                statuses.append((req[:40].decode(errors="replace"), status))
    fives = [(what, s) for what, s in statuses if s >= 500]
    assert not fives, fives
    assert len(statuses) > 150
    for base in urls:  # no process crashed, nothing outside the data root was read
        assert httpx.get(base + "/v1/health", timeout=10).status_code == 200
    # and still serves data (the cases above deleted bucket b on purpose)
    fuzzed.client.post("/v1/buckets/after", json={"action": "create-bck"})
    assert fuzzed.client.put("/v1/objects/after/o", content=b"ok").status_code == 200
    assert fuzzed.client.get("/v1/objects/after/o").content == b"ok"
