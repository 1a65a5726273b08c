"""Highest-random-weight (rendezvous) placement of objects on targets.

Every target gets a pseudo-random score per object, ``blake2b(id + "/" +
bucket/object)``; the highest score owns the object (and with ``copies = k``
the top ``k`` hold it). Nothing is stored: any gateway or target computes the
same owners from the list of member ids (``etl_runtime.cluster.clustermap``), and
when a target joins or leaves only the objects it owns (or will own) move.
"""

from __future__ import annotations

from collections.abc import Sequence

from etl_runtime.cluster.clustermap import hrw_score
from etl_runtime.cluster.records import TargetInfo

__all__ = ["hrw_owner", "hrw_score", "object_key"]


def object_key(bucket: str, name: str) -> str:
    return f"{bucket}/{name}"


def hrw_owner(targets: Sequence[TargetInfo], key: str) -> TargetInfo:
    """The target that owns ``key``; ``targets`` must not be empty."""
    if not targets:
        raise ValueError("hrw_owner needs at least one target")
    return max(targets, key=lambda t: (hrw_score(t.id, key), t.id))
