"""GetBatch's per-target shares (``POST /v1/_moss`` on each target), seen from a client.

A real ``sluice up`` with 3 targets. The gateway asks every target once per
part of ``PART`` items and merges the shares in request order: a batch of
several parts per target keeps its order, byte ranges and missing items land
where they were asked, the multipart answer's ``MossOut`` sizes are the bytes
delivered, and a target killed while its share streams breaks the answer
(a tar reader fails, the HTTP body never ends) with the gateway naming the
target, never a short archive that reads as complete.
"""

from __future__ import annotations

import io
import json
import signal
import tarfile
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import psutil
import pytest
import requests

from etl_runtime.getbatch.exchange import ELSEWHERE, MANIFEST_LEN, SHARE_PATH, padding
from etl_runtime.getbatch.shares import PART, WHOLE_PART
from etl_runtime.local import LocalCluster
from etl_runtime.storage_target.getbatch_share import LOOP_ITEMS

N = 40
BIG = 4 << 20


def data_of(i: int) -> bytes:
    return f"obj-{i:03d}|".encode() * (1 + i * 53 % 400)


def read_tar(raw: bytes) -> list[tuple[str, bytes]]:
    out = []
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r|") as tar:
        for m in tar:
            f = tar.extractfile(m)
            out.append((m.name, f.read() if f is not None else b""))
    return out


