"""Storage target: objects on local disk, transformed reads through the local transformer.

Run it with ``python -m etl_runtime.target`` (``sluice-target``); embed it with
``create_target_app``.
"""

from __future__ import annotations

from etl_runtime.target.app import create_target_app
from etl_runtime.target.store import ObjectInfo, ObjectStore

__all__ = ["ObjectInfo", "ObjectStore", "create_target_app"]
