"""Safe shards: the wds path refuses hostile member names and huge tar headers.

Hostile shards (members ``../../../../X/dd.cls``, ``/X/abs.cls``, a member
under a symlinked directory, the same names behind pax and GNU long-name
headers, a 64 MiB pax record) go to a real transformer by hpush (``PUT``) and
by path (``etl_fqn``). The answer is read by the real ``webdataset`` library
(``wds.WebDataset(url)``, curl underneath) and by ``tarfile``: a refusal in
the first sample is a 422 naming object and sample, a later one breaks the
stream with the error marker; no reader ever gets an unsafe name, and
``tar x`` of any answer writes nothing outside its folder.

Then through a real ``sluice up``: the same refusals by an ETL GET, and error
bodies that never carry a filesystem path (an object's file gone or not a
file, by plain GET, ETL GET by path, and GetBatch).
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import httpx
import psutil
import pytest
import requests
import webdataset as wds
from aistore.sdk import Client

from etl_runtime import Client as SluiceClient
from etl_runtime.local import LocalCluster
from tests.webserver.conftest import pickled_code, transformer
from tests.webserver.test_wds_midstream import pushed

cloudpickle.register_pickle_by_value(sys.modules[__name__])

N = 40  # samples of a shard, 50 KB each: the parser, held to a window of samples in
LATE = 30  # flight, reaches sample LATE only after output began


def same(sample: dict[str, Any]) -> dict[str, Any]:
    return sample


def upper(data: bytes) -> bytes:
    return data.upper()


def climbs(sample: dict[str, Any]) -> dict[str, Any]:
    """A function whose result would make an unsafe name."""
    return {**sample, "__key__": "../../out/" + sample["__key__"]}


def shard(
    hostile: dict[str, Callable[[tarfile.TarInfo], None]] | None = None,
    at: int = 0,
    fmt: int = tarfile.GNU_FORMAT,
) -> bytes:
    """``N`` samples ``s000..``; at sample ``at``, the ``hostile`` members instead
    (name -> how its TarInfo is set up)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for i in range(N):
            if i == at and hostile:
                for name, setup in hostile.items():
                    info = tarfile.TarInfo(name)
                    setup(info)
                    data = b"" if info.type != tarfile.REGTYPE else b"pwned"
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
                continue
            for ext, data in (("cls", str(i).encode()), ("txt", b"%05d" % i * 10_000)):
                info = tarfile.TarInfo(f"s{i:03d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def regular(info: tarfile.TarInfo) -> None:
    pass


def symlink_to(target: str) -> Callable[[tarfile.TarInfo], None]:
    def setup(info: tarfile.TarInfo) -> None:
        info.type, info.linkname = tarfile.SYMTYPE, target

    return setup


LONG = "d" * 120  # past ustar's 100 bytes: a pax or GNU long-name header
HOSTILE = {  # case -> (members, the sample named, what the error says, tar format)
    "dotdot": ({"../../../../X/dd.cls": regular}, "../../../../X/dd", "'..'", tarfile.GNU_FORMAT),
    "absolute": ({"/X/abs.cls": regular}, "/X/abs", "absolute", tarfile.GNU_FORMAT),
    "symlinked-dir": (
        {"lnk": symlink_to("/X"), "lnk/evil.cls": regular},
        "lnk/evil",
        "symlink member 'lnk'",
        tarfile.GNU_FORMAT,
    ),
    "pax-dotdot": (
        {f"{LONG}/../../../X/p.cls": regular},
        f"{LONG}/../../../X/p",
        "'..'",
        tarfile.PAX_FORMAT,
    ),
    "gnu-long-absolute": (
        {f"/{LONG}/g.cls": regular},
        f"/{LONG}/g",
        "absolute",
        tarfile.GNU_FORMAT,
    ),
}


def huge_pax_shard() -> bytes:
    """A pax header whose one record is 64 MiB long, before an ordinary shard."""
    body = b" comment=" + b"x" * (64 << 20) + b"\n"
    n = len(body)
    n += len(str(n + len(str(n))))
    record = str(n).encode() + body
    info = tarfile.TarInfo("././@PaxHeader")
    info.type, info.size = tarfile.XHDTYPE, len(record)
    head = info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "surrogateescape")
    return head + record + b"\0" * (-len(record) % 512) + shard()


