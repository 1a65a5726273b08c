"""The output cache of ``cache: true`` ETLs (issue 23 item 3), against real transformers.

A second GET of the same object, spec and ``etl_args`` is answered by the
target from disk: the transformer's ``/stats`` object counter does not move
and the bytes are identical. Anything that changes the answer is a miss, a
failed answer is never kept, the budget holds, ``cache: false`` keeps nothing.
"""

from __future__ import annotations

import io
import os
import shutil
import tarfile
import time

import httpx
import pytest

from etl_runtime.etl.cacheindex import budget_from_env
from tests.etl.conftest import CacheTarget, Transformers, running_target
from tests.prom import scrape
from tests.webserver.conftest import tar_members, text_shard

CACHE = "x-sluice-etl-cache"


def test_second_get_is_a_hit_byte_identical(ctarget: CacheTarget) -> None:
    c, tf = ctarget.client, ctarget.transformers
    ctarget.register("up", "v1")
    data = os.urandom(300_000)
    c.put("/v1/objects/bkt/dir/img.bin", content=data)
    before = tf.objects("v1")

    first = ctarget.get("dir/img.bin", "up")
    assert first.status_code == 200, first.text  # relayed, not a 307: the bytes pass here
    assert first.content == data.upper() and first.headers[CACHE] == "miss"
    (entry,) = ctarget.wait_entries(1)
    assert entry.read_bytes() == data.upper()
    assert tf.objects("v1") == before + 1

    sent_by_sendfile = scrape(ctarget.url).value("sluice_sendfile_responses_total")
    second = ctarget.get("dir/img.bin", "up")
    assert second.status_code == 200 and second.headers[CACHE] == "hit"
    assert second.content == first.content
    assert second.headers["content-length"] == str(len(data))
    assert second.headers["x-sluice-etl"] == "up"
    assert tf.objects("v1") == before + 1  # the transform did not run again
    metrics = scrape(ctarget.url)
    assert metrics.value("sluice_sendfile_responses_total") == sent_by_sendfile + 1  # zero-copy
    labels = {"target": "t0", "etl": "up"}
    assert metrics.value("sluice_etl_cache_hits_total", **labels) == 1
    assert metrics.value("sluice_etl_cache_misses_total", **labels) == 1
    assert metrics.value("sluice_etl_cache_bytes", **labels) == len(data)
    assert metrics.value("sluice_etl_cache_budget_bytes", target="t0") == 64 << 20
    stats = c.get("/v1/_etl/up/stats").json()
    assert (stats["cache_hits"], stats["cache_misses"], stats["cache_bytes"]) == (1, 1, len(data))

    # The entries are not objects: listings and the stored-bytes gauge see the object only.
    listed = c.get("/v1/buckets/bkt").json()["objects"]
    assert [o["name"] for o in listed] == ["dir/img.bin"]
    assert c.get("/v1/objects/bkt/dir/img.bin").content == data  # the plain GET is unchanged


def test_streamed_answer_is_kept_and_served_whole(ctarget: CacheTarget) -> None:
    """An answer of unknown length (chunked, relayed as a stream) goes through the tee."""
    ctarget.register("up", "v1")
    data = os.urandom(1_000_000)
    ctarget.client.put("/v1/objects/bkt/o", content=data)
    first = ctarget.get("o", "up", etl_args="pieces")
    assert first.headers.get("transfer-encoding") == "chunked" and first.headers[CACHE] == "miss"
    ctarget.wait_entries(1)
    before = ctarget.transformers.objects("v1")
    second = ctarget.get("o", "up", etl_args="pieces")
    assert second.headers[CACHE] == "hit" and second.content == first.content == data.upper()
    assert second.headers["content-length"] == str(len(data))
    assert ctarget.transformers.objects("v1") == before


def test_changed_object_is_a_miss_and_drops_the_old_entry(ctarget: CacheTarget) -> None:
    c, tf = ctarget.client, ctarget.transformers
    ctarget.register("up", "v1")
    c.put("/v1/objects/bkt/o", content=b"first version")
    assert ctarget.get("o", "up").content == b"FIRST VERSION"
    ctarget.wait_entries(1)

    c.put("/v1/objects/bkt/o", content=b"second version")
    assert ctarget.entries() == [] and len(ctarget.cache.index) == 0  # dropped at the PUT
    before = tf.objects("v1")
    r = ctarget.get("o", "up")
    assert r.headers[CACHE] == "miss" and r.content == b"SECOND VERSION"
    assert tf.objects("v1") == before + 1
    ctarget.wait_entries(1)
    assert ctarget.get("o", "up").headers[CACHE] == "hit"

    # Same bytes again: same ETag, same key; and a DELETE drops the entries too.
    c.put("/v1/objects/bkt/o", content=b"second version")
    assert ctarget.get("o", "up").headers[CACHE] == "miss"
    ctarget.wait_entries(1)
    assert c.delete("/v1/objects/bkt/o").status_code == 200
    assert ctarget.entries() == []
    assert ctarget.get("o", "up").status_code == 404


