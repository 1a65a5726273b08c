"""The SDK pointed straight at one real storage target (no gateway, so no redirect).

Targets serve the object API too; this pins the SDK's "no redirect" path and its
reading of the real server's JSON (listing, ETags, error bodies).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from etl_runtime import BadRequest, Client, NotFound, Unauthorized
from etl_runtime.cluster.records import EtlRecord
from etl_runtime.storage_target.app import create_target_app
from tests.servers import serve_in_thread

TOKEN = "tok-123"


class NoEtls:
    def get(self, name: str) -> EtlRecord | None:
        return None


@pytest.fixture(scope="module")
def target_url(tmp_path_factory) -> Iterator[str]:
    app = create_target_app("t0", tmp_path_factory.mktemp("t0"), NoEtls(), token=TOKEN)
    with serve_in_thread(app) as url:
        yield url


def test_objects_roundtrip_on_a_target(target_url, tmp_path) -> None:
    with Client(target_url, token=TOKEN) as client:
        bucket = client.bucket("direct").create()
        path = tmp_path / "f.bin"
        path.write_bytes(b"\x00\xff" * 100_000)
        assert bucket.object("deep/f.bin").put_file(path).size == 200_000
        bucket.object("deep/g.txt").put_content(b"g")
        bucket.object("h.txt").put_content(b"hh")

        listed = list(bucket.list_objects(page_size=2))
        assert [o.name for o in listed] == ["deep/f.bin", "deep/g.txt", "h.txt"]
        assert [o.name for o in bucket.list_objects(prefix="deep/")] == ["deep/f.bin", "deep/g.txt"]
        head = bucket.object("deep/f.bin").head()
        assert (head.size, head.etag) == (200_000, listed[0].etag) and head.etag
        assert bucket.object("deep/f.bin").get_bytes() == path.read_bytes()

        bucket.object("h.txt").delete()
        assert not bucket.object("h.txt").exists()
        assert "direct" in client.list_buckets()


def test_errors_from_a_real_target_name_the_thing(target_url) -> None:
    with Client(target_url, token=TOKEN) as client:
        bucket = client.bucket("errs").create()
        with pytest.raises(NotFound) as nf:
            bucket.object("nothing/here").get_bytes()
        assert "nothing/here" in nf.value.message and nf.value.bucket == "errs"
        with pytest.raises(BadRequest) as br:
            bucket.object("a/../b").put_content(b"x")
        assert "a/../b" in br.value.message
        with pytest.raises(NotFound) as nf:
            list(client.bucket("no-such-bucket").list_objects())
        assert "no-such-bucket" in nf.value.message

    with Client(target_url) as anonymous:
        with pytest.raises(Unauthorized):
            anonymous.bucket("errs").object("x").put_content(b"x")
        assert not anonymous.bucket("errs").object("x").exists()
