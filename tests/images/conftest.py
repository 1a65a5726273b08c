"""The built images, once per session (``scripts/images.sh``; cached by content)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.images.podman import build_images


@pytest.fixture(scope="session")
def built_images() -> dict[str, Any]:
    """``index.json`` of ``make images``: a build when something changed, else seconds."""
    index, _ = build_images()
    return index
