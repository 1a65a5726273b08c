"""``make images`` a second time builds nothing, and leaves archives containerd can import.

The contract of ``scripts/images.sh`` (its header): ``index.json`` maps each
image to its ref, podman image id and a docker-archive under the cache, which
``ctr -n k8s.io images import`` reads; the archive holds that image under
that ref.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

from tests.images.podman import build_images, podman, ref

pytestmark = [pytest.mark.images, pytest.mark.timeout(3600)]

NAMES = ("server", "runtime", "operator")


def test_a_second_run_with_no_change_builds_nothing(built_images: dict[str, Any]) -> None:
    # Another checkout on this machine may have built its own :dev since the
    # session's build; the first run puts this checkout's back, the second
    # must then find everything cached.
    first, _ = build_images()
    index, log = build_images()
    for name in NAMES:
        assert f"{name} {ref(name)} cached" in log, log
        assert index["images"][name]["id"] == first["images"][name]["id"]
    assert "base localhost/sluice/python-base:3.11-bookworm cached" in log
    assert "building" not in log and "mmdebstrap" not in log, log


@pytest.mark.parametrize("name", NAMES)
def test_index_names_an_archive_of_the_image_in_the_store(
    built_images: dict[str, Any], name: str
) -> None:
    entry = built_images["images"][name]
    assert entry["ref"] == ref(name) and entry["format"] == "docker-archive"
    store_id = podman("image", "inspect", "--format", "{{.Id}}", ref(name)).strip()
    assert entry["id"] == store_id
    archive = Path(entry["archive"])
    assert archive.is_file() and entry["key"][:12] in archive.name
    assert (archive.parent / f"{name}.tar").resolve() == archive.resolve()
    with tarfile.open(archive) as tar:
        member = tar.extractfile("manifest.json")
        assert member is not None
        (manifest,) = json.load(member)
        config = manifest["Config"]  # the image config's digest names the image id
        assert set(manifest["RepoTags"]) == {ref(name)}
        assert store_id in config
        labels = json.load(tar.extractfile(config))["config"]["Labels"]  # type: ignore[arg-type]
    assert labels["org.opencontainers.image.title"] == f"sluice-{name}"
    assert len(manifest["Layers"]) >= 2
