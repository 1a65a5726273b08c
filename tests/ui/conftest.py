"""A real headless Chromium (Debian's, installed by ``scripts/browser.sh``) driven by Playwright.

Playwright's own browser download cannot run here, so it launches the system
binary (``SLUICE_CHROMIUM``, default ``/usr/bin/chromium``). ``make test`` runs
``scripts/browser.sh`` first; a missing browser is a failure, not a skip.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("SLUICE_CHROMIUM", "/usr/bin/chromium")
# Generous: the page refreshes every 2 s and a loaded 2-core machine is slow.
WAIT_MS = 45_000


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install -e '.[dev]'")
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no browser at {CHROMIUM}: run scripts/browser.sh (make test does)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser) -> Iterator[object]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    pg.set_default_timeout(WAIT_MS)
    problems: list[str] = []
    pg.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    # A 404 from /v1/jobs is logged too ("Failed to load resource"): only CSP refusals count.
    pg.on(
        "console",
        lambda m: problems.append(f"console: {m.text}") if "Refused to" in m.text else None,
    )
    pg.problems = problems  # type: ignore[attr-defined]
    try:
        yield pg
    finally:
        context.close()
