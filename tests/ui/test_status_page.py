"""``/ui`` in a real browser: what a person looking at the status page sees.

A real ``sluice up`` with 2 targets and a wds ETL whose transform raises on
one sample (its key carries HTML, which must show as text). The page must
list the ETL, show the error row with the sample key, and show a target as
down once it stops answering (SIGSTOP, as a hung node would).
"""

from __future__ import annotations

import io
import json
import os
import signal
import tarfile
from pathlib import Path

import httpx
import pytest

from etl_runtime import Client
from etl_runtime.gateway import create_gateway_app
from etl_runtime.local import LocalCluster
from tests.gateway.conftest import DictBackend
from tests.local.conftest import FakeTargets
from tests.servers import serve_in_thread
from tests.storage_target.fakes import DictRegistry
from tests.ui.conftest import WAIT_MS

# The failing sample's key: if the page inserted it as HTML, the image's onerror would run.
HOSTILE_KEY = "k<img src=x onerror=pwned=1>"


def shard(keys: list[str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for key in keys:
            payload = f"text of {key}".encode()
            info = tarfile.TarInfo(f"{key}.txt")
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return buf.getvalue()


def picky(sample: dict) -> dict:
    if "<img" in sample["__key__"]:
        raise ValueError(f"cannot use sample {sample['__key__']} <b>at all</b>")
    return sample


def target_pid(data_dir: Path, target: str) -> int:
    kids = json.loads((data_dir / "run" / "up.json").read_text())["children"]
    return next(int(k["pid"]) for k in kids if k["name"] == f"target {target}")


def row(page, table: str, attr: str, value: str):
    return page.locator(f"#{table} tr[data-{attr}='{value}']")


@pytest.mark.timeout(240)
def test_status_page_shows_etls_errors_and_a_target_going_down(
    tmp_path: Path, page, capsys: pytest.CaptureFixture[str]
) -> None:
    from playwright.sync_api import expect

    data = tmp_path / "data"
    with LocalCluster(data, targets=2) as cluster, Client(cluster.endpoint) as client:
        bucket = client.bucket("ui-bkt").create()
        bucket.object("shards/a.tar").put_content(shard(["s0", HOSTILE_KEY, "s2"]))
        client.etl("ui-picky").init_code(transform=picky, mode="wds", on_error="skip", workers=1)

        page.goto(f"{cluster.endpoint}/ui")
        etl = row(page, "etls", "etl", "ui-picky")
        expect(etl).to_contain_text("Running", timeout=WAIT_MS)
        expect(etl).to_contain_text("2/2")
        for t in ("t0", "t1"):
            expect(row(page, "targets", "target", t)).to_contain_text("up")
        expect(page.locator("#jobs")).to_contain_text("no jobs")

        # A GET through the ETL skips the bad sample; the page shows why, naming it.
        out = bucket.object("shards/a.tar").get_bytes(etl_name="ui-picky", progress=True)
        names = tarfile.open(fileobj=io.BytesIO(out)).getnames()
        assert names == ["s0.txt", "s2.txt"], names
        # (The SDK's bar for an ETL GET: bytes and speed, the size is not known up front.)
        assert "get ui-bkt/shards/a.tar via ui-picky" in capsys.readouterr().err
        errors = page.locator("#errors tbody")
        expect(errors).to_contain_text(HOSTILE_KEY, timeout=WAIT_MS)
        expect(errors).to_contain_text("shards/a.tar")
        expect(errors).to_contain_text("<b>at all</b>")  # shown as text, not bold
        expect(etl.locator("td").nth(6)).to_have_text("1")  # skipped
        assert page.locator("#errors img, #errors b").count() == 0
        assert page.evaluate("typeof window.pwned") == "undefined"
        # The sparkline has drawn the traffic it saw.
        expect(page.locator("#spark polyline")).to_have_count(1)

        pid = target_pid(data, "t1")
        os.kill(pid, signal.SIGSTOP)
        try:
            expect(row(page, "targets", "target", "t1")).to_contain_text("down", timeout=WAIT_MS)
            expect(row(page, "targets", "target", "t0")).to_contain_text("up")
            expect(page.locator("#status")).to_contain_text("1 target(s) down")
        finally:
            os.kill(pid, signal.SIGCONT)
        if os.environ.get("SLUICE_UI_SCREENSHOT"):
            page.screenshot(path=os.environ["SLUICE_UI_SCREENSHOT"], full_page=True)
    assert page.problems == []  # no script error, nothing refused by the CSP


def test_status_page_with_a_read_token(tmp_path: Path, page) -> None:
    """Without the token the page asks for it; ``?token=`` is kept for the tab, not in the URL."""
    from playwright.sync_api import expect

    app = create_gateway_app(FakeTargets([]), DictBackend(DictRegistry()), read_token="s3cret")
    with serve_in_thread(app) as url:
        assert httpx.get(f"{url}/v1/ui/summary").status_code == 401
        page.goto(f"{url}/ui")
        expect(page.locator("#auth")).to_be_visible()
        expect(page.locator("#status")).to_contain_text("a token is needed")

        page.fill("#token", "wrong")
        page.click("#authform button")
        expect(page.locator("#status")).to_contain_text("the token was refused")

        page.goto(f"{url}/ui?token=s3cret")
        expect(page.locator("#etls")).to_contain_text("no ETLs")
        expect(page.locator("#auth")).to_be_hidden()
        assert "token" not in page.url
        page.reload()  # the tab keeps it
        expect(page.locator("#etls")).to_contain_text("no ETLs")
        page.click("#forget")
        expect(page.locator("#auth")).to_be_visible()
    assert page.problems == []


def test_jobs_show_state_progress_and_reason(tmp_path: Path, page) -> None:
    """A job as ``GET /v1/jobs`` describes it (issue 11's shape) is shown, escaped.

    Jobs are built on another branch, so the browser is handed that answer
    (Playwright's ``route``); with no jobs the real gateway's answer shows
    "no jobs" (above).
    """
    from playwright.sync_api import expect

    job = {
        "id": "j-1f3a",
        "kind": "dsort",
        "state": "Failed",
        "reason": "target t1 away for 60 s <script>pwned=1</script>",
        "started": 1_763_856_000.0,
        "progress": {"objects": 12, "bytes": 3 << 20, "records": 480, "skipped": 0},
        "error_count": 2,
        "targets": {"t0": {"state": "Finished", "progress": {"objects": 12}}},
    }
    app = create_gateway_app(FakeTargets([]), DictBackend(DictRegistry()))
    with serve_in_thread(app) as url:
        page.route("**/v1/jobs", lambda route: route.fulfill(json={"jobs": [job]}))
        page.goto(f"{url}/ui")
        row = page.locator("#jobs tr[data-job='j-1f3a']")
        expect(row).to_contain_text("dsort")
        expect(row).to_contain_text("Failed")
        expect(row).to_contain_text("12 objects, 480 records, 3.0 MiB")
        expect(row).to_contain_text("<script>pwned=1</script>")
        expect(page.locator("#jobs")).to_contain_text("t0: Finished, 12 obj")
        assert page.evaluate("typeof window.pwned") == "undefined"
    assert page.problems == []


def test_ui_refuses_unknown_parameters_and_sets_a_csp() -> None:
    app = create_gateway_app(FakeTargets([]), DictBackend(DictRegistry()))
    with serve_in_thread(app) as url:
        r = httpx.get(f"{url}/ui?token=x")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        assert "script-src 'sha256-" in r.headers["content-security-policy"]
        r = httpx.get(f"{url}/ui?refresh=5")
        assert r.status_code == 400 and "refresh" in r.json()["error"]
        r = httpx.get(f"{url}/v1/ui/summary?verbose=1")
        assert r.status_code == 400 and "verbose" in r.json()["error"]
        body = httpx.get(f"{url}/v1/ui/summary").json()
        assert body["targets"] == [] and body["etls"] == [] and "gateway" in body["traffic"]
