"""The full-stack test installs the chart on the project's test control plane."""

from __future__ import annotations

from tests.k8s.fixtures import control_plane, k8s_namespace, kubelet  # noqa: F401
