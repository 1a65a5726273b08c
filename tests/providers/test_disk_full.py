"""A remote (aws) bucket's cache on a full disk: 507 naming ``aws://``, never a raw OSError.

The single target's data dir is a small tmpfs (``tests/tmpfs.py``: root only,
skipped elsewhere with the reason), with a cache budget larger than the disk,
so a prefetch job fills it for real. Every object that does not fit is listed
in the job as the 507's message (target, ``aws://bucket/object``), never as
a raw ``OSError``. (A job that cannot even record its state on a full disk:
``tests/jobs/test_disk_full.py``.)
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from unittest import mock

import httpx

from etl_runtime.local.api import LocalCluster
from tests.providers.minio import MinioServer
from tests.tmpfs import mounted_tmpfs

OBJECTS = 12
SIZE = 1 << 20
CREATE = {"action": "create-bck"}


def test_prefetch_onto_a_full_disk_is_507_naming_the_aws_object(
    minio: MinioServer, tmp_path: Path
) -> None:
    bucket = f"rb-{uuid.uuid4().hex[:10]}"
    s3 = minio.client()
    s3.create_bucket(Bucket=bucket)
    for i in range(OBJECTS):
        s3.put_object(Bucket=bucket, Key=f"w/{i:02d}.bin", Body=os.urandom(SIZE))
    env = {**minio.env(), "SLUICE_REMOTE_CACHE_BYTES": str(1 << 30)}  # no eviction
    with (
        mounted_tmpfs(tmp_path / "disk", size="6m") as disk,
        mock.patch.dict(os.environ, env),
        LocalCluster(disk / "data", targets=1) as cluster,
        httpx.Client(base_url=cluster.endpoint, timeout=60) as http,
    ):
        add = http.post(f"/v1/buckets/{bucket}", params={"provider": "aws"}, json=CREATE)
        assert add.status_code == 200, add.text
        spec = {"bucket": bucket, "prefix": "w/"}
        r = http.post("/v1/jobs", json={"kind": "prefetch", "spec": spec})
        assert r.status_code == 200, r.text
        job_id = r.json()["id"]
        job: dict = {}
        for _ in range(600):
            job = http.get(f"/v1/jobs/{job_id}").json()
            if job["state"] != "Running":
                break
            time.sleep(0.1)
        assert job["state"] in ("Finished", "Failed"), job
        assert job["error_count"] >= 1 and job["progress"]["objects"] < OBJECTS, job
        for err in job["errors"]:
            assert "OSError" not in err["error"], err
            assert "no space left" in err["error"] and f"aws://{bucket}/w/" in err["error"], err
            assert err["target"] == "t0"
