"""Sluice: run Python transforms next to the data.

The public Python API is the SDK, re-exported here::

    from etl_runtime import Client

Servers (``webserver``, ``target``, ``gateway``, ``local``) are started as
processes (``sluice up``, ``python -m etl_runtime.<part>``), not imported.
"""

from __future__ import annotations

from etl_runtime.sdk import *  # noqa: F403
from etl_runtime.sdk import __all__ as __all__
