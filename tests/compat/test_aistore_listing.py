"""Listing flags of the official ``aistore`` SDK over a 3-target ``sluice up``.

``NO_RECURSION`` lists the names right under the prefix and each directory
once; ``NAME_ONLY`` drops sizes; ``ARCH_DIR`` (``list_archive``) lists the
files inside shards, which ``archpath`` / ``archregx`` GETs read; a flag
Sluice does not list by (``DIFF``...) is a 400 naming it, never a listing
that ignores it.
"""

from __future__ import annotations

import io
import tarfile
import zipfile
from collections.abc import Iterator

import httpx
import pytest
from aistore.sdk import Client, ListObjectFlag
from aistore.sdk.archive_config import ArchiveConfig, ArchiveMode
from aistore.sdk.errors import AISError

from etl_runtime.local import LocalCluster

pytestmark = pytest.mark.timeout(300)


FILES = {"s1.cls": b"1", "s1.jpg": b"jpeg-one", "./d/s2.cls": b"22", "d/s2.jpg": b"jpeg-2"}


def tar_of(files: dict[str, bytes], mode: str = "w") -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode=mode) as tar:  # type: ignore[call-overload]
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        folder = tarfile.TarInfo("d")  # a directory: not listed, as AIStore's
        folder.type = tarfile.DIRTYPE
        tar.addfile(folder)
        evil = tarfile.TarInfo("../evil.txt")  # unsafe: never listed nor read as it is
        evil.size = 4
        tar.addfile(evil, io.BytesIO(b"evil"))
    return out.getvalue()


def zip_of(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for name, data in files.items():
            z.writestr(name.removeprefix("./"), data)
    return out.getvalue()


SHARDS = {
    "a.tar": tar_of(FILES),
    "b.tar.gz": tar_of(FILES, "w:gz"),
    "c.zip": zip_of(FILES),
    "plain.txt": b"not a shard",
}
MEMBERS = [("d/s2.cls", 2), ("d/s2.jpg", 6), ("s1.cls", 1), ("s1.jpg", 8)]
IN_ARCH, IS_ARCHIVE = 1 << 7, 1 << 9  # AIStore's apc.EntryInArch, apc.EntryIsArchive


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with LocalCluster(tmp_path_factory.mktemp("aislist") / "data", targets=3) as c:
        bck = Client(c.endpoint).bucket("tree")
        bck.create(exist_ok=True)
        for name in ("a.txt", "b.txt", "d1/x.txt", "d1/y/z.txt", "d2/w.txt"):
            bck.object(name).get_writer().put_content(b"12345")
        shards = Client(c.endpoint).bucket("shards")
        shards.create(exist_ok=True)
        for name, body in SHARDS.items():
            shards.object(name).get_writer().put_content(body)
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
    for flag in (ListObjectFlag.DIFF, ListObjectFlag.DELETED, ListObjectFlag.MISSING):
        with pytest.raises(AISError) as err:
            bck.list_all_objects(flags=[flag])
        assert err.value.status_code == 400 and flag.name in str(err.value), err.value
    body = {"action": "list", "value": {"prefix": "", "shiny": True}}
    r = httpx.request("GET", f"{up}/v1/buckets/tree", json=body)
    assert r.status_code == 400 and "shiny" in r.json()["error"], r.text


def test_list_archive_lists_the_files_inside_each_shard(up: str) -> None:
    bck = Client(up).bucket("shards")
    for shard in ("a.tar", "b.tar.gz", "c.zip"):
        files = bck.list_archive(shard)
        assert [(e.name, e.size) for e in files] == [(f"{shard}/{m}", n) for m, n in MEMBERS]
        assert all(e.flags & IN_ARCH for e in files), files
        (parent,) = [
            e for e in bck.list_archive(shard, include_archive_obj=True) if e.name == shard
        ]
        assert parent.flags & IS_ARCHIVE and parent.size == len(SHARDS[shard])
    everything = bck.list_all_objects(flags=[ListObjectFlag.ARCH_DIR])
    assert len(everything) == 4 + 3 * len(MEMBERS)  # four objects, three of them shards
    assert [e.name for e in everything][-1] == "plain.txt"
    assert not any("evil" in e.name for e in everything)


@pytest.mark.parametrize("direct", [False, True], ids=["gateway", "direct"])
def test_archpath_and_regex_reads_from_inside_a_shard(up: str, direct: bool) -> None:
    """Through the gateway, and with ``direct=True`` from a target (the SDK picks one
    by AIStore's HRW; one that does not hold the shard redirects to its owner)."""
    bck = Client(up).bucket("shards")
    for shard in ("a.tar", "b.tar.gz", "c.zip"):
        obj = bck.object(shard)
        config = ArchiveConfig(archpath="d/s2.jpg")
        got = obj.get_reader(archive_config=config, direct=direct).read_all()
        assert got == b"jpeg-2", shard
        config = ArchiveConfig(regex="s1", mode=ArchiveMode.WDSKEY)
        with tarfile.open(
            fileobj=io.BytesIO(obj.get_reader(archive_config=config, direct=direct).read_all())
        ) as t:
            assert {m.name: t.extractfile(m).read() for m in t} == {  # type: ignore[union-attr]
                "s1.cls": b"1",
                "s1.jpg": b"jpeg-one",
            }
        config = ArchiveConfig(regex=r"\.jpg$", mode=ArchiveMode.REGEXP)
        with tarfile.open(
            fileobj=io.BytesIO(obj.get_reader(archive_config=config, direct=direct).read_all())
        ) as t:
            assert [m.name for m in t] in (["s1.jpg", "d/s2.jpg"], ["d/s2.jpg", "s1.jpg"])
        with pytest.raises(AISError) as err:
            config = ArchiveConfig(archpath="nope.txt")
            obj.get_reader(archive_config=config, direct=direct).read_all()
        assert err.value.status_code == 404 and shard in err.value.message, err.value
        assert "nope.txt" in err.value.message
    with pytest.raises(AISError) as err:
        bck.object("a.tar").get_reader(
            archive_config=ArchiveConfig(archpath="../evil.txt"), direct=direct
        ).read_all()
    assert err.value.status_code == 422 and "a.tar" in err.value.message, err.value
    if direct:
        return
    r = httpx.get(f"{up}/v1/objects/shards/a.tar", params={"archregx": "x", "archmode": "glob"})
    assert r.status_code == 400 and "glob" in r.json()["error"], r.text
    r = httpx.get(f"{up}/v1/objects/shards/plain.txt", params={"archpath": "x"})
    assert r.status_code == 400 and "plain.txt" in r.json()["error"], r.text
