"""Listing flags of the official ``aistore`` SDK over a 3-target ``sluice up``.

``NO_RECURSION`` lists the names right under the prefix and each directory
once; ``NAME_ONLY`` drops sizes; a flag Sluice does not list by
(``ARCH_DIR``, ``DIFF``...) is a 400 naming it, never a listing that ignores it.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from aistore.sdk import Client, ListObjectFlag
from aistore.sdk.errors import AISError

from etl_runtime.local import LocalCluster

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with LocalCluster(tmp_path_factory.mktemp("aislist") / "data", targets=3) as c:
        bck = Client(c.endpoint).bucket("tree")
        bck.create(exist_ok=True)
        for name in ("a.txt", "b.txt", "d1/x.txt", "d1/y/z.txt", "d2/w.txt"):
            bck.object(name).get_writer().put_content(b"12345")
        yield str(c.endpoint)


def test_no_recursion_lists_one_level(up: str) -> None:
    bck = Client(up).bucket("tree")
    top = bck.list_all_objects(flags=[ListObjectFlag.NO_RECURSION])
    assert [e.name for e in top] == ["a.txt", "b.txt", "d1/", "d2/"]
    inner = bck.list_all_objects(prefix="d1/", flags=[ListObjectFlag.NO_RECURSION])
    assert [e.name for e in inner] == ["d1/x.txt", "d1/y/"]
    everything = bck.list_all_objects()
    assert len(everything) == 5 and all(e.size == 5 for e in everything)


def test_name_only_drops_sizes(up: str) -> None:
    bck = Client(up).bucket("tree")
    entries = bck.list_all_objects(flags=[ListObjectFlag.NAME_ONLY])
    assert [e.name for e in entries][:2] == ["a.txt", "b.txt"]
    assert all(e.size == 0 for e in entries)
    sized = bck.list_all_objects(flags=[ListObjectFlag.NAME_SIZE])
    assert all(e.size == 5 for e in sized)


def test_flags_not_supported_are_400s_naming_them(up: str) -> None:
    bck = Client(up).bucket("tree")
    for flag in (ListObjectFlag.ARCH_DIR, ListObjectFlag.DIFF, ListObjectFlag.DELETED):
        with pytest.raises(AISError) as err:
            bck.list_all_objects(flags=[flag])
        assert err.value.status_code == 400 and flag.name in str(err.value), err.value
    body = {"action": "list", "value": {"prefix": "", "shiny": True}}
    r = httpx.request("GET", f"{up}/v1/buckets/tree", json=body)
    assert r.status_code == 400 and "shiny" in r.json()["error"], r.text
