"""An auditor's probes against a real 3-target ``sluice up`` with a user and a read token.

Four callers: a token for bucket ``mine`` (read, or write), an S3 key for it, ETL code
in a transformer, and an anonymous client. Each probe is a request a hostile caller
would make, and what it must get: a 403 naming the bucket for a second bucket a route
names (a view's source, a copy's source, a multi-object job's bucket, a GetBatch on a
target); a 401, never a 500, for credentials no server could accept (non-ASCII ones
too); a 400 naming the parameter for a name that could escape the data dir; 431/413/400
for heads and bodies a shared cluster must not keep in memory; and no answer naming a
filesystem path. ETL code (as root, each ETL its own uid) cannot hold the cluster map's
lock, which would stop every map update, token revocation included.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
import shutil
import socket
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import httpx
import psutil
import pytest
from aistore.sdk import Client as AisClient
from aistore.sdk.errors import AISError
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

import etl_runtime
from etl_runtime import Client
from etl_runtime.local import LocalCluster

pytestmark = pytest.mark.timeout(300)
ADMIN, READER = "admin-secret", "reader-secret"


def upcase(data: bytes) -> bytes:
    return data.upper()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


class Env:
    def __init__(self, up: LocalCluster) -> None:
        self.up, self.ep = up, up.endpoint
        self.targets = list(json.loads((up.data_dir / "cluster.json").read_text())["urls"].values())
        self.read = self.mint(["mine"], "read")
        self.write = self.mint(["mine"], "write")
        self.answers: list[str] = []  # every error body seen: none may name a path

    def mint(self, buckets: list[str], permission: str) -> str:
        body = {"buckets": buckets, "permission": permission}
        r = httpx.post(f"{self.ep}/v1/tokens", json=body, headers=bearer(ADMIN))
        assert r.status_code == 200, r.text
        return str(r.json()["token"])

    def key(self, permission: str) -> dict[str, str]:
        body = {"permission": permission, "buckets": ["mine"]}
        return dict(httpx.post(f"{self.ep}/v1/s3/keys", json=body, headers=bearer(ADMIN)).json())

    def s3(self, permission: str, signature: str = "s3v4") -> Any:
        key = self.key(permission)
        return boto3.client(
            "s3",
            endpoint_url=f"{self.ep}/s3",
            aws_access_key_id=key["access_key"],
            aws_secret_access_key=key["secret_key"],
            region_name="us-east-1",
            config=Config(
                signature_version=signature,
                s3={"addressing_style": "path"},
                retries={"max_attempts": 1},
            ),
        )

    def seen(self, r: httpx.Response) -> httpx.Response:
        self.answers.append(r.text)
        return r

    def pid(self, name: str) -> int:
        run = json.loads((self.up.data_dir / "run" / "up.json").read_text())
        return int(next(c["pid"] for c in run["children"] if c["name"] == name))


@pytest.fixture(scope="module")
def env() -> Iterator[Env]:
    base = Path(tempfile.mkdtemp(prefix="sluice-probes-"))
    base.chmod(0o755)  # pytest's own tmp dirs are 0700: no ETL uid could enter them
    try:
        with LocalCluster(base / "data", targets=3, token=ADMIN, read_token=READER) as up:
            with Client(up.endpoint, token=ADMIN) as admin:
                for b in ("mine", "theirs"):
                    bucket = admin.bucket(b).create()
                    for i in range(3):
                        bucket.object(f"o{i}.txt").put_content(f"{b} o{i}".encode())
                admin.etl("upcase").init_code(transform=upcase)
                admin.bucket("peek").create(view_of="theirs", etl="upcase")
            e = Env(up)
            yield e
            data_dir = str(up.data_dir.resolve())
            leaked = [a[:200] for a in e.answers if data_dir in a or "/tmp/" in a]
            assert not leaked, leaked
    finally:
        shutil.rmtree(base, ignore_errors=True)


def forbidden(r: httpx.Response, bucket: str) -> None:
    assert r.status_code == 403, (r.request.method, r.request.url, r.status_code, r.text)
    if r.request.method != "HEAD":
        assert r.json().get("bucket") == bucket and repr(bucket) in r.json()["error"], r.text


def names_in_tar(raw: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]


# -- a second bucket ------------------------------------------------------------------


def test_a_views_source_is_checked_everywhere(env: Env) -> None:
    """A token for the view 'peek' alone reads nothing of its source 'theirs': not through
    the gateway, nor a GetBatch sent to a target directly (it served the source's
    objects); a token may not make a view of a bucket it cannot read, whether or not
    that bucket exists."""
    peeker = bearer(env.mint(["peek"], "read"))
    batch = {"in": [{"objname": "o1.txt"}, {"objname": "o2.txt"}], "strm": True}
    for base in [env.ep, *env.targets]:
        for path in ("/v1/ml/moss/peek", "/v1/ml/moss"):
            body = (
                batch
                if path.endswith("peek")
                else {"in": [{"objname": "o1.txt", "bucket": "peek"}]}
            )
            r = env.seen(httpx.request("GET", base + path, json=body, headers=peeker))
            forbidden(r, "theirs")
        forbidden(env.seen(httpx.get(f"{base}/v1/objects/peek/o1.txt", headers=peeker)), "theirs")
    both = bearer(env.mint(["peek", "theirs"], "read"))
    r = httpx.request("GET", f"{env.targets[0]}/v1/ml/moss/peek", json=batch, headers=both)
    assert names_in_tar(r.content) == {"peek/o1.txt": b"THEIRS O1", "peek/o2.txt": b"THEIRS O2"}
    maker = bearer(env.mint(["mine", "newv"], "write"))
    for source in ("theirs", "no-such-bucket"):
        props = {"view_of": source, "etl": "upcase"}
        r = httpx.post(
            f"{env.ep}/v1/buckets/newv",
            json={"action": "create-bck", "props": props},
            headers=maker,
        )
        forbidden(env.seen(r), source)
    with Client(env.ep, token=ADMIN) as admin:
        assert "newv" not in admin.list_buckets()


def test_s3_routes_that_name_a_second_bucket(env: Env) -> None:
    writer, reader = env.s3("write"), env.s3("read")
    upload = writer.create_multipart_upload(Bucket="mine", Key="mp")["UploadId"]
    calls = {
        "UploadPartCopy": lambda: writer.upload_part_copy(
            Bucket="mine",
            Key="mp",
            UploadId=upload,
            PartNumber=1,
            CopySource={"Bucket": "theirs", "Key": "o0.txt"},
            CopySourceRange="bytes=0-3",
        ),
        "CopyObject": lambda: writer.copy_object(
            Bucket="mine", Key="c", CopySource={"Bucket": "theirs", "Key": "o0.txt"}
        ),
        "DeleteObjects": lambda: writer.delete_objects(
            Bucket="theirs", Delete={"Objects": [{"Key": "o0.txt"}]}
        ),
        "ListObjectsV2": lambda: reader.list_objects_v2(Bucket="theirs", Prefix="o"),
        "ListMultipartUploads": lambda: reader.list_multipart_uploads(Bucket="theirs"),
        "AbortMultipartUpload": lambda: writer.abort_multipart_upload(
            Bucket="theirs", Key="mp", UploadId=upload
        ),
    }
    for name, call in calls.items():
        with pytest.raises(ClientError) as err:
            call()
        assert err.value.response["Error"]["Code"] == "AccessDenied", name
        assert "'theirs'" in err.value.response["Error"]["Message"], name
    # A listing of 'mine' with a prefix that climbs out of it lists nothing of 'theirs'.
    listed = reader.list_objects_v2(Bucket="mine", Prefix="../theirs/").get("Contents", [])
    assert listed == []
    # A presigned URL (SigV4 and SigV2) for 'mine': another bucket or method is refused.
    for signature in ("s3v4", "s3"):
        signer = env.s3("read", signature)
        url = signer.generate_presigned_url("get_object", {"Bucket": "mine", "Key": "o0.txt"})
        assert httpx.get(url).content == b"mine o0"
        for method, target in (
            ("GET", url.replace("/mine/", "/theirs/")),
            ("PUT", url),
            ("DELETE", url),
        ):
            r = env.seen(httpx.request(method, target, content=b"x" if method == "PUT" else None))
            assert r.status_code == 403 and b"SignatureDoesNotMatch" in r.content, (
                signature,
                method,
            )
        other = signer.generate_presigned_url("get_object", {"Bucket": "theirs", "Key": "o0.txt"})
        r = httpx.get(other)
        assert r.status_code == 403 and b"'theirs'" in r.content, (signature, r.text)
        put = signer.generate_presigned_url("put_object", {"Bucket": "mine", "Key": "p"})
        assert httpx.put(put, content=b"x").status_code == 403  # a read key's PUT
    with Client(env.ep, token=ADMIN) as admin:
        assert admin.bucket("theirs").object("o0.txt").get_bytes() == b"theirs o0"


def test_aistore_multi_object_calls_on_another_bucket(env: Env) -> None:
    ais = AisClient(env.ep, token=env.write)
    theirs, mine = ais.bucket("theirs"), ais.bucket("mine")
    calls = {
        "delete names": lambda: theirs.objects(obj_names=["o0.txt"]).delete(),
        "delete template": lambda: theirs.objects(obj_template="o{0..2}.txt").delete(),
        "copy out": lambda: theirs.objects(obj_names=["o0.txt"]).copy(mine),
        "copy in": lambda: mine.objects(obj_names=["o0.txt"]).copy(theirs),
        "transform in": lambda: mine.objects(obj_names=["o0.txt"]).transform(
            theirs, etl_name="upcase"
        ),
        "archive in": lambda: mine.objects(obj_names=["o0.txt"]).archive(
            archive_name="a.tar", to_bck=theirs
        ),
        "archive out": lambda: theirs.objects(obj_names=["o0.txt"]).archive(
            archive_name="a.tar", to_bck=mine
        ),
        "bucket copy": lambda: theirs.copy(mine),
        "rename": lambda: theirs.rename("stolen"),
        "append": lambda: theirs.object("o9").get_writer().append_content(b"x"),
        "object copy": lambda: mine.object("o0.txt").copy(theirs.object("x")),
    }
    for name, call in calls.items():
        with pytest.raises(AISError) as err:
            call()
        assert err.value.status_code == 403 and "'theirs'" in str(err.value), name
    with Client(env.ep, token=ADMIN) as admin:
        assert sorted(o.name for o in admin.bucket("theirs").list_objects()) == [
            "o0.txt",
            "o1.txt",
            "o2.txt",
        ]
        assert "stolen" not in admin.list_buckets()


def test_every_job_kind_with_another_bucket(env: Env) -> None:
    """``POST /v1/jobs`` of each kind, with 'theirs' as its source or its destination."""
    kinds = [
        ("prefetch", {"bucket": "theirs"}),
        ("evict", {"bucket": "theirs"}),
        ("scrub", {"bucket": "theirs"}),
        ("delete-listrange", {"bucket": "theirs", "objnames": ["o0.txt"]}),
        ("copy-bck", {"src": "theirs", "dst": "mine"}),
        ("move-bck", {"src": "mine", "dst": "theirs"}),
        ("copy-listrange", {"src": "mine", "dst": "theirs", "objnames": ["o0.txt"]}),
        (
            "etl-listrange",
            {"src": "theirs", "dst": "mine", "etl": ["upcase"], "objnames": ["o0.txt"]},
        ),
        ("etl-bck", {"src": "mine", "dst": "theirs", "etl": ["upcase"]}),
    ]
    archive = {"archname": "a.tar", "objnames": ["o0.txt"], "format": ".tar"}
    kinds += [("archive", {"bucket": "theirs", "dst": "mine", **archive})]
    kinds += [("archive", {"bucket": "mine", "dst": "theirs", **archive})]
    for kind, spec in kinds:
        body = {"kind": kind, "spec": spec}
        r = env.seen(httpx.post(f"{env.ep}/v1/jobs", json=body, headers=bearer(env.write)))
        forbidden(r, "theirs")


# -- credentials no server accepts ------------------------------------------------------


def test_odd_credentials_are_a_401_never_a_500(env: Env) -> None:
    """Non-ASCII bearers and signatures (``hmac.compare_digest`` raises on them) and a
    non-ASCII digit ('²' passes ``str.isdigit`` and fails ``int``), on every server."""
    odd: list[tuple[str, dict[str, Any]]] = [
        ("/v1/objects/mine/o0.txt", {"headers": {"Authorization": b"Bearer \xe9\xe9"}}),
        ("/v1/objects/mine/o0.txt", {"headers": {"Authorization": b"Bearer sluice1.\xe9.\xe9"}}),
        ("/v1/buckets/mine", {"headers": {"Authorization": b"Bearer \xe9"}}),
        ("/v1/objects/mine/o0.txt?sluice_exp=%C2%B2&sluice_sig=x", {}),
        ("/v1/objects/mine/o0.txt?sluice_exp=99999999999&sluice_sig=%C3%A9", {}),
    ]
    for base in [env.ep, *env.targets]:
        for path, kw in odd:
            r = env.seen(httpx.get(base + path, **kw))
            assert r.status_code == 401, (base, path, r.status_code, r.text)
    r = httpx.request(
        "GET",
        f"{env.targets[0]}/v1/ml/moss/mine?sluice_map=%C2%B2",
        json={"in": []},
        headers=bearer(ADMIN),
    )
    assert r.status_code == 400 and "sluice_map" in r.json()["error"], r.text
    for signature in ("s3v4", "s3"):
        url = env.s3("read", signature).generate_presigned_url(
            "get_object", {"Bucket": "mine", "Key": "o0.txt"}
        )
        bad = re.sub(r"((?:X-Amz-)?Expires)=\d+", r"\1=%C2%B2", url)
        r = env.seen(httpx.get(bad))
        assert r.status_code in (400, 403) and b"InternalError" not in r.content, r.text


# -- names ---------------------------------------------------------------------------


def raw_get(base: str, target: str, headers: dict[str, str]) -> bytes:
    host, port = base.split("//", 1)[1].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as s:
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        s.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\n{extra}Connection: close\r\n\r\n".encode())
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def test_names_that_could_escape_are_a_400_naming_them(env: Env) -> None:
    admin = bearer(ADMIN)
    for base in (env.ep, env.targets[0]):
        for name in ("../theirs/o0.txt", "a/../../theirs/o0.txt", "%2e%2e/theirs/o0.txt"):
            answer = raw_get(base, f"/v1/objects/mine/{name}", admin)  # unnormalised, as sent
            assert answer.startswith(b"HTTP/1.1 400") and b"'..' path segments" in answer, answer
        for name, why in (
            ("%2fetc%2fpasswd", "absolute paths"),
            ("a%00b", "NUL byte"),
            ("x" * 1100, "longer than 1024 bytes"),
            ("a/" + "y" * 300, "longer than 255 bytes"),
            ("a//b", "empty path segment"),
        ):
            for method in ("GET", "PUT"):
                r = env.seen(
                    httpx.request(
                        method, f"{base}/v1/objects/mine/{name}", headers=admin, content=b"z"
                    )
                )
                assert r.status_code == 400 and why in r.json()["error"], (base, name, r.text)
                assert r.json()["kind"] == "InvalidName" and "object" in r.json()
        r = env.seen(httpx.get(f"{base}/v1/buckets/..%2fetc", headers=admin))
        assert r.status_code in (400, 404) and "etc" not in r.headers.get("location", "")
    r = env.seen(httpx.get(f"{env.ep}/v1/buckets/BAD..name!", headers=admin))
    assert r.status_code == 400 and r.json()["bucket"] == "BAD..name!", r.text
    key = (env.up.data_dir / "cluster-key").read_text().strip()
    r = env.seen(httpx.get(f"{env.ep}/v1/etl/..%2f..%2fcluster-key", headers=admin))
    assert r.status_code in (400, 404) and key not in r.text, r.text
    r = env.seen(httpx.delete(f"{env.ep}/v1/tokens/..%2f..%2fx", headers=admin))
    assert r.status_code in (400, 404), r.text
    # archpath: a member name, never a path on the target.
    with Client(env.ep, token=ADMIN) as c:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tarfile.TarInfo("a.txt")
            info.size = 1
            tar.addfile(info, io.BytesIO(b"a"))
        c.bucket("mine").object("s.tar").put_content(buf.getvalue())
    for archpath in ("../../../../etc/passwd", "/etc/passwd", "a.txt%00"):
        r = env.seen(
            httpx.get(
                f"{env.ep}/v1/objects/mine/s.tar?archpath={archpath}",
                headers=admin,
                follow_redirects=True,
            )
        )
        assert 400 <= r.status_code < 500 and b"root:" not in r.content, (archpath, r.status_code)
    # S3 upload ids: never a path.
    writer = env.s3("write")
    for upload in (
        "../../theirs/.s3-multipart/x",
        "/etc/passwd",
        "a/b",
        "0" * 32 + "\n",
        "x" * 3000,
    ):
        for call in (writer.list_parts, writer.abort_multipart_upload):
            with pytest.raises(ClientError) as err:
                call(Bucket="mine", Key="k", UploadId=upload)
            assert err.value.response["Error"]["Code"] == "NoSuchUpload", upload  # as MinIO
            assert "uploadId" in err.value.response["Error"]["Message"], upload
    with pytest.raises(ClientError) as err:  # well formed, but never made: S3's 404
        writer.list_parts(Bucket="mine", Key="k", UploadId="0" * 32)
    assert err.value.response["Error"]["Code"] == "NoSuchUpload"
    r = env.seen(
        httpx.put(
            f"{env.ep}/v1/objects/mine/k?provider=ais&uploadId=..%2F..%2Fx&partNumber=1",
            content=b"x",
            headers=admin,
        )
    )
    assert r.status_code == 400 and "is not an upload id" in r.json()["error"], r.text


def test_a_redirect_location_carries_no_injected_header(env: Env) -> None:
    for name in ("a%0d%0aX-Evil:%201", "caf%C3%A9", "%E2%80%A8x"):
        r = env.seen(httpx.get(f"{env.ep}/v1/objects/mine/{name}", headers=bearer(env.read)))
        assert "x-evil" not in r.headers, r.headers
        location = r.headers.get("location", "")
        assert location.isascii() and "\r" not in location and "\n" not in location, location


# -- resources -------------------------------------------------------------------------


def s3_post(key: dict[str, str], url: str, body: bytes) -> httpx.Response:
    request = AWSRequest(
        method="POST",
        url=url,
        data=body,
        headers={"Content-MD5": base64.b64encode(hashlib.md5(body).digest()).decode()},
    )
    credentials = Credentials(key["access_key"], key["secret_key"])
    S3SigV4Auth(credentials, "s3", "us-east-1").add_auth(request)
    return httpx.post(url, content=body, headers=dict(request.headers.items()), timeout=60)


def test_heads_and_bodies_a_shared_cluster_does_not_keep(env: Env) -> None:
    gateway = psutil.Process(env.pid("gateway"))
    before = gateway.memory_info().rss
    host, port = env.ep.split("//", 1)[1].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as s:  # a 16 MiB header
        s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Big: ")
        try:
            for _ in range(256):
                s.sendall(b"a" * 65536)
        except OSError:
            pass  # closed under us, once refused
        assert s.recv(100).startswith(b"HTTP/1.1 431"), "a 16 MiB head is refused"
    big = b'{"in": [' + b",".join([b'{"objname": "o0.txt"}'] * 1_000_000) + b"]}"  # 21 MB
    for method, path in (
        ("GET", "/v1/ml/moss/mine"),
        ("POST", "/v1/buckets/mine"),
        ("POST", "/v1/jobs"),
        ("PUT", "/v1/etl"),
    ):
        for base in (env.ep, env.targets[0]) if "moss" in path else (env.ep,):
            r = env.seen(
                httpx.request(method, base + path, content=big, headers=bearer(ADMIN), timeout=60)
            )
            assert r.status_code == 413 and r.json()["kind"] == "PayloadTooLarge", (path, r.text)

    deep = b'{"in": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"  # json.loads: RecursionError
    for base, path in (
        (env.ep, "/v1/ml/moss/mine"),
        (env.targets[0], "/v1/ml/moss/mine"),
        (env.ep, "/v1/buckets/mine"),
    ):
        r = env.seen(httpx.request("GET", base + path, content=deep, headers=bearer(env.read)))
        assert 400 <= r.status_code < 500, (base, path, r.status_code, r.text)

    def chunked() -> Iterator[bytes]:
        yield b'{"in": ['
        for _ in range(40):
            yield b",".join([b'{"objname": "o0.txt"}'] * 25_000) + b","
        yield b"{}]}"

    r = httpx.request(
        "POST", f"{env.ep}/v1/jobs", content=chunked(), headers=bearer(ADMIN), timeout=60
    )
    assert r.status_code == 413, r.text
    # S3 XML bodies (signed by hand: boto3 takes seconds to write 100,000 keys).
    key = env.key("write")
    upload = env.s3("write").create_multipart_upload(Bucket="mine", Key="big")["UploadId"]
    keys = b"".join(b"<Object><Key>k%d</Key></Object>" % i for i in range(100_000))
    parts = b"".join(
        b"<Part><PartNumber>%d</PartNumber><ETag>%s</ETag></Part>" % (i + 1, b"e" * 32)
        for i in range(100_000)
    )
    for url, xml in (
        (f"{env.ep}/s3/mine?delete", b"<Delete>" + keys + b"</Delete>"),
        (
            f"{env.ep}/s3/mine/big?uploadId={upload}",
            b"<CompleteMultipartUpload>" + parts + b"</CompleteMultipartUpload>",
        ),
    ):
        r = env.seen(s3_post(key, url, xml))
        assert r.status_code == 400 and b"MalformedXML" in r.content, r.text
    grown = (gateway.memory_info().rss - before) >> 20
    assert grown < 100, f"the gateway grew by {grown} MiB"
    # Idle connections that never finish a head do not keep a client out (they are
    # closed after SLUICE_HEADER_TIMEOUT: tests/wire/test_connections.py).
    idle = [socket.create_connection((host, int(port))) for _ in range(200)]
    for s in idle:
        s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n")
    assert httpx.get(f"{env.ep}/v1/health", timeout=10).status_code == 200
    for s in idle:
        s.close()


# -- ETL code ----------------------------------------------------------------------------


def sniff(data: bytes) -> bytes:
    """Every ``Authorization`` header the transformer's process holds (its requests'
    scopes and headers, found through the garbage collector), and every bearer in bytes."""
    import gc

    if data == b"raise":
        raise ValueError("asked to")
    if data.startswith(b"{"):  # a plan: URLs to GET, with the ETL's token and with none
        import json
        import os
        import urllib.error
        import urllib.request

        got = {}
        for url in json.loads(data)["urls"]:
            for token in (os.environ.get("SLUICE_ETL_TOKEN", ""), ""):
                ask = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
                try:
                    got[f"{url} {bool(token)}"] = urllib.request.urlopen(ask, timeout=10).status
                except urllib.error.HTTPError as e:
                    got[f"{url} {bool(token)}"] = e.code
        return json.dumps(got).encode()
    found = set()
    for o in gc.get_objects():
        try:
            if isinstance(o, dict) and "headers" in o and "type" in o:  # an ASGI scope
                found |= {v.decode() for k, v in o["headers"] if k.lower() == b"authorization"}
            elif isinstance(o, bytes) and b"Bearer " in o and len(o) < 4096:
                i = o.find(b"Bearer ")
                found.add(o[i : i + 80].decode("latin-1"))
        except Exception:  # noqa: BLE001 (anything the collector holds)
            pass
    return "\n".join(sorted(found)).encode()


def test_etl_code_never_sees_a_callers_token(env: Env) -> None:
    """A read through an ETL is a 307 from the target to the transformer, where the ETL's
    code runs: the SDK sent the caller's token on that hop too (the admin token, say),
    and the ETL's code found it in its process. Now the signed hop goes without it."""
    with Client(env.ep, token=ADMIN) as admin:
        admin.etl("sniff").init_code(transform=sniff)
    for token in (ADMIN, env.read):
        with Client(env.ep, token=token) as c:
            for i in range(3):
                seen = c.bucket("mine").object(f"o{i}.txt").get_bytes(etl_name="sniff")
                assert token.encode() not in seen, seen
        r = httpx.get(
            f"{env.ep}/v1/objects/mine/o0.txt?etl_name=sniff",
            headers=bearer(token),
            follow_redirects=True,
        )
        assert r.status_code == 200 and token.encode() not in r.content, r.text
    # Nor can its code read another bucket through the servers' HTTP API with what it has.
    urls = [f"{b}/v1/objects/theirs/o0.txt" for b in (env.ep, *env.targets)]
    urls += [f"{env.ep}/v1/buckets/theirs", f"{env.ep}/v1/tokens"]
    with Client(env.ep, token=ADMIN) as admin:
        admin.bucket("mine").object("plan").put_content(json.dumps({"urls": urls}).encode())
        got = json.loads(admin.bucket("mine").object("plan").get_bytes(etl_name="sniff"))
    assert len(got) == 2 * len(urls) and set(got.values()) == {401}, got
    # An ETL's error names its frames' files without the directories they live in.
    with Client(env.ep, token=ADMIN) as admin:
        admin.bucket("mine").object("boom").put_content(b"raise")
    r = env.seen(
        httpx.get(
            f"{env.ep}/v1/objects/mine/boom?etl_name=sniff",
            headers=bearer(ADMIN),
            follow_redirects=True,
        )
    )
    assert r.status_code == 422 and "asked to" in r.json()["detail"], r.text
    assert 'File "etl_runtime/webserver/' in r.json()["detail"], r.json()["detail"]
    assert str(Path(etl_runtime.__file__).parent) not in r.text, r.text


def locker(data: bytes) -> bytes:
    import fcntl

    try:
        lock = open(data.decode(), "rb")
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        globals()["held"] = lock
        return b"held"
    except OSError as e:
        return ("refused: " + type(e).__name__).encode()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root and a system Python")
def test_etl_code_cannot_hold_the_servers_locks(env: Env) -> None:
    """Held, the cluster map's lock would stop every map update: a bucket made, a token
    made or revoked. ETL code runs as its own uid and cannot open it."""
    with Client(env.ep, token=ADMIN) as admin:
        admin.etl("locker").init_code(transform=locker)
        for lock in ("cluster.json.lock", ".sluice-up.lock"):
            path = str((env.up.data_dir / lock).resolve())
            admin.bucket("mine").object("lock").put_content(path.encode())
            got = admin.bucket("mine").object("lock").get_bytes(etl_name="locker")
            assert got == b"refused: PermissionError", got
    r = httpx.post(
        f"{env.ep}/v1/tokens",
        json={"buckets": ["mine"], "permission": "read"},
        headers=bearer(ADMIN),
        timeout=10,
    )
    assert r.status_code == 200, r.text
