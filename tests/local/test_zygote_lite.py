"""The first ETL after ``sluice up`` never waits for the full zygote's warm-up.

The full zygote here is made to import a module that never finishes loading
(``SLUICE_ZYGOTE_PRELOAD``), the extreme of torch and torchvision on a busy
machine: an ETL registered meanwhile is Running, forked by the lite zygote
(the server's modules only), and transforms.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from etl_runtime import Client
from etl_runtime.local.up import LocalCluster
from tests.local.conftest import pid_gone


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("zygote-lite")
    mods = root / "mods"
    mods.mkdir()
    (mods / "sluice_test_never_loads.py").write_text("import time\ntime.sleep(3600)\n")
    saved = {k: os.environ.get(k) for k in ("SLUICE_ZYGOTE", "SLUICE_ZYGOTE_PRELOAD", "PYTHONPATH")}
    os.environ.pop("SLUICE_ZYGOTE", None)
    os.environ["SLUICE_ZYGOTE_PRELOAD"] = "sluice_test_never_loads"
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(mods), saved["PYTHONPATH"]) if p)
    try:
        with LocalCluster(root / "data", targets=3) as c:
            yield c
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def upper(data: bytes) -> bytes:
    return data.upper()


def test_an_etl_is_forked_by_the_lite_zygote_while_the_full_one_still_imports(
    cluster: LocalCluster,
) -> None:
    client = Client(cluster.endpoint)
    client.bucket("bkt-z").create().object("a.txt").put_content(b"first minute")
    details = client.etl("lite-upper").init_code(transform=upper, timeout=120)
    assert details.phase == "Running" and details.ready == 3
    assert (
        client.bucket("bkt-z").object("a.txt").get_bytes(etl_name="lite-upper") == b"FIRST MINUTE"
    )
    full_log = Path(cluster.data_dir) / "etl" / "logs" / "zygote.log"
    assert "ready" not in (full_log.read_text() if full_log.exists() else "")
    parents = set()
    for f in (Path(cluster.data_dir) / "etl" / "run").glob("etl-lite-upper-*.json"):
        pid = int(json.loads(f.read_text())["pid"])
        assert not pid_gone(pid)
        parents.add(psutil.Process(pid).parent().name())  # type: ignore[union-attr]
    assert parents == {"sluice-zyg-lite"}
    client.etl("lite-upper").delete()
