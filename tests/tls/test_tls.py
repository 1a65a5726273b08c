"""``sluice up --tls``: HTTPS on every hop, with the clients users have.

One 3-target cluster with ``--tls`` for the module: its CA and a certificate
per server under ``DATA_DIR/tls``, every redirect ``https://``, plain HTTP to
any of its ports refused (the connection closes, nothing is served), and
curl, the SDK (``ca=`` and ``SLUICE_CA``), the aistore SDK (``ca_cert``),
boto3 (``verify=``) and webdataset (curl under ``pipe:`` and its own https
URLs) read plain objects, ETL GETs (307 to the transformer, itself on
HTTPS), S3 GETs and GetBatches through it, while the internal hops (gateway
→ targets, target → target, target → transformer) verify the same CA.
"""

from __future__ import annotations

import io
import os
import socket
import ssl
import stat
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import boto3
import httpx
import pytest
import webdataset as wds
from aistore.sdk import Client as AisClient
from aistore.sdk.etl import ETLConfig
from aistore.sdk.retry_config import RetryConfig
from botocore.config import Config
from botocore.exceptions import SSLError as BotoSSLError
from tenacity import Retrying, stop_after_attempt
from urllib3.util.retry import Retry

from etl_runtime.local import LocalCluster
from etl_runtime.sdk import Client

pytestmark = pytest.mark.timeout(300)

UPPER = "def transform(data):\n    return data.upper()\n"
NO_RETRIES = RetryConfig(
    http_retry=Retry(total=0), network_retry=Retrying(stop=stop_after_attempt(1), reraise=True)
)
BIG = b"abcdefgh" * (256 << 10)  # 2 MiB: bigger than any socket buffer, past every small path


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("tls") / "data", targets=3, tls=True) as c:
        with Client(c.endpoint, ca=c.ca) as sdk:
            bucket = sdk.bucket("sec")
            bucket.create()
            for i in range(6):
                bucket.object(f"o{i}.txt").put_content(f"object {i}".encode())
            bucket.object("big.bin").put_content(BIG)
            sdk.etl("upper").init_spec(UPPER)
        yield c


def curl(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["curl", "-sS", *args], capture_output=True, timeout=60)


def target_urls(up: LocalCluster) -> list[str]:
    with Client(up.endpoint, ca=up.ca) as sdk:
        return [t["url"] for t in sdk.cluster()["targets"]]


def test_every_server_has_its_own_certificate_and_private_keys_are_0600(
    up: LocalCluster,
) -> None:
    tls = up.data_dir / "tls"
    assert up.endpoint.startswith("https://127.0.0.1:")
    names = {p.stem for p in tls.glob("*.crt")}
    assert names == {"ca", "gateway", "t0", "t1", "t2", "transformer"}
    for key in tls.glob("*.key"):
        mode = stat.S_IMODE(key.stat().st_mode)
        assert not mode & 0o007, f"{key.name} is {oct(mode)}"  # nobody else
        if key.stem != "transformer":  # that one is the ETL users' group's to read
            assert mode == 0o600, f"{key.name} is {oct(mode)}"
    # a target's certificate is for the loopback names, signed by the CA
    for host in ("127.0.0.1", "localhost"):
        port = urlsplit(target_urls(up)[0]).port
        r = curl("--cacert", up.ca, f"https://{host}:{port}/v1/health")
        assert r.returncode == 0, r.stderr
    r = curl(f"{up.endpoint}/v1/health")  # the system's CAs do not know ours
    assert r.returncode == 60 and b"certificate" in r.stderr


def test_plain_http_to_every_tls_port_is_refused_not_served(up: LocalCluster) -> None:
    with Client(up.endpoint, ca=up.ca) as sdk:
        etl = sdk.request_json("GET", "/v1/etl/upper")
    ports = [urlsplit(u).port for u in [up.endpoint, *target_urls(up)]]
    ports += [urlsplit(t["endpoint"]).port for t in etl["transformers"] if t.get("endpoint")]
    assert len(ports) >= 5, etl  # gateway, 3 targets, transformers
    for port in ports:
        assert port is not None
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
            got = b""
            try:
                while chunk := s.recv(4096):
                    got += chunk
            except ConnectionResetError:
                pass
        assert b"HTTP/1.1 200" not in got and b"healthy" not in got.lower(), (port, got[:200])
        r = curl(f"http://127.0.0.1:{port}/v1/health")
        assert r.returncode == 52 or r.returncode == 56, (port, r)  # empty reply / reset


