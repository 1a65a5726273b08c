"""WebDataset shards of real (small, PIL-generated) JPEG images, written with ShardWriter."""

from __future__ import annotations

import io
import json
import random
import tarfile
from pathlib import Path

import webdataset as wds
from PIL import Image


def jpeg(rng: random.Random, side: int = 40) -> bytes:
    img = Image.new("RGB", (side, side), tuple(rng.randrange(256) for _ in range(3)))
    px = img.load()
    for _ in range(side * side // 3):  # some noise so JPEG sizes vary per image
        px[rng.randrange(side), rng.randrange(side)] = tuple(rng.randrange(256) for _ in range(3))
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def write_shards(
    directory: Path, shards: int, per_shard: int, seed: int = 0, prefix: str = "shard"
) -> dict[str, dict[str, dict[str, bytes]]]:
    """``shards`` tar files in ``directory``; returns {shard name: {key: {ext: bytes}}}."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    samples: dict[str, dict[str, dict[str, bytes]]] = {}
    pattern = str(directory / f"{prefix}-%06d.tar")
    with wds.ShardWriter(pattern, maxcount=per_shard, verbose=0) as sink:
        for i in range(shards * per_shard):
            key = f"sample{i:06d}"
            rec = {
                "jpg": jpeg(rng),
                "cls": str(rng.randrange(10)).encode(),
                "json": json.dumps({"i": i, "label": rng.random()}).encode(),
            }
            sink.write({"__key__": key, **rec})
            samples.setdefault(f"{prefix}-{i // per_shard:06d}.tar", {})[key] = rec
    return samples


def read_samples(data: bytes) -> list[tuple[str, dict[str, bytes]]]:
    """(key, fields) in order, grouped as webdataset groups them."""
    out: list[tuple[str, dict[str, bytes]]] = []
    with tarfile.open(fileobj=io.BytesIO(data), mode="r|") as tar:
        for ti in tar:
            f = tar.extractfile(ti)
            assert f is not None
            key, ext = ti.name.split(".", 1)
            if not out or out[-1][0] != key:
                out.append((key, {}))
            out[-1][1][ext] = f.read()
    return out
