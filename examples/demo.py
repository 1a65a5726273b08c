"""``make demo``: a local Sluice cluster, two ETLs, original vs transformed objects.

1. start a local cluster (gateway + 3 storage targets) in a temp directory;
2. create a bucket and upload a few text files and a small PNG;
3. register two ETLs from plain Python functions (pickled by the SDK):
   ``shout`` upper-cases text, ``thumb`` resizes an image to ``etl_args`` size;
4. GET every object as stored and through its ETL, and print both;
5. the WebDataset workflow (``examples/pets``): convert a generated pets-like
   dataset into shards (144 images in 3 shards), register a per-sample
   torchvision ETL, stream 2 epochs of batches through a DataLoader, and
   write a PNG grid of original vs transformed images to
   ``demo-out/pets-grid.png``;
6. shut everything down.
"""

from __future__ import annotations

import importlib.util
import io
import json
import sys
import tempfile
import time
from pathlib import Path

from PIL import Image

from etl_runtime import Client
from etl_runtime.local.up import LocalCluster

TEXTS = {
    "notes/hello.txt": b"hello from sluice: transforms run next to the data",
    "notes/poem.txt": b"the river moves the stones, one object at a time",
    "readme.txt": b"GET /v1/objects/demo/readme.txt?etl_name=shout",
}


def shout(data: bytes) -> bytes:
    """Object ETL: upper-case the text and mark it."""
    return data.upper() + b" (shouted beside the data)"


def thumb(data: bytes, args: str) -> bytes:
    """Object ETL with arguments: resize a PNG to ``{"size": N}`` pixels wide."""
    size = int(json.loads(args or "{}").get("size", 32))
    image = Image.open(io.BytesIO(data))
    image.thumbnail((size, size))
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def sample_png() -> bytes:
    """A 120x80 colour gradient, made here so the demo needs no files."""
    image = Image.new("RGB", (120, 80))
    image.putdata([(x * 2, y * 3, 128) for y in range(80) for x in range(120)])
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def png_size(data: bytes) -> str:
    width, height = Image.open(io.BytesIO(data)).size
    return f"{width}x{height} PNG, {len(data)} bytes"


HERE = Path(__file__).resolve().parent
GRID_PATH = HERE.parent / "demo-out" / "pets-grid.png"


def load_workflow():  # type: ignore[no-untyped-def]
    """``examples/pets/workflow.py`` (the folder is not a package)."""
    spec = importlib.util.spec_from_file_location("pets_workflow", HERE / "pets" / "workflow.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="sluice-demo-") as data_dir:
        print(f"starting a local cluster (gateway + 3 targets) in {data_dir} ...")
        started = time.monotonic()
        with LocalCluster(data_dir, targets=3, port=0) as cluster:
            print(f"Sluice is up at {cluster.endpoint} ({time.monotonic() - started:.1f}s)\n")
            with Client(cluster.endpoint) as client:
                run(client)
                print("\n--- WebDataset: per-sample ETL feeding a PyTorch DataLoader ---\n")
                GRID_PATH.parent.mkdir(parents=True, exist_ok=True)
                figures = load_workflow().run_workflow(
                    client, Path(data_dir) / "work", images=144, epochs=2, grid_path=GRID_PATH
                )
                print(
                    f"\n{figures['samples_written']} samples in {len(figures['urls'])} shards; "
                    f"best epoch {figures['samples_per_s']:.1f} samples/s through the ETL"
                )
                print(f"original vs transformed grid: {figures['grid_path']}")
        print("\ncluster stopped; bye")
    return 0


def run(client: Client) -> None:
    bucket = client.bucket("demo").create()
    for name, data in TEXTS.items():
        bucket.object(name).put_content(data)
    bucket.object("images/gradient.png").put_content(sample_png())
    print("bucket 'demo':")
    for info in bucket.list_objects():
        print(f"  {info.name:<22} {info.size:>6} bytes  etag {info.etag}")

    print("\nregistering ETLs 'shout' and 'thumb' (one transformer per target) ...")
    for name, fn in (("shout", shout), ("thumb", thumb)):
        details = client.etl(name).init_code(transform=fn, timeout=120)
        print(f"  {name}: {details.phase}, {details.ready}/{details.total} transformers ready")

    print("\noriginal -> through ETL 'shout':")
    for name in TEXTS:
        obj = bucket.object(name)
        print(f"  {name}")
        print(f"    {obj.get_bytes().decode()}")
        print(f"    {obj.get_bytes(etl_name='shout').decode()}")

    image = bucket.object("images/gradient.png")
    args = {"size": 30}
    print(f"\noriginal -> through ETL 'thumb' with etl_args={json.dumps(args)}:")
    print(f"  {png_size(image.get_bytes())} -> {png_size(image.get_bytes('thumb', args))}")
    print(f"\nany HTTP client can do the same:\n  curl -L '{image.url('thumb', args)}'")

    for name in ("shout", "thumb"):
        client.etl(name).delete()


if __name__ == "__main__":
    sys.exit(main())