def test_curl_with_the_ca_gets_redirected_to_https_targets_and_transformers(
    up: LocalCluster,
) -> None:
    r = curl("--cacert", up.ca, "-i", f"{up.endpoint}/v1/objects/sec/o1.txt")
    head = r.stdout.decode("latin-1").lower()
    assert " 307 " in head.splitlines()[0], head
    location = next(line for line in head.splitlines() if line.startswith("location:"))
    assert location.split(":", 1)[1].strip().startswith("https://127.0.0.1:"), location
    r = curl("--cacert", up.ca, "-L", f"{up.endpoint}/v1/objects/sec/o1.txt")
    assert r.returncode == 0 and r.stdout == b"object 1", r
    # an ETL GET: gateway -> target -> transformer, every hop verified
    r = curl("--cacert", up.ca, "-L", f"{up.endpoint}/v1/objects/sec/o2.txt?etl_name=upper")
    assert r.returncode == 0 and r.stdout == b"OBJECT 2", r
    r = curl("--cacert", up.ca, "-L", "-o", "-", f"{up.endpoint}/v1/objects/sec/big.bin")
    assert r.stdout == BIG
    r = curl("--cacert", up.ca, "-L", f"{up.endpoint}/v1/objects/sec/big.bin?etl_name=upper")
    assert r.stdout == BIG.upper()


def test_every_redirect_location_is_https(up: LocalCluster) -> None:
    """Each 307 on the way, followed by hand: gateway -> target (-> transformer)."""
    with httpx.Client(verify=ssl.create_default_context(cafile=up.ca)) as http:
        for query in ("", "?etl_name=upper"):
            url, hops = f"{up.endpoint}/v1/objects/sec/o3.txt{query}", 0
            while True:
                r = http.get(url)
                if r.status_code != 307:
                    break
                url, hops = r.headers["location"], hops + 1
                assert url.startswith("https://"), url
            assert r.status_code == 200 and r.content.lower() == b"object 3", r.text
            assert hops >= 1


