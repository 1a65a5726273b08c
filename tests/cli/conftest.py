"""A real local cluster (gateway, 3 targets, transformers) per module, for the CLI tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.local import running_cluster


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory) -> Iterator[str]:
    with running_cluster(tmp_path_factory.mktemp("cluster")) as url:
        yield url
