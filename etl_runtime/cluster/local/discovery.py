"""A fixed list of local targets, with liveness from their health endpoint.

The gateway of the local cluster is started with ``--targets t0=URL,...``.
``StaticTargets`` probes ``{url}/v1/health`` of each about once a second, so a
target that dies drops out of HRW placement (and gets no transformers) and
comes back when it answers again. Until the first probe round every target
counts as alive, so a gateway started together with its targets does not
begin with an empty cluster.

A refused connection marks a target dead at once (nothing listens there); a
timeout or an error status only after ``failures_to_drop`` probes in a row, so
one slow answer on a busy laptop does not reshuffle object placement.

A target whose probe has not answered within ``suspect_after`` (0.5 s) is
*suspect* until one answers again (``suspect_ids()``): the gateway sends reads
of objects that have a copy to the copy instead (issue 20 #9: a paused target
used to stall its readers for the ~6 s it took to be marked dead). Suspicion
moves no placement and fails no write, so a slow probe costs nothing.

``down_file`` (``sluice up``'s ``run/down.json``) names the targets the local
supervisor has marked down after a crash loop, and why; it is read with every
probe round and shown by ``down_reasons()`` (``sluice cluster``, ``/ui``,
the gateway's metrics).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx

from etl_runtime.cluster.records import TargetInfo
from etl_runtime.core import tls
from etl_runtime.core.eventloop import cancel_and_wait

log = logging.getLogger(__name__)


def parse_targets(text: str) -> list[TargetInfo]:
    """Parse ``t0=http://127.0.0.1:9001,t1=...`` (the gateway's ``--targets``)."""
    out: list[TargetInfo] = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        tid, sep, url = item.partition("=")
        if not sep or not tid.strip() or not url.strip():
            raise ValueError(f"bad target {item!r}: expected ID=URL, e.g. t0=http://127.0.0.1:9001")
        out.append(TargetInfo(id=tid.strip(), url=url.strip().rstrip("/")))
    ids = [t.id for t in out]
    if len(set(ids)) != len(ids):
        raise ValueError(f"duplicate target ids in {text!r}")
    return out


class StaticTargets:
    """``TargetDiscovery`` over a fixed target list, filtered by a health loop."""

    def __init__(
        self,
        targets: Iterable[TargetInfo],
        interval: float = 0.5,
        timeout: float = 2.0,
        failures_to_drop: int = 2,
        suspect_after: float = 0.5,
        down_file: Path | None = None,
    ) -> None:
        self._all = list(targets)
        self.down_file = down_file
        self._down: dict[str, str] = {}
        self.interval = interval
        self.timeout = timeout
        self.failures_to_drop = failures_to_drop
        self._alive = {t.id: True for t in self._all}
        self._failures = {t.id: 0 for t in self._all}
        self.suspect_after = suspect_after
        self._suspect: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self._client: httpx.AsyncClient | None = None

    def targets(self) -> list[TargetInfo]:
        """The targets that answered their last health probe(s), in configured order."""
        return [t for t in self._all if self._alive[t.id]]

    def all_targets(self) -> list[TargetInfo]:
        return list(self._all)

    def is_alive(self, target_id: str) -> bool:
        return self._alive.get(target_id, False)

    def suspect_ids(self) -> set[str]:
        """Targets whose health probe is late or failed: reads prefer their copies."""
        return set(self._suspect)

    def down_reasons(self) -> dict[str, str]:
        """Targets marked down by the local supervisor (a crash loop) -> why."""
        return dict(self._down)

    def _read_down_file(self) -> None:
        if self.down_file is None:
            return
        try:
            doc: dict[str, Any] = json.loads(self.down_file.read_text())
        except FileNotFoundError:
            doc = {}
        except (OSError, ValueError):
            return  # being replaced: keep what we had
        down = {}
        for tid, d in doc.items():
            d = d if isinstance(d, dict) else {}
            down[tid] = (
                f"crash loop: {d.get('crashes', '?')} crashes in a row; last: "
                f"{d.get('reason') or 'unknown'}"
            )
        if down != self._down:
            for tid in down.keys() - self._down.keys():
                log.error("target %s is marked down: %s", tid, down[tid])
            self._down = down

    async def start(self) -> None:
        """Probe every target once, then keep probing in the background."""
        if self._task is not None:
            return
        self._client = httpx.AsyncClient(
            timeout=self.timeout, trust_env=False, verify=tls.client_context()
        )
        await self.probe_all()
        self._task = asyncio.create_task(self._loop(), name="sluice-target-health")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.probe_all()
            except Exception:  # never let one bad round end liveness tracking
                log.exception("target health probe round failed")

    async def probe_all(self) -> None:
        self._read_down_file()
        await asyncio.gather(*(self._probe(t) for t in self._all))

    async def _probe(self, target: TargetInfo) -> None:
        assert self._client is not None
        was_alive = self._alive[target.id]
        probe = asyncio.ensure_future(self._client.get(f"{target.url}/v1/health"))
        try:
            done, _ = await asyncio.wait({probe}, timeout=self.suspect_after)
        except asyncio.CancelledError:
            probe.cancel()
            raise
        if not done and target.id not in self._suspect:
            self._suspect.add(target.id)
            log.warning(
                "target %s (%s) is slow to answer: reads prefer copies", target.id, target.url
            )
        try:
            r = await probe
            ok, definite = r.status_code == 200, False
        except httpx.ConnectError:
            ok, definite = False, True
        except httpx.HTTPError:
            ok, definite = False, False
        if ok:
            self._failures[target.id] = 0
            self._alive[target.id] = True
            self._suspect.discard(target.id)
        else:
            self._suspect.add(target.id)
            self._failures[target.id] += 1
            if definite or self._failures[target.id] >= self.failures_to_drop:
                self._alive[target.id] = False
        if was_alive != self._alive[target.id]:
            state = "alive" if self._alive[target.id] else "down"
            log.warning("target %s (%s) is %s", target.id, target.url, state)
