"""SigV4 on the gateway: keys, presigned URLs, bad and expired signatures, anonymous reads."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import requests
from botocore.exceptions import ClientError

from etl_runtime.local import LocalCluster
from tests.s3.conftest import make_key, s3_client


def code(e: pytest.ExceptionInfo[ClientError]) -> tuple[str, int]:
    r = e.value.response
    return r["Error"]["Code"], r["ResponseMetadata"]["HTTPStatusCode"]


@pytest.fixture(scope="module")
def shared(s3: Any) -> str:
    s3.create_bucket(Bucket="s3-auth")
    s3.put_object(Bucket="s3-auth", Key="doc.txt", Body=b"hello s3")
    return "s3-auth"


def test_bad_signature_and_unknown_key(endpoint: str, writer: dict[str, Any], shared: str) -> None:
    bad = s3_client(endpoint, writer, secret="not-the-secret")
    with pytest.raises(ClientError) as e:
        bad.get_object(Bucket=shared, Key="doc.txt")
    assert code(e) == ("SignatureDoesNotMatch", 403)
    with pytest.raises(ClientError) as e:
        bad.put_object(Bucket=shared, Key="doc.txt", Body=b"overwritten")
    assert code(e) == ("SignatureDoesNotMatch", 403)
    ghost = s3_client(endpoint, {"access_key": "SLKNOSUCHKEY", "secret_key": "x"})
    with pytest.raises(ClientError) as e:
        ghost.list_buckets()
    assert code(e) == ("InvalidAccessKeyId", 403)
    good = s3_client(endpoint, writer)
    assert good.get_object(Bucket=shared, Key="doc.txt")["Body"].read() == b"hello s3"


def test_a_body_that_does_not_match_its_signed_hash_is_not_stored(
    endpoint: str, writer: dict[str, Any], shared: str
) -> None:
    s3 = s3_client(endpoint, writer)

    def swap_body(request: Any, **kwargs: Any) -> None:
        request.body = b"tampered"  # after signing: the hash signed is the original's
        request.headers["Content-Length"] = str(len(request.body))

    s3.meta.events.register("before-send.s3.PutObject", swap_body)
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=shared, Key="tampered.txt", Body=b"original")
    assert code(e) == ("XAmzContentSHA256Mismatch", 400)
    with pytest.raises(ClientError) as e:
        s3_client(endpoint, writer).head_object(Bucket=shared, Key="tampered.txt")
    assert code(e)[1] == 404


def test_read_key_reads_only(endpoint: str, reader: dict[str, Any], shared: str) -> None:
    s3 = s3_client(endpoint, reader)
    assert s3.get_object(Bucket=shared, Key="doc.txt")["Body"].read() == b"hello s3"
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=shared)["Contents"]] == ["doc.txt"]
    for call in (
        lambda: s3.put_object(Bucket=shared, Key="new.txt", Body=b"x"),
        lambda: s3.delete_object(Bucket=shared, Key="doc.txt"),
        lambda: s3.create_bucket(Bucket="by-reader"),
    ):
        with pytest.raises(ClientError) as e:
            call()
        assert code(e) == ("AccessDenied", 403)


def test_presigned_get_and_expiry(endpoint: str, reader: dict[str, Any], shared: str) -> None:
    s3 = s3_client(endpoint, reader)
    url = s3.generate_presigned_url(
        "get_object", Params={"Bucket": shared, "Key": "doc.txt"}, ExpiresIn=60
    )
    r = requests.get(url, timeout=10)
    assert r.status_code == 200 and r.content == b"hello s3"
    tampered = url.replace("doc.txt", "doc.txt2")
    assert requests.get(tampered, timeout=10).status_code == 403
    short = s3.generate_presigned_url(
        "get_object", Params={"Bucket": shared, "Key": "doc.txt"}, ExpiresIn=1
    )
    time.sleep(2.1)
    r = requests.get(short, timeout=10)
    assert r.status_code == 403 and b"<Code>AccessDenied</Code>" in r.content
    assert b"expired" in r.content and b"hello" not in r.content


def test_anonymous_reads_where_the_cluster_allows_them(endpoint: str, shared: str) -> None:
    anon = s3_client(endpoint, None)
    assert anon.get_object(Bucket=shared, Key="doc.txt")["Body"].read() == b"hello s3"
    assert requests.get(f"{endpoint}/s3/{shared}/doc.txt", timeout=10).content == b"hello s3"
    with pytest.raises(ClientError) as e:
        anon.put_object(Bucket=shared, Key="anon.txt", Body=b"x")
    assert code(e) == ("AccessDenied", 403)


def test_botocore_does_not_follow_the_native_307(endpoint: str, shared: str) -> None:
    """Why the S3 API proxies object data (``gateway/s3/objects.py``)."""
    import boto3
    from botocore import UNSIGNED
    from botocore.config import Config

    v1 = boto3.client(
        "s3",
        endpoint_url=f"{endpoint}/v1/objects",
        region_name="us-east-1",
        config=Config(signature_version=UNSIGNED, s3={"addressing_style": "path"}),
    )
    assert httpx.get(f"{endpoint}/v1/objects/{shared}/doc.txt").status_code == 307
    with pytest.raises(ClientError) as e:
        v1.get_object(Bucket=shared, Key="doc.txt")
    assert code(e)[1] == 307


def test_refused_get_objects_never_answer_and_the_next_ones_do(
    endpoint: str, writer: dict[str, Any], shared: str
) -> None:
    """On this cluster reads need no token, so the gateway sends a plain GetObject to the
    owner before it checks the signature (``objects.send_early``): a refused call must still
    be refused first (not NoSuchKey), and the pooled connections it used must not leak the
    refused answer into the next calls, small or spliced."""
    good, bad = s3_client(endpoint, writer), s3_client(endpoint, writer, secret="wrong")
    big = bytes(range(256)) * 2048  # 512 KiB: the gateway splices it
    good.put_object(Bucket=shared, Key="big.bin", Body=big)
    for _ in range(8):
        for key, body in (("doc.txt", b"hello s3"), ("big.bin", big)):
            with pytest.raises(ClientError) as e:
                bad.get_object(Bucket=shared, Key=key)
            assert code(e) == ("SignatureDoesNotMatch", 403)
            assert good.get_object(Bucket=shared, Key=key)["Body"].read() == body
        with pytest.raises(ClientError) as e:
            bad.get_object(Bucket=shared, Key="no-such-key")
        assert code(e) == ("SignatureDoesNotMatch", 403)
        with pytest.raises(ClientError) as e:
            good.get_object(Bucket=shared, Key="no-such-key")
        assert code(e) == ("NoSuchKey", 404)


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with LocalCluster(
        tmp_path_factory.mktemp("s3-guarded") / "data", targets=1, token="t0k", read_token="r34d"
    ) as c:
        yield c.endpoint.rstrip("/")


def _owner_gets(target: str) -> float:
    """The object GETs a target has answered (its request metrics)."""
    text = httpx.get(f"{target}/metrics", headers={"Authorization": "Bearer t0k"}).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("sluice_http_requests_total{")
        and 'op="get"' in line
        and 'route="/v1/objects/{bucket}/{name:path}"' in line
    )


def test_keys_need_the_token_and_anonymous_reads_are_refused(guarded: str) -> None:
    assert httpx.post(f"{guarded}/v1/s3/keys", json={}).status_code == 401
    assert httpx.get(f"{guarded}/v1/s3/keys").status_code == 401
    writer = make_key(guarded, "write", token="t0k")
    listed = httpx.get(f"{guarded}/v1/s3/keys", headers={"Authorization": "Bearer t0k"}).json()
    assert writer["access_key"] in [k["access_key"] for k in listed["keys"]]
    assert "secret_key" not in str(listed)
    s3 = s3_client(guarded, writer)
    s3.create_bucket(Bucket="guarded")
    s3.put_object(Bucket="guarded", Key="secret.txt", Body=b"classified")
    assert s3.get_object(Bucket="guarded", Key="secret.txt")["Body"].read() == b"classified"
    # Reads need a token here: a refused GetObject never reaches the owner.
    owner = (
        httpx.get(
            f"{guarded}/v1/objects/guarded/secret.txt", headers={"Authorization": "Bearer r34d"}
        )
        .headers["location"]
        .split("/v1/")[0]
    )
    before = _owner_gets(owner)
    r = requests.get(f"{guarded}/s3/guarded/secret.txt", timeout=10)
    assert r.status_code == 403 and b"classified" not in r.content
    with pytest.raises(ClientError) as e:
        s3_client(guarded, writer, secret="wrong").get_object(Bucket="guarded", Key="secret.txt")
    assert code(e) == ("SignatureDoesNotMatch", 403)
    assert _owner_gets(owner) == before
    with pytest.raises(ClientError) as e:
        s3_client(guarded, None).list_objects_v2(Bucket="guarded")
    assert code(e) == ("AccessDenied", 403)
    gone = httpx.delete(
        f"{guarded}/v1/s3/keys/{writer['access_key']}", headers={"Authorization": "Bearer t0k"}
    )
    assert gone.json() == {"access_key": writer["access_key"], "deleted": True}
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket="guarded", Key="secret.txt")
    assert code(e) == ("InvalidAccessKeyId", 403)


def test_cli_makes_lists_and_deletes_keys(
    endpoint: str, shared: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from etl_runtime.cli import main

    assert main(["--endpoint", endpoint, "s3", "key", "create", "--read"]) == 0
    out = capsys.readouterr().out
    fields = dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)
    key = {"access_key": fields["access key"].strip(), "secret_key": fields["secret key"].strip()}
    assert fields["permission"].strip() == "read"
    s3 = s3_client(endpoint, key)
    assert s3.get_object(Bucket=shared, Key="doc.txt")["Body"].read() == b"hello s3"
    assert main(["--endpoint", endpoint, "s3", "key", "list"]) == 0
    assert key["access_key"] in capsys.readouterr().out
    assert main(["--endpoint", endpoint, "s3", "key", "delete", key["access_key"]]) == 0
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=shared, Key="doc.txt")
    assert code(e) == ("InvalidAccessKeyId", 403)
