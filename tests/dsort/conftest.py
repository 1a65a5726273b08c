"""dSort tests run on the in-process map cluster of ``tests/cluster`` (3 targets over HTTP)."""

from tests.cluster.conftest import map_cluster  # noqa: F401
