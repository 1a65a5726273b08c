"""The chart's tests: on the process kubelet (fast) and on real nodes (test_realstack.py)."""

from __future__ import annotations

from tests.k8s.fixtures import control_plane, k8s_namespace, kubelet  # noqa: F401
from tests.k8s.realfixtures import real_cluster, real_namespace  # noqa: F401
