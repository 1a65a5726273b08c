"""Job tests reuse the in-process map cluster of ``tests/cluster``."""

from tests.cluster.conftest import map_cluster  # noqa: F401
