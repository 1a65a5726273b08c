"""Operator tests: unit tests need nothing; ``test_e2e.py`` uses the real control plane."""

from __future__ import annotations

from tests.k8s.fixtures import control_plane, kubelet  # noqa: F401
