"""Fixtures for the tests of the Kubernetes test harness itself."""

from __future__ import annotations

from tests.k8s.fixtures import control_plane, k8s_namespace, kubelet  # noqa: F401
from tests.k8s.realfixtures import real_cluster, real_namespace  # noqa: F401
