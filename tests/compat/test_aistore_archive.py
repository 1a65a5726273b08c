"""The official ``aistore`` SDK's ``objects(...).archive()`` over a 3-target ``sluice up``.

``PUT /v1/buckets/{b}`` with the ``archive`` action is an ``archive`` job
(``Job.wait()``): the listed objects, spread over the targets, become one
new tar / tgz / zip object, in another bucket or the same one, appended to
with ``allow_append``; a missing object fails the job (or is counted with
``continue_on_err``); a body the route does not read is a 400, nothing written.
"""

from __future__ import annotations

import io
import tarfile
import zipfile
from collections.abc import Iterator

import httpx
import pytest
from aistore.sdk import Client
from aistore.sdk.errors import AISError
from aistore.sdk.multiobj import ObjectRange

from etl_runtime.local import LocalCluster

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("arch") / "data", targets=3) as c:
        ais = Client(c.endpoint)
        for b in ("src", "shards"):
            ais.bucket(b).create()
        for i in range(10):
            ais.bucket("src").object(f"o{i}.txt").get_writer().put_content(f"object {i}".encode())
        yield c


def tar_members(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]


def wait(ais: Client, job_ids: list[str]) -> None:
    assert len(job_ids) == 1, job_ids
    result = ais.job(job_ids[0]).wait(timeout=60, verbose=False)
    assert result.success, result


def test_a_list_becomes_one_tar_in_another_bucket(up: LocalCluster) -> None:
    ais = Client(up.endpoint)
    names = ["o1.txt", "o7.txt", "o3.txt"]
    jobs = ais.bucket("src").objects(obj_names=names).archive("a.tar", to_bck=ais.bucket("shards"))
    wait(ais, jobs)
    data = ais.bucket("shards").object("a.tar").get_reader().read_all()
    assert tar_members(data) == {n: f"object {n[1]}".encode() for n in names}
    assert list(tar_members(data)) == names  # in the order asked
    snaps = ais.job(jobs[0]).get_details().list_snapshots()
    assert sum(s.stats.objects for s in snaps if s.stats) == 3


def test_a_range_as_tgz_with_source_names_then_appended(up: LocalCluster) -> None:
    ais = Client(up.endpoint)
    rng = ObjectRange(prefix="o", min_index=0, max_index=2, suffix=".txt")
    wait(ais, ais.bucket("src").objects(obj_range=rng).archive("r.tgz", include_source_name=True))
    obj = ais.bucket("src").object("r.tgz")
    assert sorted(tar_members(obj.get_reader().read_all())) == [
        "src/o0.txt",
        "src/o1.txt",
        "src/o2.txt",
    ]
    more = ais.bucket("src").objects(obj_names=["o9.txt"])
    wait(ais, more.archive("r.tgz", include_source_name=True, allow_append=True))
    members = tar_members(obj.get_reader().read_all())
    assert sorted(members) == ["src/o0.txt", "src/o1.txt", "src/o2.txt", "src/o9.txt"]
    assert members["src/o9.txt"] == b"object 9"


def test_a_prefix_as_zip(up: LocalCluster) -> None:
    ais = Client(up.endpoint)
    ais.bucket("src").object("sub/x.txt").get_writer().put_content(b"x")
    ais.bucket("src").object("sub/y.txt").get_writer().put_content(b"y")
    jobs = (
        ais.bucket("src")
        .objects(obj_template="sub/")
        .archive("sub.zip", to_bck=ais.bucket("shards"))
    )
    wait(ais, jobs)
    data = ais.bucket("shards").object("sub.zip").get_reader().read_all()
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        assert {n: z.read(n) for n in z.namelist()} == {"sub/x.txt": b"x", "sub/y.txt": b"y"}


def test_a_missing_object_fails_the_job_or_is_counted(up: LocalCluster) -> None:
    ais = Client(up.endpoint)
    group = ais.bucket("src").objects(obj_names=["o4.txt", "gone.txt"])
    jobs = group.archive("m.tar", to_bck=ais.bucket("shards"))
    result = ais.job(jobs[0]).wait(timeout=60, verbose=False)
    assert not result.success and "gone.txt" in str(result.error), result
    with pytest.raises(AISError) as e:
        ais.bucket("shards").object("m.tar").head()
    assert e.value.status_code == 404
    jobs = group.archive("m.tar", to_bck=ais.bucket("shards"), continue_on_err=True)
    result = ais.job(jobs[0]).wait(timeout=60, verbose=False)
    assert not result.success and "1 object(s) failed" in str(result.error), result
    data = ais.bucket("shards").object("m.tar").get_reader().read_all()
    assert tar_members(data) == {"o4.txt": b"object 4"}


def test_a_body_the_route_does_not_read_is_a_400_and_writes_nothing(up: LocalCluster) -> None:
    url = f"{up.endpoint}/v1/buckets/src"
    value = {"objnames": ["o1.txt"], "archname": "bad.tar", "tobck": {"name": "shards"}}
    cases = [
        ({"action": "archive-listrange", "value": value}, "archive-listrange"),
        ({"action": "archive", "value": {**value, "sparkle": 1}}, "sparkle"),
        ({"action": "archive", "value": {**value, "archname": "bad.tar.lz4"}}, ".tar.lz4"),
        ({"action": "archive", "value": {**value, "objnames": None}}, "objnames"),
    ]
    for body, named in cases:
        r = httpx.put(url, params={"provider": "ais"}, json=body)
        assert r.status_code == 400 and named in r.text, (body, r.text)
    r = httpx.put(url, params={"provider": "ais"})
    assert r.status_code == 400
    assert "bad.tar" not in [
        e.name for e in Client(up.endpoint).bucket("shards").list_all_objects()
    ]
