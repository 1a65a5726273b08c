"""An AIStore user creates ETLs with the official ``aistore`` SDK (2.0.x) against a
real ``sluice up``: ``init_class`` runs their ``ETLServer`` subclass in Sluice's
runtime (docs/aistore.md)."""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterator

import cloudpickle
import pytest
import requests

from etl_runtime import Client as SluiceClient
from etl_runtime.core.spec import runtime_python_version
from etl_runtime.local import LocalCluster

aistore = pytest.importorskip("aistore")
from aistore.sdk import Client  # noqa: E402
from aistore.sdk.errors import AISError  # noqa: E402
from aistore.sdk.etl import ETLConfig  # noqa: E402
from aistore.sdk.etl.webserver import serialize_class  # noqa: E402
from aistore.sdk.etl.webserver.fastapi_server import FastAPIServer  # noqa: E402

# The classes travel by value, as a notebook's or a script's (__main__) would.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Md5(FastAPIServer):
    def transform(self, data: bytes, path: str, etl_args: str) -> bytes:
        return f"{hashlib.md5(data).hexdigest()} {path} {etl_args}".strip().encode()


class XxHash(FastAPIServer):
    def __init__(self) -> None:
        super().__init__()
        import xxhash  # a dependency: installed by Sluice before the ETL is ready

        self.hasher = xxhash.xxh64

    def transform(self, data: bytes, path: str, etl_args: str) -> bytes:
        import xxhash

        where = "deps" if "/etl/deps/" in xxhash.__file__ else xxhash.__file__
        return f"{self.hasher(data).hexdigest()} {where}".encode()


class Picky(FastAPIServer):
    def transform(self, data: bytes, path: str, etl_args: str) -> bytes:
        if data.startswith(b"bad"):
            raise ValueError(f"{path} is bad")
        return data.upper()


class Sleepy(FastAPIServer):
    """Sleeps past its ``obj_timeout`` on objects that start with ``slow``; says so first."""

    def transform(self, data: bytes, path: str, etl_args: str) -> bytes:
        import time

        if data.startswith(b"slow"):
            print(f"sleepy-call {path}", flush=True)  # counted in the ETL's logs
            time.sleep(6)
        return data.upper()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with LocalCluster(tmp_path_factory.mktemp("aisetl") / "data", targets=2) as c:
        ais = Client(c.endpoint)
        bck = ais.bucket("src")
        bck.create(exist_ok=True)
        for name, body in (
            ("a.txt", b"hello"),
            ("dir/b.txt", b"world"),
            ("bad.txt", b"bad!"),
            ("slow.txt", b"slow"),
        ):
            bck.object(name).get_writer().put_content(body)
        yield c.endpoint


def md5_of(data: bytes, path: str, args: str = "") -> bytes:
    return f"{hashlib.md5(data).hexdigest()} {path} {args}".strip().encode()


def test_init_class_then_get_through_the_sdk_and_plain_http(cluster: str) -> None:
    ais = Client(cluster)
    etl = ais.etl("md5-etl")
    etl.init_class(NUM_WORKERS=2)(Md5)  # answers once the ETL runs, as AIStore does
    obj = ais.bucket("src").object("dir/b.txt")
    assert obj.get_reader(etl=ETLConfig("md5-etl")).read_all() == md5_of(b"world", "src/dir/b.txt")
    got = obj.get_reader(etl=ETLConfig("md5-etl", args="x=1")).read_all()
    assert got == md5_of(b"world", "src/dir/b.txt", "x=1")
    r = requests.get(f"{cluster}/v1/objects/src/a.txt", params={"etl_name": "md5-etl"})
    assert r.status_code == 200 and r.content == md5_of(b"hello", "src/a.txt")

    # a bucket-to-bucket transform through the same class
    job = ais.bucket("src").transform("md5-etl", to_bck=ais.bucket("dst"), prefix_filter="dir/")
    SluiceClient(cluster).job(job).wait(timeout=60)
    assert ais.bucket("dst").object("dir/b.txt").get_reader().read_all() == md5_of(
        b"world", "src/dir/b.txt"
    )

    # AIStore's views, and Sluice's own SDK
    infos = {i.id: i for i in ais.cluster().list_etls()}
    assert infos["md5-etl"].stage == "Running" and infos["md5-etl"].obj_count >= 3
    view = etl.view()
    assert view.init_msg.name == "md5-etl" and view.init_msg.obj_timeout == "45s"
    assert view.init_msg.runtime.image == f"aistorage/runtime_python:{runtime_python_version()}"
    details = SluiceClient(cluster).etl("md5-etl").details()
    assert details.phase == "Running" and details.ready == details.total == 2
    assert details.spec["code"]["aisClass"].endswith("characters>")  # the class is not shown
    assert details.spec["workers"] == 2 and details.spec["timeouts"]["requestSeconds"] == 45


def test_stop_start_delete(cluster: str) -> None:
    ais = Client(cluster)
    etl = ais.etl("upper-etl")
    etl.init_class()(Picky)
    obj = ais.bucket("src").object("a.txt")
    assert obj.get_reader(etl=ETLConfig("upper-etl")).read_all() == b"HELLO"
    etl.stop()
    assert "upper-etl" not in [i.id for i in ais.cluster().list_etls()]  # Running only
    assert [i.stage for i in ais.cluster().list_etls(["Aborted"]) if i.id == "upper-etl"] == [
        "Aborted"
    ]
    r = requests.get(f"{cluster}/v1/objects/src/a.txt", params={"etl_name": "upper-etl"})
    assert r.status_code == 409
    etl.start()  # waits until it runs again, as AIStore's does
    assert obj.get_reader(etl=ETLConfig("upper-etl")).read_all() == b"HELLO"
    etl.stop()
    etl.delete()
    assert "upper-etl" not in [e.name for e in SluiceClient(cluster).list_etls()]


