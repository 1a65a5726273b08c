"""Flexible checksums and aws-chunked uploads, as the AWS SDKs send them by default.

boto3 at its defaults (no ``AWS_REQUEST_CHECKSUM_CALCULATION``) sends a CRC32
header with each upload; pyarrow (the AWS C++ SDK) streams aws-chunked bodies
with a trailing checksum. Each is stored verified, and a body that does not
match its checksum, chunk signature or length is refused with nothing stored.
"""

from __future__ import annotations

import base64
import hashlib
import zlib
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from etl_runtime.gateway.s3.chunked import ChunkSigner
from etl_runtime.gateway.s3.sigv4 import signing_key

BUCKET = "sums"


def _default_client(endpoint: str, key: dict[str, Any]) -> Any:
    """boto3 as a user gets it: no Config at all."""
    return boto3.client(
        "s3",
        endpoint_url=f"{endpoint}/s3",
        aws_access_key_id=key["access_key"],
        aws_secret_access_key=key["secret_key"],
        region_name="us-east-1",
    )


@pytest.fixture(scope="module")
def s3d(endpoint: str, writer: dict[str, Any]) -> Any:
    client = _default_client(endpoint, writer)
    try:
        client.create_bucket(Bucket=BUCKET)
    except ClientError:
        pass
    return client


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _crc32(data: bytes) -> str:
    return _b64(zlib.crc32(data).to_bytes(4, "big"))


def test_boto3_defaults_store_and_return_each_checksum(s3d: Any) -> None:
    data = b"flexible checksums " * 100
    put = s3d.put_object(Bucket=BUCKET, Key="crc32", Body=data)
    assert put["ChecksumCRC32"] == _crc32(data)
    got = s3d.get_object(Bucket=BUCKET, Key="crc32", ChecksumMode="ENABLED")
    assert got["Body"].read() == data
    assert got["ChecksumCRC32"] == _crc32(data)
    expected = {
        "SHA1": _b64(hashlib.sha1(data).digest()),
        "SHA256": _b64(hashlib.sha256(data).digest()),
    }
    for algorithm in ("CRC32C", "CRC64NVME", "SHA1", "SHA256"):
        key = f"alg-{algorithm}"
        put = s3d.put_object(Bucket=BUCKET, Key=key, Body=data, ChecksumAlgorithm=algorithm)
        value = put[f"Checksum{algorithm}"]
        if algorithm in expected:
            assert value == expected[algorithm]
        head = s3d.head_object(Bucket=BUCKET, Key=key, ChecksumMode="ENABLED")
        assert head[f"Checksum{algorithm}"] == value
        assert s3d.get_object(Bucket=BUCKET, Key=key)["Body"].read() == data


def test_a_wrong_checksum_header_stores_nothing(s3d: Any) -> None:
    def corrupt(request: Any, **_: Any) -> None:
        del request.headers["x-amz-checksum-crc32"]
        request.headers["x-amz-checksum-crc32"] = _crc32(b"something else")

    s3d.meta.events.register("before-sign.s3.PutObject", corrupt)
    try:
        with pytest.raises(ClientError) as e:
            s3d.put_object(Bucket=BUCKET, Key="wrong-crc", Body=b"the real bytes")
    finally:
        s3d.meta.events.unregister("before-sign.s3.PutObject", corrupt)
    assert e.value.response["Error"]["Code"] == "BadDigest"
    assert "x-amz-checksum-crc32" in e.value.response["Error"]["Message"]
    with pytest.raises(ClientError) as gone:
        s3d.head_object(Bucket=BUCKET, Key="wrong-crc")
    assert gone.value.response["Error"]["Code"] == "404"


def test_boto3_multipart_upload_file_at_defaults(s3d: Any, tmp_path: Path) -> None:
    path = tmp_path / "big"
    path.write_bytes(bytes(range(256)) * (48 << 10))  # 12 MiB: two parts and a bit
    s3d.upload_file(str(path), BUCKET, "big")
    out = tmp_path / "back"
    s3d.download_file(BUCKET, "big", str(out))
    assert out.read_bytes() == path.read_bytes()


