"""The status page: ``GET /ui`` and the one JSON call it makes, ``GET /v1/ui/summary``.

``/ui`` is a single static HTML file (``static/ui.html``: inline CSS and plain
JavaScript, no build step) that polls every 2 s:

* ``GET /v1/ui/summary`` (below): targets, ETLs and traffic counters in one
  answer, so a page costs the cluster one fan-out per refresh;
* ``GET /v1/jobs``: batch jobs, shown as "no jobs" while that answers 404; a
  ``scrub`` job's findings (corrupted, repaired, unrepaired, missing and
  orphaned copies, the first corrupted objects) under its row.

Each target's row also shows its integrity counters (bad reads, read
repairs, what the scrub scanned, found and repaired).

The summary is built from what already exists: the cluster map and target
discovery for up/down, each live target's ``/metrics`` (disk, stored objects,
bytes in and out, parsed with ``prometheus_client.parser``), the ETL backend
and the targets' ``/v1/_etl/{name}/stats`` (``etl_api.gather_stats``) for the
ETLs. Traffic is reported as raw counters per server; the page turns two
samples into a rate, so a target that restarts (counters back to 0) only
drops out of one interval.

The page holds no data itself, so ``/ui`` is open; the summary is a read
(``Gateway.require_read``). With a read token set, the page takes the token
from ``/ui?token=...`` or a form, keeps it in ``sessionStorage`` and sends it as
``Authorization: Bearer``. Everything user-controlled (object names, sample
keys, error messages) is inserted with ``textContent``, never as HTML, and the
page's Content-Security-Policy allows only its own inline script (by hash).
"""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import re
import time
from importlib import resources
from typing import Any

import httpx
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from etl_runtime.core.params import refuse_unknown
from etl_runtime.etl.forward import STAT_FIELDS
from etl_runtime.gateway.context import Gateway
from etl_runtime.gateway.etl_api import combine_stats, stats_by_target, summary

SCRAPE_TIMEOUT = 1.5  # a paused target must not hold the page up for long
STATS_TIMEOUT = 3.0

# What the page shows of a target's /metrics, by sample name.
TARGET_GAUGES = {
    "sluice_target_disk_total_bytes": "disk_total",
    "sluice_target_disk_used_bytes": "disk_used",
    "sluice_target_disk_free_bytes": "disk_free",
    "sluice_target_objects": "objects",
    "sluice_target_stored_bytes": "stored_bytes",
    # storage/integrity.py: bad bytes found by reads and by the scrub, and what was mended
    "sluice_integrity_corrupted_reads_total": "corrupted_reads",
    "sluice_integrity_read_repairs_total": "read_repairs",
    "sluice_integrity_scrub_objects_total": "scrub_objects",
    "sluice_integrity_scrub_corrupted_total": "scrub_corrupted",
    "sluice_integrity_scrub_repaired_total": "scrub_repaired",
}
TRAFFIC_COUNTERS = {
    "sluice_http_requests_total": "requests",
    "sluice_http_received_bytes_total": "bytes_in",
    "sluice_http_sent_bytes_total": "bytes_out",
}


@functools.cache
def page() -> tuple[str, str]:
    """The page's HTML and its Content-Security-Policy (the inline script by hash)."""
    html = resources.files("etl_runtime.gateway").joinpath("static/ui.html").read_text("utf-8")
    scripts = re.findall(r"<script>(.*?)</script>", html, flags=re.S)
    hashes = " ".join(
        "'sha256-" + base64.b64encode(hashlib.sha256(s.encode()).digest()).decode() + "'"
        for s in scripts
    )
    csp = (
        f"default-src 'none'; script-src {hashes}; style-src 'unsafe-inline'; "
        "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'"
    )
    return html, csp


def metric_values(text: str) -> tuple[dict[str, float], dict[str, float]]:
    """(gauges, traffic counters summed over their labels) from a ``/metrics`` page."""
    gauges: dict[str, float] = {}
    traffic = dict.fromkeys(TRAFFIC_COUNTERS.values(), 0.0)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in TARGET_GAUGES:
                gauges[TARGET_GAUGES[s.name]] = s.value
            elif s.name in TRAFFIC_COUNTERS:
                traffic[TRAFFIC_COUNTERS[s.name]] += s.value
    return gauges, traffic


