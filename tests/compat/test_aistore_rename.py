"""The official ``aistore`` SDK's ``bucket.rename(to)`` over a 3-target ``sluice up``.

``move-bck`` is a job: ``Job.wait()`` returns once every object is under the
new name (each read back whole) and the old bucket is gone; a new name that
exists is a 409 and moves nothing; a body or parameter the route does not
read is a 400 naming it.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from aistore.sdk import Client
from aistore.sdk.errors import AISError

from etl_runtime.local import LocalCluster

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("mv") / "data", targets=3) as c:
        yield c


def fill(ais: Client, bucket: str, count: int) -> None:
    bck = ais.bucket(bucket)
    bck.create()
    for i in range(count):
        bck.object(f"d/o{i:02d}").get_writer().put_content(f"object {i}".encode() * 100)


def bucket_names(ais: Client) -> list[str]:
    return sorted(b.name for b in ais.cluster().list_buckets())


def test_rename_moves_every_object_and_drops_the_old_bucket(up: LocalCluster) -> None:
    ais = Client(up.endpoint)
    fill(ais, "old", 12)
    bck = ais.bucket("old")
    job_id = bck.rename("new")
    assert job_id.startswith("move-bck-"), job_id
    assert bck.name == "new"  # the SDK's own object follows the rename
    result = ais.job(job_id).wait(timeout=60, verbose=False)
    assert result.success, result
    assert "old" not in bucket_names(ais) and "new" in bucket_names(ais)
    names = [e.name for e in ais.bucket("new").list_all_objects()]
    assert names == [f"d/o{i:02d}" for i in range(12)]
    for i in (0, 7, 11):
        got = ais.bucket("new").object(f"d/o{i:02d}").get_reader().read_all()
        assert got == f"object {i}".encode() * 100
    with pytest.raises(AISError) as e:
        ais.bucket("old").head()
    assert e.value.status_code == 404
    # the old name is free again, and a later look at the job does not touch it
    ais.bucket("old").create()
    ais.bucket("old").object("fresh").get_writer().put_content(b"fresh")
    assert ais.job(job_id).wait(timeout=60, verbose=False).success
    assert ais.bucket("old").object("fresh").get_reader().read_all() == b"fresh"


def test_rename_into_an_existing_bucket_is_a_409_that_moves_nothing(up: LocalCluster) -> None:
    ais = Client(up.endpoint)
    fill(ais, "keep1", 2)
    ais.bucket("keep2").create()
    with pytest.raises(AISError) as e:
        ais.bucket("keep1").rename("keep2")
    assert e.value.status_code == 409 and "keep2" in str(e.value)
    assert len(list(ais.bucket("keep1").list_all_objects())) == 2
    assert list(ais.bucket("keep2").list_all_objects()) == []


def test_a_bad_rename_is_a_400_naming_it(up: LocalCluster) -> None:
    ais = Client(up.endpoint)
    fill(ais, "stay", 1)
    url = f"{up.endpoint}/v1/buckets/stay"
    params = {"provider": "ais", "bck_to": "ais/@#/elsewhere/"}
    r = httpx.post(url, params=params, json={"action": "move-bck", "value": {"x": 1}})
    assert r.status_code == 400 and "takes no value" in r.text
    r = httpx.post(url, params={**params, "force": "true"}, json={"action": "move-bck"})
    assert r.status_code == 400 and "force" in r.text
    r = httpx.post(url, params={"provider": "ais"}, json={"action": "move-bck"})
    assert r.status_code == 400 and "bck_to" in r.text
    assert bucket_names(ais).count("stay") == 1 and "elsewhere" not in bucket_names(ais)
