"""ETL views end to end: a read-only bucket that any client reads transformed.

On the package's real ``sluice up`` (gateway + 3 targets + transformers):
the SDK and the CLI make views; Sluice's SDK, curl, ``webdataset`` over HTTP
URLs, the official aistore SDK, boto3 and ``s3torchconnector`` read them;
writes, a stopped ETL, a view of a missing source and deleting a viewed
source are refused with errors that name the view (or the ETL).
"""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
from typing import Any

import httpx
import pytest

from etl_runtime import BadRequest, Client, Conflict, HTTPError, NotFound
from tests.s3.conftest import make_key, s3_client

SHOUT = "e2e-view-shout"
WDS = "e2e-view-wds"


def shout(data: bytes, args: str) -> bytes:
    return data.upper() + (args.encode() if args else b"")


def upper_txt(sample: dict[str, Any]) -> dict[str, Any]:
    return {**sample, "txt": sample["txt"].upper()}


def make_shard(shard: int, samples: int = 4) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for i in range(samples):
            for ext, payload in (("txt", f"sample {shard}-{i}".encode()), ("cls", b"%d" % i)):
                info = tarfile.TarInfo(f"s{shard}-{i:03d}.{ext}")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    return buf.getvalue()


@pytest.fixture(scope="module")
def client(endpoint: str) -> Any:
    with Client(endpoint) as c:
        # both ETLs start together, and while the objects are uploaded
        c.etl(SHOUT).init_code(transform=shout, wait=False)
        c.etl(WDS).init_code(transform=upper_txt, mode="wds", decode=None, wait=False)
        src = c.bucket("view-src").create()
        for name in ("a.txt", "dir/b.txt"):
            src.object(name).put_content(f"hello {name}".encode())
        shards = c.bucket("view-shards").create()
        for s in range(3):
            shards.object(f"train/shard-{s:03d}.tar").put_content(make_shard(s))
        c.etl(SHOUT).wait_until_running(120)
        c.etl(WDS).wait_until_running(120)
        yield c


def test_a_view_reads_the_source_transformed_and_lists_it(client: Client, endpoint: str) -> None:
    view = client.bucket("view-loud").create(view_of="view-src", etl=SHOUT, etl_args="!")
    assert view.object("a.txt").get_bytes() == b"HELLO A.TXT!"
    assert view.object("dir/b.txt").get_bytes() == b"HELLO DIR/B.TXT!"
    assert client.bucket("view-src").object("a.txt").get_bytes() == b"hello a.txt"
    listed = list(view.list_objects())
    assert [o.name for o in listed] == ["a.txt", "dir/b.txt"]
    assert [(o.size, o.size_known) for o in listed] == [(11, False), (15, False)]
    raw = httpx.get(f"{endpoint}/v1/buckets/view-loud", timeout=10).json()["objects"]
    assert [(o["size"], o["source_size"]) for o in raw] == [(None, 11), (None, 15)]
    assert client.bucket("view-loud").props()["view"] == {
        "of": "view-src",
        "etl": SHOUT,
        "args": "!",
    }
    # curl follows the gateway's 307, as any HTTP client does.
    url = f"{endpoint}/v1/objects/view-loud/dir/b.txt"
    got = subprocess.run(["curl", "-sfL", url], capture_output=True, check=True, timeout=60)
    assert got.stdout == b"HELLO DIR/B.TXT!"
    head = httpx.head(url, follow_redirects=True, timeout=10)
    assert head.status_code == 200 and "content-length" not in head.headers
    assert head.headers["x-sluice-view"] == f"view-src|{SHOUT}"
    assert head.headers["etag"].endswith('-v"')
    missing = httpx.get(f"{endpoint}/v1/objects/view-loud/nope.txt", follow_redirects=True)
    assert missing.status_code == 404 and "nope.txt" in missing.json()["error"]


def test_writes_and_other_etls_are_refused_naming_the_view(client: Client, endpoint: str) -> None:
    client.bucket("view-ro").create(view_of="view-src", etl=SHOUT)
    put = httpx.put(f"{endpoint}/v1/objects/view-ro/new.txt", content=b"x", timeout=10)
    assert put.status_code == 405 and "'view-ro' is an ETL view" in put.json()["error"]
    assert put.headers["allow"] == "GET, HEAD"
    delete = httpx.delete(f"{endpoint}/v1/objects/view-ro/a.txt", timeout=10)
    assert delete.status_code == 405
    assert client.bucket("view-src").object("a.txt").get_bytes() == b"hello a.txt"
    other = httpx.get(f"{endpoint}/v1/objects/view-ro/a.txt?etl_name={WDS}", timeout=10)
    assert other.status_code == 400 and "already reads through ETL" in other.json()["error"]
    with pytest.raises(BadRequest, match="is an ETL view and stores nothing"):
        client.bucket("view-ro").transform(SHOUT, to_bucket="view-ro-out")
    with pytest.raises(HTTPError, match="'view-ro' is an ETL view, read-only"):
        client.bucket("view-src").transform(SHOUT, to_bucket="view-ro")