def test_changed_etl_args_is_a_miss(ctarget: CacheTarget) -> None:
    tf = ctarget.transformers
    ctarget.register("up", "v1")
    ctarget.client.put("/v1/objects/bkt/o", content=b"abc")
    before = tf.objects("v1")
    answers = {}
    for args in (None, "", "x=1", "x=2"):
        params = {} if args is None else {"etl_args": args}
        r = ctarget.get("o", "up", **params)
        assert r.headers[CACHE] == "miss", args
        answers[args] = r.content
    assert answers == {None: b"ABC", "": b"ABC", "x=1": b"ABCx=1", "x=2": b"ABCx=2"}
    assert tf.objects("v1") == before + 4  # no args and empty args are two keys
    ctarget.wait_entries(4)
    for args, content in answers.items():
        params = {} if args is None else {"etl_args": args}
        r = ctarget.get("o", "up", **params)
        assert r.headers[CACHE] == "hit" and r.content == content
    assert tf.objects("v1") == before + 4


def test_new_spec_is_a_miss(ctarget: CacheTarget) -> None:
    tf = ctarget.transformers
    ctarget.register("conv", "v1")
    ctarget.client.put("/v1/objects/bkt/o", content=b"MiXeD")
    assert ctarget.get("o", "conv").content == b"MIXED"
    ctarget.wait_entries(1)

    # Re-init with other code: a new spec hash, so a new key.
    ctarget.register("conv", "v2")
    before = tf.objects("v2")
    r = ctarget.get("o", "conv")
    assert r.headers[CACHE] == "miss" and r.content == b"mixed|v2"
    assert tf.objects("v2") == before + 1
    ctarget.wait_entries(2)  # the old generation's entry is garbage for eviction
    assert ctarget.get("o", "conv").content == b"mixed|v2"
    assert tf.objects("v2") == before + 1

    # Back to v1: its entries are still good (same spec, same object).
    ctarget.register("conv", "v1")
    before = tf.objects("v1")
    r = ctarget.get("o", "conv")
    assert r.headers[CACHE] == "hit" and r.content == b"MIXED"
    assert tf.objects("v1") == before


def test_an_answer_of_another_generation_is_not_kept(ctarget: CacheTarget) -> None:
    """During a rollover the record names the new spec while the old transformer still
    answers: its answer goes to the client but is not kept under the new spec's key."""
    ctarget.register("roll", "v2", endpoint=ctarget.transformers.urls["v1"])
    ctarget.client.put("/v1/objects/bkt/o", content=b"abc")
    for _ in range(2):
        r = ctarget.get("o", "roll")
        assert r.status_code == 200 and r.content == b"ABC" and CACHE not in r.headers
    ctarget.settle()
    assert ctarget.entries() == [] and ctarget.temp_files() == []


def test_failed_answers_are_not_kept(ctarget: CacheTarget) -> None:
    c, tf = ctarget.client, ctarget.transformers
    ctarget.register("up", "v1")
    c.put("/v1/objects/bkt/o", content=os.urandom(1 << 20))
    url = f"{ctarget.url}/v1/objects/bkt/o?etl_name=up&etl_args=failmid"
    for _ in range(2):  # fails mid-stream: the client sees the break, nothing is kept
        got = bytearray()
        with pytest.raises(httpx.RemoteProtocolError):
            with httpx.stream("GET", url, timeout=30) as r:
                assert r.status_code == 200
                for chunk in r.iter_bytes():
                    got += chunk
        assert 0 < len(got) < 1 << 20
    before = tf.objects("v1")
    r = ctarget.get("o", "up", etl_args="raise")  # fails before the first byte
    assert r.status_code == 422 and r.json()["kind"] == "TransformError"
    assert tf.objects("v1") == before
    ctarget.settle()
    assert ctarget.entries() == [] and len(ctarget.cache.index) == 0
    assert ctarget.temp_files() == []
    assert c.get("/v1/_etl/up/stats").json()["cache_misses"] == 3


