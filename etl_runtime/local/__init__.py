"""Sluice on one machine: gateway, targets and transformers as local processes.

* ``registry.FileRegistry`` -- ETL records as JSON files (targets read them);
* ``discovery.StaticTargets`` -- the gateway's fixed target list with health;
* ``controller.LocalEtlBackend`` -- the gateway's ETL API, running transformers
  (the local counterpart of the kopf operator, sharing its reconcile logic);
* ``cluster.main`` -- ``sluice up``; ``LocalCluster`` -- the same from Python.
"""

from __future__ import annotations

from etl_runtime.local.api import LocalCluster

__all__ = ["LocalCluster"]
