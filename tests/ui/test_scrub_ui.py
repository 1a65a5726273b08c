"""``/ui`` shows what the scrub found: a scrub job's findings under its row, and each
target's integrity counters (bad reads, repairs, what the scrub checked and found)."""

from __future__ import annotations

from etl_runtime.gateway import create_gateway_app
from etl_runtime.gateway.ui import metric_values
from tests.gateway.conftest import DictBackend
from tests.local.conftest import FakeTargets
from tests.servers import serve_in_thread
from tests.storage_target.fakes import DictRegistry

SCRUB = {
    "id": "j-scrub1",
    "kind": "scrub",
    "state": "Finished",
    "started": 1_763_856_000.0,
    "progress": {"objects": 40, "bytes": 4 << 20},
    "error_count": 1,
    "output": {
        "scanned": 40,
        "bytes": 4 << 20,
        "corrupted": 3,
        "repaired": 2,
        "unrepaired": 1,
        "missing_copies": 1,
        "copies_made": 1,
        "orphaned": 0,
        "checksums_added": 5,
        "corrupted_objects": ["b/x<script>pwned=1</script>", "b/y", "b/z"],
        "orphaned_objects": [],
    },
}


def test_a_scrub_job_shows_what_it_found(page) -> None:
    from playwright.sync_api import expect

    app = create_gateway_app(FakeTargets([]), DictBackend(DictRegistry()))
    with serve_in_thread(app) as url:
        page.route("**/v1/jobs", lambda route: route.fulfill(json={"jobs": [SCRUB]}))
        page.goto(f"{url}/ui")
        row = page.locator("#jobs tr[data-scrub='j-scrub1']")
        expect(row).to_contain_text("40 checked, 4.0 MiB; 3 corrupted, 2 repaired, 1 unrepaired")
        expect(row).to_contain_text("1 missing copies (1 made), 0 orphaned, 5 checksums added")
        expect(row).to_contain_text("corrupted: b/x<script>pwned=1</script>, b/y, b/z")
        assert page.evaluate("typeof window.pwned") == "undefined"
    assert page.problems == []


def test_a_targets_integrity_counters_reach_the_summary() -> None:
    text = "\n".join(
        [
            "# TYPE sluice_integrity_corrupted_reads counter",
            'sluice_integrity_corrupted_reads_total{target="t0"} 4.0',
            "# TYPE sluice_integrity_read_repairs counter",
            'sluice_integrity_read_repairs_total{target="t0"} 3.0',
            "# TYPE sluice_integrity_scrub_objects counter",
            'sluice_integrity_scrub_objects_total{target="t0"} 120.0',
            "# TYPE sluice_integrity_scrub_corrupted counter",
            'sluice_integrity_scrub_corrupted_total{target="t0"} 2.0',
            "# TYPE sluice_integrity_scrub_repaired counter",
            'sluice_integrity_scrub_repaired_total{target="t0"} 1.0',
            "",
        ]
    )
    gauges, _ = metric_values(text)
    assert gauges == {
        "corrupted_reads": 4.0,
        "read_repairs": 3.0,
        "scrub_objects": 120.0,
        "scrub_corrupted": 2.0,
        "scrub_repaired": 1.0,
    }
