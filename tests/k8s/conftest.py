"""Fixtures for the tests of the Kubernetes test harness itself."""

from __future__ import annotations

from tests.k8s.fixtures import control_plane, k8s_namespace, kubelet  # noqa: F401
