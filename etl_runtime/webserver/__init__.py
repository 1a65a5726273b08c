"""The transformer runtime: a FastAPI server that runs one ETL's user code.

``create_app(name, spec, workers, token)`` builds the app (hpush protocol,
``/health``, ``/stats``, ``/logs``); ``python -m etl_runtime.webserver`` (the
``sluice-transformer`` command) serves it with uvicorn. User code runs only in
a pool of worker processes (``pool``), per object (``objects``) or per
WebDataset sample (``shards``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from etl_runtime.webserver.app import create_app
    from etl_runtime.webserver.transformer import Transformer

__all__ = ["Transformer", "create_app"]
_HOMES = {
    "create_app": "etl_runtime.webserver.app",
    "Transformer": "etl_runtime.webserver.transformer",
}


def __getattr__(name: str) -> Any:
    # Lazy, so worker processes (which import .worker) skip FastAPI and uvicorn.
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'etl_runtime.webserver' has no attribute {name!r}")
