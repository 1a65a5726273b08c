"""Storage target: objects on local disk, transformed reads through the local transformer.

Run it with ``python -m etl_runtime.storage_target`` (``sluice-target``); embed it with
``create_target_app``.
"""

from __future__ import annotations

from etl_runtime.storage.store import ObjectInfo, ObjectStore
from etl_runtime.storage_target.app import create_target_app

__all__ = ["ObjectInfo", "ObjectStore", "create_target_app"]
