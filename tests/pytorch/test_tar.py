"""``etl_runtime.pytorch.tar``: the same samples as webdataset's tarfile path, with offsets."""

from __future__ import annotations

import io
import tarfile

import pytest
import webdataset as wds
from webdataset import tariterators

from etl_runtime.pytorch import tar


def webdataset_samples(data: bytes) -> list[tuple[str, dict[str, bytes]]]:
    files = tariterators.tar_file_expander([{"url": "u", "stream": io.BytesIO(data)}])
    return [
        (s["__key__"], {k: v for k, v in s.items() if not k.startswith("__")})
        for s in tariterators.group_by_keys(files)
    ]


def chunked(data: bytes, size: int) -> tar.Chunks:
    return tar.Chunks(iter([data[i : i + size] for i in range(0, len(data), size)]))


def ours(data: bytes, size: int = 1000) -> list[tuple[str, dict[str, bytes]]]:
    return [(k, f) for k, f, _ in tar.samples(chunked(data, size))]


def add(t: tarfile.TarFile, name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE) -> None:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    t.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)


def odd_shard(fmt: int) -> bytes:
    """Long names, a directory, a symlink, __meta__ files, upper-case and multi-dot
    extensions, a file without an extension, a nested key, empty members."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as t:
        add(t, "__meta__", b"skipped")
        add(t, "dir", kind=tarfile.DIRTYPE)
        add(t, "a.JPG", b"x" * 700)
        add(t, "a.seg.png", b"")
        add(t, "a.link", kind=tarfile.SYMTYPE)
        add(t, "noext", b"n")
        add(t, "d" * 150 + "/key.cls", b"7")  # over 100 characters: pax / GNU / ustar prefix
        add(t, "sub/__x__/b.txt", b"meta below a dir")
        add(t, "sub/b.txt", "é".encode() * 300)
        add(t, "sub/b.json", b"{}")
        add(t, "ünï.txt", b"unicode name")
    return buf.getvalue()


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT])
def test_odd_shards_give_webdataset_s_samples_at_any_chunk_size(fmt: int) -> None:
    data = odd_shard(fmt)
    want = webdataset_samples(data)
    assert [k for k, _ in want] == ["a", "d" * 150 + "/key", "sub/__x__/b", "sub/b", "ünï"]
    for size in (1, 511, 512, 4096, len(data)):
        assert ours(data, size) == want


def test_a_sample_read_from_its_offset_is_the_same_as_from_the_start() -> None:
    buf = io.BytesIO()
    with wds.TarWriter(buf) as w:
        for i in range(20):
            w.write({"__key__": f"k{i:03d}", "jpg": bytes([i]) * (i * 97), "cls": i})
    data = buf.getvalue()
    full = list(tar.samples(chunked(data, 4096)))
    assert [k for k, _, _ in full] == [f"k{i:03d}" for i in range(20)]
    assert [(k, f) for k, f, _ in full] == webdataset_samples(data)
    for i in (1, 13, 19):
        offset = full[i][2]
        tail = list(tar.samples(tar.Chunks(iter([data[offset:]]), offset=offset)))
        assert tail == full[i:]


def test_a_corrupt_header_raises_where_tarfile_would_stop_quietly() -> None:
    buf = io.BytesIO()
    with wds.TarWriter(buf) as w:
        for i in range(4):
            w.write({"__key__": f"k{i}", "bin": b"z" * 600})
    data = bytearray(buf.getvalue())
    third = list(tar.samples(chunked(bytes(data), 512)))[2][2]
    data[third + 10] ^= 0xFF
    assert len(webdataset_samples(bytes(data))) == 2  # webdataset: a shorter shard
    with pytest.raises(tar.TarFormatError, match=f"bad checksum in the header at byte {third}"):
        ours(bytes(data))
    with pytest.raises(tar.TarFormatError, match="ends after"):
        ours(bytes(data[: third - 500]))  # inside the second sample's data
    with pytest.raises(tar.TarFormatError, match="empty file"):
        ours(b"")


def test_a_repeated_field_raises_as_webdataset_does() -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        add(t, "a.txt", b"1")
        add(t, "a.txt", b"2")
    with pytest.raises(ValueError, match="duplicate file name"):
        ours(buf.getvalue())
    with pytest.raises(ValueError, match="duplicate file name"):
        webdataset_samples(buf.getvalue())


def test_compressed_shards_are_left_to_tarfile() -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        add(t, "a.txt", b"1")
    assert tar.compressed(buf.getvalue()[:8])
    assert not tar.compressed(odd_shard(tarfile.PAX_FORMAT)[:8])