def own_traffic(registry: CollectorRegistry | None) -> dict[str, float]:
    traffic = dict.fromkeys(TRAFFIC_COUNTERS.values(), 0.0)
    for family in registry.collect() if registry is not None else ():
        for s in family.samples:
            if s.name in TRAFFIC_COUNTERS:
                traffic[TRAFFIC_COUNTERS[s.name]] += s.value
    return traffic


async def scrape_targets(gw: Gateway) -> dict[str, dict[str, Any]]:
    """Each live target's disk, objects and traffic from its ``/metrics``."""
    out: dict[str, dict[str, Any]] = {}
    targets = gw.discovery.targets()

    async def one(url: str) -> httpx.Response | httpx.HTTPError:
        try:
            return await gw.http.get(url + "/metrics", timeout=SCRAPE_TIMEOUT)
        except httpx.HTTPError as e:
            return e

    answers = await asyncio.gather(*(one(t.url) for t in targets))
    for t, r in zip(targets, answers, strict=True):
        if isinstance(r, httpx.Response) and r.status_code == 200:
            try:
                gauges, traffic = metric_values(r.text)
            except ValueError as e:
                out[t.id] = {"error": f"unreadable /metrics: {e}"}
                continue
            out[t.id] = {**gauges, "traffic": traffic}
        elif isinstance(r, httpx.Response):
            out[t.id] = {"error": f"/metrics answered {r.status_code}"}
        else:
            out[t.id] = {"error": f"not answering: {type(r).__name__}"}
    return out


def target_rows(gw: Gateway, scraped: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    alive = gw.alive_ids()
    down = gw.down_reasons()
    known = {t.id: t for t in gw.known_targets()}
    members: list[str] = list(gw.cmap.get().members) if gw.cmap is not None else []
    rows = []
    for tid in dict.fromkeys([*members, *known]):
        info = known.get(tid)
        rows.append(
            {
                "id": tid,
                "url": info.url if info else None,
                "node": info.node if info else None,
                "alive": tid in alive,
                "down": down.get(tid) if tid not in alive else None,
                "member": tid in members if gw.cmap is not None else True,
                **scraped.get(tid, {}),
            }
        )
    return rows


async def etl_rows(gw: Gateway) -> list[dict[str, Any]]:
    records = await gw.backend.list()
    answers = await asyncio.gather(
        *(stats_by_target(gw, r.name, timeout=STATS_TIMEOUT) for r in records)
    )
    rows = []
    for record, per_target in zip(records, answers, strict=True):
        stats, errors = combine_stats(per_target)
        rows.append(
            {
                **summary(record),
                "message": record.message,
                "stats": stats,
                "per_target": {
                    tid: {f: int(body.get(f) or 0) for f in STAT_FIELDS}
                    for tid, body in sorted(per_target.items())
                },
                "last_errors": errors,
            }
        )
    return rows


async def ui_summary(gw: Gateway, registry: CollectorRegistry | None) -> dict[str, Any]:
    scraped, etls = await asyncio.gather(scrape_targets(gw), etl_rows(gw))
    traffic = {"gateway": own_traffic(registry)}
    for tid, row in scraped.items():
        if "traffic" in row:
            traffic[tid] = row.pop("traffic")
    rebalance = None
    if gw.cmap is not None:
        cmap = gw.cmap.get()
        rebalance = {"id": cmap.rebalance_id, "state": "running" if cmap.rebalancing else "idle"}
    return {
        "time": time.time(),
        "targets": target_rows(gw, scraped),
        "rebalance": rebalance,
        "etls": etls,
        "traffic": traffic,
    }


def ui_router(gw: Gateway) -> APIRouter:
    router = APIRouter()

    @router.get("/ui", include_in_schema=False)
    async def status_page(request: Request) -> HTMLResponse:
        refuse_unknown(request, ("token",))  # the page itself reads ?token=
        html, csp = page()
        return HTMLResponse(
            html,
            headers={
                "Content-Security-Policy": csp,
                "Cache-Control": "no-store",
                "Referrer-Policy": "no-referrer",  # ?token= must not leak onwards
                "X-Content-Type-Options": "nosniff",
            },
        )

    @router.get("/v1/ui/summary")
    async def ui_summary_route(request: Request) -> dict[str, Any]:
        """Targets, ETLs (with stats and last errors) and traffic counters for ``/ui``."""
        gw.require_read(request)  # before the parameters: no 400 for a caller without it
        refuse_unknown(request, ())
        registry = getattr(request.app.state, "metrics_registry", None)
        return await ui_summary(gw, registry)

    return router
