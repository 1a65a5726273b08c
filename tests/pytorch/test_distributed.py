"""Two DDP ranks (two processes, gloo on loopback) split the data between them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.pytorch.conftest import OBJECTS, PER_SHARD, SHARDS, sample_key
from tests.servers import free_port

pytestmark = pytest.mark.torch
pytest.importorskip("torch.distributed")

ROOT = Path(__file__).resolve().parents[2]


def test_two_ranks_read_disjoint_halves_of_everything(endpoint, objects, shards, tmp_path) -> None:
    out, port = tmp_path / "seen.json", str(free_port())
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    ranks = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.pytorch.ddp_rank", endpoint, port, str(r), str(out)],
            cwd=ROOT,
            env=env,
        )
        for r in (0, 1)
    ]
    for proc in ranks:
        assert proc.wait(timeout=120) == 0
    rank0, rank1 = json.loads(out.read_text())

    all_samples = {sample_key(s, i) for s in range(SHARDS) for i in range(PER_SHARD)}
    for what, everything in (("samples", all_samples), ("objects", set(OBJECTS))):
        mine, theirs = rank0[what], rank1[what]
        assert len(mine) == len(set(mine)) and len(theirs) == len(set(theirs))
        assert not set(mine) & set(theirs)  # disjoint
        assert set(mine) | set(theirs) == everything  # together: everything
        assert mine and theirs
    # Each rank knows its own share of the objects.
    assert int(rank0["len_objects"][0]) + int(rank1["len_objects"][0]) == len(OBJECTS)
    assert int(rank0["len_objects"][0]) == len(rank0["objects"])
