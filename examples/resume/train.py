"""Kill a training loop mid-epoch, resume it with another number of DataLoader workers.

``python examples/resume/train.py`` starts a local cluster, uploads WebDataset
shards, registers a per-sample ETL, then:

1. trains with 3 DataLoader workers in a child process that saves a
   checkpoint (model + ``StatefulDataLoader.state_dict()``) after every step
   and is killed (SIGKILL) in the middle of epoch 0;
2. trains again from that checkpoint with 1 worker (in this process), to the
   end of epoch 1:
   ``merge_positions`` turns the 3-worker loader state into a position any
   layout can read from;
3. checks that every sample was trained on exactly once per epoch.

``--endpoint URL`` uses a running cluster instead. Under DDP, save every
rank's ``loader.state_dict()`` (e.g. ``torch.distributed.all_gather_object``)
and pass them all to ``merge_positions``.
"""

from __future__ import annotations

import argparse
import io
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from etl_runtime import Client
from etl_runtime.pytorch import ShardReader, merge_positions

BUCKET, ETL = "resume-demo", "resume-demo-scale"


def scale(sample: dict) -> dict:
    """Per-sample ETL, on the storage target: the feature vector, doubled."""
    sample["x"] = bytes(min(255, 2 * b) for b in sample["x"])
    return sample


def prepare(client: Client, shards: int = 4, per_shard: int = 12) -> list[str]:
    """Upload ``shards`` tar shards of ``per_shard`` samples (``x``: 8 bytes, ``cls``)."""
    bucket = client.bucket(BUCKET).create(exist_ok=True)
    keys = []
    for s in range(shards):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for i in range(per_shard):
                key = f"s{s}-{i:03d}"
                keys.append(key)
                for ext, data in (("x", bytes(range(i, i + 8))), ("cls", str(i % 2).encode())):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        bucket.object(f"shard-{s:03d}.tar").put_content(buf.getvalue())
    client.etl(ETL).init_code(transform=scale, mode="wds", workers=1)
    return keys


def train(endpoint: str, checkpoint: Path, workers: int, epochs: int, kill_after: int | None):
    """The training loop: resumes from ``checkpoint`` if there is one, saves it each step."""
    client = Client(endpoint)
    # decode="rgb": webdataset's decoders (.cls -> int; the unknown .x stays bytes)
    data = ShardReader(client.bucket(BUCKET), etl_name=ETL, decode="rgb", shuffle=True, seed=0)
    model = torch.nn.Linear(8, 2)
    seen: list[list[str]] = [[] for _ in range(epochs)]
    if checkpoint.exists():
        saved = torch.load(checkpoint, weights_only=False)
        model.load_state_dict(saved["model"])
        seen = saved["seen"]
        # One loader state per rank (one rank here), saved with any number of workers.
        data.load_state_dict(merge_positions(saved["loader"]))
    steps = 0
    for epoch in range(data.epoch, epochs):
        data.set_epoch(epoch)  # keeps a loaded position of this epoch
        loader = StatefulDataLoader(data, batch_size=4, num_workers=workers)
        for keys, sample in loader:
            x = torch.tensor([list(b) for b in sample["x"]], dtype=torch.float32)
            loss = torch.nn.functional.cross_entropy(model(x / 255), sample["cls"])
            model.zero_grad()
            loss.backward()
            with torch.no_grad():  # plain SGD
                for p in model.parameters():
                    p -= 0.01 * p.grad
            seen[epoch] += list(keys)
            state = {
                "model": model.state_dict(),
                "loader": [loader.state_dict()],
                "seen": seen,
            }
            torch.save(state, checkpoint.with_suffix(".tmp"))
            os.replace(checkpoint.with_suffix(".tmp"), checkpoint)
            steps += 1
            if kill_after is not None and steps == kill_after:
                os.kill(os.getpid(), signal.SIGKILL)  # a crash: no cleanup, workers orphaned
    return seen


def run(endpoint: str, workdir: Path, kill_after: int = 5, log=print) -> dict[str, Any]:
    """The whole story against ``endpoint``; returns what was trained on per epoch."""
    with Client(endpoint) as client:
        keys = prepare(client)
    checkpoint = workdir / "checkpoint.pt"
    checkpoint.unlink(missing_ok=True)
    # Run 1 in a child process of its own (a fresh interpreter, as a crashed job's
    # restart would be), killed mid-epoch.
    first = subprocess.run(
        [sys.executable, __file__, "--endpoint", endpoint, "--first-run", str(checkpoint),
         "--kill-after", str(kill_after)],
        check=False,
    )  # fmt: skip
    log(f"run 1 (3 workers) ended by signal {-first.returncode} after {kill_after} steps")
    saved = torch.load(checkpoint, weights_only=False)
    log(f"checkpoint: epoch 0, {len(saved['seen'][0])} of {len(keys)} samples trained on")
    # Run 2 in a fresh interpreter too (DataLoader workers are forked: a fork of a
    # process with threads of its own, a test runner's say, can hang), to the end.
    second = subprocess.run(
        [sys.executable, __file__, "--endpoint", endpoint, "--second-run", str(checkpoint)],
        check=True,
    )  # fmt: skip
    assert second.returncode == 0
    seen = torch.load(checkpoint, weights_only=False)["seen"]
    for epoch, got in enumerate(seen):
        once = Counter(got) == Counter(keys)
        log(f"epoch {epoch}: {len(got)} samples, each exactly once: {once}")
    return {"keys": keys, "seen": seen, "killed": -first.returncode}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint")
    parser.add_argument("--first-run", type=Path, help=argparse.SUPPRESS)  # run 1's checkpoint
    parser.add_argument("--kill-after", type=int, default=5, help=argparse.SUPPRESS)
    parser.add_argument("--second-run", type=Path, help=argparse.SUPPRESS)  # run 2's
    args = parser.parse_args()
    if args.first_run is not None:  # run 1 of run(): 3 workers, killed after some steps
        train(args.endpoint, args.first_run, 3, 2, args.kill_after)
        return
    if args.second_run is not None:  # run 2 of run(): 1 worker, from the checkpoint
        train(args.endpoint, args.second_run, 1, 2, None)
        return
    with ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        endpoint = args.endpoint
        if endpoint is None:
            from etl_runtime.local.up import LocalCluster

            cluster = stack.enter_context(LocalCluster(workdir / "cluster", targets=2, port=0))
            endpoint = str(cluster.endpoint)
        run(endpoint, workdir)


if __name__ == "__main__":
    main()