@pytest.fixture(scope="module", params=["uvloop", "asyncio"])
def cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalCluster]:
    """``sluice up`` on each event loop (the share reads and splices are loop calls)."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SLUICE_LOOP", request.param)  # read by the servers `sluice up` starts
        with LocalCluster(tmp_path_factory.mktemp("shares") / "data", targets=3) as c:
            env.delenv("SLUICE_LOOP")
            url = c.endpoint.rstrip("/")
            with httpx.Client(base_url=url, timeout=120, trust_env=False) as h:
                for b in ("small", "big"):
                    h.post(f"/v1/buckets/{b}", json={"action": "create-bck"}).raise_for_status()
                for i in range(N):
                    h.put(f"/v1/objects/small/o{i:03d}", content=data_of(i)).raise_for_status()
                for i in range(12):
                    h.put(f"/v1/objects/big/b{i:02d}", content=bytes([i]) * BIG).raise_for_status()
            yield c


def test_many_parts_per_target_keep_order_ranges_and_missing_items(cluster: LocalCluster) -> None:
    url = cluster.endpoint.rstrip("/")
    count = 3 * PART + 77  # well over one part per target
    items: list[dict[str, object]] = []
    want: list[tuple[str, bytes]] = []
    for k in range(count):
        i = (k * 7) % N
        if k % 97 == 50:
            items.append({"objname": f"gone-{k}"})
            want.append((f"__404__/small/gone-{k}", b""))
        elif k % 5 == 3:
            start, length = k % 11, 5 + k % 13
            items.append({"objname": f"o{i:03d}", "start": start, "length": length})
            want.append((f"small/o{i:03d}", data_of(i)[start : start + length]))
        elif k % 5 == 4:
            items.append({"objname": f"o{i:03d}", "start": 3, "length": -1})
            want.append((f"small/o{i:03d}", data_of(i)[3:]))
        else:
            items.append({"objname": f"o{i:03d}"})
            want.append((f"small/o{i:03d}", data_of(i)))
    body = {"in": items, "strm": True, "coer": True}
    r = requests.get(f"{url}/v1/ml/moss/small", json=body, timeout=120)
    assert r.status_code == 200, r.text
    assert read_tar(r.content) == want

    # the buffered answer: one MossOut per item, sizes as delivered, errors named
    body["strm"] = False
    r = requests.get(f"{url}/v1/ml/moss/small", json=body, timeout=120)
    assert r.status_code == 200, r.text
    boundary = r.headers["content-type"].split("boundary=")[1].encode()
    parts = r.content.split(b"--" + boundary)
    meta = json.loads(parts[1].split(b"\r\n\r\n", 1)[1])
    assert [o["size"] for o in meta["out"]] == [len(d) for _, d in want]
    missing = [o for o in meta["out"] if o.get("err_msg")]
    assert len(missing) == sum(1 for n, _ in want if n.startswith("__404__/"))
    assert all("does not exist" in o["err_msg"] for o in missing)
    archive = parts[2].split(b"\r\n\r\n", 1)[1][: -len(b"\r\n")]
    assert read_tar(archive) == want


def test_parts_read_whole_or_entry_by_entry_keep_order_and_bytes(cluster: LocalCluster) -> None:
    """A part of small entries up to ``WHOLE_PART`` in all is read in one piece and
    handed on as slices; a bigger part of small entries, or one with a big entry, is
    read entry by entry. Batches of each kind (and both mixed in one batch) come back
    whole, in order, on both answers (streamed and multipart)."""
    url = cluster.endpoint.rstrip("/")
    mid = [bytes([65 + i]) * (60 << 10) for i in range(24)]  # 60 KiB: small entries
    with httpx.Client(base_url=url, timeout=120, trust_env=False) as h:
        h.post("/v1/buckets/mid", json={"action": "create-bck"})
        for i, data in enumerate(mid):
            h.put(f"/v1/objects/mid/m{i:02d}", content=data).raise_for_status()

    def mixed(i: int) -> tuple[str, str]:
        if i % 9 == 4:
            return "big", f"b{i % 12:02d}"
        return ("small", f"o{i % N:03d}") if i % 2 else ("mid", f"m{i % 24:02d}")

    def data(b: str, o: str) -> bytes:
        k = int(o[1:])
        return data_of(k) if b == "small" else mid[k] if b == "mid" else bytes([k]) * BIG

    batches = {
        "whole parts": [("small", f"o{i % N:03d}") for i in range(50)],
        "parts over WHOLE_PART": [("mid", f"m{i % 24:02d}") for i in range(PART)],
        "mixed, with big entries": [mixed(i) for i in range(60)],
    }
    assert 24 * (60 << 10) > WHOLE_PART  # a part of them is past it
    for label, pairs in batches.items():
        want = [(f"{b}/{o}", data(b, o)) for b, o in pairs]
        items = [{"objname": o, "bucket": b} for b, o in pairs]
        for strm in (True, False):
            r = requests.get(f"{url}/v1/ml/moss", json={"in": items, "strm": strm}, timeout=120)
            assert r.status_code == 200, (label, r.text)
            raw = r.content
            if not strm:
                boundary = r.headers["content-type"].split("boundary=")[1].encode()
                raw = raw.split(b"--" + boundary)[2].split(b"\r\n\r\n", 1)[1][: -len(b"\r\n")]
            assert read_tar(raw) == want, (label, strm)


def test_a_share_opened_on_the_loop_or_in_a_thread_answers_the_same(
    cluster: LocalCluster,
) -> None:
    """A target opens a share of up to ``LOOP_ITEMS`` items on its event loop and a
    bigger one in a worker thread: the same manifest, headers and bytes either way,
    every item in its place (asked of one target directly, as the gateway does)."""
    url = cluster.endpoint.rstrip("/")
    r = httpx.get(f"{url}/v1/objects/small/o000", follow_redirects=False, trust_env=False)
    target = r.headers["location"].split("/v1/")[0]
    for count in (LOOP_ITEMS, LOOP_ITEMS + 72):
        rows = [["small", f"o{i % N:03d}", 0, 0, f"e{i}"] for i in range(count)]
        rows.append(["small", "gone", 0, 0, "gone"])
        r = httpx.post(f"{target}{SHARE_PATH}", json={"in": rows}, trust_env=False, timeout=60)
        assert r.status_code == 200, r.text
        raw = r.content
        (size,) = MANIFEST_LEN.unpack_from(raw)
        pos = MANIFEST_LEN.size + size
        manifest = json.loads(raw[MANIFEST_LEN.size : pos])
        assert len(manifest) == count + 1
        here = 0
        for i, entry in enumerate(manifest[:-1]):
            if entry == [ELSEWHERE]:  # another target owns it
                continue
            status, n, head = entry
            assert status == 200
            info = tarfile.TarInfo.frombuf(raw[pos : pos + 512], "utf-8", "surrogateescape")
            assert (info.name, info.size) == (f"e{i}", n)
            pos += head
            assert raw[pos : pos + n] == data_of(i % N)
            pos += n + padding(n)
            here += 1
        assert here >= count // 10 and pos == len(raw)
        last = manifest[-1]
        assert last == [ELSEWHERE] or (last[0] == 404 and "small/gone" in last[1]["error"])


def test_a_share_placed_under_another_map_is_checked_item_by_item(
    cluster: LocalCluster,
) -> None:
    """The gateway sends ``placed``: [target, map version] it chose the items by. Under
    the same map the target takes its word (owners() is a function of the map); a
    share placed for another target or by another map version is checked item by
    item, so an object the target holds but does not own is "not here", never served."""
    url = cluster.endpoint.rstrip("/")
    r = httpx.get(f"{url}/v1/objects/small/o000", follow_redirects=False, trust_env=False)
    target = r.headers["location"].split("/v1/")[0]
    proc = _target_process(cluster, urlsplit(target).port or 0)
    tid = proc.cmdline()[proc.cmdline().index("--id") + 1]
    version = json.loads((cluster.data_dir / "cluster.json").read_text())["version"]
    rows = [["small", f"o{i:03d}", 0, 0, f"e{i}"] for i in range(N)]

    def manifest(placed: list[object] | None) -> list[list[object]]:
        body: dict[str, object] = {"in": rows} if placed is None else {"in": rows, "placed": placed}
        r = httpx.post(f"{target}{SHARE_PATH}", json=body, trust_env=False, timeout=60)
        assert r.status_code == 200, r.text
        (size,) = MANIFEST_LEN.unpack_from(r.content)
        return json.loads(r.content[MANIFEST_LEN.size : MANIFEST_LEN.size + size])

    checked = manifest(None)
    elsewhere = [i for i, e in enumerate(checked) if e == [ELSEWHERE]]
    assert 0 < len(elsewhere) < N  # some of the objects are another target's
    assert manifest([tid, version - 1]) == checked
    assert manifest(["t-other", version]) == checked
    # placed here by this map: taken as placed (the gateway never sends such an
    # item here; an object this target holds no file of is still not served)
    trusted = manifest([tid, version])
    assert all(trusted[i] == checked[i] for i in range(N) if i not in elsewhere)
    assert all(trusted[i] != [200] and trusted[i][0] in (0, 404) for i in elsewhere)


def test_a_range_past_the_end_names_the_item(cluster: LocalCluster) -> None:
    url = cluster.endpoint.rstrip("/")
    size = len(data_of(4))
    body = {"in": [{"objname": "o001"}, {"objname": "o004", "start": size, "length": 2}]}
    r = requests.get(f"{url}/v1/ml/moss/small", json={**body, "strm": True}, timeout=60)
    assert r.status_code == 416
    assert "in[1] ais://small/o004" in r.json()["error"] and str(size) in r.json()["error"]


def _target_process(cluster: LocalCluster, port: int) -> psutil.Process:
    for p in psutil.Process(cluster.pid).children(recursive=True):
        try:
            cmd = p.cmdline()
        except psutil.NoSuchProcess:
            continue
        if "etl_runtime.storage_target" in cmd and str(port) in cmd:
            return p
    raise AssertionError(f"no target on port {port} below sluice up:\n{cluster.output}")


def test_a_target_killed_mid_share_breaks_the_answer_and_is_named(cluster: LocalCluster) -> None:
    url = cluster.endpoint.rstrip("/")
    names = [f"b{i:02d}" for i in range(12)]
    owner = {}
    for n in names:
        r = httpx.get(f"{url}/v1/objects/big/{n}", follow_redirects=False, trust_env=False)
        assert r.status_code == 307
        owner[n] = urlsplit(r.headers["location"]).port
    victim_port = owner[names[-1]]
    victim = _target_process(cluster, victim_port)
    victim_id = victim.cmdline()[victim.cmdline().index("--id") + 1]
    # the victim's items come last, many times over: far more than socket buffers hold
    first = [n for n in names if owner[n] != victim_port]
    theirs = [n for n in names if owner[n] == victim_port]
    order = first + theirs * 8
    body = {"in": [{"objname": n} for n in order], "strm": True}
    # the gateway designates a target to assemble the batch: one that is not the victim
    for _ in range(100):
        dt = requests.get(f"{url}/v1/ml/moss/big", json=body, allow_redirects=False, timeout=60)
        assert dt.status_code == 307, dt.text
        if urlsplit(dt.headers["location"]).port != victim_port:
            break
    else:
        raise AssertionError("the gateway designated the victim 100 times in a row")
    dt_port = urlsplit(dt.headers["location"]).port
    dt_proc = _target_process(cluster, dt_port)
    dt_id = dt_proc.cmdline()[dt_proc.cmdline().index("--id") + 1]
    r = requests.get(dt.headers["location"], json=body, stream=True, timeout=120)
    assert r.status_code == 200
    raw = bytearray()
    it = r.iter_content(1 << 16)
    while len(raw) < 2 * BIG:  # the answer is under way
        raw += next(it)
    victim.send_signal(signal.SIGKILL)
    with pytest.raises(requests.exceptions.ChunkedEncodingError):
        for chunk in it:
            raw += chunk
    got = []
    with pytest.raises(tarfile.ReadError):
        with tarfile.open(fileobj=io.BytesIO(bytes(raw)), mode="r|") as tar:
            for m in tar:
                f = tar.extractfile(m)
                assert f is not None
                got.append((m.name, f.read()))
    # what came whole is what was asked, in order; nothing after the break reads as whole
    assert len(got) < len(order)
    for (name, data), n in zip(got, order, strict=False):
        assert name == f"big/{n}" and data == bytes([int(n[1:])]) * BIG

    log = cluster.data_dir / "logs" / f"{dt_id}.log"  # the assembling target names it

    def assembler_said() -> list[str]:
        lines = log.read_text(errors="replace").splitlines()
        return [x for x in lines if "GetBatch" in x and f"target {victim_id} " in x]

    deadline = time.monotonic() + 60
    while not assembler_said():
        assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
        time.sleep(0.2)
    assert "ais://big/b" in assembler_said()[0]

    # `sluice up` starts the target again: wait until the gateway reaches it (the next
    # tests need it)
    while True:
        try:
            back = httpx.get(
                f"{url}/v1/objects/big/{theirs[0]}", follow_redirects=True, trust_env=False
            )
            if back.is_success:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline + 60, cluster.output[-3000:]
        time.sleep(0.2)


@pytest.mark.parametrize("form", ["stream", "multipart", "tgz", "with-a-shard-file"])
def test_big_items_in_every_answer_form(cluster: LocalCluster, form: str) -> None:
    """Big entries go socket to socket (a streamed TAR of known length) or through
    the gateway (multipart, gzip, a batch with an item read by a GET): the same bytes."""
    url = cluster.endpoint.rstrip("/")
    names = ["b03", "b07", "b03", "b11"]
    items: list[dict[str, object]] = [{"objname": n} for n in names]
    body: dict[str, object] = {"in": items, "strm": form != "multipart"}
    if form == "tgz":
        body["mime"] = ".tgz"
    if form == "with-a-shard-file":  # archpath: read with a GET, so no known length
        items.append({"objname": "no-shard.tar", "archpath": "a/1.txt"})
        body["coer"] = True
    r = requests.get(f"{url}/v1/ml/moss/big", json=body, timeout=120)
    assert r.status_code == 200, r.text[:500]
    raw = r.content
    if form == "multipart":
        boundary = r.headers["content-type"].split("boundary=")[1].encode()
        raw = raw.split(b"--" + boundary)[2].split(b"\r\n\r\n", 1)[1][: -len(b"\r\n")]
    if form == "tgz":
        import gzip

        raw = gzip.decompress(raw)
    got = read_tar(raw)
    want = [(f"big/{n}", bytes([int(n[1:])]) * BIG) for n in names]
    if form == "with-a-shard-file":  # the shard itself is missing: under __404__
        assert got == [*want, ("__404__/big/no-shard.tar", b"")]
        return
    assert got == want


def test_clients_that_leave_mid_item_spoil_no_later_batch(cluster: LocalCluster) -> None:
    """A client gone while a big item moves leaves the share's connection mid-entry:
    it must be closed, never pooled for the next batch to read from."""
    url = cluster.endpoint.rstrip("/")
    names = [f"b{i % 12:02d}" for i in range(24)]
    body = {"in": [{"objname": n} for n in names], "strm": True}
    for _ in range(4):
        r = requests.get(f"{url}/v1/ml/moss/big", json=body, stream=True, timeout=120)
        assert r.status_code == 200
        got = 0
        for chunk in r.iter_content(1 << 16):
            got += len(chunk)
            if got > BIG + BIG // 2:  # inside the second item
                break
        r.close()
    want = [(f"big/{n}", bytes([int(n[1:])]) * BIG) for n in names[:9]]
    for _ in range(3):  # enough batches to reuse every pooled connection
        body = {"in": [{"objname": n} for n in names[:9]], "strm": True}
        r = requests.get(f"{url}/v1/ml/moss/big", json=body, timeout=120)
        assert r.status_code == 200, r.text[:300]
        assert read_tar(r.content) == want


def test_the_sdk_raises_on_a_batch_that_breaks_off_never_ends_short(
    cluster: LocalCluster,
) -> None:
    """``Client.get_batch``: a missing object past the first parts breaks the answer
    mid-stream; the SDK raises (naming how far it got), it never just stops early."""
    from etl_runtime import Client
    from etl_runtime.sdk.errors import StreamError

    far = 4 * 3 * PART
    items = [("small", f"o{i % N:03d}") for i in range(far)] + [("small", "gone")]
    with Client(cluster.endpoint) as c:
        got = 0
        with pytest.raises(StreamError, match=f"broke off after .* of {far + 1} items") as e:
            for item in c.get_batch(items):
                assert item.data == data_of(int(item.name[1:]))
                got += 1
        # what came was whole and in order (tarfile may hold the last few back: it reads
        # ahead), and the error says how far it got
        assert far - 16 < got <= far and f"after {got} of" in str(e.value)
        # with missing_ok the same batch ends with an item without data, in its place
        out = list(c.get_batch(items, missing_ok=True))
        assert len(out) == far + 1 and out[-1].data is None and out[-1].name == "gone"


def test_an_item_not_on_its_targets_disk_is_read_by_a_get(cluster: LocalCluster) -> None:
    """A copy gone from the target the gateway picked (copies=2): the target's share
    says "not here", the gateway reads that item with a GET, which pulls the copy
    from the other owner; the batch is whole and in order."""
    url = cluster.endpoint.rstrip("/")
    with httpx.Client(base_url=url, timeout=60, trust_env=False) as h:
        r = h.post("/v1/buckets/twice", json={"action": "create-bck", "props": {"copies": 2}})
        assert r.status_code == 200 or "exists" in r.text, r.text
        for i in range(6):
            h.put(f"/v1/objects/twice/t{i}", content=data_of(i)).raise_for_status()
        moved = h.get("/v1/objects/twice/t3", follow_redirects=False)
    assert moved.status_code == 307
    owner = _target_process(cluster, urlsplit(moved.headers["location"]).port or 0)
    tid = owner.cmdline()[owner.cmdline().index("--id") + 1]
    (cluster.data_dir / "targets" / tid / "buckets" / "twice" / "t3").unlink()
    names = ["t0", "t3", "t5", "t3"]
    body = {"in": [{"objname": n} for n in names], "strm": True}
    r = requests.get(f"{url}/v1/ml/moss/twice", json=body, timeout=60)
    assert r.status_code == 200, r.text[:300]
    assert read_tar(r.content) == [(f"twice/{n}", data_of(int(n[1:]))) for n in names]