def test_pyarrow_writes_and_reads_parquet(endpoint: str, writer: dict[str, Any]) -> None:
    import pyarrow as pa
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    fs = pafs.S3FileSystem(
        access_key=writer["access_key"],
        secret_key=writer["secret_key"],
        endpoint_override=f"{endpoint}/s3",
        region="us-east-1",
        allow_bucket_creation=True,
    )
    fs.create_dir("arrow")
    rows = 1_500_000  # over pyarrow's part size: multipart, each part aws-chunked
    table = pa.table({"x": list(range(rows)), "y": [f"row {i}" for i in range(rows)]})
    pq.write_table(table, "arrow/t.parquet", filesystem=fs)
    assert fs.get_file_info("arrow/t.parquet").size > 5 << 20
    back = pq.read_table("arrow/t.parquet", filesystem=fs)
    assert back.equals(table)
    small = pa.table({"a": [1, 2, 3]})
    pq.write_table(small, "arrow/small.parquet", filesystem=fs)
    assert pq.read_table("arrow/small.parquet", filesystem=fs).equals(small)


def _framed(chunks: list[bytes], trailer: str = "", signer: ChunkSigner | None = None) -> bytes:
    out, previous = b"", signer.seed if signer else ""
    for chunk in [*chunks, b""]:
        ext = ""
        if signer is not None:
            previous = signer.chunk(previous, hashlib.sha256(chunk).hexdigest())
            ext = f";chunk-signature={previous}"
        out += f"{len(chunk):x}{ext}\r\n".encode() + chunk
        out += b"\r\n" if chunk else b""
    if trailer:
        out += trailer.encode() + b"\r\n"
        if signer is not None:
            sig = signer.trailer(previous, trailer.encode() + b"\n")
            out += f"x-amz-trailer-signature:{sig}\r\n".encode()
    return out + b"\r\n"


def _send(
    endpoint: str, key: dict[str, Any], name: str, payload: str, body: bytes, **headers: str
) -> tuple[httpx.Response, str]:
    url = f"{endpoint}/s3/{BUCKET}/{name}"
    headers = {"x-amz-content-sha256": payload, "content-encoding": "aws-chunked", **headers}
    request = AWSRequest(method="PUT", url=url, headers=headers)
    SigV4Auth(Credentials(key["access_key"], key["secret_key"]), "s3", "us-east-1").add_auth(
        request
    )
    sent = dict(request.headers.items())
    seed = sent["Authorization"].rsplit("Signature=", 1)[1]
    return httpx.put(url, content=body, headers=sent, timeout=30), seed + "|" + sent["X-Amz-Date"]


def _signer(key: dict[str, Any], seed_and_date: str) -> ChunkSigner:
    seed, amz_date = seed_and_date.split("|")
    scope = f"{amz_date[:8]}/us-east-1/s3/aws4_request"
    return ChunkSigner(
        signing_key(key["secret_key"], amz_date[:8], "us-east-1"), amz_date, scope, seed
    )