def test_the_sdk_with_ca_and_with_sluice_ca(
    up: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Client(up.endpoint, ca=up.ca) as sdk:
        assert sdk.bucket("sec").object("o4.txt").get_bytes() == b"object 4"
        assert sdk.bucket("sec").object("o4.txt").get_bytes(etl_name="upper") == b"OBJECT 4"
        got = [(g.name, g.data) for g in sdk.get_batch([("sec", "o0.txt"), ("sec", "big.bin")])]
        assert got == [("o0.txt", b"object 0"), ("big.bin", BIG)]
        got = [g.data for g in sdk.get_batch([("sec", "o5.txt")], etl_name="upper")]
        assert got == [b"OBJECT 5"]
    monkeypatch.setenv("SLUICE_CA", up.ca)
    with Client(up.endpoint) as sdk:
        assert sdk.bucket("sec").object("o5.txt").get_bytes() == b"object 5"
    monkeypatch.delenv("SLUICE_CA")
    with Client(up.endpoint, retries=0) as sdk, pytest.raises(Exception) as raised:
        sdk.bucket("sec").object("o5.txt").get_bytes()
    assert "certificate" in str(raised.value).lower(), raised.value


def test_the_aistore_sdk_with_ca_cert(up: LocalCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    # requests (under the aistore SDK) lets REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE override a
    # session's CA file: a machine that sets them (this one does) must name ours there
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    ais = AisClient(up.endpoint, ca_cert=up.ca, retry_config=NO_RETRIES)
    obj = ais.bucket("sec").object("o1.txt")
    assert obj.get_reader().read_all() == b"object 1"
    assert obj.get_reader(etl=ETLConfig("upper")).read_all() == b"OBJECT 1"
    assert ais.bucket("sec").object("big.bin").get_reader().read_all() == BIG
    names = {e.name for e in ais.bucket("sec").list_all_objects()}
    assert {"o0.txt", "big.bin"} <= names
    ais.bucket("sec").object("ais/put.txt").get_writer().put_content(b"via aistore")
    assert ais.bucket("sec").object("ais/put.txt").get_reader().read_all() == b"via aistore"
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", up.ca)  # the environment's way
    assert AisClient(up.endpoint).bucket("sec").object("o2.txt").get_reader().read_all() == (
        b"object 2"
    )
    monkeypatch.delenv("REQUESTS_CA_BUNDLE")
    with pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED"):
        AisClient(up.endpoint, retry_config=NO_RETRIES).bucket("sec").object(
            "o2.txt"
        ).get_reader().read_all()


def test_aistore_multipart_upload_and_append_over_https(
    up: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over HTTPS the aistore SDK sends a PUT's headers alone first and its body where a
    307 points: parts and appends still land once, whole (docs/aistore.md)."""
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    ais = AisClient(up.endpoint, ca_cert=up.ca, retry_config=NO_RETRIES)
    obj = ais.bucket("sec").object("ais/multipart.bin")
    parts = [BIG, b"middle part", b"tail"]
    mpu = obj.multipart_upload().create()
    for n in (3, 1, 2):  # out of order: the object is the parts in ascending order
        mpu.add_part(n).put_content(parts[n - 1])
    mpu.complete()
    assert obj.get_reader().read_all() == b"".join(parts)
    log = ais.bucket("sec").object("ais/log.txt").get_writer()
    handle = log.append_content(b"one ")
    handle = log.append_content(b"two", handle=handle)
    log.append_content(b"", handle=handle, flush=True)
    assert ais.bucket("sec").object("ais/log.txt").get_reader().read_all() == b"one two"
    with ais.bucket("sec").object("ais/log.txt").get_writer().as_file(mode="a") as f:
        f.write(b" three")
    assert ais.bucket("sec").object("ais/log.txt").get_reader().read_all() == b"one two three"


def s3_key(up: LocalCluster) -> dict[str, Any]:
    r = httpx.post(
        f"{up.endpoint}/v1/s3/keys",
        json={"permission": "write"},
        verify=ssl.create_default_context(cafile=up.ca),
        timeout=30,
    )
    r.raise_for_status()
    return dict(r.json())


def boto(up: LocalCluster, key: dict[str, Any], verify: str | bool) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=f"{up.endpoint}/s3",
        aws_access_key_id=key["access_key"],
        aws_secret_access_key=key["secret_key"],
        region_name="us-east-1",
        verify=verify,
        config=Config(
            signature_version="s3v4",
            s3={"addressing_style": "path"},
            retries={"max_attempts": 1, "mode": "standard"},
        ),
    )


def test_boto3_with_verify_ca(up: LocalCluster) -> None:
    key = s3_key(up)
    s3 = boto(up, key, up.ca)
    s3.put_object(Bucket="sec", Key="s3/put.txt", Body=b"via boto3")
    assert s3.get_object(Bucket="sec", Key="s3/put.txt")["Body"].read() == b"via boto3"
    assert s3.get_object(Bucket="sec", Key="big.bin")["Body"].read() == BIG
    got = s3.get_object(Bucket="sec", Key="o2.txt", Range="bytes=2-4")["Body"].read()
    assert got == b"jec"
    with pytest.raises(BotoSSLError):
        boto(up, key, True).get_object(Bucket="sec", Key="o2.txt")


def shards(up: LocalCluster) -> list[str]:
    with Client(up.endpoint, ca=up.ca) as sdk:
        for i in range(2):
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as tar:
                for j in range(3):
                    data = f"sample {i}-{j}".encode()
                    info = tarfile.TarInfo(f"s{i}{j}.txt")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
            sdk.bucket("sec").object(f"shard-{i}.tar").put_content(buf.getvalue())
    return [f"{up.endpoint}/v1/objects/sec/shard-{i}.tar" for i in range(2)]


def test_webdataset_over_https(up: LocalCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    urls = shards(up)
    want = sorted(f"sample {i}-{j}".encode() for i in range(2) for j in range(3))
    piped = [f"pipe:curl -sS -f -L --cacert {up.ca} '{u}'" for u in urls]
    got = sorted(s["txt"] for s in wds.WebDataset(piped, shardshuffle=False))
    assert got == want
    # its own https:// URLs go through curl too; curl reads the CA from CURL_CA_BUNDLE
    monkeypatch.setenv("CURL_CA_BUNDLE", up.ca)
    got = sorted(s["txt"] for s in wds.WebDataset(urls, shardshuffle=False))
    assert got == want


def test_the_fast_path_indicator_says_zero_copy_is_off_under_tls(up: LocalCluster) -> None:
    with httpx.Client(verify=ssl.create_default_context(cafile=up.ca)) as http:
        for url in [up.endpoint, *target_urls(up)]:
            text = http.get(f"{url}/metrics").text
            lines = [ln for ln in text.splitlines() if ln.startswith("sluice_fast_path_enabled")]
            on = {ln.split('path="')[1].split('"')[0]: ln.endswith(" 1.0") for ln in lines}
            assert on["zerocopy"] is False and on["splice"] is False, (url, lines)
            assert on["inprotocol"] is True, (url, lines)
    logs = Path(up.data_dir / "logs" / "t0.log").read_text()
    assert "fast paths off: zerocopy (TLS" in logs


def test_the_cli_env_points_at_the_ca(up: LocalCluster) -> None:
    env = {**os.environ, "SLUICE_CA": up.ca, "SLUICE_ENDPOINT": up.endpoint}
    r = subprocess.run(
        [sys.executable, "-m", "etl_runtime.cli", "ls", "sec"],
        capture_output=True,
        env=env,
        timeout=60,
    )
    assert r.returncode == 0 and b"o0.txt" in r.stdout, r.stderr


S3TORCH = """
import sys
from s3torchconnector import S3ClientConfig
from s3torchconnector._s3client import S3Client
config = S3ClientConfig(unsigned=True, force_path_style=True, max_attempts=1)
client = S3Client("us-east-1", endpoint=sys.argv[1] + "/s3", s3client_config=config)
sys.stdout.buffer.write(client.get_object("sec", "o3.txt").read())
"""


def test_s3torchconnector_trusts_the_ca_named_by_ssl_cert_file(up: LocalCluster) -> None:
    """It takes no CA argument; its CRT client reads the trust store from SSL_CERT_FILE."""
    env = {**os.environ, "SSL_CERT_FILE": up.ca}
    r = subprocess.run(
        [sys.executable, "-c", S3TORCH, up.endpoint], capture_output=True, env=env, timeout=60
    )
    assert r.returncode == 0 and r.stdout == b"object 3", r.stderr[-2000:]


def connections_to(port: int) -> set[tuple[str, int]]:
    """This machine's TCP connections to ``port`` (open or in TIME_WAIT), by local end."""
    import psutil

    return {
        (c.laddr.ip, c.laddr.port)
        for c in psutil.net_connections("tcp")
        if c.raddr and c.raddr.port == port
    }


def test_the_sdk_keeps_its_connections_across_redirects(
    up: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An SDK read is a 307 from the gateway, then the target's answer: both connections
    are kept, so 30 reads cost no new TLS handshake (each one used to close the
    gateway's connection, unread, and make a new one: a handshake per object)."""
    monkeypatch.setenv("SLUICE_HEDGE_AFTER", "off")  # a hedge on a busy machine asks anew
    ports = [urlsplit(u).port or 0 for u in [up.endpoint, *target_urls(up)]]
    with Client(up.endpoint, ca=up.ca) as c:
        bucket = c.bucket("sec")
        assert bucket.object("o3.txt").get_bytes() == b"object 3"  # the connections made
        before = {p: connections_to(p) for p in ports}
        for i in range(30):
            assert bucket.object(f"o{i % 4}.txt").get_bytes() == f"object {i % 4}".encode()
        after = {p: connections_to(p) for p in ports}
        made = {p: len(after[p] - before[p]) for p in ports}
        assert sum(made.values()) <= len(target_urls(up)), made  # a target first met, at most
        # GetBatch: the gateway's 307 to the target that assembles it, the same way.
        items = [("sec", f"o{i}.txt") for i in range(4)]
        assert [i.data for i in c.get_batch(items)] == [f"object {i}".encode() for i in range(4)]
        gateway = connections_to(ports[0])
        for _ in range(10):
            assert len(list(c.get_batch(items))) == 4
        assert connections_to(ports[0]) - gateway == set()


def handed_files(up: LocalCluster) -> float:
    """Object files the targets handed the gateway (storage_target/handoff.py)."""
    total = 0.0
    with httpx.Client(verify=ssl.create_default_context(cafile=up.ca), timeout=30) as http:
        for url in target_urls(up):
            for line in http.get(f"{url}/metrics").text.splitlines():
                if line.startswith("sluice_handoff_files_total{"):
                    total += float(line.rsplit(" ", 1)[-1])
    return total


def test_s3_gets_under_tls_come_from_the_owners_file_encrypted_once(up: LocalCluster) -> None:
    # Gateway and owner share the host: the owner hands its open file over a Unix
    # socket, and the gateway encrypts it to the client (one TLS hop, not two).
    s3 = boto(up, s3_key(up), up.ca)
    data = {"s3h/small": os.urandom(16 << 10), "s3h/mid": os.urandom(300 << 10)}
    data["s3h/big"] = os.urandom(3 << 20)
    for key, body in data.items():
        s3.put_object(Bucket="sec", Key=key, Body=body)
    time.sleep(1.1)  # a file changed within the last second is never handed
    before = handed_files(up)
    for _ in range(2):  # over 1 MiB: relayed until a GET has checked it, then handed
        for key, body in data.items():
            r = s3.get_object(Bucket="sec", Key=key)
            assert r["ContentLength"] == len(body)
            assert r["Body"].read() == body
    assert handed_files(up) - before >= len(data)  # each one at least once
    # a range still goes the usual way, through the owner's TLS port
    got = s3.get_object(Bucket="sec", Key="s3h/big", Range="bytes=5-9")["Body"].read()
    assert got == data["s3h/big"][5:10]