def webdataset_read(url: str) -> tuple[Exception | None, list[str]]:
    keys: list[str] = []
    try:
        for sample in wds.WebDataset(url, shardshuffle=False):
            keys.append(sample["__key__"])
    except Exception as e:
        return e, keys
    return None, keys


def tarfile_read(data: bytes) -> tuple[Exception | None, list[str]]:
    names: list[str] = []
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r|*") as tar:
            for m in tar:
                names.append(m.name)
                if m.isreg():
                    tar.extractfile(m).read()  # type: ignore[union-attr]
    except tarfile.TarError as e:
        return e, names
    return None, names


def received(url: str, **params: str) -> tuple[int, bytes]:
    """Status and body bytes of a GET, up to where the connection breaks."""
    got = bytearray()
    try:
        with httpx.stream("GET", url, params=params, timeout=60) as r:
            for chunk in r.iter_raw():
                got += chunk
    except (httpx.RemoteProtocolError, httpx.ReadError):
        pass
    return r.status_code, bytes(got)


def safe_names(names: list[str]) -> bool:
    return all(not n.startswith("/") and ".." not in n.split("/") for n in names)


@pytest.fixture(scope="module")
def same_url() -> Iterator[str]:
    with transformer("same", {"mode": "wds", "code": pickled_code(same)}, workers=1) as url:
        yield url


@pytest.mark.parametrize("at", [0, LATE])
@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_member_names_are_refused(
    same_url: str, tmp_path: Path, case: str, at: int
) -> None:
    members, sample, why, fmt = HOSTILE[case]
    data = shard(members, at=at, fmt=fmt)
    path = tmp_path / "in.tar"
    path.write_bytes(data)
    for how in ("put", "fqn"):
        if how == "put" and at:  # read while the body still goes out: the answer breaks
            status, body = 200, pushed(same_url, data)
        elif how == "put":
            r = httpx.put(f"{same_url}/b/in.tar", content=data, timeout=60)
            status, body = r.status_code, r.content
        else:
            status, body = received(f"{same_url}/b/in.tar", etl_fqn=str(path))
        if at == 0:  # before the first byte: a JSON answer naming object and sample
            assert status == 422, (how, status, body[:300])
            err = httpx.Response(422, content=body).json()
            assert err["kind"] == "UnsafeShard" and "'b/in.tar'" in err["error"], err
            assert err["sample"] == sample and why in err["error"], err
            assert str(tmp_path) not in err["error"]
        else:  # samples went out: the stream ends in the error marker, every reader fails
            assert status == 200
            error, names = tarfile_read(body)
            assert isinstance(error, tarfile.ReadError), (how, names)
            assert names[-1].startswith("__sluice_error__/") and safe_names(names), names
            # whole samples before it (the refusal may come a sample or two early: the
            # headers are checked as the bytes are read, ahead of the parser)
            whole = [f"s{i:03d}.{ext}" for i in range(at) for ext in ("cls", "txt")]
            assert 1 < len(names) and names[:-1] == whole[: len(names) - 1], names
    # the real webdataset reader, through curl: an error, never an unsafe sample
    error, keys = webdataset_read(f"{same_url}/b/in.tar?etl_fqn={path}")
    assert error is not None and keys == [f"s{i:03d}" for i in range(len(keys))], keys
    assert len(keys) <= at
    # GNU tar extracting whatever came: nothing lands outside its folder
    if shutil.which("tar"):
        _, body = received(f"{same_url}/b/in.tar", etl_fqn=str(path))
        out = tmp_path / "x" / "y"
        out.mkdir(parents=True)
        subprocess.run(["tar", "xf", "-", "-C", str(out)], input=body, capture_output=True)
        outside = [p for p in tmp_path.rglob("*") if out not in p.parents and p != out]
        assert sorted(p.name for p in outside) == ["in.tar", "x"], outside


