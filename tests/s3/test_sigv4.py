"""SigV4 as botocore signs it, verified by ``gateway/s3/sigv4.py`` without a server.

botocore (the official client's signer) signs requests whose signed headers
hold runs of spaces, tabs and repeated names, and a query; the gateway's
check must accept each exactly as signed and refuse any change to a signed
part. The servers' tests (``test_auth.py``) cover the wire; these cover the
canonical forms the wire tests do not send.
"""

from __future__ import annotations

import time

import botocore.auth
import botocore.awsrequest
import botocore.credentials
import pytest
from starlette.requests import Request

from etl_runtime.core.errors import S3Error
from etl_runtime.gateway.s3 import sigv4

SECRET = "s3cr3t/with+odd=chars"


class Keys:
    def secret(self, access_key: str) -> str | None:
        return SECRET if access_key == "AKTEST" else None


def _signed(headers: dict[str, str], query: str = "") -> list[tuple[bytes, bytes]]:
    url = "http://127.0.0.1:8080/s3/bucket/some%20key.bin" + (f"?{query}" if query else "")
    request = botocore.awsrequest.AWSRequest(method="GET", url=url, headers=headers)
    creds = botocore.credentials.Credentials("AKTEST", SECRET)
    botocore.auth.S3SigV4Auth(creds, "s3", "eu-west-1").add_auth(request)
    out = [(b"host", b"127.0.0.1:8080")]
    for k, v in request.headers.items():
        out.append((k.lower().encode(), v if isinstance(v, bytes) else v.encode()))
    return out


def _request(headers: list[tuple[bytes, bytes]], query: str = "") -> Request:
    path = "/s3/bucket/some key.bin"
    return Request(
        {
            "type": "http",
            "method": "GET",
            "path": path,
            "raw_path": b"/s3/bucket/some%20key.bin",
            "query_string": query.encode(),
            "headers": headers,
        }
    )


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"X-Amz-Meta-Note": "two  spaces\tand a tab", "Range": " bytes=0-9 "},
        {"X-Amz-Meta-Plain": "one space only"},
    ],
)
def test_what_botocore_signs_verifies(extra: dict[str, str]) -> None:
    headers = _signed(extra, "versionId=x%2By&acl=")
    signed = sigv4.verify(_request(headers, "versionId=x%2By&acl="), Keys())
    assert signed.access_key == "AKTEST"


def test_a_changed_signed_header_or_query_is_refused() -> None:
    headers = _signed({"X-Amz-Meta-Note": "a  b"}, "acl=")
    changed = [(k, b"a b c" if k == b"x-amz-meta-note" else v) for k, v in headers]
    with pytest.raises(S3Error) as e:
        sigv4.verify(_request(changed, "acl="), Keys())
    assert e.value.code == "SignatureDoesNotMatch"
    with pytest.raises(S3Error) as e:
        sigv4.verify(_request(headers, "acl=&x=1"), Keys())
    assert e.value.code == "SignatureDoesNotMatch"


def test_a_repeated_signed_header_is_joined_as_signed() -> None:
    headers = _signed({"X-Amz-Meta-Note": "first"})
    # the same header twice on the wire: canonical value "first,second" (AWS's rule)
    doubled = [*headers, (b"x-amz-meta-note", b"second")]
    with pytest.raises(S3Error) as e:
        sigv4.verify(_request(doubled), Keys())
    assert e.value.code == "SignatureDoesNotMatch"
    assert sigv4.verify(_request(headers), Keys()).access_key == "AKTEST"


def test_a_request_time_is_checked_however_often_it_repeats() -> None:
    headers = _signed({})
    for _ in range(3):  # the parsed time is kept: the skew check still runs each time
        assert sigv4.verify(_request(headers), Keys(), now=time.time()).access_key == "AKTEST"
    with pytest.raises(S3Error) as e:
        sigv4.verify(_request(headers), Keys(), now=time.time() + 3600)
    assert e.value.code == "RequestTimeTooSkewed"
