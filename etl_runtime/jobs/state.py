"""One target's part of a job, as persisted under ``DATA/.jobs/<id>.json``."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from etl_runtime.core.durable import make_dirs, write_atomic

RUNNING, FINISHED, ABORTED, FAILED = "Running", "Finished", "Aborted", "Failed"
STATES = (RUNNING, FINISHED, ABORTED, FAILED)
TERMINAL = frozenset({FINISHED, ABORTED, FAILED})
MAX_ERRORS = 100  # errors listed per target; all are counted


@dataclass
class JobPart:
    id: str
    kind: str
    spec: dict[str, Any]
    members: dict[str, str]  # target id -> URL at start (the cluster map's URL wins)
    target: str
    state: str = RUNNING
    started: float = field(default_factory=time.time)
    ended: float | None = None
    reason: str | None = None
    progress: dict[str, int] = field(
        default_factory=lambda: {"objects": 0, "bytes": 0, "records": 0, "skipped": 0}
    )
    errors: list[dict[str, Any]] = field(default_factory=list)
    error_count: int = 0
    output: dict[str, Any] = field(default_factory=dict)
    checkpoint: dict[str, Any] = field(default_factory=dict)
    phases: list[str] = field(default_factory=list)
    restarts: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> JobPart:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in known})

    def summary(self) -> dict[str, Any]:
        """What the gateway aggregates (the checkpoint stays on the target)."""
        d = self.to_dict()
        d.pop("checkpoint")
        return d

    def finish(self, state: str, reason: str | None = None) -> None:
        if self.state in TERMINAL:
            return
        self.state, self.reason, self.ended = state, reason, time.time()


class JobFiles:
    """``DATA/.jobs/``: one JSON file per job (atomic replace), one scratch dir per job."""

    def __init__(self, data_dir: Path | str) -> None:
        self.dir = Path(data_dir) / ".jobs"

    def path(self, job_id: str) -> Path:
        return self.dir / f"{job_id}.json"

    def workdir(self, job_id: str) -> Path:
        return self.dir / job_id

    def save(self, part: JobPart) -> None:
        make_dirs(self.dir)  # a new DATA/.jobs/ survives a power loss with the file
        write_atomic(self.path(part.id), json.dumps(part.to_dict()).encode())

    def remove(self, job_id: str) -> None:
        self.path(job_id).unlink(missing_ok=True)
        shutil.rmtree(self.workdir(job_id), ignore_errors=True)

    def load_all(self) -> list[JobPart]:
        parts = []
        for p in sorted(self.dir.glob("*.json")) if self.dir.is_dir() else []:
            try:
                parts.append(JobPart.from_dict(json.loads(p.read_text())))
            except (OSError, ValueError, TypeError):
                continue  # a torn file cannot exist (atomic replace); skip foreign ones
        return parts
