"""Active/standby with kopf peering: who this replica is, and whether it is the active one.

kopf pauses a replica when another live replica in the same ``KopfPeering``
has a higher priority, and pauses *every* replica when two share the highest
priority. So each replica needs its own priority: ``--priority`` or, by
default, a random one (``default_priority()``); the highest one is active and
the others stand by until its entry in the peering object is removed (clean
exit) or expires (``lifetime`` seconds after its last keep-alive).

kopf's pause stops its watch streams, not the operator's own periodic resync,
so ``is_active()`` applies kopf's rule to the peering object's ``status``
(``{identity: {priority, lifetime, lastseen}}``) and the resync skips
namespaces where this replica stands by. Plain functions, tested directly.
"""

from __future__ import annotations

import datetime as dt
import os
import random
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# kopf's peering priorities are plain ints stored in JSON; stay well inside int32.
PRIORITY_RANGE = (1, 2**31 - 1)
DEFAULT_LIFETIME = 60


@dataclass(frozen=True)
class Peering:
    """This replica's place in a kopf peering."""

    name: str
    identity: str
    priority: int
    clusterwide: bool
    lifetime: int = DEFAULT_LIFETIME


def own_identity() -> str:
    """kopf's peer id: ``POD_ID`` (the pod name in the chart), else host and pid."""
    return os.environ.get("POD_ID") or f"{socket.gethostname()}/{os.getpid()}"


def default_priority(rng: random.Random | None = None) -> int:
    """A random priority: two replicas collide with probability ~1e-9."""
    return (rng or random.SystemRandom()).randint(*PRIORITY_RANGE)


def _parse_time(value: str | None) -> dt.datetime | None:
    if not value:
        return None
    try:
        stamp = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=dt.UTC)


def is_active(
    status: dict[str, Any] | None,
    identity: str,
    priority: int,
    now: dt.datetime | None = None,
) -> bool:
    """Whether kopf lets this replica work, given the peering object's ``status``.

    ``None`` (no peering object) means kopf waits for one: not active. Any
    live other peer with a priority >= ours pauses us (equal priorities pause
    both, as in kopf).
    """
    if status is None:
        return False
    now = now or dt.datetime.now(dt.UTC)
    for peer, info in status.items():
        if peer == identity or not isinstance(info, dict):
            continue
        try:
            their = int(info.get("priority", 0))
            lifetime = int(info.get("lifetime", DEFAULT_LIFETIME))
        except (TypeError, ValueError):
            continue
        seen = _parse_time(info.get("lastseen")) or now
        alive = seen + dt.timedelta(seconds=lifetime) > now
        if alive and their >= priority:
            return False
    return True


def active_namespaces(
    peering: Peering | None,
    namespaces: set[str],
    read_status: Callable[[str | None, str], dict[str, Any] | None],
) -> set[str]:
    """The namespaces (of ``namespaces``) where this replica is the active one.

    ``read_status(namespace, name)`` returns the status of peering object
    ``name`` in that namespace (``None``: the cluster-wide
    ``ClusterKopfPeering``), or ``None`` if there is no such object. Standalone: every namespace.
    """
    if peering is None:
        return set(namespaces)
    if peering.clusterwide:
        status = read_status(None, peering.name)
        return set(namespaces) if is_active(status, peering.identity, peering.priority) else set()
    return {
        ns
        for ns in namespaces
        if is_active(read_status(ns, peering.name), peering.identity, peering.priority)
    }