def test_safe_names_pass(same_url: str, tmp_path: Path) -> None:
    """Relative names with ``./`` and directories (no symlink above them) are fine."""
    data = shard({"./dir/sub/s000.cls": regular, "./dir/sub/s000.txt": regular}, at=0)
    r = httpx.put(f"{same_url}/b/ok.tar", content=data, timeout=60)
    assert r.status_code == 200
    error, names = tarfile_read(r.content)
    assert error is None and names[:2] == ["./dir/sub/s000.cls", "./dir/sub/s000.txt"]
    assert len(names) == 2 * N


def test_an_unsafe_result_key_is_refused(tmp_path: Path) -> None:
    with transformer("climbs", {"mode": "wds", "code": pickled_code(climbs)}, workers=1) as url:
        r = httpx.put(f"{url}/b/s.tar", content=shard(), timeout=60)
    assert r.status_code == 422
    err = r.json()
    assert err["kind"] == "BadResult" and err["sample"] == "../../out/s000", err
    assert "'..'" in err["error"]


def test_error_bodies_carry_no_path(same_url: str, tmp_path: Path) -> None:
    """An object's file gone, or not a file (its OSError's message names the path)."""
    folder = tmp_path / "a-dir"
    folder.mkdir()
    code = pickled_code(upper)
    with transformer("upper", {"mode": "object", "code": code}, workers=1) as upper_url:
        for url in (same_url, upper_url):
            for fqn, status in ((tmp_path / "gone", 404), (folder, 400), ("/etc/passwd", 400)):
                r = httpx.put(f"{url}/b/x.tar", params={"etl_fqn": str(fqn)}, timeout=60)
                assert r.status_code == status, (url, fqn, r.text)
                assert str(tmp_path) not in r.text and str(fqn) not in r.text, r.text
                assert r.json()["object"] == "b/x.tar" and "etl_fqn" in r.json()["error"]
        status, body = received(f"{same_url}/b/x.tar", etl_fqn=str(folder))  # the direct GET
        assert status == 400 and str(tmp_path).encode() not in body, body


def rss(pid: int) -> int:
    return psutil.Process(pid).memory_info().rss


def test_a_64mib_pax_header_is_refused_without_reading_it(same_url: str, tmp_path: Path) -> None:
    data = huge_pax_shard()
    path = tmp_path / "pax.tar"
    path.write_bytes(data)
    pid = httpx.get(f"{same_url}/health").json()["pid"]
    before = rss(pid)
    for _ in range(3):
        r = httpx.put(f"{same_url}/b/pax.tar", content=data, timeout=60)
        assert r.status_code == 422, r.text[:300]
        assert r.json()["kind"] == "UnsafeShard" and "'b/pax.tar'" in r.json()["error"]
        assert "pax header of 67108" in r.json()["error"] and "1 MiB" in r.json()["error"]
        status, body = received(f"{same_url}/b/pax.tar", etl_fqn=str(path))
        assert status == 422 and b"pax header" in body
    grew = rss(pid) - before
    # tarfile read the whole record into memory: +190 MiB; refused at its header block
    assert grew < 32 << 20, f"the transformer's RSS grew by {grew >> 20} MiB"


# ---- through a real cluster ------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    data = tmp_path_factory.mktemp("safe") / "data"
    with LocalCluster(data, targets=3) as c:
        sluice = SluiceClient(c.endpoint)
        # the three ETLs start together, and while the shards are uploaded
        sluice.etl("same").init_code(transform=same, mode="wds", wait=False)
        sluice.etl("same-fqn").init_code(transform=same, mode="wds", arg_type="fqn", wait=False)
        sluice.etl("up-fqn").init_code(transform=bytes.upper, arg_type="fqn", wait=False)
        bck = Client(c.endpoint).bucket("bkt")
        bck.create(exist_ok=True)
        bck.object("dotdot.tar").get_writer().put_content(shard(HOSTILE["dotdot"][0]))
        late = shard(HOSTILE["symlinked-dir"][0], at=LATE)
        bck.object("late.tar").get_writer().put_content(late)
        bck.object("pax.tar").get_writer().put_content(huge_pax_shard())
        for name in ("gone", "dir", "fine"):
            bck.object(name).get_writer().put_content(b"some bytes")
        for name in ("same", "same-fqn", "up-fqn"):
            sluice.etl(name).wait_until_running(120)
        yield c.endpoint.rstrip("/"), data