def test_views_refuse_bad_sources_and_guard_their_source(client: Client) -> None:
    with pytest.raises(NotFound, match="source bucket ais://no-such-src"):
        client.bucket("view-bad").create(view_of="no-such-src", etl=SHOUT)
    with pytest.raises(NotFound, match="ETL 'no-such-etl' does not exist"):
        client.bucket("view-bad").create(view_of="view-src", etl="no-such-etl")
    with pytest.raises(Conflict, match="exists and is not a view"):
        client.bucket("view-src").create(view_of="view-shards", etl=SHOUT)
    client.bucket("view-guard-src").create().object("x").put_content(b"x")
    client.bucket("view-guard").create(view_of="view-guard-src", etl=SHOUT)
    with pytest.raises(BadRequest, match="is itself a view"):
        client.bucket("view-of-view").create(view_of="view-guard", etl=SHOUT)
    with pytest.raises(Conflict, match="source of ETL view.*view-guard"):
        client.bucket("view-guard-src").delete()
    client.bucket("view-guard").delete()
    client.bucket("view-guard-src").delete()  # no view reads it any more


def test_a_stopped_etl_makes_the_view_answer_an_error_not_the_source(client: Client) -> None:
    def lower(data: bytes) -> bytes:
        return data.lower() + b"~"

    etl = client.etl("e2e-view-stop")
    etl.init_code(transform=lower, timeout=120)
    view = client.bucket("view-stop").create(view_of="view-src", etl="e2e-view-stop")
    assert view.object("a.txt").get_bytes() == b"hello a.txt~"
    etl.stop()
    with pytest.raises(HTTPError, match="e2e-view-stop") as stopped:
        view.object("a.txt").get_bytes()
    assert stopped.value.status in (409, 503)
    etl.delete()
    with pytest.raises(HTTPError, match="e2e-view-stop") as gone:
        view.object("a.txt").get_bytes()
    assert gone.value.status == 404


def test_webdataset_and_the_cli_read_a_wds_view(client: Client, endpoint: str) -> None:
    wds = pytest.importorskip("webdataset")
    cli = subprocess.run(
        [sys.executable, "-m", "etl_runtime.cli", "--endpoint", endpoint, "bucket", "create",
         "view-wds", "--view-of", "view-shards", "--etl", WDS],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr
    assert "view 'view-wds' ready" in cli.stdout
    urls = client.bucket("view-wds").list_urls(prefix="train/")
    assert len(urls) == 3 and all("etl_name" not in u for u in urls)
    got = [(s["__key__"], s["txt"]) for s in wds.WebDataset(urls, shardshuffle=False)]
    assert got == [
        (f"s{s}-{i:03d}", f"SAMPLE {s}-{i}".encode()) for s in range(3) for i in range(4)
    ]


def test_the_aistore_sdk_reads_a_view(client: Client, endpoint: str) -> None:
    aistore = pytest.importorskip("aistore")
    client.bucket("view-ais").create(view_of="view-src", etl=SHOUT)
    ais = aistore.sdk.Client(endpoint)
    bucket = ais.bucket("view-ais")
    assert bucket.object("a.txt").get_reader().read_all() == b"HELLO A.TXT"
    assert sorted(e.name for e in bucket.list_all_objects()) == ["a.txt", "dir/b.txt"]


def test_s3_clients_read_a_view_and_cannot_write_it(client: Client, endpoint: str) -> None:
    botocore = pytest.importorskip("botocore.exceptions")
    client.bucket("view-s3").create(view_of="view-src", etl=SHOUT, etl_args="?")
    s3 = s3_client(endpoint, make_key(endpoint, "write"))
    got = s3.get_object(Bucket="view-s3", Key="dir/b.txt")["Body"].read()
    assert got == b"HELLO DIR/B.TXT?"
    part = s3.get_object(Bucket="view-s3", Key="dir/b.txt", Range="bytes=6-8")
    assert part["Body"].read() == b"DIR" and part["ContentRange"] == "bytes 6-8/16"
    listed = s3.list_objects_v2(Bucket="view-s3")["Contents"]
    assert [o["Key"] for o in listed] == ["a.txt", "dir/b.txt"]
    with pytest.raises(botocore.ClientError) as denied:
        s3.put_object(Bucket="view-s3", Key="new.txt", Body=b"x")
    error = denied.value.response["Error"]
    assert error["Code"] == "AccessDenied" and "'view-s3' is an ETL view" in error["Message"]


def test_s3torchconnector_reads_a_wds_view_in_a_dataloader(
    client: Client, endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    s3tc = pytest.importorskip("s3torchconnector")
    torch_data = pytest.importorskip("torch.utils.data")
    client.bucket("view-torch").create(view_of="view-shards", etl=WDS)
    key = make_key(endpoint, "read")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key["access_key"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", key["secret_key"])
    dataset = s3tc.S3IterableDataset.from_prefix(
        "s3://view-torch/train/",
        region="us-east-1",
        endpoint=f"{endpoint}/s3",
        s3client_config=s3tc.S3ClientConfig(force_path_style=True),
        transform=_samples,
        enable_sharding=True,
    )
    loader = torch_data.DataLoader(dataset, batch_size=None, num_workers=2)
    got = sorted(text for shard in loader for text in shard)
    assert got == sorted(f"SAMPLE {s}-{i}" for s in range(3) for i in range(4))


def _samples(reader: Any) -> list[str]:
    """An S3Reader of one transformed shard -> the txt members, read as a tar stream."""
    with tarfile.open(fileobj=reader, mode="r|") as tar:
        return [
            tar.extractfile(m).read().decode()  # type: ignore[union-attr]
            for m in tar
            if m.name.endswith(".txt")
        ]
