"""Build the test ETL images of ``tests/images/<name>/`` with buildah, cached by content.

``image("hpush_echo")`` -> ``localhost/sluice-test/hpush-echo:<key12>``: the key is
the sha256 of every file of the directory and of the base image's id, so an
unchanged image is found in the local store (``podman image exists``) and a
changed one gets a new tag. Built ``FROM`` the base ``make images`` makes
(``localhost/sluice/python-base:3.11-bookworm``; no registry is reachable here)
with ``--runtime runc`` (crun cannot start containers on these machines).

    python tests/images/build.py hpush_echo     # prints the ref
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BASE_IMAGE = "localhost/sluice/python-base:3.11-bookworm"
REPOSITORY = "localhost/sluice-test"


class ImageUnavailable(Exception):
    """What is missing to build a test image (podman, buildah or the base image)."""


def _run(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def base_id(base: str = BASE_IMAGE) -> str:
    for tool in ("podman", "buildah"):
        if shutil.which(tool) is None:
            raise ImageUnavailable(f"{tool} is not installed (`make images` installs it)")
    r = _run("podman", "image", "inspect", "--format", "{{.Id}}", base)
    if r.returncode != 0:
        raise ImageUnavailable(f"no base image {base} (build it: bash scripts/images.sh base)")
    return r.stdout.strip()


def content_key(name: str, base: str = BASE_IMAGE) -> str:
    h = hashlib.sha256(base_id(base).encode())
    for path in sorted((HERE / name).rglob("*")):
        if path.is_file():
            h.update(str(path.relative_to(HERE / name)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def image(name: str, base: str = BASE_IMAGE) -> str:
    """The ref of test image ``name``, built now unless the store has it."""
    ref = f"{REPOSITORY}/{name.replace('_', '-')}:{content_key(name, base)[:12]}"
    if _run("podman", "image", "exists", ref).returncode == 0:
        return ref
    r = _run(
        "buildah",
        "bud",
        "--layers",
        "--runtime",
        "runc",
        "--pull-never",
        "--build-arg",
        f"BASE_IMAGE={base}",
        "-t",
        ref,
        str(HERE / name),
        timeout=600,
    )
    if r.returncode != 0:
        raise RuntimeError(f"building {ref} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    # older builds of this image go (one still used by a container stays)
    repo = ref.rsplit(":", 1)[0]
    listed = _run("podman", "images", "--format", "{{.Repository}}:{{.Tag}}", repo).stdout
    old = [r for r in listed.split() if r.startswith(f"{repo}:") and r != ref]
    if old:
        _run("podman", "rmi", *old)
    return ref


if __name__ == "__main__":
    print(image(sys.argv[1] if len(sys.argv) > 1 else "hpush_echo"))