def test_an_exception_in_transform_is_a_422_naming_etl_and_object(cluster: str) -> None:
    ais = Client(cluster)
    ais.etl("picky-etl").init_class()(Picky)
    with pytest.raises(AISError) as e:
        ais.bucket("src").object("bad.txt").get_reader(etl=ETLConfig("picky-etl")).read_all()
    assert e.value.status_code == 422
    r = requests.get(f"{cluster}/v1/objects/src/bad.txt", params={"etl_name": "picky-etl"})
    body = r.json()
    assert r.status_code == 422 and body["kind"] == "TransformError"
    assert (body["etl"], body["bucket"], body["object"]) == ("picky-etl", "src", "bad.txt")
    assert "ValueError: src/bad.txt is bad" in body["error"]
    errors = ais.etl("picky-etl").view().obj_errors
    assert errors and errors[-1].obj_name == "src/bad.txt" and errors[-1].ecode == 422


def test_an_object_past_obj_timeout_fails_once_naming_etl_object_and_timeout(cluster: str) -> None:
    """AIStore fails such an object once; a 504 would have the SDK try it six times
    (about 100 s). The ETL's logs count what the transformer was asked."""
    ais = Client(cluster)
    etl = ais.etl("sleepy-etl")
    etl.init_class(obj_timeout="2s")(Sleepy)

    def calls() -> int:
        return sum(e.logs.count("sleepy-call src/slow.txt") for e in etl.logs())

    src = ais.bucket("src")
    assert src.object("a.txt").get_reader(etl=ETLConfig("sleepy-etl")).read_all() == b"HELLO"
    with pytest.raises(AISError) as e:
        src.object("slow.txt").get_reader(etl=ETLConfig("sleepy-etl")).read_all()
    assert e.value.status_code == 422, e.value
    body = json.loads(e.value.message)
    assert body["kind"] == "TransformTimeout" and "2s" in body["error"], body
    assert (body["etl"], body["object"]) == ("sleepy-etl", "slow.txt"), body
    assert calls() == 1  # asked once: the SDK did not retry

    # An offline transform counts it as one failed object and goes on.
    job = src.objects(obj_names=["a.txt", "slow.txt"]).transform(
        ais.bucket("sleepy-out"), "sleepy-etl", continue_on_error=True
    )
    result = ais.job(job).wait(timeout=60, verbose=False)
    assert not result.success and "1 object(s) failed" in str(result.error), result
    assert "src/slow.txt" in str(result.error) and "2s" in str(result.error), result
    (err,) = etl.view(job).obj_errors or []
    assert err.obj_name == "src/slow.txt" and "timeout" in err.msg, err
    assert ais.bucket("sleepy-out").object("a.txt").get_reader().read_all() == b"HELLO"
    assert calls() == 2
    etl.stop()
    etl.delete()


def test_dependencies_are_installed_before_the_etl_runs(cluster: str) -> None:
    xxhash = pytest.importorskip("xxhash")  # the expected answer (PyPI must be reachable)

    ais = Client(cluster)
    ais.etl("xxhash-etl").init_class(dependencies=["xxhash"])(XxHash)
    got = ais.bucket("src").object("a.txt").get_reader(etl=ETLConfig("xxhash-etl")).read_all()
    # ... from the copy pip installed for this ETL (DIR/etl/deps/<etl>/<target>)
    assert got == f"{xxhash.xxh64(b'hello').hexdigest()} deps".encode()
    spec = SluiceClient(cluster).etl("xxhash-etl").details().spec
    assert spec["dependencies"] == ["xxhash"]


def test_another_python_is_refused_clearly(cluster: str) -> None:
    other = "3.10" if runtime_python_version() != "3.10" else "3.12"
    message = {  # what init_class sends from a Python `other` client
        "name": "old-py-etl",
        "communication": "hpush://",
        "init_timeout": "1m",
        "obj_timeout": "45s",
        "support_direct_put": True,
        "runtime": {
            "image": f"aistorage/runtime_python:{other}",
            "env": [{"name": "ETL_CLASS_PAYLOAD", "value": serialize_class(Md5)}],
        },
    }
    r = requests.put(f"{cluster}/v1/etl", json=message, timeout=90)
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["kind"] == "EtlInitFailed" and body["etl"] == "old-py-etl"
    assert f"the ETL class was pickled with Python {other}" in body["error"]
    assert f"this transformer runs Python {runtime_python_version()}" in body["error"]
    SluiceClient(cluster).etl("old-py-etl").delete()


def test_os_packages_and_hpull_images_are_refused_locally(cluster: str) -> None:
    ais = Client(cluster)
    with pytest.raises(AISError) as e:
        ais.etl("ffmpeg-etl").init_class(os_packages=["ffmpeg"])(Md5)
    assert e.value.status_code == 400 and "os_packages" in e.value.message
    # images themselves run (tests/compat/test_aistore_image.py), spoken to with hpush
    with pytest.raises(AISError) as e:
        ais.etl("image-etl").init(image="aistorage/transformer_md5:latest", comm_type="hpull")
    assert e.value.status_code == 400
    assert "Sluice's targets speak hpush:// to ETL images" in e.value.message
    names = [e.name for e in SluiceClient(cluster).list_etls()]
    assert "ffmpeg-etl" not in names and "image-etl" not in names