def test_client_gone_mid_answer_keeps_nothing(ctarget: CacheTarget) -> None:
    ctarget.register("up", "v1")
    ctarget.client.put("/v1/objects/bkt/o", content=os.urandom(4 << 20))
    # Slow pieces: with a fast answer all of it can be in the kernel's socket buffers
    # (written out, from the server's side) before the hang-up reaches the server.
    with httpx.stream("GET", f"{ctarget.url}/v1/objects/bkt/o?etl_name=up&etl_args=slow") as r:
        next(r.iter_raw(65536))  # the first bytes, then hang up
    deadline = time.monotonic() + 10
    while ctarget.temp_files() and time.monotonic() < deadline:
        time.sleep(0.05)  # the relay notices the client is gone at its next write
    ctarget.settle()
    assert ctarget.temp_files() == [] and ctarget.entries() == []


@pytest.fixture
def small_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_ETL_CACHE_BYTES", "1000k")  # 1,024,000 bytes


def test_eviction_keeps_the_cache_under_budget(small_budget: None, ctarget: CacheTarget) -> None:
    c, tf = ctarget.client, ctarget.transformers
    ctarget.register("up", "v1")
    budget = 1000 << 10
    assert ctarget.cache.budget == budget
    blobs = {f"o{i}": os.urandom(300_000) for i in range(6)}
    for name, data in blobs.items():
        c.put(f"/v1/objects/bkt/{name}", content=data)
    for i, name in enumerate(blobs):
        assert ctarget.get(name, "up").headers[CACHE] == "miss"
        ctarget.wait_entries(min(i + 1, 3))  # 3 x 300,000 fit, a 4th does not
        if name == "o2":
            assert ctarget.get("o0", "up").headers[CACHE] == "hit"  # o0: used last, o1 goes
        held = sum(p.stat().st_size for p in ctarget.entries())
        assert held <= budget and ctarget.cache.index.total == held
    metrics = scrape(ctarget.url)
    assert metrics.value("sluice_etl_cache_evictions_total", target="t0", etl="up") == 3
    assert metrics.value("sluice_etl_cache_bytes", target="t0", etl="up") == 900_000
    before = tf.objects("v1")
    assert ctarget.get("o0", "up").headers[CACHE] == "miss"  # evicted after o3..o5
    assert [ctarget.get(n, "up").headers[CACHE] for n in ("o4", "o5")] == ["hit", "hit"]
    assert tf.objects("v1") == before + 1
    # An answer bigger than the whole budget is served, never kept.
    c.put("/v1/objects/bkt/huge", content=os.urandom(budget + 1))
    r = ctarget.get("huge", "up", etl_args="pieces")
    assert r.status_code == 200 and len(r.content) == budget + 1
    assert ctarget.get("huge", "up", etl_args="pieces").headers[CACHE] == "miss"
    ctarget.settle()
    assert ctarget.temp_files() == []


def test_cache_false_never_stores(ctarget: CacheTarget) -> None:
    c = ctarget.client
    ctarget.register("plain", "v1", cache=False)
    c.put("/v1/objects/bkt/o", content=b"abc")
    r = ctarget.get("o", "plain")
    assert r.status_code == 307  # the default answer path: the client goes to the transformer
    assert httpx.get(r.headers["location"]).content == b"ABC"
    ctarget.app.state.target.forwarder.redirect_bytes = None  # relayed, and still nothing kept
    for _ in range(2):
        r = ctarget.get("o", "plain")
        assert r.content == b"ABC" and CACHE not in r.headers
    ctarget.settle()
    assert ctarget.entries() == [] and len(ctarget.cache.index) == 0
    assert "cache_hits" not in c.get("/v1/_etl/plain/stats").json()
    assert scrape(ctarget.url).labels("sluice_etl_cache_misses_total", "etl") == set()


def test_wds_shards_are_cached(ctarget: CacheTarget) -> None:
    tf = ctarget.transformers
    ctarget.register("shout", "wds")
    shard = text_shard([f"s{i:03d}" for i in range(50)], size=10_000)
    ctarget.client.put("/v1/objects/bkt/shard-0.tar", content=shard)
    first = ctarget.get("shard-0.tar", "shout")
    assert first.status_code == 200 and first.headers[CACHE] == "miss"
    ctarget.wait_entries(1)
    before = tf.objects("wds")
    second = ctarget.get("shard-0.tar", "shout")
    assert second.headers[CACHE] == "hit" and second.content == first.content
    assert second.headers["content-type"] == "application/x-tar"
    assert tf.objects("wds") == before
    members = tar_members(second.content)
    assert len(members) == 50 and members[0] == ("s000.txt", b"S000".ljust(10_000, b"."))
    with tarfile.open(fileobj=io.BytesIO(second.content)) as tar:
        assert len(tar.getnames()) == 50


