"""The archive halves of GetBatch, without a cluster: the answer's TAR and reading shards."""

from __future__ import annotations

import asyncio
import gzip
import io
import tarfile
from collections.abc import AsyncIterator

import pytest

from etl_runtime.core.errors import InvalidName, InvalidRequest, NotATar
from etl_runtime.getbatch.archive import ArchiveWriter, ShardReader
from etl_runtime.getbatch.exchange import tar_header
from etl_runtime.getbatch.request import parse_request


def shard(members: dict[str, bytes], fmt: int = tarfile.GNU_FORMAT, gz: bool = False) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz" if gz else "w", format=fmt) as tar:
        tar.addfile(tarfile.TarInfo("dir/"), None)  # not a file: skipped
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


async def chunked(data: bytes, size: int) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


async def read_member(data: bytes, archpath: str, piece: int = 7, start: int = 0) -> bytes | None:
    reader = ShardReader(chunked(data, piece), "ais://bkt/s.tar")
    size = await reader.find(archpath)
    if size is None:
        return None
    return b"".join([c async for c in reader.member(size - start, start)])


LONG = "l" * 150 + "/name.txt"
MEMBERS = {"a.txt": b"A" * 1000, LONG: b"long", "ünï.txt": b"unicode", "z.bin": bytes(range(256))}


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT])
@pytest.mark.parametrize("gz", [False, True])
def test_shard_reader_finds_every_member(fmt: int, gz: bool) -> None:
    members = {k: v for k, v in MEMBERS.items() if fmt != tarfile.USTAR_FORMAT or k != "ünï.txt"}
    if fmt == tarfile.USTAR_FORMAT:
        members.pop(LONG)
        members["p" * 120 + "/q.txt"] = b"ustar prefix"  # ustar splits it: prefix + name
    data = shard(members, fmt, gz)
    for name, want in members.items():
        for piece in (1, 7, 512, 1 << 20):
            assert asyncio.run(read_member(data, name, piece)) == want
    assert asyncio.run(read_member(data, "./a.txt")) == MEMBERS["a.txt"]
    assert asyncio.run(read_member(data, "missing")) is None
    assert asyncio.run(read_member(data, "a.txt", start=990)) == b"A" * 10


def test_shard_reader_refuses_what_is_not_a_tar() -> None:
    with pytest.raises(NotATar, match="ais://bkt/s.tar"):
        asyncio.run(read_member(b"this is no tar at all" * 50, "a"))
    with pytest.raises(NotATar):
        asyncio.run(read_member(b"", "a"))
    data = shard({"a.txt": b"x" * 5000})
    with pytest.raises(NotATar, match="ends inside"):
        asyncio.run(read_member(data[:2000], "a.txt"))


@pytest.mark.parametrize("fmt", [".tar", ".tgz"])
def test_archive_writer(fmt: str) -> None:
    w = ArchiveWriter(fmt)
    out = bytearray()
    w.entry("b/one", b"1" * 700)
    out += w.take()
    w.header("b/" + "n" * 200, 3)
    w.data(b"abc")
    w.pad(3)
    w.entry("__404__/b/gone")
    out += w.take()
    w.end()
    out += w.take()
    raw = gzip.decompress(bytes(out)) if fmt == ".tgz" else bytes(out)
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r|") as tar:
        got = [(m.name, tar.extractfile(m).read()) for m in tar]  # type: ignore[union-attr]
    assert got == [("b/one", b"1" * 700), ("b/" + "n" * 200, b"abc"), ("__404__/b/gone", b"")]


def test_broken_entry_cannot_pass_for_complete() -> None:
    w = ArchiveWriter(".tar")
    w.entry("b/one", b"1")
    w.broken_entry("b/two", 1)
    with pytest.raises(tarfile.ReadError):
        with tarfile.open(fileobj=io.BytesIO(w.take()), mode="r|") as tar:
            for m in tar:
                tar.extractfile(m).read()  # type: ignore[union-attr]


def test_request_names_unknown_fields_and_bad_items() -> None:
    ok = {"in": [{"objname": "o"}], "strm": True}
    assert parse_request(ok, "b", "ais", None).items[0].bucket == "b"
    with pytest.raises(InvalidRequest, match="'extra'"):
        parse_request({**ok, "extra": 1}, "b", "", None)
    with pytest.raises(InvalidRequest, match=r"'what' in in\[1\]"):
        parse_request({"in": [{"objname": "o"}, {"objname": "p", "what": 2}]}, "b", "", None)
    with pytest.raises(InvalidRequest, match="names no bucket"):
        parse_request(ok, None, "", None)
    with pytest.raises(InvalidName):
        parse_request({"in": [{"objname": "a//b"}]}, "b", "", None)
    with pytest.raises(InvalidRequest, match="byte range"):
        parse_request({"in": [{"objname": "o", "start": 5}]}, "b", "", None)
    with pytest.raises(InvalidRequest, match="etl_name"):
        parse_request({"in": [{"objname": "o", "length": 5}]}, "b", "", None, etl_name="x")
    with pytest.raises(InvalidRequest, match="uname"):
        parse_request({"in": [{"objname": "o", "uname": "ais/@#/b/o"}]}, "b", "", None)
    req = parse_request(
        {"in": [{"objname": "o", "archpath": "x/y"}], "onob": True, "mime": "tar.gz"}, "b", "", None
    )
    assert req.fmt == ".tgz" and req.name_in_archive(req.items[0]) == "o/x/y"
    assert req.missing_name(req.items[0], shard_missing=True) == "__404__/o"


@pytest.mark.parametrize(
    "name, size, mtime",
    [
        ("a", 0, 0),
        ("bench/10KiB/00012", 10240, 1_700_000_000),
        ("x" * 100, 5, 1),  # the longest name a ustar header holds
        ("", 0, 0),
        ("x" * 101, 5, 1),  # a pax record
        ("é/ü.txt", 3, 3),  # not ASCII: a pax record
        ("a/b c", 8**11 - 1, 123),  # the largest size in 11 octal digits
        ("a", 8**11, 5),  # bigger: a pax size record
    ],
)
def test_the_fast_tar_header_is_the_one_tarfile_writes(name: str, size: int, mtime: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, mtime, 0o644
    assert tar_header(name, size, mtime) == info.tobuf(
        tarfile.PAX_FORMAT, "utf-8", "surrogateescape"
    )
