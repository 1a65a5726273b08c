"""``wire.tarbreak``: a tar stream cut anywhere, then marked, never reads as whole."""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile

import pytest

from etl_runtime.wire.formats.tarbreak import ERROR_DIR, MISSING, TarCursor, error_marker


def small_tar(sizes: list[int]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for i, size in enumerate(sizes):
            info = tarfile.TarInfo(f"s{i:03d}.bin")
            info.size = size
            tar.addfile(info, io.BytesIO(bytes([65 + i % 26]) * size))
        directory = tarfile.TarInfo("dir")  # a member type without data
        directory.type = tarfile.DIRTYPE
        tar.addfile(directory)
    return buf.getvalue()


def read_stream(data: bytes) -> list[str]:
    """Members as ``tarfile`` in stream mode (webdataset's way) reads them; raises if broken."""
    names = []
    with tarfile.open(fileobj=io.BytesIO(data), mode="r|*") as tar:
        for member in tar:
            names.append(member.name)
            if member.isreg():
                tar.extractfile(member).read()  # type: ignore[union-attr]
    return names


def relay(data: bytes, pieces: list[int], cut: int | None) -> bytes:
    """``data`` through a cursor in ``pieces``; with ``cut``, broken after that many bytes."""
    cursor, out, pos = TarCursor(), bytearray(), 0
    for n in pieces:
        chunk = data[pos : pos + n]
        if cut is not None and pos + n > cut:
            chunk = data[pos:cut]
        for piece in cursor.feed(chunk):
            out += piece
        pos += len(chunk)
        if cut is not None and pos >= cut:
            return bytes(out + cursor.broken("stream broke off", "s007"))
    return bytes(out + cursor.flush())


def test_marker_declares_more_than_it_carries() -> None:
    marker = error_marker("sample 's1': transform raised ValueError: no", "a/b c")
    info = tarfile.TarInfo.frombuf(marker[:512], "utf-8", "surrogateescape")
    assert info.name == f"{ERROR_DIR}/a_b_c.txt"
    carried = marker[512:]
    assert carried == b"sample 's1': transform raised ValueError: no\n"
    assert info.size == len(carried) + MISSING
    for message in ("x" * 511, "y" * 1023):  # never ends on a block boundary
        assert len(error_marker(message)) % 512
    assert tarfile.TarInfo.frombuf(error_marker("m")[:512], "utf-8", "x").name.endswith(
        "/stream.txt"
    )


def test_whole_members_then_the_marker_fail_every_reader() -> None:
    whole = small_tar([700, 3, 0, 4096])
    members = whole[: whole.index(b"dir") // 512 * 512]  # up to the directory member
    broken = members + error_marker("boom", "s004")
    with pytest.raises(tarfile.ReadError, match="unexpected end of data"):
        read_stream(broken)
    assert read_stream(members) == ["s000.bin", "s001.bin", "s002.bin", "s003.bin"]  # silent
    if shutil.which("tar"):
        r = subprocess.run(["tar", "tf", "-"], input=broken, capture_output=True)
        assert r.returncode != 0 and b"Unexpected EOF" in r.stderr


@pytest.mark.parametrize("pieces", [[1], [100], [511], [512], [513], [4096]])
def test_relayed_stream_is_unchanged_in_any_pieces(pieces: list[int]) -> None:
    data = small_tar([700, 3, 0, 4096, 1024])
    step = pieces[0]
    assert relay(data, [step] * (len(data) // step + 1), None) == data


def test_a_cut_anywhere_never_reads_as_a_whole_archive() -> None:
    data = small_tar([700, 3, 0, 1500])
    end = data.index(b"\0" * 1024, data.index(b"dir") // 512 * 512 + 512)  # end-of-archive
    near_blocks = {b + d for b in range(512, end + 1, 512) for d in (-1, 0, 1)}
    for step in (97, 512, 1000):
        for cut in sorted(set(range(1, end + 1, 11)) | near_blocks):
            got = relay(data, [step] * (len(data) // step + 1), cut)
            assert got == data[: len(got)] or ERROR_DIR.encode() in got[-600:]
            with pytest.raises(tarfile.ReadError):
                read_stream(got)


def test_not_a_tar_is_passed_on_unmarked() -> None:
    cursor = TarCursor()
    junk = b"hello, not a tar" * 100
    assert b"".join(bytes(p) for p in cursor.feed(junk)) == junk
    assert cursor.broken("broke") == b""


def members(sizes: list[int]) -> bytes:
    """Whole tar members, as a wds answer streams them before its end."""
    out = b""
    for i, size in enumerate(sizes):
        info = tarfile.TarInfo(f"s{i:03d}.bin")
        info.size = size
        out += info.tobuf(tarfile.USTAR_FORMAT) + b"x" * size + b"\0" * (-size % 512)
    return out


@pytest.mark.parametrize("step", [1, 100, 512, 4096])
def test_the_senders_marker_is_read_back(step: int) -> None:
    """A target relaying a transformer's stream learns what the transformer said
    in its marker: the sample, the message and the error's kind."""
    data = members([700, 3]) + error_marker(
        "ETL 'x', object 'b/s.tar': poisoned sample", "s-7", "TransformError"
    )
    cursor = TarCursor()
    for k in range(0, len(data), step):
        cursor.feed(data[k : k + step])
    assert cursor.marked() == (
        "s-7",
        "ETL 'x', object 'b/s.tar': poisoned sample",
        "TransformError",
    )
    plain = TarCursor()
    plain.feed(members([700]) + error_marker("m"))
    assert plain.marked() == ("stream", "m", None)
    assert TarCursor().marked() is None
