"""The AWS CLI (v1, botocore at its defaults: flexible checksums on) and s3fs (aiobotocore)
against the gateway's S3 API, as a data team runs them: ``aws s3 cp/sync/ls/rm``,
``aws s3api`` multipart with ``--checksum-algorithm``, s3fs ``open/ls/put/get/rm``,
pandas reading Parquet through s3fs, and both reading an ETL view's object whole."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import os
import subprocess
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from botocore.exceptions import ClientError

from etl_runtime import Client

ETL = "s3-cli-shout"


def shout(data: bytes, args: str) -> bytes:
    return data.upper() * 2


@pytest.fixture(scope="module")
def aws(endpoint: str, writer: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Any:
    home = tmp_path_factory.mktemp("aws-home")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k != "HOME"} | {
        "HOME": str(home),
        "AWS_ACCESS_KEY_ID": writer["access_key"],
        "AWS_SECRET_ACCESS_KEY": writer["secret_key"],
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": str(home / "config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(home / "credentials"),
        "AWS_MAX_ATTEMPTS": "1",
    }
    import awscli  # noqa: F401  # its import names its data directory in AWS_DATA_PATH

    env["AWS_DATA_PATH"] = os.environ["AWS_DATA_PATH"]

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        # The CLI's own entry point (``aws`` is ``awscli.clidriver.main``), in this process:
        # a subprocess would spend a second of CPU importing botocore for every command.
        from awscli.clidriver import create_clidriver

        argv = ["--endpoint-url", f"{endpoint}/s3", *args]
        out, err = io.StringIO(), io.StringIO()
        with (
            mock.patch.dict(os.environ, env, clear=True),
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
        ):
            rc = create_clidriver().main(argv)
        p = subprocess.CompletedProcess(["aws", *argv], rc, out.getvalue(), err.getvalue())
        if check and rc != 0:
            raise AssertionError(f"aws {' '.join(args)}: rc {rc}\n{p.stderr}")
        return p

    return run


@pytest.fixture(scope="module")
def fs(endpoint: str, writer: dict[str, Any]) -> Any:
    import s3fs

    return s3fs.S3FileSystem(
        key=writer["access_key"],
        secret=writer["secret_key"],
        endpoint_url=f"{endpoint}/s3",
        client_kwargs={"region_name": "us-east-1"},
        use_listings_cache=False,
    )


@pytest.fixture(scope="module")
def view(endpoint: str, s3: Any) -> str:
    s3.create_bucket(Bucket="cli-view-src")
    s3.put_object(Bucket="cli-view-src", Key="w.txt", Body=b"soft voice")
    with Client(endpoint) as c:
        c.etl(ETL).init_code(transform=shout, timeout=120)
        c.bucket("cli-loud").create(view_of="cli-view-src", etl=ETL)
    return "cli-loud"


def test_aws_s3_cp_sync_ls_rm(aws: Any, s3: Any, tmp_path: Path) -> None:
    s3.create_bucket(Bucket="cli-a")
    big = os.urandom(9 << 20)  # over the CLI's 8 MiB threshold: a multipart upload
    (tmp_path / "big.bin").write_bytes(big)
    aws("s3", "cp", str(tmp_path / "big.bin"), "s3://cli-a/data/big.bin")
    assert s3.head_object(Bucket="cli-a", Key="data/big.bin")["ContentLength"] == len(big)
    aws("s3", "mv", "s3://cli-a/data/big.bin", "s3://cli-a/moved.bin")  # CopyObject + delete
    aws("s3", "cp", "s3://cli-a/moved.bin", str(tmp_path / "back.bin"))
    assert (tmp_path / "back.bin").read_bytes() == big
    with pytest.raises(ClientError):
        s3.head_object(Bucket="cli-a", Key="data/big.bin")

    src = tmp_path / "tree"
    (src / "sub").mkdir(parents=True)
    for name, body in {"a.txt": b"alpha", "sub/b.txt": b"bravo", "sub/c.txt": b"charlie"}.items():
        (src / name).write_bytes(body)
    assert aws("s3", "sync", str(src), "s3://cli-a/tree").stdout.count("upload:") == 3
    # sync compares sizes and times from the listing: nothing changed, nothing sent
    assert aws("s3", "sync", str(src), "s3://cli-a/tree").stdout.count("upload:") == 0
    listing = aws("s3", "ls", "--recursive", "s3://cli-a/").stdout.split("\n")
    assert sorted(line.split()[-1] for line in listing if line) == [
        "moved.bin",
        "tree/a.txt",
        "tree/sub/b.txt",
        "tree/sub/c.txt",
    ]
    dst = tmp_path / "down"
    aws("s3", "sync", "s3://cli-a/tree", str(dst))
    assert (dst / "sub" / "c.txt").read_bytes() == b"charlie"
    aws("s3", "rm", "--recursive", "s3://cli-a/tree")
    left = s3.list_objects_v2(Bucket="cli-a")["Contents"]
    assert [o["Key"] for o in left] == ["moved.bin"]


def test_aws_s3api_multipart_with_checksums(aws: Any, s3: Any, tmp_path: Path) -> None:
    s3.create_bucket(Bucket="cli-mp")
    start = aws(
        "s3api",
        "create-multipart-upload",
        "--bucket",
        "cli-mp",
        "--key",
        "mp",
        "--checksum-algorithm",
        "SHA256",
    )
    upload = json.loads(start.stdout)["UploadId"]
    parts = [os.urandom(5 << 20), os.urandom(1234)]
    done = []
    for n, body in enumerate(parts, 1):
        (tmp_path / f"part{n}").write_bytes(body)
        up = aws(
            "s3api",
            "upload-part",
            "--bucket",
            "cli-mp",
            "--key",
            "mp",
            "--upload-id",
            upload,
            "--part-number",
            str(n),
            "--body",
            str(tmp_path / f"part{n}"),
            "--checksum-algorithm",
            "SHA256",
        )
        answer = json.loads(up.stdout)
        assert answer["ETag"].strip('"') == hashlib.md5(body).hexdigest()
        # the checksum the CLI computed, verified and echoed
        assert base64.b64decode(answer["ChecksumSHA256"]) == hashlib.sha256(body).digest()
        done.append(
            {"PartNumber": n, "ETag": answer["ETag"], "ChecksumSHA256": answer["ChecksumSHA256"]}
        )
    listed = s3.list_parts(Bucket="cli-mp", Key="mp", UploadId=upload)
    assert [p["Size"] for p in listed["Parts"]] == [len(b) for b in parts]
    aws(
        "s3api",
        "complete-multipart-upload",
        "--bucket",
        "cli-mp",
        "--key",
        "mp",
        "--upload-id",
        upload,
        "--multipart-upload",
        json.dumps({"Parts": done}),
    )
    assert s3.get_object(Bucket="cli-mp", Key="mp")["Body"].read() == b"".join(parts)


def test_s3fs_open_ls_put_get_rm(fs: Any, s3: Any, tmp_path: Path) -> None:
    fs.mkdir("fs-a")
    with fs.open("fs-a/dir/one.txt", "wb") as f:
        f.write(b"first line\n")
    big = os.urandom(6 << 20)
    with fs.open("fs-a/dir/big.bin", "wb", block_size=5 << 20) as f:  # a multipart write
        f.write(big)
    with fs.open("fs-a/dir/big.bin", "rb", block_size=1 << 20) as f:
        f.seek(3 << 20)
        assert f.read(100) == big[3 << 20 : (3 << 20) + 100]  # a ranged read
    assert fs.cat("fs-a/dir/one.txt") == b"first line\n"
    local = tmp_path / "local.txt"
    local.write_bytes(b"put from disk")
    fs.put(str(local), "fs-a/dir/sub/put.txt")
    assert sorted(fs.ls("fs-a/dir", detail=False)) == [
        "fs-a/dir/big.bin",
        "fs-a/dir/one.txt",
        "fs-a/dir/sub",
    ]
    assert fs.info("fs-a/dir/big.bin")["size"] == len(big)
    assert fs.info("fs-a/dir/sub")["type"] == "directory"
    assert fs.find("fs-a/dir/sub") == ["fs-a/dir/sub/put.txt"]
    fs.get("fs-a/dir/sub/put.txt", str(tmp_path / "got.txt"))
    assert (tmp_path / "got.txt").read_bytes() == b"put from disk"
    fs.copy("fs-a/dir/one.txt", "fs-a/copied.txt")
    assert s3.get_object(Bucket="fs-a", Key="copied.txt")["Body"].read() == b"first line\n"
    fs.rm("fs-a/dir", recursive=True)
    assert not fs.exists("fs-a/dir/one.txt")
    assert fs.ls("fs-a", detail=False) == ["fs-a/copied.txt"]
    with pytest.raises(FileNotFoundError):
        fs.cat("fs-a/dir/one.txt")


def test_pandas_parquet_through_s3fs(endpoint: str, writer: dict[str, Any], fs: Any) -> None:
    import pandas as pd

    fs.mkdir("fs-pq")
    frame = pd.DataFrame({"id": range(1000), "name": [f"row {i}" for i in range(1000)]})
    options = {
        "key": writer["access_key"],
        "secret": writer["secret_key"],
        "endpoint_url": f"{endpoint}/s3",
        "client_kwargs": {"region_name": "us-east-1"},
    }
    frame.to_parquet("s3://fs-pq/t.parquet", storage_options=options)
    back = pd.read_parquet("s3://fs-pq/t.parquet", storage_options=options)
    assert back.equals(frame)


def test_a_view_read_whole_by_the_cli_and_s3fs(
    aws: Any, fs: Any, view: str, tmp_path: Path
) -> None:
    expected = b"SOFT VOICE" * 2
    aws("s3", "cp", f"s3://{view}/w.txt", str(tmp_path / "w"))
    assert (tmp_path / "w").read_bytes() == expected
    assert fs.cat(f"{view}/w.txt") == expected
    with fs.open(f"{view}/w.txt", "rb") as f:
        assert f.size == len(expected) and f.read() == expected
