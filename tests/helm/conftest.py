"""The chart's tests: rendered with ``helm template``, and on real nodes (test_realstack.py)."""

from __future__ import annotations

from tests.k8s.realfixtures import real_cluster  # noqa: F401