def test_chunk_signatures_follow_aws_example() -> None:
    """AWS's published example of a chunked upload (65 KiB + 1 KiB of 'a')."""
    key = signing_key("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "20130524", "us-east-1")
    seed = "4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9"
    signer = ChunkSigner(key, "20130524T000000Z", "20130524/us-east-1/s3/aws4_request", seed)
    first = signer.chunk(seed, hashlib.sha256(b"a" * 65536).hexdigest())
    assert first == "ad80c730a21e5b8d04586a2213dd63b9a0e99e0e2307b0ade35a65485a288648"
    second = signer.chunk(first, hashlib.sha256(b"a" * 1024).hexdigest())
    assert second == "0055627c9e194cb4542bae2aa5492e3c1575bbb81b612b7d234b86a503ef5497"
    last = signer.chunk(second, hashlib.sha256(b"").hexdigest())
    assert last == "b6c6ea8a5354eaf15b3cb7646744f4275b71ea724fed81ceb9323e279d449df9"


def test_unsigned_trailer_verified(endpoint: str, writer: dict[str, Any], s3d: Any) -> None:
    data = [b"a" * 70000, b"b" * 1000]
    whole = b"".join(data)
    payload = "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
    common = {
        "x-amz-decoded-content-length": str(len(whole)),
        "x-amz-trailer": "x-amz-checksum-crc32",
    }
    good = _framed(data, f"x-amz-checksum-crc32:{_crc32(whole)}")
    r, _ = _send(endpoint, writer, "trailed", payload, good, **common)
    assert r.status_code == 200, r.text
    assert r.headers["x-amz-checksum-crc32"] == _crc32(whole)
    got = s3d.get_object(Bucket=BUCKET, Key="trailed", ChecksumMode="ENABLED")
    assert got["Body"].read() == whole and got["ChecksumCRC32"] == _crc32(whole)
    bad = _framed(data, f"x-amz-checksum-crc32:{_crc32(b'other')}")
    r, _ = _send(endpoint, writer, "trailed-bad", payload, bad, **common)
    assert r.status_code == 400 and "<Code>BadDigest</Code>" in r.text
    short = {**common, "x-amz-decoded-content-length": str(len(whole) + 1)}
    r, _ = _send(endpoint, writer, "trailed-bad", payload, good, **short)
    assert r.status_code == 400 and "x-amz-decoded-content-length" in r.text
    with pytest.raises(ClientError):
        s3d.head_object(Bucket=BUCKET, Key="trailed-bad")


def test_signed_chunks_verified(endpoint: str, writer: dict[str, Any], s3d: Any) -> None:
    data = [b"x" * 65536, b"y" * 4096]
    whole = b"".join(data)
    for payload, trailer in (
        ("STREAMING-AWS4-HMAC-SHA256-PAYLOAD", ""),
        ("STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER", "x-amz-checksum-sha256"),
    ):
        headers = {"x-amz-decoded-content-length": str(len(whole))}
        if trailer:
            headers["x-amz-trailer"] = trailer
        # The chunk signatures chain from the request's signature: sign first, then frame.
        url = f"{endpoint}/s3/{BUCKET}/signed"
        request = AWSRequest(
            method="PUT",
            url=url,
            headers={"x-amz-content-sha256": payload, "content-encoding": "aws-chunked", **headers},
        )
        SigV4Auth(
            Credentials(writer["access_key"], writer["secret_key"]), "s3", "us-east-1"
        ).add_auth(request)
        sent = dict(request.headers.items())
        seed = sent["Authorization"].rsplit("Signature=", 1)[1]
        signer = _signer(writer, f"{seed}|{sent['X-Amz-Date']}")
        value = _b64(hashlib.sha256(whole).digest())
        line = f"{trailer}:{value}" if trailer else ""
        r = httpx.put(url, content=_framed(data, line, signer), headers=sent, timeout=30)
        assert r.status_code == 200, (payload, r.text)
        assert s3d.get_object(Bucket=BUCKET, Key="signed")["Body"].read() == whole


def test_tampered_chunk_stores_nothing(endpoint: str, writer: dict[str, Any], s3d: Any) -> None:
    payload = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
    data = [b"z" * 65536, b"w" * 10]
    url = f"{endpoint}/s3/{BUCKET}/chunk-tampered"
    request = AWSRequest(
        method="PUT",
        url=url,
        headers={
            "x-amz-content-sha256": payload,
            "content-encoding": "aws-chunked",
            "x-amz-decoded-content-length": str(65546),
        },
    )
    SigV4Auth(Credentials(writer["access_key"], writer["secret_key"]), "s3", "us-east-1").add_auth(
        request
    )
    sent = dict(request.headers.items())
    seed = sent["Authorization"].rsplit("Signature=", 1)[1]
    body = _framed(data, "", _signer(writer, f"{seed}|{sent['X-Amz-Date']}"))
    body = body.replace(b"w" * 10, b"W" * 10)  # same length, other bytes
    r = httpx.put(url, content=body, headers=sent, timeout=30)
    assert r.status_code == 403 and "chunk" in r.text
    with pytest.raises(ClientError):
        s3d.head_object(Bucket=BUCKET, Key="chunk-tampered")


def test_content_md5_edge_cases(endpoint: str, s3d: Any) -> None:
    def md5(value: str) -> Any:
        def set_it(request: Any, **_: Any) -> None:
            del request.headers["Content-MD5"]
            request.headers["Content-MD5"] = value

        return set_it

    for value, code in (("", "InvalidDigest"), ("c2hvcnQ=", "InvalidDigest")):
        hook = md5(value)
        s3d.meta.events.register("before-sign.s3.PutObject", hook)
        try:
            with pytest.raises(ClientError) as e:
                s3d.put_object(Bucket=BUCKET, Key="md5", Body=b"abc")
        finally:
            s3d.meta.events.unregister("before-sign.s3.PutObject", hook)
        assert e.value.response["Error"]["Code"] == code, value
    hook = md5(_b64(hashlib.md5(b"other").digest()))
    s3d.meta.events.register("before-sign.s3.PutObject", hook)
    try:
        with pytest.raises(ClientError) as e:
            s3d.put_object(Bucket=BUCKET, Key="md5", Body=b"abc")
    finally:
        s3d.meta.events.unregister("before-sign.s3.PutObject", hook)
    assert e.value.response["Error"]["Code"] == "BadDigest"
