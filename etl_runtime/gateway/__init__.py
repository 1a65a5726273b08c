"""Gateway: stateless entry point that redirects object calls to their owning target.

Run it with ``python -m etl_runtime.gateway`` (``sluice-gateway``); embed it
with ``create_gateway_app``.
"""

from __future__ import annotations

from etl_runtime.cluster.hrw import hrw_owner, hrw_score
from etl_runtime.gateway.app import create_gateway_app

__all__ = ["create_gateway_app", "hrw_owner", "hrw_score"]
