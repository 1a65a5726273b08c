"""Step 1: pack the pets images into WebDataset shards and upload them to Sluice.

Each sample of a shard is one image and its labels, grouped by the file-name
stem the way the ``webdataset`` library groups them (the key is everything
before the *first* dot, the field is everything after it)::

    Abyssinian_1.jpg         -> sample["jpg"]         JPEG bytes, as on disk
    Abyssinian_1.cls         -> sample["cls"]         "0" (0-based class id)
    Abyssinian_1.trimap.png  -> sample["trimap.png"]  PNG bytes of the trimap

``wds.ShardWriter`` closes a shard every ``maxcount`` samples and calls
``post(path)``; ``post`` uploads the finished shard with the SDK and deletes the
local copy, so the local disk never holds more than one shard.

Run it: ``python examples/pets/1_convert.py --data-dir /tmp/pets --images 200``
(endpoint from ``$SLUICE_ENDPOINT``, e.g. after ``sluice up``).
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import webdataset as wds
from make_dataset import PetRecord, make_pets, read_pets

if TYPE_CHECKING:
    from etl_runtime import Bucket

SHARD_PATTERN = "shard-%06d.tar"


class Converted(NamedTuple):
    """What ``convert_and_upload`` wrote."""

    shards: list[str]  # object names, in upload order
    samples: int
    bytes: int


def pet_samples(records: list[PetRecord], seed: int = 0) -> Iterator[dict[str, Any]]:
    """WebDataset samples for ``records``, shuffled so every shard mixes classes."""
    order = list(records)
    random.Random(seed).shuffle(order)
    for record in order:
        yield {
            "__key__": record.name,
            "jpg": record.image.read_bytes(),  # bytes are written as-is, no re-encoding
            "cls": record.class_id,
            "trimap.png": record.trimap.read_bytes(),
        }


def shard_brace(count: int) -> str:
    """The brace pattern naming the first ``count`` shards: ``shard-{000000..000003}.tar``."""
    return SHARD_PATTERN.replace("%06d", "{%06d..%06d}") % (0, count - 1)


def convert_and_upload(
    bucket: Bucket,
    records: list[PetRecord],
    *,
    maxcount: int = 64,
    seed: int = 0,
    shard_dir: str | Path | None = None,
    log: Callable[[str], None] = print,
) -> Converted:
    """Write ``records`` as shards of ``maxcount`` samples; upload each one as it closes.

    ``bucket`` is an SDK bucket handle (``client.bucket(name)``), created here if
    needed. Returns the uploaded object names and the number of samples.
    """
    if not records:
        raise ValueError("no images to convert")
    bucket.create(exist_ok=True)
    uploaded: list[str] = []
    counts = {"samples": 0, "in_shard": 0, "bytes": 0}
    started = time.monotonic()
    total = len(records)

    def upload(path: str) -> None:
        # Called by ShardWriter with the local path of each finished shard.
        local = Path(path)
        size = local.stat().st_size
        bucket.object(local.name).put_file(str(local))
        local.unlink()
        uploaded.append(local.name)
        counts["bytes"] += size
        rate = counts["samples"] / max(time.monotonic() - started, 1e-9)
        log(
            f"  uploaded {bucket.name}/{local.name}: {counts['in_shard']} samples, "
            f"{size / 1e6:.1f} MB  [{counts['samples']}/{total} samples, {rate:.0f}/s]"
        )
        counts["in_shard"] = 0

    with tempfile.TemporaryDirectory(prefix="pets-shards-", dir=shard_dir) as tmp:
        pattern = str(Path(tmp) / SHARD_PATTERN)
        with wds.ShardWriter(pattern, maxcount=maxcount, post=upload, verbose=0) as sink:
            for sample in pet_samples(records, seed):
                sink.write(sample)
                counts["samples"] += 1
                counts["in_shard"] += 1
    return Converted(shards=uploaded, samples=counts["samples"], bytes=counts["bytes"])


def main(argv: list[str] | None = None) -> None:
    from etl_runtime import Client

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", default=None, help="gateway URL ($SLUICE_ENDPOINT)")
    parser.add_argument("--bucket", default="pets")
    parser.add_argument("--data-dir", type=Path, default=Path("/tmp/sluice-pets"))
    parser.add_argument("--images", type=int, default=200, help="generated if data-dir is empty")
    parser.add_argument("--maxcount", type=int, default=64, help="samples per shard")
    args = parser.parse_args(argv)

    if (args.data_dir / "annotations" / "list.txt").exists():
        records = read_pets(args.data_dir)
    else:
        records = make_pets(args.data_dir, images=args.images)
    with Client(args.endpoint) as client:
        bucket = client.bucket(args.bucket)
        print(f"converting {len(records)} images from {args.data_dir} into {client.endpoint}")
        result = convert_and_upload(bucket, records, maxcount=args.maxcount)
    print(
        f"{result.samples} samples in {len(result.shards)} shards: "
        f"{args.bucket}/{shard_brace(len(result.shards))}"
    )


if __name__ == "__main__":
    main()
