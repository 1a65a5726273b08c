"""The ``sluice`` command (``main``; ``python -m etl_runtime.cli``), one module per command group.

``commands`` (the parser and dispatch; objects, buckets, ``sluice up``), ``etl``,
``remote`` (remote buckets, prefetch), ``jobs`` (``sluice job ...``), ``dsort``.
It talks to a cluster only through the SDK, and starts a local cluster through
``etl_runtime.local``.
"""

from __future__ import annotations

from etl_runtime.cli.commands import main

__all__ = ["main"]
