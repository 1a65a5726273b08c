"""Copies and offline transforms with the official ``aistore`` SDK over a 3-target ``sluice up``.

``obj.copy(to_obj[, etl])``, ``bucket.copy(to_bck, prefix_filter, prepend,
dry_run)``, ``objects(...).copy(to_bck)`` (``copy-listrange``),
``objects(...).transform(to_bck, etl)`` (``etl-listrange``) and
``objects(...).inspect(etl)``: each job's id is followed with ``Job.wait()``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import cloudpickle
import httpx
import pytest
from aistore.sdk import Client
from aistore.sdk.errors import AISError
from aistore.sdk.etl import ETLConfig
from aistore.sdk.etl.webserver.fastapi_server import FastAPIServer
from aistore.sdk.multiobj import ObjectRange

from etl_runtime.local import LocalCluster

pytestmark = pytest.mark.timeout(300)
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Upper(FastAPIServer):
    def transform(self, data: bytes, path: str, etl_args: str) -> bytes:
        if data.startswith(b"bad"):
            raise ValueError(f"{path} is bad")
        return data.upper()


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with LocalCluster(tmp_path_factory.mktemp("aiscopy") / "data", targets=3) as c:
        client = Client(c.endpoint)
        src = client.bucket("src")
        src.create(exist_ok=True)
        for i in range(6):
            src.object(f"o{i}.txt").get_writer().put_content(f"object {i}".encode())
        src.object("dir/n.txt").get_writer().put_content(b"nested")
        client.etl("upper-etl").init_class()(Upper)
        yield str(c.endpoint)


@pytest.fixture
def ais(up: str) -> Client:
    return Client(up)


def listing(ais: Client, bucket: str) -> dict[str, bytes]:
    bck = ais.bucket(bucket)
    return {e.name: bck.object(e.name).get_reader().read_all() for e in bck.list_all_objects()}


def made(ais: Client, bucket: str) -> None:
    ais.bucket(bucket).create(exist_ok=True)


def test_object_copy_plain_and_through_an_etl(ais: Client, up: str) -> None:
    made(ais, "objcopy")
    src = ais.bucket("src").object("o1.txt")
    src.copy(ais.bucket("objcopy").object("copied/one.txt"))
    src.copy(ais.bucket("objcopy").object("upper.txt"), etl=ETLConfig("upper-etl"))
    assert listing(ais, "objcopy") == {"copied/one.txt": b"object 1", "upper.txt": b"OBJECT 1"}
    with pytest.raises(AISError) as err:
        ais.bucket("src").object("nope.txt").copy(ais.bucket("objcopy").object("x"))
    assert err.value.status_code == 404
    with httpx.Client(base_url=up) as http:
        r = http.put("/v1/objects/src/o1.txt", params={"object_to": "ais/@#/objcopy/y", "x": "1"})
        assert r.status_code == 400 and "x" in r.json()["error"], r.text
        r = http.put(
            "/v1/objects/src/o1.txt",
            params={"object_to": "ais/@#/objcopy/y", "latest-ver": "true"},
        )
        assert r.status_code == 400 and "latest-ver" in r.json()["error"], r.text
    assert "y" not in listing(ais, "objcopy")


def test_bucket_copy_with_prefix_prepend_and_dry_run(ais: Client) -> None:
    job = ais.bucket("src").copy(ais.bucket("dry"), dry_run=True)
    assert ais.job(job).wait(timeout=60, verbose=False).success
    assert listing(ais, "dry") == {}
    job = ais.bucket("src").copy(ais.bucket("bcopy"), prefix_filter="o", prepend="p/")
    assert job.startswith("copy-bck-"), job
    assert ais.job(job).wait(timeout=60, verbose=False).success
    assert listing(ais, "bcopy") == {f"p/o{i}.txt": f"object {i}".encode() for i in range(6)}


def test_copying_a_list_and_a_range(ais: Client) -> None:
    made(ais, "lcopy")
    jobs = ais.bucket("src").objects(obj_names=["o0.txt", "dir/n.txt"]).copy(ais.bucket("lcopy"))
    assert len(jobs) == 1 and jobs[0].startswith("copy-listrange-"), jobs
    assert ais.job(jobs[0]).wait(timeout=60, verbose=False).success
    rng = ObjectRange(prefix="o", min_index=3, max_index=4, suffix=".txt")
    (job,) = ais.bucket("src").objects(obj_range=rng).copy(ais.bucket("lcopy"), prepend="r-")
    assert ais.job(job).wait(timeout=60, verbose=False).success
    assert listing(ais, "lcopy") == {
        "dir/n.txt": b"nested",
        "o0.txt": b"object 0",
        "r-o3.txt": b"object 3",
        "r-o4.txt": b"object 4",
    }


def test_transforming_a_list_and_inspecting(ais: Client) -> None:
    made(ais, "ltrans")
    job = (
        ais.bucket("src")
        .objects(obj_template="o{1..2}.txt")
        .transform(ais.bucket("ltrans"), "upper-etl", ext={"txt": "up"})
    )
    assert job.startswith("etl-listrange-"), job
    assert ais.job(job).wait(timeout=60, verbose=False).success
    assert listing(ais, "ltrans") == {"o1.up": b"OBJECT 1", "o2.up": b"OBJECT 2"}
    job = ais.bucket("src").objects(obj_names=["o5.txt"]).inspect("upper-etl")
    assert ais.job(job).wait(timeout=60, verbose=False).success
    assert "o5.up" not in listing(ais, "src") and len(listing(ais, "src")) == 7


def test_a_listrange_action_with_an_unknown_field_is_a_400_naming_it(ais: Client, up: str) -> None:
    value = {"objnames": ["o0.txt"], "tobck": {"name": "never", "provider": "ais"}}
    with httpx.Client(base_url=up) as http:
        for extra, named in (({"bogus": 1}, "bogus"), ({"force": True}, "force")):
            body = {"action": "copy-listrange", "name": "", "value": {**value, **extra}}
            r = http.post("/v1/buckets/src", params={"provider": "ais"}, json=body)
            assert r.status_code == 400 and named in r.json()["error"], r.text
        body = {"action": "copy-listrange", "value": {**value, "id": "upper-etl"}}
        r = http.post("/v1/buckets/src", json=body)
        assert r.status_code == 400 and "no ETL" in r.json()["error"], r.text
    assert "never" not in [b.name for b in ais.cluster().list_buckets()]


def test_etl_logs_per_target(ais: Client) -> None:
    entries = ais.etl("upper-etl").logs()
    assert len(entries) == 3 and len({e.target_id for e in entries}) == 3, entries
    assert all(isinstance(e.logs, str) for e in entries)
    one = ais.etl("upper-etl").logs(entries[1].target_id)
    assert [e.target_id for e in one] == [entries[1].target_id]
    with pytest.raises(AISError) as err:
        ais.etl("upper-etl").logs("no-such-target")
    assert err.value.status_code == 404 and "no-such-target" in str(err.value)


def test_a_job_whose_objects_fail_ends_with_its_error_count(ais: Client) -> None:
    mixed = ais.bucket("mixed")
    mixed.create(exist_ok=True)
    mixed.object("good.txt").get_writer().put_content(b"good")
    mixed.object("bad.txt").get_writer().put_content(b"bad one")
    made(ais, "mixed-out")
    group = mixed.objects(obj_names=["good.txt", "bad.txt"])
    job = group.transform(ais.bucket("mixed-out"), "upper-etl", continue_on_error=True)
    result = ais.job(job).wait(timeout=60, verbose=False)
    assert not result.success and "1 object(s) failed" in str(result.error), result
    assert "mixed/bad.txt" in str(result.error), result
    assert listing(ais, "mixed-out") == {"good.txt": b"GOOD"}
    errors = ais.etl("upper-etl").view(job).obj_errors  # the job's own, by its id
    assert [e.obj_name for e in errors or []] == ["mixed/bad.txt"], errors
    job = group.transform(ais.bucket("mixed-out"), "upper-etl", prepend="again-")
    result = ais.job(job).wait(timeout=60, verbose=False)  # no coer: the job fails
    assert not result.success and "mixed/bad.txt" in str(result.error), result
    (job,) = mixed.objects(obj_names=["good.txt", "gone.txt"]).copy(
        ais.bucket("mixed-out"), prepend="c-", continue_on_error=True
    )
    result = ais.job(job).wait(timeout=60, verbose=False)
    assert not result.success and "mixed/gone.txt does not exist" in str(result.error), result
    assert listing(ais, "mixed-out")["c-good.txt"] == b"good"
