"""S3's bucket-name rules on every way of making a bucket, over a 3-target ``sluice up``.

A bucket made by ``POST /v1/buckets/{b}``, the ``sluice`` CLI and SDK, the
aistore SDK, an ETL view, a copy's, a rename's, a transform's or a dSort's
destination follows the rules
S3's CreateBucket does: a name that breaks one is a 400 naming the bucket and
the rule, and nothing is made. A bucket that exists under a looser name (from
an older version) keeps working: only creation is refused.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import boto3
import httpx
import pytest
from aistore.sdk import Client as AisClient
from aistore.sdk.errors import AISError
from botocore.client import Config
from botocore.exceptions import ClientError

from etl_runtime import Client
from etl_runtime.cluster.clustermap import BucketProps, FileClusterMap
from etl_runtime.local import LocalCluster
from etl_runtime.sdk.errors import BadRequest

pytestmark = pytest.mark.timeout(300)

BAD = {
    "bk": "must be 3 to 63 characters long",
    "My_Data": "may hold only lower-case letters, digits, '.' and '-'",
    "data-": "must begin and end with a letter or digit",
    "a..b": "may not hold two adjacent periods",
    "192.168.1.10": "may not be formatted as an IP address",
    "xn--data": "may not start with xn--",
}


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("names") / "data", targets=3) as c:
        yield c


def buckets(up: LocalCluster) -> list[str]:
    return httpx.get(f"{up.endpoint}/v1/buckets").json()["buckets"]


def test_native_create_names_the_bucket_and_the_rule_and_makes_nothing(up: LocalCluster) -> None:
    for name, rule in BAD.items():
        r = httpx.post(f"{up.endpoint}/v1/buckets/{name}", json={"action": "create-bck"})
        assert r.status_code == 400, (name, r.text)
        body = r.json()
        assert body["kind"] == "InvalidName" and body["bucket"] == name
        assert repr(name) in body["error"] and rule in body["error"], body
    assert not set(BAD) & set(buckets(up))
    ok = httpx.post(f"{up.endpoint}/v1/buckets/data-1.v2", json={"action": "create-bck"})
    assert ok.status_code == 200 and ok.json()["created"] is True


def test_s3_create_bucket_says_the_same_rule(up: LocalCluster) -> None:
    key = httpx.post(f"{up.endpoint}/v1/s3/keys", json={"permission": "write"}).json()
    s3 = boto3.client(
        "s3",
        endpoint_url=f"{up.endpoint}/s3",
        aws_access_key_id=key["access_key"],
        aws_secret_access_key=key["secret_key"],
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}),
    )
    native = httpx.post(f"{up.endpoint}/v1/buckets/My_Data", json={"action": "create-bck"})
    with pytest.raises(ClientError) as e:
        s3.create_bucket(Bucket="My_Data")
    assert e.value.response["Error"]["Code"] == "InvalidBucketName"
    assert e.value.response["Error"]["Message"] in native.json()["error"]


def test_sluice_sdk_cli_and_aistore_sdk_creates_are_refused(up: LocalCluster) -> None:
    with pytest.raises(BadRequest, match="must be 3 to 63 characters long"):
        Client(up.endpoint).bucket("bk").create()
    with pytest.raises(AISError) as e:
        AisClient(up.endpoint).bucket("My_Data").create()
    assert e.value.status_code == 400 and "lower-case letters" in str(e.value)
    cli = [sys.executable, "-m", "etl_runtime.cli", "--endpoint", up.endpoint]
    env = {**os.environ, "SLUICE_TOKEN": ""}
    r = subprocess.run(
        [*cli, "bucket", "create", "xn--data"], capture_output=True, timeout=120, env=env
    )
    assert r.returncode == 1 and "may not start with xn--" in r.stderr.decode(), r.stderr
    assert not {"bk", "My_Data", "xn--data"} & set(buckets(up))


def test_views_copies_and_renames_do_not_make_a_bucket_with_a_bad_name(up: LocalCluster) -> None:
    client = Client(up.endpoint)
    src = client.bucket("names-src").create()
    src.object("x").put_content(b"payload")
    with pytest.raises(BadRequest, match="'Up_View'.*lower-case letters"):
        client.bucket("Up_View").create(view_of="names-src", etl="upcase")
    ais = AisClient(up.endpoint)
    with pytest.raises(AISError) as e:
        ais.bucket("names-src").copy(to_bck=ais.bucket("cp"))
    assert e.value.status_code == 400 and "3 to 63 characters" in str(e.value)
    with pytest.raises(AISError) as e:
        ais.bucket("names-src").rename("Renamed")
    assert e.value.status_code == 400 and "lower-case letters" in str(e.value)
    assert not {"Up_View", "cp", "Renamed"} & set(buckets(up))
    assert src.object("x").get_bytes() == b"payload"  # the rename moved nothing


def test_a_bucket_from_an_older_version_with_a_loose_name_keeps_working(
    up: LocalCluster,
) -> None:
    # an older version made buckets under core.names' rule (e.g. "ab", "Old_Data")
    FileClusterMap(up.data_dir / "cluster.json").update(
        lambda m: m.with_bucket("Old_Data", BucketProps(created=time.time()))
    )
    http = httpx.Client(base_url=f"{up.endpoint}/v1", follow_redirects=True)
    assert "Old_Data" in buckets(up)
    again = http.post("/buckets/Old_Data", json={"action": "create-bck"})
    assert again.status_code == 200 and again.json()["created"] is False
    assert http.put("/objects/Old_Data/k", content=b"kept").status_code == 200
    assert http.get("/objects/Old_Data/k").content == b"kept"
    assert [o["name"] for o in http.get("/buckets/Old_Data").json()["objects"]] == ["k"]
    assert http.delete("/objects/Old_Data/k").status_code == 200
    assert http.delete("/buckets/Old_Data").status_code == 200
    assert "Old_Data" not in buckets(up)


def test_transform_and_dsort_jobs_do_not_make_a_destination_with_a_bad_name(
    up: LocalCluster,
) -> None:
    client = Client(up.endpoint)
    src = client.bucket("jobs-src").create()
    src.object("shard-000000.tar").put_content(b"not read: the job is refused first")
    spec = {"mode": "object", "workers": 1, "code": {"source": "def transform(d):\n  return d\n"}}
    http = httpx.Client(base_url=up.endpoint, timeout=30)
    assert http.put("/v1/etl", json={"name": "same", "spec": spec}).status_code == 200
    with pytest.raises(BadRequest, match="'B_ad'.*lower-case letters"):
        src.transform("same", to_bucket="B_ad")
    dsort = {
        "extension": ".tar",
        "bck": {"name": "jobs-src", "provider": "ais"},
        "input_format": "shard-{000000..000000}",
        "output_format": "out-%06d.tar",
        "output_shard_size": "40KB",
        "output_bck": {"name": "B_ad", "provider": "ais"},
    }
    r = http.post("/v1/dsort", json=dsort)
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["kind"] == "InvalidName" and body["bucket"] == "B_ad"
    assert "'B_ad'" in body["error"] and "lower-case letters" in body["error"]
    assert "B_ad" not in buckets(up)
    assert client.jobs() == []  # neither job was started
    assert http.delete("/v1/etl/same").status_code == 200
