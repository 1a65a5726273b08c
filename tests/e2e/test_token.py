"""A cluster started with a token: writes need it (401 and no change without), reads do not."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from etl_runtime import Client, Unauthorized
from tests.e2e.local import running_cluster

TOKEN = "e2e-token-42"


@pytest.fixture(scope="module")
def secure(tmp_path_factory) -> Iterator[str]:
    with running_cluster(tmp_path_factory.mktemp("secure"), targets=2, token=TOKEN) as url:
        yield url


def test_without_token_writes_are_refused_and_change_nothing(secure: str) -> None:
    with Client(secure, token=TOKEN) as owner:
        owner.bucket("guarded").create().object("keep.txt").put_content(b"original")
    with Client(secure, token="") as anonymous, Client(secure, token="wrong") as intruder:
        for c in (anonymous, intruder):
            with pytest.raises(Unauthorized):
                c.bucket("intruder").create()
            with pytest.raises(Unauthorized):
                c.bucket("guarded").object("keep.txt").put_content(b"overwritten")
            with pytest.raises(Unauthorized):
                c.bucket("guarded").object("new.txt").put_content(b"new")
            with pytest.raises(Unauthorized):
                c.bucket("guarded").object("keep.txt").delete()
            with pytest.raises(Unauthorized):
                c.bucket("guarded").delete()
            with pytest.raises(Unauthorized):
                c.etl("sneaky").init_code(transform=lambda d: d)
        # Reads are open.
        assert anonymous.bucket("guarded").object("keep.txt").get_bytes() == b"original"
    with Client(secure, token=TOKEN) as owner:
        assert "intruder" not in owner.list_buckets()
        assert [o.name for o in owner.bucket("guarded").list_objects()] == ["keep.txt"]
        assert owner.list_etls() == [] or all(e.name != "sneaky" for e in owner.list_etls())


def test_with_token_everything_works_including_streamed_files(secure: str, tmp_path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(b"\x01\x02" * 700_000)
    with Client(secure, token=TOKEN) as c:
        bucket = c.bucket("with-token").create()
        for i in range(6):  # several names, so both targets take redirected writes
            assert bucket.object(f"files/f{i}.bin").put_file(path).size == 1_400_000
        assert bucket.object("files/f5.bin").get_bytes() == path.read_bytes()
        c.etl("tok-upper").init_code(transform=lambda d: d.upper())
        bucket.object("t.txt").put_content(b"abc")
        assert bucket.object("t.txt").get_bytes(etl_name="tok-upper") == b"ABC"
        # a big one is answered by the transformer itself (signed 307 from the target)
        assert bucket.object("files/f5.bin").get_bytes(etl_name="tok-upper") == path.read_bytes()
        c.etl("tok-upper").delete()
        bucket.object("files/f0.bin").delete()
        assert not bucket.object("files/f0.bin").exists()


def test_curl_put_with_token_follows_the_signed_redirect(secure: str, tmp_path) -> None:
    with Client(secure, token=TOKEN) as c:
        obj = c.bucket("curl-put").create().object("dir/x.txt")
    src = tmp_path / "x.txt"
    src.write_bytes(b"via curl")
    put = [
        "curl",
        "-sL",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "-X",
        "PUT",
        "--data-binary",
        f"@{src}",
        obj.url(),
    ]
    denied = subprocess.run(put, capture_output=True, text=True, timeout=30)
    assert denied.stdout == "401"
    auth = ["-H", f"Authorization: Bearer {TOKEN}"]
    ok = subprocess.run(put[:1] + auth + put[1:], capture_output=True, text=True, timeout=30)
    assert ok.stdout == "200"
    got = subprocess.run(["curl", "-sfL", obj.url()], capture_output=True, check=True)
    assert got.stdout == b"via curl"
