"""Step 3: train from the transformed shards with a plain WebDataset + DataLoader pipeline.

The URLs are ordinary Sluice object URLs with ``?etl_name=pets-train``: the
gateway answers 307 to the target that owns the shard, and webdataset opens
http URLs with ``curl -f -s -L``, so the redirect is followed and the
transformed shard streams straight from the storage node into the loader.
Nothing here knows about Sluice beyond the URL list.

The pipeline is the one the webdataset docs recommend for multi-worker loading:
batch inside the workers (cheap IPC), then unbatch, shuffle across workers and
re-batch in the main process::

    WebDataset(urls).shuffle().decode().to_tuple("npy", "cls").batched(16)
      -> WebLoader(batch_size=None, num_workers=4)
      -> .unbatched().shuffle().batched(16)

Run it: ``python examples/pets/3_train.py --epochs 2`` (after steps 1 and 2).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import torch
import webdataset as wds
from torch import nn

BATCH_SIZE = 16


class EpochStats(NamedTuple):
    """What one pass over the shards saw."""

    samples: int
    batches: int
    seconds: float
    loss: float
    classes: list[int]  # every class id read, in order

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0


def make_loader(
    urls: list[str],
    *,
    batch_size: int = BATCH_SIZE,
    num_workers: int = 4,
    shuffle: int = 64,
    seed: int | None = None,
) -> wds.WebLoader:
    """A multi-worker loader yielding ``(images[B,3,H,W] float32, classes[B] int64)``.

    Workers split the shards between them, so more workers than shards would
    leave some idle (webdataset raises on a worker that gets no shard):
    ``num_workers`` is capped at ``len(urls)``. Every sample is delivered once
    per epoch; only the last batch may be short.
    """
    if not urls:
        raise ValueError("no shard URLs to read")
    dataset = (
        wds.WebDataset(urls, shardshuffle=len(urls), seed=seed)
        .shuffle(shuffle)
        .decode()  # .npy -> ndarray, .cls -> int: the default decoders suffice
        .to_tuple("npy", "cls")
        .batched(batch_size)
    )
    loader = wds.WebLoader(dataset, batch_size=None, num_workers=min(num_workers, len(urls)))
    return loader.unbatched().shuffle(shuffle * 4).batched(batch_size)


def make_model(classes: int = 37) -> nn.Module:
    """A deliberately tiny classifier: pooled colour features and one linear layer."""
    return nn.Sequential(nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(3 * 4 * 4, classes))


def run_epoch(
    loader: Any,
    model: nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    check: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
    log: Callable[[str], None] | None = print,
) -> EpochStats:
    """One pass over ``loader``; a SGD step per batch when ``model``/``optimizer`` are given."""
    samples = batches = 0
    losses: list[float] = []
    classes: list[int] = []
    loss_fn = nn.CrossEntropyLoss()
    started = time.monotonic()
    for images, labels in _batches(loader):
        if check is not None:
            check(images, labels)
        if model is not None and optimizer is not None:
            optimizer.zero_grad()
            loss = loss_fn(model(images), labels)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        samples += len(labels)
        batches += 1
        classes.extend(int(c) for c in labels)
        if log is not None and batches % 4 == 0:
            rate = samples / max(time.monotonic() - started, 1e-9)
            log(f"    batch {batches:4d}: {samples} samples, {rate:.1f} samples/s")
    seconds = time.monotonic() - started
    mean_loss = sum(losses) / len(losses) if losses else float("nan")
    return EpochStats(samples, batches, seconds, mean_loss, classes)


def _batches(loader: Any) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    for images, labels in loader:
        yield torch.as_tensor(images), torch.as_tensor(labels)


def check_batch(images: torch.Tensor, labels: torch.Tensor, size: int = 224) -> None:
    """Raise if a batch does not look like the ETL's output."""
    b = len(labels)
    if not (1 <= b <= BATCH_SIZE):
        raise AssertionError(f"batch of {b} samples")
    if tuple(images.shape) != (b, 3, size, size) or images.dtype != torch.float32:
        raise AssertionError(f"images {tuple(images.shape)} {images.dtype}")
    if labels.dtype != torch.int64 or tuple(labels.shape) != (b,):
        raise AssertionError(f"labels {tuple(labels.shape)} {labels.dtype}")


def train(
    urls: list[str],
    *,
    epochs: int = 2,
    classes: int = 37,
    num_workers: int = 4,
    lr: float = 0.1,
    log: Callable[[str], None] = print,
) -> list[EpochStats]:
    """Train the tiny model for ``epochs`` passes; returns per-epoch figures."""
    torch.manual_seed(0)
    model = make_model(classes)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    loader = make_loader(urls, num_workers=num_workers)
    stats = []
    for epoch in range(1, epochs + 1):
        log(f"  epoch {epoch}/{epochs}")
        s = run_epoch(loader, model, optimizer, check=check_batch, log=log)
        log(
            f"  epoch {epoch}: {s.samples} samples in {s.batches} batches, "
            f"{s.seconds:.1f}s, {s.samples_per_s:.1f} samples/s, loss {s.loss:.3f}"
        )
        stats.append(s)
    return stats


def main(argv: list[str] | None = None) -> None:
    from etl_runtime import Client

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", default=None, help="gateway URL ($SLUICE_ENDPOINT)")
    parser.add_argument("--bucket", default="pets")
    parser.add_argument("--etl", default="pets-train")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args(argv)
    with Client(args.endpoint) as client:
        urls = client.bucket(args.bucket).list_urls(prefix="shard-", etl_name=args.etl)
    print(f"training on {len(urls)} shards, e.g. {urls[0]}")
    train(urls, epochs=args.epochs, num_workers=args.workers)


if __name__ == "__main__":
    main()
