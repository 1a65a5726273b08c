"""The pure parts of dSort: spec checks, record extraction, the global plan."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import webdataset as wds

from etl_runtime.core.errors import DsortFailed, InvalidDsortSpec
from etl_runtime.dsort.plan import Placed, cut_shards, make_plan
from etl_runtime.dsort.records import END_OF_ARCHIVE, Record, index_shard
from etl_runtime.dsort.spec import DsortSpec
from tests.dsort.shards import read_samples, write_shards

SEED_SPEC = {
    "extension": ".tar",
    "bck": {"name": "images", "provider": "ais"},
    "input_format": "shard-{000000..000003}",
    "output_format": "shuffled-%06d.tar",
    "output_shard_size": "40KB",
    "algorithm": {"kind": "shuffle", "seed": "42"},
    "output_bck": {"name": "shuffled"},
    "description": "shuffle the converted shards",
}


@pytest.fixture(scope="module")
def shard_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    d = tmp_path_factory.mktemp("shards")
    return d, write_shards(d, shards=4, per_shard=25)


def inventory(shard_dir: tuple[Path, dict]) -> dict[str, dict[str, list[Record]]]:
    d, samples = shard_dir
    # two "targets" holding two shards each
    inv: dict[str, dict[str, list[Record]]] = {"t0": {}, "t1": {}}
    for i, name in enumerate(sorted(samples)):
        inv[f"t{i % 2}"][name] = index_shard(d / name, name)
    return inv


def spec(**change: object) -> DsortSpec:
    raw = {**SEED_SPEC, **change}
    return DsortSpec.from_dict(raw)


def test_seed_spec_parses() -> None:
    s = spec()
    assert s.input_bck == "images" and s.output_bck == "shuffled"
    assert s.input_names() == [f"shard-{i:06d}.tar" for i in range(4)]
    assert s.output_shard_size == 40_000
    assert s.algorithm.kind == "shuffle" and s.algorithm.seed == "42"
    names = s.output_names()
    assert [next(names), next(names)] == ["shuffled-000000.tar", "shuffled-000001.tar"]
    # AIStore's newer shape and a brace output template work too
    s2 = DsortSpec.from_dict(
        {
            "input_bck": {"name": "images"},
            "input_format": {"template": "shard-{000000..000003}.tar"},
            "input_extension": ".tar",
            "output_extension": ".tar",
            "output_format": "out-{00..99}",
            "output_shard_size": "1GiB",
        }
    )
    assert s2.input_names() == s.input_names() and s2.output_bck == "images"
    assert next(s2.output_names()) == "out-00.tar" and s2.output_shard_size == 1 << 30
    assert s2.algorithm.kind == "alphanumeric"
    assert DsortSpec.from_dict(s.to_dict()) == s


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"output_shard_size": "lots"}, "output_shard_size"),
        ({"output_shard_size": None}, "output_shard_size"),
        ({"algorithm": {"kind": "random"}}, "algorithm.kind"),
        ({"algorithm": {"kind": "content"}}, "algorithm.kind"),
        ({"algorithm": {"kind": "shuffle", "seed": [1]}}, "algorithm.seed"),
        ({"algorithm": {"kind": "shuffle", "sed": "1"}}, "algorithm.sed"),
        ({"output_format": "shuffled.tar"}, "output_format"),
        ({"output_format": "s-%s-%d.tar"}, "output_format"),
        ({"output_format": "s-%.99999999d"}, "output_format"),
        ({"input_format": 7}, "input_format"),
        ({"input_format": {"tmpl": "x"}}, "input_format.tmpl"),
        ({"bck": {"provider": "ais"}}, "bck.name"),
        ({"bck": {"name": "images", "provider": "gcp"}}, "bck.provider"),
        ({"output_bck": {"name": "../x"}}, "output_bck.name"),
        ({"extension": ".tgz"}, "extension"),
        ({"ekm_file": "http://x/ekm.json"}, "ekm_file"),
        ({"shard_size": "1MB"}, "shard_size"),
        ({"create_concurrency_max_limit": -1}, "create_concurrency_max_limit"),
        ({"extract_concurrency_max_limit": "2"}, "extract_concurrency_max_limit"),
    ],
)
def test_bad_spec_names_the_field(change: dict, field: str) -> None:
    with pytest.raises(InvalidDsortSpec) as e:
        spec(**change)
    assert e.value.field == field
    assert e.value.status == 400 and field in e.value.message


def test_records_match_webdataset_samples(shard_dir: tuple[Path, dict]) -> None:
    d, samples = shard_dir
    name = "shard-000001.tar"
    records = index_shard(d / name, name)
    assert [r.key for r in records] == list(samples[name])
    # each record's byte range alone is a tar webdataset reads as exactly that sample
    data = (d / name).read_bytes()
    for r in records[:3]:
        one = data[r.offset : r.offset + r.size] + END_OF_ARCHIVE
        got = read_samples(one)
        assert got == [(r.key, samples[name][r.key])]


def test_not_a_tar_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.tar"
    bad.write_bytes(b"not a tar at all" * 100)
    with pytest.raises(DsortFailed, match="bad.tar"):
        index_shard(bad, "bad.tar")


def owner(name: str) -> str:
    return "t0" if int(name[-8:-4]) % 2 == 0 else "t1"


def flat(plan) -> list[str]:
    return [p.record.key for shard in plan for p in shard.records]


def test_shuffle_plan(shard_dir: tuple[Path, dict]) -> None:
    d, samples = shard_dir
    inv = inventory(shard_dir)
    plan = make_plan(spec(), inv, owner)
    keys = flat(plan)
    every = [k for name in sorted(samples) for k in samples[name]]
    assert sorted(keys) == every and len(set(keys)) == len(every)  # each record once
    assert keys != every
    for shard in plan[:-1]:  # at least 40 KB, less than a record over, the last excepted
        assert 40_000 <= shard.size <= 40_000 + max(p.record.size for p in shard.records)
    assert plan[-1].size <= 42_000
    # a global shuffle: some output shard mixes records of 3+ input shards and 2 targets
    assert max(len({p.shard for p in s.records}) for s in plan) >= 3
    mixed = [len({p.target for p in s.records}) == 2 for s in plan[:-1]]
    assert sum(mixed) >= len(mixed) - 1, mixed  # 5-6 records each: one may be one target's
    # the same seed gives the same plan, another seed another one
    assert flat(make_plan(spec(), inv, owner)) == keys
    other = flat(make_plan(spec(algorithm={"kind": "shuffle", "seed": "43"}), inv, owner))
    assert other != keys and sorted(other) == every
    assert [s.name for s in plan[:2]] == ["shuffled-000000.tar", "shuffled-000001.tar"]
    assert {s.owner for s in plan} == {"t0", "t1"}


def test_none_and_alphanumeric_orders(shard_dir: tuple[Path, dict]) -> None:
    d, samples = shard_dir
    inv = inventory(shard_dir)
    every = [k for name in sorted(samples) for k in samples[name]]
    assert flat(make_plan(spec(algorithm={"kind": "none"}), inv, owner)) == every
    # input order is the template's, not the keys'
    rev = spec(algorithm={"kind": "none"}, input_format={"objnames": sorted(samples)[::-1]})
    assert flat(make_plan(rev, inv, owner))[:25] == list(samples[sorted(samples)[-1]])
    alpha = spec(algorithm={"kind": "alphanumeric", "decreasing": True})
    assert flat(make_plan(alpha, inv, owner)) == sorted(every, reverse=True)


def test_output_range_too_small_and_overwrite(shard_dir: tuple[Path, dict]) -> None:
    inv = inventory(shard_dir)
    with pytest.raises(DsortFailed, match="yields only 2 names"):
        make_plan(spec(output_format="out-{0..1}"), inv, lambda n: "t0")
    with pytest.raises(DsortFailed, match="overwrite an input shard"):
        make_plan(spec(output_bck=None, output_format="shard-%06d"), inv, lambda n: "t0")


def test_webdataset_reads_a_planned_shard(shard_dir: tuple[Path, dict], tmp_path: Path) -> None:
    d, samples = shard_dir
    plan = make_plan(spec(), inventory(shard_dir), owner)
    shard = plan[0]
    out = io.BytesIO()
    for p in shard.records:
        out.write((d / p.shard).read_bytes()[p.record.offset : p.record.offset + p.record.size])
    out.write(END_OF_ARCHIVE)
    assert out.tell() == shard.size
    (tmp_path / "o.tar").write_bytes(out.getvalue())
    got = [s["__key__"] for s in wds.WebDataset(str(tmp_path / "o.tar"), shardshuffle=False)]
    assert got == [p.record.key for p in shard.records]


def test_a_shard_replaced_after_indexing_is_refused_by_name(
    shard_dir: tuple[Path, dict], tmp_path: Path
) -> None:
    import asyncio
    import os
    import shutil

    from etl_runtime.dsort.job import _record_stream, _stamp

    d, _samples = shard_dir
    shard = tmp_path / "shard-000000.tar"
    shutil.copy(d / "shard-000000.tar", shard)
    records = index_shard(shard, shard.name)
    stamps = {shard.name: _stamp(os.stat(shard))}
    offsets = [(0, shard.name, records[0])]

    async def drain() -> bytes:
        stream = _record_stream(b"[]", {shard.name: shard}, offsets, "images", stamps)
        return b"".join([c async for c in stream])

    assert records[0].size < len(asyncio.run(drain()))  # unchanged: the record's bytes
    replaced = tmp_path / "new.tar"
    shutil.copy(d / "shard-000001.tar", replaced)
    os.replace(replaced, shard)  # as the store publishes a new version
    with pytest.raises(DsortFailed, match="images/shard-000000.tar changed during the job"):
        asyncio.run(drain())


def test_shards_close_once_they_reach_the_size_as_in_aistore() -> None:
    records = [Placed("t0", "in.tar", Record(f"r{i:04d}", 0, 10 * 1024 + 512)) for i in range(1000)]
    shards = cut_shards(records, 100 * 1024)
    assert len(shards) == 100  # an output_format of {000..100} (101 names) is enough
    assert all(len(s) == 10 for s in shards)