def object_file(data: Path, bucket: str, name: str) -> Path:
    found = [p for p in (data / "targets").glob(f"*/buckets/{bucket}/**/{name}") if p.is_file()]
    assert found, name
    return found[0]


@pytest.mark.parametrize("etl", ["same", "same-fqn"])
def test_etl_get_of_a_hostile_shard(cluster: tuple[str, Path], etl: str) -> None:
    url, data = cluster
    r = requests.get(f"{url}/v1/objects/bkt/dotdot.tar", params={"etl_name": etl}, timeout=60)
    assert r.status_code == 422, r.text[:300]
    err = r.json()
    assert err["kind"] == "UnsafeShard" and err["sample"] == "../../../../X/dd", err
    assert "dotdot.tar" in err["error"] and str(data) not in r.text
    r = requests.get(f"{url}/v1/objects/bkt/pax.tar", params={"etl_name": etl}, timeout=60)
    assert r.status_code == 422 and "pax header" in r.json()["error"], r.text[:300]
    # a refusal after output began: the bytes that came end in the marker
    with requests.get(
        f"{url}/v1/objects/bkt/late.tar", params={"etl_name": etl}, stream=True, timeout=60
    ) as r:
        assert r.status_code == 200
        got = bytearray()
        try:
            for chunk in r.raw.stream(1 << 16, decode_content=False):
                got += chunk
        except Exception:
            pass
    error, names = tarfile_read(bytes(got))
    assert error is not None and safe_names(names) and "lnk/evil.cls" not in names, names


def test_error_bodies_carry_no_filesystem_path(cluster: tuple[str, Path]) -> None:
    url, data = cluster
    gone, folder = object_file(data, "bkt", "gone"), object_file(data, "bkt", "dir")
    gone.unlink()
    folder.unlink()
    folder.mkdir()
    try:
        bodies: list[tuple[str, str, int, str]] = []
        for name in ("gone", "dir"):
            for params in ({}, {"etl_name": "up-fqn"}):
                r = requests.get(f"{url}/v1/objects/bkt/{name}", params=params, timeout=60)
                bodies.append((name, f"GET {params}", r.status_code, r.text))
            for streaming in (True, False):
                r = requests.get(
                    f"{url}/v1/ml/moss/bkt",
                    json={"in": [{"objname": "fine"}, {"objname": name}], "strm": streaming},
                    timeout=60,
                )
                bodies.append((name, f"moss strm={streaming}", r.status_code, r.text))
        print(*bodies, sep="\n")
        for name, what, status, text in bodies:
            assert 400 <= status < 600 and status != 500, (what, status, text[:300])
            assert str(data) not in text and os.path.realpath(data) not in text, (what, text)
            assert name in text, (what, text[:300])  # the object is named
    finally:
        folder.rmdir()


# ---- dSort moves records' bytes verbatim: it refuses such shards too ------------


@pytest.mark.parametrize("case", [*HOSTILE, "huge-pax"])
def test_dsort_refuses_a_hostile_shard(tmp_path: Path, case: str) -> None:
    from etl_runtime.core.errors import DsortFailed
    from etl_runtime.dsort.records import index_shard

    if case == "huge-pax":
        data, want = huge_pax_shard(), "pax header of 67108"
    else:
        members, _, why, fmt = HOSTILE[case]
        data, want = shard(members, at=LATE, fmt=fmt), why
    path = tmp_path / "in.tar"
    path.write_bytes(data)
    rss_before = psutil.Process().memory_info().rss
    with pytest.raises(DsortFailed) as e:
        index_shard(path, "ais://b/in.tar")
    assert "'ais://b/in.tar'" in str(e.value) and want in str(e.value), str(e.value)
    assert psutil.Process().memory_info().rss - rss_before < 32 << 20
    path.write_bytes(shard(fmt=tarfile.PAX_FORMAT))
    assert len(index_shard(path, "ais://b/in.tar")) == N  # a whole shard still indexes
