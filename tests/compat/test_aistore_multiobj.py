"""The official ``aistore`` SDK's multi-object delete over a 3-target ``sluice up``.

``bucket.objects(obj_names=... | obj_range=... | obj_template=...).delete()``
sends ``DELETE /v1/buckets/{b}`` with a ``delete-listrange`` action message:
those objects go, the bucket and the other objects stay, and the answer is a
job id ``Job.wait()`` follows. A body the route does not understand deletes
nothing and is a 400 naming the action and the bucket.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from aistore.sdk import Client
from aistore.sdk.multiobj import ObjectRange

from etl_runtime.local import LocalCluster

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("multiobj") / "data", targets=3) as c:
        yield c


def fill(ais: Client, bucket: str, count: int) -> None:
    bck = ais.bucket(bucket)
    bck.create(exist_ok=True)
    for i in range(count):
        bck.object(f"o{i:02d}.txt").get_writer().put_content(f"object {i}".encode())


def names(ais: Client, bucket: str) -> list[str]:
    return [e.name for e in ais.bucket(bucket).list_all_objects()]


def test_deleting_two_of_six_objects_keeps_the_bucket_and_the_other_four(
    up: LocalCluster,
) -> None:
    ais = Client(up.endpoint)
    fill(ais, "six", 6)
    job_id = ais.bucket("six").objects(obj_names=["o01.txt", "o04.txt"]).delete()
    assert job_id.startswith("delete-listrange-"), job_id
    result = ais.job(job_id).wait(timeout=60, verbose=False)
    assert result.success and not result.error, result
    assert names(ais, "six") == ["o00.txt", "o02.txt", "o03.txt", "o05.txt"]
    assert "six" in [b.name for b in ais.cluster().list_buckets()]
    assert ais.bucket("six").object("o05.txt").get_reader().read_all() == b"object 5"
    snaps = ais.job(job_id).get_details().list_snapshots()
    assert sum(s.stats.objects for s in snaps if s.stats) == 2


def test_range_and_template_deletes(up: LocalCluster) -> None:
    ais = Client(up.endpoint)
    fill(ais, "ranged", 10)
    rng = ObjectRange(prefix="o", min_index=2, max_index=5, pad_width=2, suffix=".txt")
    job_id = ais.bucket("ranged").objects(obj_range=rng).delete()
    assert ais.job(job_id).wait(timeout=60, verbose=False).success
    assert names(ais, "ranged") == [f"o{i:02d}.txt" for i in (0, 1, 6, 7, 8, 9)]
    job_id = ais.bucket("ranged").objects(obj_template="o0{7..9}.txt").delete()
    assert ais.job(job_id).wait(timeout=60, verbose=False).success
    assert names(ais, "ranged") == ["o00.txt", "o01.txt", "o06.txt"]
    # a template without a range is a prefix, as in AIStore
    job_id = ais.bucket("ranged").objects(obj_template="o0").delete()
    assert ais.job(job_id).wait(timeout=60, verbose=False).success
    assert names(ais, "ranged") == []
    assert "ranged" in [b.name for b in ais.cluster().list_buckets()]


def test_missing_names_are_skipped_not_errors(up: LocalCluster) -> None:
    ais = Client(up.endpoint)
    fill(ais, "partly", 3)
    job_id = ais.bucket("partly").objects(obj_names=["o00.txt", "nope.txt"]).delete()
    assert ais.job(job_id).wait(timeout=60, verbose=False).success
    assert names(ais, "partly") == ["o01.txt", "o02.txt"]
    with httpx.Client(base_url=up.endpoint, timeout=30) as http:
        view = http.get(f"/v1/jobs/{job_id}").json()
    assert view["progress"]["objects"] == 1 and view["progress"]["skipped"] == 1
    assert view["output"]["missing"] == ["nope.txt"]


def test_a_body_the_route_does_not_read_deletes_nothing(up: LocalCluster) -> None:
    ais = Client(up.endpoint)
    fill(ais, "kept", 3)
    bodies = [
        ({"action": "delete-objects", "value": {"objnames": ["o00.txt"]}}, "'delete-objects'"),
        ({"action": "delete-listrange", "value": {"names": ["o00.txt"]}}, "names"),
        ({"action": "delete-listrange", "value": {}}, "objnames"),
        ({"action": "destroy-bck", "value": {"objnames": ["o00.txt"]}}, "takes no value"),
        ({"action": "delete-listrange", "value": {"objnames": []}, "extra": 1}, "extra"),
        ({"objnames": ["o00.txt"]}, "action message"),
        (["o00.txt"], "action message"),
    ]
    with httpx.Client(base_url=up.endpoint, timeout=30) as http:
        for body, named in bodies:
            r = http.request("DELETE", "/v1/buckets/kept", json=body)
            assert r.status_code == 400, (body, r.text)
            assert named in r.json()["error"] and r.json()["bucket"] == "kept", r.text
        r = http.request("DELETE", "/v1/buckets/kept", content=b"not json")
        assert r.status_code == 400 and "JSON" in r.json()["error"]
        r = http.delete("/v1/buckets/kept", params={"keep": "1"})
        assert r.status_code == 400 and "keep" in r.json()["error"]
    assert names(ais, "kept") == ["o00.txt", "o01.txt", "o02.txt"]
    # the whole bucket still goes when that is what is asked
    ais.bucket("kept").delete()
    assert "kept" not in [b.name for b in ais.cluster().list_buckets()]
    with httpx.Client(base_url=up.endpoint, timeout=30) as http:
        http.post("/v1/buckets/plain", json={"action": "create-bck"}).raise_for_status()
        assert http.delete("/v1/buckets/plain").json() == {"bucket": "plain", "deleted": True}


def test_evicting_objects_of_an_ais_bucket_is_a_400_that_deletes_nothing(
    up: LocalCluster,
) -> None:
    ais = Client(up.endpoint)
    fill(ais, "local", 2)
    for value in ({"objnames": ["o00.txt"]}, {"template": "o0{0..1}.txt"}, {"template": "o"}):
        with httpx.Client(base_url=up.endpoint, timeout=30) as http:
            r = http.request(
                "DELETE",
                "/v1/buckets/local",
                params={"provider": "ais"},
                json={"action": "evict-listrange", "name": "", "value": value},
            )
        assert r.status_code == 400, r.text
        assert "not a remote" in r.json()["error"] and r.json()["bucket"] == "local", r.text
    assert names(ais, "local") == ["o00.txt", "o01.txt"]
