"""Pack static binaries into a one-layer container image archive, no registry.

The real-node harness (``tests/k8s/realnode.py``) needs a sandbox ("pause")
image and a small test image in each node's containerd, and no registry is
reachable.  A Dockerfile ``FROM scratch`` + ``COPY`` of one static binary is
just a tar layer plus two JSON documents, so we write that directly, in the
``docker save`` archive layout that ``ctr images import`` (and ``podman
load``) read::

    python3 tests/k8s/ociimage.py --tag localhost/sluice/pause:3.10 \
        --entrypoint /pause --add pause=/path/to/pause --out pause.tar

Deterministic: the same inputs give byte-identical archives (mtimes 0,
files sorted), so the image ID only changes when a binary does.
Standard library only: ``scripts/k8s-tools.sh`` runs it with the system Python.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import sys
import tarfile
from pathlib import Path


def _tar_bytes(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name in sorted(files):
            info = tarfile.TarInfo(name.lstrip("/"))
            info.size, info.mode, info.mtime = len(files[name]), 0o755, 0
            tar.addfile(info, io.BytesIO(files[name]))
    return buf.getvalue()


def build(tag: str, entrypoint: list[str], files: dict[str, bytes], out: Path) -> str:
    """Write the archive to ``out``; return the image ID (``sha256:...``)."""
    layer = _tar_bytes(files)
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": entrypoint, "Env": ["PATH=/"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": f"sluice tests/k8s/ociimage.py {' '.join(sorted(files))}"}],
    }
    config_raw = json.dumps(config, sort_keys=True).encode()
    config_id = hashlib.sha256(config_raw).hexdigest()
    manifest = [{"Config": f"{config_id}.json", "RepoTags": [tag], "Layers": ["layer.tar"]}]
    archive = {
        f"{config_id}.json": config_raw,
        "layer.tar": layer,
        "manifest.json": json.dumps(manifest).encode(),
        "repositories": json.dumps(
            {tag.rsplit(":", 1)[0]: {tag.rsplit(":", 1)[1]: config_id}}
        ).encode(),
    }
    tmp = out.with_suffix(".tmp")
    tmp.write_bytes(_tar_bytes(archive))
    tmp.replace(out)
    return f"sha256:{config_id}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tag", required=True, help="e.g. localhost/sluice/pause:3.10")
    parser.add_argument("--entrypoint", required=True, help="path of the binary in the image")
    parser.add_argument("--add", action="append", default=[], help="PATH_IN_IMAGE=HOST_FILE")
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    files = {}
    for pair in args.add:
        dest, _, src = pair.partition("=")
        files[dest] = Path(src).read_bytes()
    print(build(args.tag, [args.entrypoint], files, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
