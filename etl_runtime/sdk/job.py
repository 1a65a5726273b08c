"""``Job``: a batch job on the cluster (offline transform, dSort, ...).

``client.bucket("src").transform("etl", to_bucket="dst")`` and
``client.dsort(spec)`` return one; ``client.job(id)`` makes one from an id and
``client.jobs()`` lists them. ``status()`` is ``GET /v1/jobs/{id}``;
``wait()`` polls it until the job ends and raises ``JobError`` (with the
reason) unless it finished.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from etl_runtime.sdk.errors import SluiceError

if TYPE_CHECKING:
    from etl_runtime.sdk.client import Client

ENDED = ("Finished", "Aborted", "Failed")


class JobError(SluiceError):
    """The job ended ``Failed`` or ``Aborted`` (``state``, ``reason``, ``job_id``)."""

    def __init__(self, job_id: str, state: str, reason: str | None, status: dict[str, Any]):
        super().__init__(f"job {job_id} {state.lower()}: {reason or 'no reason given'}")
        self.job_id, self.state, self.reason, self.last_status = job_id, state, reason, status


class JobTimeout(SluiceError):
    """``wait(timeout)`` ran out while the job still ran (it goes on: abort it if you must)."""


class Job:
    def __init__(self, client: Client, job_id: str) -> None:
        self.client = client
        self.id = job_id

    def status(self) -> dict[str, Any]:
        """``{"id", "kind", "state", "reason", "progress", "targets", "errors", ...}``."""
        return self.client.request_json("GET", f"/v1/jobs/{quote(self.id, safe='')}")

    def abort(self) -> dict[str, Any]:
        return self.client.request_json("POST", f"/v1/jobs/{quote(self.id, safe='')}/abort")

    def wait(
        self,
        timeout: float | None = None,
        poll: float = 0.5,
        on_progress: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Block until the job ends; its final status. Raises ``JobError`` unless Finished."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = min(0.1, poll)
        while True:
            status = self.status()
            if on_progress is not None:
                on_progress(status)
            state = status.get("state")
            if state == "Finished":
                return status
            if state in ENDED:
                raise JobError(self.id, str(state), status.get("reason"), status)
            if deadline is not None and time.monotonic() >= deadline:
                raise JobTimeout(f"job {self.id} still {state} after {timeout}s")
            time.sleep(delay)
            delay = min(poll, delay * 2)

    def __repr__(self) -> str:
        return f"Job({self.id!r})"


def list_jobs(client: Client, kind: str | None = None, state: str | None = None) -> list[dict]:
    params = {k: v for k, v in (("kind", kind), ("state", state)) if v}
    return list(client.request_json("GET", "/v1/jobs", params=params)["jobs"])