def test_in_process_callers_get_the_cached_answer(ctarget: CacheTarget) -> None:
    """A pipeline (and an offline transform, which uses the same ``transform_chain``)
    reads the cached answer as a stream."""
    tf = ctarget.transformers
    ctarget.register("up", "v1")
    ctarget.register("low", "v2", cache=False)
    ctarget.client.put("/v1/objects/bkt/o", content=b"Some Text")
    assert ctarget.get("o", "up").content == b"SOME TEXT"
    ctarget.wait_entries(1)
    before = tf.objects("v1")
    one = ctarget.get("o", "up", etl_pipeline="")  # a pipeline of one: the in-process path
    assert one.headers[CACHE] == "hit" and one.content == b"SOME TEXT"
    two = ctarget.get("o", "up", etl_pipeline="low")
    assert two.content == b"some text|v2"
    assert tf.objects("v1") == before


def test_entries_survive_a_restart(ctarget: CacheTarget, transformers: Transformers) -> None:
    ctarget.register("up", "v1")
    ctarget.client.put("/v1/objects/bkt/o", content=b"abc")
    ctarget.get("o", "up")
    ctarget.wait_entries(1)
    record = ctarget.registry.get("up")
    assert record is not None
    for again in running_target(ctarget.data_dir, transformers):
        again.registry.put(record)
        again.settle()  # indexed in the background at start
        assert again.cache.index.total == 3
        before = transformers.objects("v1")
        r = again.get("o", "up")
        assert r.headers[CACHE] == "hit" and r.content == b"ABC"
        assert transformers.objects("v1") == before


@pytest.mark.parametrize(
    ("value", "expected"),
    [("1000", 1000), ("64MiB", 64 << 20), ("2g", 2 << 30), ("512 KB", 512 << 10), ("0", 0)],
)
def test_budget_values(value: str, expected: int) -> None:
    assert budget_from_env("/", value) == expected


def test_budget_shares_and_bad_values(tmp_path: os.PathLike[str]) -> None:
    total = shutil.disk_usage(tmp_path).total
    assert budget_from_env(tmp_path, "") == int(total * 0.10)  # the default: 10% of the disk
    assert budget_from_env(tmp_path, "25%") == int(total * 0.25)
    assert budget_from_env(f"{tmp_path}/not/made/yet", "1%") == int(total * 0.01)
    for bad in ("ten", "-1", "150%", "1.5G", "x%"):
        with pytest.raises(ValueError, match="SLUICE_ETL_CACHE_BYTES"):
            budget_from_env(tmp_path, bad)


def test_without_xattrs_the_lookup_goes_to_a_thread(
    ctarget: CacheTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file system without extended attributes: the ETag is not stored with the
    object, the store hashes the file (in a thread, never on the loop), hits still hit."""
    ctarget.register("up", "v1")
    ctarget.client.put("/v1/objects/bkt/o", content=b"no xattrs here")

    def no_xattrs(*args: object) -> bytes:
        raise OSError(95, "Operation not supported")

    monkeypatch.setattr(os, "getxattr", no_xattrs)
    assert ctarget.get("o", "up").headers[CACHE] == "miss"
    ctarget.wait_entries(1)
    before = ctarget.transformers.objects("v1")
    r = ctarget.get("o", "up")
    assert r.headers[CACHE] == "hit" and r.content == b"NO XATTRS HERE"
    assert ctarget.transformers.objects("v1") == before


def test_many_hits_without_a_publish_are_applied_in_the_background(
    ctarget: CacheTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    from etl_runtime.etl import cacheindex

    monkeypatch.setattr(cacheindex, "TOUCH_BATCH", 3)
    ctarget.register("up", "v1")
    for name in ("a", "b"):
        ctarget.client.put(f"/v1/objects/bkt/{name}", content=name.encode())
        ctarget.get(name, "up")
    ctarget.wait_entries(2)
    for _ in range(4):  # a, a, a, a: the 4th is over the batch
        assert ctarget.get("a", "up").headers[CACHE] == "hit"
    ctarget.settle()  # no publish since: the 4th hit had them applied
    index = ctarget.cache.index
    record = ctarget.registry.get("up")
    assert record is not None
    a = cacheindex.object_dir(f"up/{ctarget.cache.spec_hash(record)}", "bkt", "a")
    assert not index._touched and list(index._lru)[-1].startswith(f"{a}/")  # a: used last
    assert [ctarget.get(n, "up").headers[CACHE] for n in ("b", "a")] == ["hit", "hit"]
