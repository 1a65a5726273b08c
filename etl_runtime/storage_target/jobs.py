"""Wiring the jobs framework into a target app (one call in ``storage_target/app.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fastapi import APIRouter

from etl_runtime.cluster.clustermap import ClusterMapStore
from etl_runtime.jobs.kinds import load_kinds
from etl_runtime.jobs.manager import JobManager
from etl_runtime.storage_target.context import Target
from etl_runtime.storage_target.jobs_routes import jobs_target_router


@dataclass
class TargetJobs:
    manager: JobManager
    router: APIRouter


def install_target_jobs(
    target: Target, data_dir: Path | str, cluster_map: ClusterMapStore | None
) -> TargetJobs:
    load_kinds()
    manager = JobManager(target, data_dir, cluster_map)
    return TargetJobs(manager, jobs_target_router(manager, target.cluster_key))
