"""The official ``aistore`` SDK's ``objects(...).prefetch()`` over a 3-target ``sluice up``
whose ``aws`` buckets live in a real MinIO on loopback.

``prefetch-listrange`` is a ``prefetch`` job: each name's owner fetches it
into its cache, ``Job.wait()`` follows it, a name the backend lacks fails
the job (or is counted with ``continue_on_error``), and an ``ais`` bucket is
a 400 saying it is not a remote bucket.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from unittest import mock

import httpx
import pytest
from aistore.sdk import Client
from aistore.sdk.errors import InvalidBckProvider

from etl_runtime.local import LocalCluster
from tests.providers.minio import MinioServer

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def minio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MinioServer]:
    data = tmp_path_factory.mktemp("pf-minio") / "data"
    data.mkdir()
    server = MinioServer(data).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def up(minio: MinioServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with (
        mock.patch.dict(os.environ, minio.env()),
        LocalCluster(tmp_path_factory.mktemp("pf") / "data", targets=3) as c,
    ):
        yield c


def remote_bucket(minio: MinioServer, count: int) -> str:
    name = f"pf-{uuid.uuid4().hex[:8]}"
    s3 = minio.client()
    s3.create_bucket(Bucket=name)
    for i in range(count):
        s3.put_object(Bucket=name, Key=f"o{i:02d}.txt", Body=f"remote {i}".encode())
    return name


def cached(ais: Client, bucket: str) -> list[str]:
    bck = ais.bucket(bucket, provider="aws")
    return [e.name for e in bck.list_all_objects() if e.is_cached()]


def test_prefetch_of_a_list_and_a_range_caches_exactly_those(
    up: LocalCluster, minio: MinioServer
) -> None:
    ais = Client(up.endpoint)
    bucket = remote_bucket(minio, 8)
    bck = ais.bucket(bucket, provider="aws")
    bck.head()  # known to the cluster, nothing cached yet
    assert cached(ais, bucket) == []
    job_id = bck.objects(obj_names=["o01.txt", "o06.txt"]).prefetch()
    result = ais.job(job_id).wait(timeout=60, verbose=False)
    assert result.success, result
    assert cached(ais, bucket) == ["o01.txt", "o06.txt"]
    job_id = bck.objects(obj_template="o0{2..4}.txt").prefetch(num_workers=2)
    assert ais.job(job_id).wait(timeout=60, verbose=False).success
    assert cached(ais, bucket) == ["o01.txt", "o02.txt", "o03.txt", "o04.txt", "o06.txt"]
    assert bck.object("o03.txt").get_reader().read_all() == b"remote 3"


def test_a_name_the_backend_lacks_fails_the_prefetch_or_is_counted(
    up: LocalCluster, minio: MinioServer
) -> None:
    ais = Client(up.endpoint)
    bucket = remote_bucket(minio, 2)
    bck = ais.bucket(bucket, provider="aws")
    bck.head()
    job_id = bck.objects(obj_names=["o00.txt", "nope.txt"]).prefetch()
    result = ais.job(job_id).wait(timeout=60, verbose=False)
    assert not result.success and "nope.txt" in str(result.error), result
    job_id = bck.objects(obj_names=["o01.txt", "nope.txt"]).prefetch(continue_on_error=True)
    result = ais.job(job_id).wait(timeout=60, verbose=False)
    assert not result.success and "1 object(s) failed" in str(result.error), result
    assert "o01.txt" in cached(ais, bucket)


def test_prefetch_of_an_ais_bucket_or_with_a_bad_field_is_a_400(up: LocalCluster) -> None:
    ais = Client(up.endpoint)
    ais.bucket("local").create(exist_ok=True)
    ais.bucket("local").object("a").get_writer().put_content(b"a")
    value = {"objnames": ["a"], "coer": False, "latest-ver": False}
    url = f"{up.endpoint}/v1/buckets/local"
    body = {"action": "prefetch-listrange", "name": "", "value": value}
    r = httpx.post(url, params={"provider": "ais"}, json=body)
    assert r.status_code == 400 and "not a remote bucket" in r.text, r.text
    body["value"] = {**value, "blob-threshold": 1 << 20}
    r = httpx.post(url, params={"provider": "ais"}, json=body)
    assert r.status_code == 400 and "blob-threshold" in r.text, r.text
    with pytest.raises(InvalidBckProvider):  # the SDK itself refuses an ais bucket, before sending
        ais.bucket("local").objects(obj_names=["a"]).prefetch()
