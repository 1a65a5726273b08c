"""Which part of an epoch this process reads: DDP rank × DataLoader worker.

Every reader (rank r of R, worker w of W) computes the same epoch order (a
permutation seeded by ``(seed, epoch)``, or the catalog order); rank r takes
every R-th item from position r, and its worker w every W-th of those from w.
So across all ranks and workers each item is read exactly once per epoch,
nobody needs to talk to anybody else to agree on it, and a rank's share does
not depend on how many DataLoader workers it runs.

The rank comes from ``torch.distributed`` when it is initialised, else from
the ``RANK``/``WORLD_SIZE`` environment variables that ``torchrun`` sets.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Part:
    """This reader's slot: worker ``worker`` of ``num_workers`` on rank ``rank``."""

    rank: int
    world_size: int
    worker: int
    num_workers: int


def rank_and_world_size() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if not 0 <= rank < world:
        raise ValueError(f"RANK={rank} is not within WORLD_SIZE={world}")
    return rank, world


def current_part(rank: int | None = None, world_size: int | None = None) -> Part:
    """This process's slot, from DDP and ``torch.utils.data.get_worker_info()``.

    ``rank``/``world_size``, when given, stand for DDP's (a dataset's arguments).
    """
    from torch.utils.data import get_worker_info

    if rank is None or world_size is None:
        rank, world = rank_and_world_size()
    else:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not within world_size {world_size}")
        world = world_size
    info = get_worker_info()
    worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
    return Part(rank, world, worker, workers)


def epoch_order(n: int, shuffle: bool, seed: int, epoch: int) -> np.ndarray:
    """The item order of an epoch: identical in every rank and worker."""
    if not shuffle:
        return np.arange(n)
    return np.random.default_rng((seed, epoch)).permutation(n)


def my_indices(n: int, part: Part, shuffle: bool, seed: int, epoch: int) -> list[int]:
    """The catalog indices this reader reads this epoch, in reading order."""
    mine = epoch_order(n, shuffle, seed, epoch)[part.rank :: part.world_size]
    return mine[part.worker :: part.num_workers].tolist()


def rank_share(n: int, part: Part) -> int:
    """How many of ``n`` items this rank reads per epoch (all its workers together)."""
    return len(range(part.rank, n, part.world_size))
