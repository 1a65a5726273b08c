"""Sluice: run Python transforms next to the data.

The public Python API is the SDK, re-exported here::

    from etl_runtime import Client

Servers (``webserver``, ``storage_target``, ``gateway``, ``local``) are started
as processes (``sluice up``, ``python -m etl_runtime.<part>``), not imported.
The packages are layers, imports running only downward (docs/architecture.md,
"Layers"): ``core``, ``wire``, ``cluster``, then ``storage``/``etl``/``providers``,
``jobs``/``dsort``, the services, and ``cli``; ``sdk`` and ``pytorch`` use only ``core``.
"""

from __future__ import annotations

from etl_runtime.sdk import *  # noqa: F403
from etl_runtime.sdk import __all__ as __all__
