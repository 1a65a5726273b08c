"""HRW placement: even spread, and only a leaving target's objects move."""

from __future__ import annotations

import collections

import pytest

from etl_runtime.cluster.clustermap import hrw_first, hrw_order
from etl_runtime.cluster.hrw import hrw_owner
from etl_runtime.cluster.records import TargetInfo

TARGETS = [TargetInfo(id=f"t{i}", url=f"http://t{i}") for i in range(5)]
KEYS = [f"bucket/shard-{i:06d}.tar" for i in range(20_000)]


def test_spread_is_even() -> None:
    counts = collections.Counter(hrw_owner(TARGETS, k).id for k in KEYS)
    expected = len(KEYS) / len(TARGETS)
    assert set(counts) == {t.id for t in TARGETS}
    assert all(abs(c - expected) < 0.06 * expected for c in counts.values()), counts


def test_owner_is_independent_of_list_order() -> None:
    shuffled = list(reversed(TARGETS))
    assert all(hrw_owner(TARGETS, k) == hrw_owner(shuffled, k) for k in KEYS[:2000])


def test_leaving_target_moves_only_its_objects() -> None:
    before = {k: hrw_owner(TARGETS, k).id for k in KEYS}
    remaining = [t for t in TARGETS if t.id != "t2"]
    after = {k: hrw_owner(remaining, k).id for k in KEYS}
    moved = [k for k in KEYS if before[k] != after[k]]
    assert moved and all(before[k] == "t2" for k in moved)
    assert len(moved) == sum(1 for v in before.values() if v == "t2")
    # and they spread over the survivors instead of piling onto one
    assert len({after[k] for k in moved}) == len(remaining)


def test_joining_target_takes_objects_only_for_itself() -> None:
    bigger = [*TARGETS, TargetInfo(id="t9", url="http://t9")]
    before = {k: hrw_owner(TARGETS, k).id for k in KEYS}
    moved = [k for k in KEYS if hrw_owner(bigger, k).id != before[k]]
    assert moved and all(hrw_owner(bigger, k).id == "t9" for k in moved)


def test_no_targets() -> None:
    with pytest.raises(ValueError):
        hrw_owner([], "b/o")


def test_placement_is_the_documented_hash_so_stored_data_is_found_after_upgrades() -> None:
    """Owners are ``blake2b(id + "/" + bucket/object)``, 8 bytes big-endian, highest first
    (docs/architecture.md): a faster way to compute it must give the same owners."""
    import hashlib

    from etl_runtime.cluster.clustermap import BucketProps, ClusterMap, hrw_order, hrw_score

    def score(tid: str, key: str) -> int:
        digest = hashlib.blake2b(f"{tid}/{key}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big")

    ids = [t.id for t in TARGETS] + ["target-é"]
    cmap = ClusterMap(version=1, members=tuple(ids), buckets={"bucket": BucketProps()})
    for key in KEYS[:3000]:
        expected = sorted(ids, key=lambda t: (score(t, key), t), reverse=True)
        assert hrw_order(ids, key) == expected
        assert cmap.owners("bucket", key.split("/", 1)[1]) == expected[:1]
        assert hrw_score(ids[0], key) == score(ids[0], key)


def test_a_single_copy_owner_is_the_first_of_the_full_order() -> None:
    """``ClusterMap.owners`` takes ``hrw_first`` for one copy, ``hrw_order`` for more:
    the two must never disagree, or a one-copy object is looked for on the wrong target."""
    ids = [t.id for t in TARGETS]
    for k in KEYS[:5000]:
        assert hrw_first(ids, k.encode()) == hrw_order(ids, k)[0]
        assert hrw_first(list(reversed(ids)), k.encode()) == hrw_order(ids, k)[0]
