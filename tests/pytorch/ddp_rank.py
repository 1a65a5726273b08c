"""One rank of the 2-rank test: ``python -m tests.pytorch.ddp_rank ENDPOINT PORT RANK OUT``.

Joins a gloo process group on loopback, reads a ShardReader in a
``DataLoader(num_workers=2)`` and an ObjectIterDataset in the rank itself, gathers every rank's
keys with ``all_gather_object`` and (rank 0) writes them to OUT as JSON.
"""

from __future__ import annotations

import json
import sys

import torch.distributed as dist
from torch.utils.data import DataLoader

from etl_runtime import Client
from etl_runtime.pytorch import ObjectIterDataset, ShardReader


def main(endpoint: str, port: str, rank: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    client = Client(endpoint)
    seen: dict[str, list[str]] = {}
    shards = ShardReader(client.bucket("pt-shards"), shuffle=True, seed=5)
    objects = ObjectIterDataset(client.bucket("pt-objects"), shuffle=True, seed=5)
    # Shards: rank x worker split; objects: rank split only (no worker start-up cost).
    for name, dataset, workers in (("samples", shards, 2), ("objects", objects, 0)):
        loader = DataLoader(dataset, num_workers=workers, batch_size=None)
        seen[name] = [key for key, _ in loader]
    seen["len_objects"] = [str(len(objects))]
    gathered: list[dict[str, list[str]] | None] = [None, None]
    dist.all_gather_object(gathered, seen)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(gathered, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
