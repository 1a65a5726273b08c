"""How a transformer sizes itself when the user set nothing: servers, inline, workers.

What a user gets without flags (docs/transformer.md,
"The default shape"). Measured on 2 cores against AIStore's own
``FastAPIServer`` (``bench/anchor_transformer.py``), one server process relaying
every byte to worker processes lost on every byte-heavy row (identity 1 MiB
0.29-0.52 of AIStore's rate, about 3x its CPU per request): each object
crossed two more process boundaries. So:

- **object mode**: ``servers`` = the CPUs this process may use, each running
  the code *inline* in its own thread (the bytes never leave the process that
  read them), one thread per server unless ``workers`` asks for more. Safety
  comes from the supervisor (``servers``): a server that dies is replaced, and
  one whose transform outlived ``spec.timeouts.requestSeconds`` answers 422,
  stops taking connections and is replaced (its thread cannot be stopped, its
  process can).
- **wds mode**: one server and ``workers`` worker processes, which transform
  the samples of one shard in parallel (the reason the pool exists).

Explicit flags and environment variables (``--servers``/``SLUICE_SERVERS``,
``--inline``/``--no-inline``/``SLUICE_INLINE``, ``--workers``) win.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from etl_runtime.core.spec import EtlSpec


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity, capped by a cgroup CPU quota
    (a pod's ``resources.limits.cpu``), at least 1."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    quota = _cgroup_quota()
    if quota is not None:
        cpus = min(cpus, max(1, math.ceil(quota)))
    return max(1, cpus)


def _cgroup_quota() -> float | None:
    """CPUs granted by cgroup v2 ``cpu.max`` (or v1 ``cfs_quota_us``), None if unlimited."""
    try:
        with open("/sys/fs/cgroup/cpu.max", encoding="ascii") as f:
            quota, period = f.read().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        with open("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", encoding="ascii") as f:
            q = int(f.read())
        with open("/sys/fs/cgroup/cpu/cpu.cfs_period_us", encoding="ascii") as f:
            p = int(f.read())
        return None if q <= 0 or p <= 0 else q / p
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class Shape:
    servers: int
    inline: bool
    workers: int  # worker processes in all (workers mode) or threads in all (inline)

    @property
    def per_server(self) -> int:
        return max(1, math.ceil(self.workers / self.servers))


def parse_inline(value: str | None) -> bool | None:
    """``SLUICE_INLINE``: 1/true/yes → on, 0/false/no → off, empty/auto → None (auto)."""
    v = (value or "").strip().lower()
    if v in ("", "auto"):
        return None
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"SLUICE_INLINE must be 1, 0 or auto, got {value!r}")


def parse_servers(value: str | None) -> int | None:
    """``SLUICE_SERVERS``: a count, or empty/auto → None (auto)."""
    v = (value or "").strip().lower()
    if v in ("", "auto"):
        return None
    try:
        return int(v)
    except ValueError:
        raise ValueError(f"SLUICE_SERVERS must be a number or auto, got {value!r}") from None


def shape(spec: EtlSpec, workers: int | None, servers: int | None, inline: bool | None) -> Shape:
    """The shape to run ``spec`` in; ``None`` arguments are chosen here."""
    cpus = usable_cpus()
    if inline is None:
        inline = spec.mode == "object"
    if spec.mode != "object":
        inline = False
    total = workers or spec.workers or cpus
    if servers is None:
        servers = min(cpus, total) if inline else 1
    return Shape(servers=max(1, servers), inline=inline, workers=total)
