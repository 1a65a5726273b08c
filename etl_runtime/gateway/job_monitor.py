"""``JobMonitor``: fails a running job whose member target stays away too long.

A job runs on every member target; a member that does not answer, or has no
part of the job, for ``SLUICE_JOB_TARGET_TIMEOUT`` seconds (default 60) while
the job runs fails the job on every target, naming it, so a job never hangs on
a target that is gone. This is the gateway's background task (started by its
lifespan, beside the rebalance monitor); reading a job (``GET /v1/jobs/{id}``,
the aistore SDK's queries) only reads, it never ends one.

Every gateway runs one: ending a job twice is harmless (a target ends a part
once), so several gateways need no election.
"""

from __future__ import annotations

import asyncio
import logging
import time

from etl_runtime.core.eventloop import cancel_and_wait
from etl_runtime.gateway.context import Gateway
from etl_runtime.gateway.jobs import NO_PART, UNREACHABLE, end_everywhere, job_views
from etl_runtime.jobs.state import FAILED, RUNNING

log = logging.getLogger("sluice.gateway")


def _why(reason: str | None) -> str:
    return "has no part of this job" if reason in (None, NO_PART) else str(reason)


class JobMonitor:
    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        self.views = job_views(gw)
        self.timeout = self.views.timeout
        self.interval = min(2.0, max(0.25, self.timeout / 4))
        self.away_since: dict[tuple[str, str], float] = {}  # (job, target) -> first seen away
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="sluice-job-monitor")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.check()
            except Exception:  # keep monitoring whatever one round hit
                log.exception("job monitor round failed")

    async def check(self) -> list[str]:
        """One round: the ids of the jobs it failed."""
        jobs, _ = await self.views.all()
        now = time.monotonic()
        running = {j["id"]: j for j in jobs if j["state"] == RUNNING}
        away_now = {
            (job_id, t): _why(info.get("reason"))
            for job_id, j in running.items()
            for t, info in j["targets"].items()
            if info["state"] == UNREACHABLE
        }
        for key in list(self.away_since):
            if key not in away_now:  # back, or the job ended
                del self.away_since[key]
        failed: list[str] = []
        for (job_id, t), why in sorted(away_now.items()):
            since = self.away_since.setdefault((job_id, t), now)
            if now - since <= self.timeout or job_id in failed:
                continue
            reason = f"target {t!r} {why} for more than {self.timeout:.0f}s"
            log.warning("job %s failed: %s", job_id, reason)
            urls = [info.url for info in self.gw.known_targets()]
            await end_everywhere(self.gw, job_id, urls, FAILED, reason)
            failed.append(job_id)
        return failed
