"""AIStore ETL classes (``spec.code.aisClass``, the aistore SDK's ``init_class``)
in a real transformer: one instance per worker, ``transform(data, path, etl_args)``
per object (bytes, or the file's path with ``ETL_DIRECT_FQN``), ``transform_stream``,
errors as 422 naming the object, and the start-up refusals (another Python, a
module the runtime lacks, a class that transforms nothing)."""

from __future__ import annotations

import base64
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import httpx
import pytest

from etl_runtime.core.spec import runtime_python_version
from tests.webserver.conftest import AUTH, TOKEN, last_line, run_to_exit, transformer

aistore = pytest.importorskip("aistore")
from aistore.sdk.etl.webserver.fastapi_server import FastAPIServer  # noqa: E402
from aistore.sdk.etl.webserver.http_multi_threaded_server import (  # noqa: E402
    HTTPMultiThreadedServer,
)

cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Echo(FastAPIServer):
    """Says what it was given; counts its calls (one instance per worker)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def transform(self, data: bytes | str, path: str, etl_args: str) -> bytes:
        self.calls += 1
        if etl_args == "raise":
            raise ValueError(f"cannot handle {path}")
        if isinstance(data, str):  # ETL_DIRECT_FQN: the file's path
            with open(data, "rb") as f:
                content, kind = f.read(), "path:" + data
        else:
            content, kind = data, "bytes"
        said = {
            "kind": kind,
            "path": path,
            "args": etl_args,
            "data": content.decode(),
            "pid": os.getpid(),
            "calls": self.calls,
        }
        return json.dumps(said).encode()


class Upper(HTTPMultiThreadedServer):
    """Streams: reads 4 bytes at a time, yields each piece upper-cased."""

    def transform_stream(self, reader: Any, path: str, etl_args: str) -> Iterator[bytes]:
        if etl_args == "early":
            raise ValueError(f"refusing {path}")
        yield f"{path}|{etl_args}|".encode()
        while piece := reader.read(4):
            if piece == b"boom":
                raise RuntimeError("boom in the stream")
            yield piece.upper()


class Nothing(FastAPIServer):
    pass


def class_code(cls: type, python_version: str | None = None) -> dict[str, Any]:
    return {
        "aisClass": base64.b64encode(cloudpickle.dumps(cls)).decode(),
        "pythonVersion": python_version or runtime_python_version(),
    }


def put(url: str, path: str, body: bytes = b"", **params: str) -> httpx.Response:
    return httpx.put(f"{url}/{path}", content=body, params=params, headers=AUTH, timeout=30)


@pytest.fixture(scope="module", params=["workers", "inline"])
def echo(request: pytest.FixtureRequest) -> Iterator[str]:
    spec = {"mode": "object", "code": class_code(Echo)}
    env = {"SLUICE_ETL_TOKEN": TOKEN}
    if request.param == "inline":
        env["SLUICE_INLINE"] = "1"
    with transformer(f"echo-{request.param}", spec, workers=1, **env) as url:
        yield url


def test_transform_gets_bytes_path_and_args_from_one_instance(echo: str, tmp_path: Path) -> None:
    first = put(echo, "bkt/dir/a.txt", b"hello", etl_args="x=1")
    assert first.status_code == 200, first.text
    said = first.json()
    assert (said["kind"], said["path"], said["args"], said["data"]) == (
        "bytes",
        "bkt/dir/a.txt",
        "x=1",
        "hello",
    )
    # etl_args absent: "" as in AIStore; the file the target names is read for the class
    obj = tmp_path / "b.txt"
    obj.write_bytes(b"from the file")
    again = put(echo, "bkt/b.txt", etl_fqn=str(obj)).json()
    assert (again["kind"], again["args"], again["data"]) == ("bytes", "", "from the file")
    # the same instance (one worker): it was made once, at start
    assert again["pid"] == said["pid"] and again["calls"] == said["calls"] + 1


def test_an_exception_is_a_422_naming_the_object(echo: str) -> None:
    r = put(echo, "bkt/bad.txt", b"x", etl_args="raise")
    assert r.status_code == 422
    body = r.json()
    assert body["kind"] == "TransformError" and body["object"] == "bkt/bad.txt"
    assert body["etl"].startswith("echo-")
    assert "ValueError: cannot handle bkt/bad.txt" in body["error"]
    assert put(echo, "bkt/ok.txt", b"ok").status_code == 200  # the worker goes on


def test_direct_fqn_hands_the_class_the_files_path(tmp_path: Path) -> None:
    spec = {"mode": "object", "code": class_code(Echo), "env": {"ETL_DIRECT_FQN": "true"}}
    obj = tmp_path / "c.txt"
    obj.write_bytes(b"on disk")
    with transformer("echo-direct", spec, workers=1, SLUICE_ETL_TOKEN=TOKEN) as url:
        said = put(url, "bkt/c.txt", etl_fqn=str(obj)).json()
        assert said["kind"] == f"path:{obj}" and said["data"] == "on disk"
        # no file (a body, as for a later pipeline stage): bytes, as AIStore does
        assert put(url, "bkt/c.txt", b"pushed").json()["kind"] == "bytes"


def test_transform_stream_streams_from_the_file_or_the_body(tmp_path: Path) -> None:
    spec = {"mode": "object", "code": class_code(Upper)}
    obj = tmp_path / "d.txt"
    obj.write_bytes(b"abcdefghij")
    with transformer("upper-stream", spec, workers=2, SLUICE_ETL_TOKEN=TOKEN) as url:
        r = put(url, "bkt/d.txt", etl_fqn=str(obj), etl_args="a")
        assert r.status_code == 200 and r.content == b"bkt/d.txt|a|ABCDEFGHIJ"
        assert "content-length" not in r.headers  # chunks, as the class yields them
        assert put(url, "bkt/e.txt", b"body").content == b"bkt/e.txt||BODY"
        early = put(url, "bkt/f.txt", b"x", etl_args="early")
        assert early.status_code == 422 and early.json()["object"] == "bkt/f.txt"
        assert "ValueError: refusing bkt/f.txt" in early.json()["error"]
        # an error after the first chunk aborts the answer: never a clean short body
        with pytest.raises(httpx.HTTPError):
            put(url, "bkt/g.txt", b"boom")


def test_another_python_is_refused_at_start() -> None:
    other = "3.99"
    proc = run_to_exit("old-class", {"code": class_code(Echo, python_version=other)})
    assert proc.returncode == 2
    line = last_line(proc.stderr)
    assert "sluice: ETL 'old-class':" in line
    assert f"the ETL class was pickled with Python {other}" in line
    assert f"runs Python {runtime_python_version()}" in line


def test_a_class_that_transforms_nothing_is_refused() -> None:
    proc = run_to_exit("nothing", {"code": class_code(Nothing)})
    assert proc.returncode == 2
    assert "overrides neither transform nor transform_stream" in last_line(proc.stderr)


def test_a_module_the_runtime_lacks_is_named(tmp_path: Path, monkeypatch: Any) -> None:
    (tmp_path / "sluice_test_only_mod.py").write_text(
        "from aistore.sdk.etl.webserver.fastapi_server import FastAPIServer\n"
        "class Mine(FastAPIServer):\n"
        "    def transform(self, data, path, etl_args):\n"
        "        return data\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import sluice_test_only_mod  # pickled by reference: the transformer cannot import it

    code = class_code(sluice_test_only_mod.Mine)
    proc = run_to_exit("lacks-mod", {"code": code})
    assert proc.returncode == 2
    line = last_line(proc.stderr)
    assert "needs the module 'sluice_test_only_mod'" in line and "dependencies" in line
