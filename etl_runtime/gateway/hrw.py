"""Highest-random-weight (rendezvous) placement of objects on targets.

Every target gets a pseudo-random score per object, ``blake2b(id + "/" +
bucket/object)``; the highest score owns the object. Nothing is stored: any
gateway computes the same owner from the list of live target ids, and when a
target leaves only the objects it owned move (each to its runner-up), so the
rest of the cluster is undisturbed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from etl_runtime.cluster import TargetInfo


def object_key(bucket: str, name: str) -> str:
    return f"{bucket}/{name}"


def hrw_score(target_id: str, key: str) -> int:
    digest = hashlib.blake2b(f"{target_id}/{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def hrw_owner(targets: Sequence[TargetInfo], key: str) -> TargetInfo:
    """The target that owns ``key``; ``targets`` must not be empty."""
    if not targets:
        raise ValueError("hrw_owner needs at least one target")
    return max(targets, key=lambda t: (hrw_score(t.id, key), t.id))
